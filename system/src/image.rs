//! `fencelab image build`: the lab's container image (`images/lab/Dockerfile`: this binary
//! and the libraries `ldd` lists for it, FROM scratch) and a Toxiproxy image on top of it
//! (entrypoint `fencelab toxiproxy`), built through testcontainers from local files only.
//! An image whose `fencelab.binary` label matches this binary (size and modification time)
//! is up to date and not built again.

use std::path::{Path, PathBuf};

use testcontainers::core::BuildImageOptions;
use testcontainers::runners::AsyncBuilder;
use testcontainers::GenericBuildableImage;

use crate::container::{docker, ImageName};
use crate::StartError;

/// The lab's image, as `systems/lab-containers.toml` names it.
pub const LAB_TAG: &str = "fencelab-lab:local";
/// The Toxiproxy image (`--toxiproxy-image`).
pub const TOXIPROXY_TAG: &str = "fencelab-toxiproxy:local";
/// The lab's Dockerfile.
pub const DOCKERFILE: &str = include_str!("../../images/lab/Dockerfile");
/// Longest a build may take (5 minutes).
const BUILD_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(300);

/// Why the images could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A tag given is not an image name (bad input).
    #[error("{flag}: {why}")]
    Tag { flag: &'static str, why: crate::container::ImageNameError },
    #[error(transparent)]
    Docker(#[from] StartError),
    #[error("{}: {source}", path.display())]
    Binary { path: PathBuf, source: std::io::Error },
    #[error("cannot run `ldd {}`: {source}", path.display())]
    Ldd { path: PathBuf, source: std::io::Error },
    #[error("building {tag}: {why}")]
    Build { tag: String, why: String },
    #[error("building {tag} took longer than {BUILD_WAIT_MAX:?}")]
    BuildTimeout { tag: String },
}

/// The shared libraries `ldd` lists for `binary` (none for a static one).
pub fn libraries(binary: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let output = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|source| ImageError::Ldd { path: binary.to_path_buf(), source })?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, after)) => after.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// What tells this binary apart: its size and modification time.
fn stamp(binary: &Path) -> Result<String, ImageError> {
    let meta = std::fs::metadata(binary).map_err(|source| ImageError::Binary { path: binary.to_path_buf(), source })?;
    let modified = meta.modified().ok().and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok());
    Ok(format!("{}-{}", meta.len(), modified.map_or(0, |time| time.as_nanos())))
}

/// The id of `image`, if it is present locally.
async fn id_of(client: &testcontainers::bollard::Docker, image: &str) -> Option<String> {
    client.inspect_image(image).await.ok()?.id
}

/// Removes the image `old` that tag `image` named before it was built again (unless a
/// container still uses it), so that rebuilds leave no untagged images behind.
async fn drop_replaced(client: &testcontainers::bollard::Docker, image: &str, old: Option<String>) {
    let Some(old) = old else { return };
    if id_of(client, image).await.as_ref() != Some(&old) {
        let _ = client
            .remove_image(&old, None::<testcontainers::bollard::query_parameters::RemoveImageOptions>, None)
            .await;
    }
}

/// The `fencelab.binary` label of `image`, if it is present locally.
async fn label_of(client: &testcontainers::bollard::Docker, image: &str) -> Option<String> {
    let info = client.inspect_image(image).await.ok()?;
    info.config?.labels?.get("fencelab.binary").cloned()
}

/// Builds both images unless up to date; what it did, one line each. The images the tags
/// named before are removed (when nothing else uses them).
pub async fn build(binary: &Path, tag: &str, toxiproxy_tag: &str, force: bool) -> Result<Vec<String>, ImageError> {
    let lab = ImageName::parse(tag).map_err(|why| ImageError::Tag { flag: "--tag", why })?;
    let toxiproxy = ImageName::parse(toxiproxy_tag).map_err(|why| ImageError::Tag { flag: "--toxiproxy-tag", why })?;
    let client = docker().await?;
    crate::container::sweep_dead(&client).await;
    let stamp = stamp(binary)?;
    let options = || BuildImageOptions::new().with_build_arg("FENCELAB_BINARY", stamp.clone());
    let (old_lab, old_toxiproxy) = (id_of(&client, &lab.full()).await, id_of(&client, &toxiproxy.full()).await);
    let mut said = Vec::new();
    if force || label_of(&client, &lab.full()).await.as_deref() != Some(stamp.as_str()) {
        let mut image = GenericBuildableImage::new(lab.name.clone(), lab.tag.clone())
            .with_dockerfile_string(DOCKERFILE)
            .with_file(binary, "rootfs/fencelab");
        for library in libraries(binary)? {
            let inside = format!("rootfs{}", library.display());
            image = image.with_file(&library, inside);
        }
        image = image.with_data(Vec::new(), "rootfs/tmp/.keep");
        build_one(image, options(), &lab.full()).await?;
        said.push(format!("built {} from {}", lab.full(), binary.display()));
    } else {
        said.push(format!("{} is up to date with {}", lab.full(), binary.display()));
    }
    if force || label_of(&client, &toxiproxy.full()).await.as_deref() != Some(stamp.as_str()) {
        let dockerfile = format!(
            "FROM {}\nARG FENCELAB_BINARY=unknown\nLABEL fencelab.binary=$FENCELAB_BINARY\n\
             ENTRYPOINT [\"/fencelab\", \"toxiproxy\"]\n",
            lab.full()
        );
        let image = GenericBuildableImage::new(toxiproxy.name.clone(), toxiproxy.tag.clone())
            .with_dockerfile_string(dockerfile);
        build_one(image, options(), &toxiproxy.full()).await?;
        said.push(format!("built {} (entrypoint `fencelab toxiproxy`)", toxiproxy.full()));
    } else {
        said.push(format!("{} is up to date", toxiproxy.full()));
    }
    // The old Toxiproxy image sits on the old lab image: it goes first.
    drop_replaced(&client, &toxiproxy.full(), old_toxiproxy).await;
    drop_replaced(&client, &lab.full(), old_lab).await;
    Ok(said)
}

async fn build_one(image: GenericBuildableImage, options: BuildImageOptions, tag: &str) -> Result<(), ImageError> {
    match tokio::time::timeout(BUILD_WAIT_MAX, image.build_image_with(options)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(ImageError::Build { tag: tag.to_string(), why: error.to_string() }),
        Err(_) => Err(ImageError::BuildTimeout { tag: tag.to_string() }),
    }
}
