//! Roles as containers: a role whose system file names an `image` is started through the
//! `testcontainers` crate on the host network (so ports, proxies and addresses are those of
//! a process), with the run's folder bind-mounted at the same path, its output appended to
//! the role's log, and labels naming the harness process and the run. Kill and restart,
//! pause (the cgroup freezer), clock skew (the host's libfaketime mounted in) act on
//! containers as on processes. Nothing outlives the run: containers are removed at the end,
//! after Ctrl-C and after a panic (by label), and a harness killed with SIGKILL leaves
//! containers that the next run using containers removes ([`sweep_dead`]).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use testcontainers::bollard;
use testcontainers::core::logs::LogFrame;
use testcontainers::core::{AccessMode, Mount};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use super::StartError;

/// The harness process that started a container (its pid).
pub const LABEL_PID: &str = "fencelab.pid";
/// That process's start time (clock ticks after boot): a reused pid is told apart.
pub const LABEL_PID_START: &str = "fencelab.pid-start";
/// The run folder.
pub const LABEL_RUN: &str = "fencelab.run";
/// The role (`control_plane`, `target`, `runner r1`, `toxiproxy`, …).
pub const LABEL_ROLE: &str = "fencelab.role";
/// One start of one container, to find it again when the start fails half-way.
const LABEL_START: &str = "fencelab.start";

/// Longest wait for one request to the Docker daemon (10 s).
const DOCKER_WAIT_MAX: Duration = Duration::from_secs(10);
/// Longest wait for a container to be created and started (not yet ready: 60 s).
const START_WAIT_MAX: Duration = Duration::from_secs(60);
/// Where the host's libfaketime is mounted in a runner's container.
pub const FAKETIME_MOUNT: &str = "/fencelab-faketime/libfaketime.so.1";
/// The dynamic loader a program needs in its image for `LD_PRELOAD` to work.
pub const LOADERS: [&str; 2] = ["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"];

/// Whether this process started a container (the panic hook then removes them).
static STARTED: AtomicBool = AtomicBool::new(false);
static STARTS: AtomicU64 = AtomicU64::new(0);

/// An image's name and tag (`NAME[:TAG]`, `latest` when none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageName {
    pub name: String,
    pub tag: String,
}

/// Why a text does not name an image; each quotes the text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImageNameError {
    #[error("`image = \"{0}\"`: name an image as NAME or NAME:TAG (no digest, no spaces)")]
    NotAName(String),
    #[error("`image = \"{0}\"`: the tag after `:` is empty")]
    EmptyTag(String),
}

impl ImageName {
    pub fn parse(text: &str) -> Result<ImageName, ImageNameError> {
        if text.is_empty() || text.contains(char::is_whitespace) || text.contains('@') {
            return Err(ImageNameError::NotAName(text.to_string()));
        }
        let slash = text.rfind('/').map_or(0, |at| at + 1);
        match text[slash..].rfind(':') {
            Some(colon) if colon + 1 < text.len() - slash => {
                Ok(ImageName { name: text[..slash + colon].to_string(), tag: text[slash + colon + 1..].to_string() })
            }
            Some(_) => Err(ImageNameError::EmptyTag(text.to_string())),
            None => Ok(ImageName { name: text.to_string(), tag: "latest".to_string() }),
        }
    }

    pub fn full(&self) -> String {
        format!("{}:{}", self.name, self.tag)
    }
}

/// A client of the Docker daemon (`DOCKER_HOST`, else the local socket) that answered a ping.
pub async fn docker() -> Result<bollard::Docker, StartError> {
    let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".to_string());
    let fail = |why: String| {
        StartError::Failed(format!(
            "the Docker daemon at {host} does not answer: {why} (start one, e.g. \
             `dockerd --bridge=none --iptables=false --ip6tables=false`, or set DOCKER_HOST)"
        ))
    };
    let client = bollard::Docker::connect_with_defaults().map_err(|error| fail(error.to_string()))?;
    match tokio::time::timeout(DOCKER_WAIT_MAX, client.ping()).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(error)) => Err(fail(error.to_string())),
        Err(_) => Err(fail(format!("no answer within {DOCKER_WAIT_MAX:?}"))),
    }
}

/// Why containers cannot be started here, if they cannot (for tests that skip; callable
/// from inside a runtime: it asks from a thread of its own).
pub fn unavailable() -> Option<String> {
    let ask = std::thread::spawn(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        runtime.block_on(docker()).map(drop).map_err(|error| error.to_string())
    });
    ask.join().unwrap_or_else(|_| Err("the Docker check panicked".to_string())).err()
}

/// Fails, naming the image, when it is not present locally (no registry is asked).
pub async fn check_image(client: &bollard::Docker, image: &str, where_: &str) -> Result<(), StartError> {
    match tokio::time::timeout(DOCKER_WAIT_MAX, client.inspect_image(image)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. })) => {
            Err(StartError::Named(format!(
                "{where_}: image `{image}` is not present locally (no registry is asked): build it \
                 (`fencelab image build` for the lab's) or load it with `docker load` first"
            )))
        }
        Ok(Err(error)) => Err(StartError::Failed(format!("{where_}: cannot inspect image `{image}`: {error}"))),
        Err(_) => {
            Err(StartError::Failed(format!("{where_}: the Docker daemon did not describe image `{image}` in time")))
        }
    }
}

/// Process `pid`'s start time (clock ticks after boot), as in `/proc/PID/stat`.
pub(crate) fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split_whitespace().nth(19)?.parse().ok()
}

/// The labels every container of this harness process carries.
fn own_labels() -> Vec<(String, String)> {
    let pid = std::process::id();
    vec![
        (LABEL_PID.to_string(), pid.to_string()),
        (LABEL_PID_START.to_string(), start_ticks(pid).unwrap_or(0).to_string()),
    ]
}

/// What a container is started from.
#[derive(Clone, Debug)]
pub struct Spec {
    pub image: ImageName,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Host paths mounted at the same path; `true`: read-only.
    pub mounts: Vec<(PathBuf, bool)>,
    /// Host files mounted elsewhere (read-only): host path, container path.
    pub files: Vec<(PathBuf, String)>,
    /// The run folder (`fencelab.run`) and the role (`fencelab.role`).
    pub run: PathBuf,
    pub role: String,
    /// Where its stdout and stderr are appended.
    pub log: PathBuf,
}

/// A started container; removed (forced) when it is killed, stopped or dropped.
pub struct Container {
    inner: Option<ContainerAsync<GenericImage>>,
    pub id: String,
    /// The host pid of its first process.
    pub pid: i32,
    paused: AtomicBool,
}

impl std::fmt::Debug for Container {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Container").field("id", &self.id).field("pid", &self.pid).finish()
    }
}

/// Appends a container's output to its log file.
fn log_writer(log: &Path) -> Result<impl Fn(&LogFrame) + Send + Sync + 'static, String> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|error| format!("{}: {error}", log.display()))?;
    let file = Mutex::new(file);
    Ok(move |frame: &LogFrame| {
        let bytes = match frame {
            LogFrame::StdOut(bytes) | LogFrame::StdErr(bytes) => bytes,
        };
        if let Ok(mut file) = file.lock() {
            let _ = file.write_all(bytes);
        }
    })
}

impl Container {
    /// Creates and starts a container of `spec` on the host network (bounded); a start
    /// that fails leaves no container.
    pub async fn start(spec: Spec, where_: &str) -> Result<Container, StartError> {
        let client = docker().await?;
        check_image(&client, &spec.image.full(), where_).await?;
        let start = format!("{}-{}", std::process::id(), STARTS.fetch_add(1, Ordering::Relaxed));
        let mut request = GenericImage::new(spec.image.name.clone(), spec.image.tag.clone())
            .with_network("host")
            .with_cmd(spec.command.clone())
            .with_label(LABEL_RUN, spec.run.display().to_string())
            .with_label(LABEL_ROLE, spec.role.clone())
            .with_label(LABEL_START, start.clone())
            .with_startup_timeout(START_WAIT_MAX)
            .with_log_consumer(log_writer(&spec.log).map_err(StartError::Failed)?);
        for (key, value) in own_labels() {
            request = request.with_label(key, value);
        }
        for (key, value) in &spec.env {
            request = request.with_env_var(key, value);
        }
        for (path, read_only) in &spec.mounts {
            let path = path.display().to_string();
            let mode = if *read_only { AccessMode::ReadOnly } else { AccessMode::ReadWrite };
            request = request.with_mount(Mount::bind_mount(path.clone(), path).with_access_mode(mode));
        }
        for (host, inside) in &spec.files {
            let mount = Mount::bind_mount(host.display().to_string(), inside.clone());
            request = request.with_mount(mount.with_access_mode(AccessMode::ReadOnly));
        }
        STARTED.store(true, Ordering::SeqCst);
        let started = tokio::time::timeout(START_WAIT_MAX + DOCKER_WAIT_MAX, request.start()).await;
        let container = match started {
            Ok(Ok(container)) => container,
            Ok(Err(error)) => {
                remove_labelled(&client, LABEL_START, &start).await;
                return Err(StartError::Failed(format!(
                    "{where_}: cannot start a container of `{}`: {error}",
                    spec.image.full()
                )));
            }
            Err(_) => {
                remove_labelled(&client, LABEL_START, &start).await;
                return Err(StartError::Failed(format!(
                    "{where_}: a container of `{}` was not started within {START_WAIT_MAX:?}",
                    spec.image.full()
                )));
            }
        };
        let id = container.id().to_string();
        let pid = match tokio::time::timeout(DOCKER_WAIT_MAX, client.inspect_container(&id, None)).await {
            Ok(Ok(info)) => info.state.and_then(|state| state.pid).unwrap_or(0) as i32,
            _ => 0,
        };
        Ok(Container { inner: Some(container), id, pid, paused: AtomicBool::new(false) })
    }

    /// Why it is not running, if it is not: its exit code and error, from the daemon.
    pub async fn exited(&self) -> Option<String> {
        let client = docker().await.ok()?;
        let info = tokio::time::timeout(DOCKER_WAIT_MAX, client.inspect_container(&self.id, None)).await.ok()?;
        let Ok(info) = info else { return Some("it is gone".to_string()) };
        let state = info.state?;
        if state.running == Some(true) {
            return None;
        }
        let error = state.error.filter(|error| !error.is_empty()).map(|error| format!(": {error}")).unwrap_or_default();
        Some(format!("its container exited (code {}){error} before it was ready", state.exit_code.unwrap_or(-1)))
    }

    /// SIGSTOP pauses it (the cgroup freezer), SIGCONT resumes it, any other signal is sent
    /// to its first process; true when the daemon did it.
    pub fn signal(&self, signal: i32) -> bool {
        let id = self.id.clone();
        let done = block_on(async move {
            let client = docker().await.ok()?;
            let result = match signal {
                libc::SIGSTOP => client.pause_container(&id).await,
                libc::SIGCONT => client.unpause_container(&id).await,
                signal => {
                    let options = bollard::query_parameters::KillContainerOptionsBuilder::new()
                        .signal(&signal.to_string())
                        .build();
                    client.kill_container(&id, Some(options)).await
                }
            };
            Some(result)
        });
        match (signal, done.flatten()) {
            (libc::SIGSTOP, Some(Ok(()))) => {
                self.paused.store(true, Ordering::SeqCst);
                true
            }
            (libc::SIGCONT, Some(Ok(()))) => {
                self.paused.store(false, Ordering::SeqCst);
                true
            }
            // Resuming a container that is not paused does nothing, as SIGCONT would.
            (libc::SIGCONT, Some(Err(_))) => !self.paused.load(Ordering::SeqCst),
            (_, Some(Ok(()))) => true,
            _ => false,
        }
    }

    /// Paused, or its first process is gone.
    pub fn is_stopped(&self) -> bool {
        self.paused.load(Ordering::SeqCst) || !Path::new(&format!("/proc/{}", self.pid)).exists()
    }

    /// Kills and removes it.
    pub async fn kill(&mut self) {
        if let Some(container) = self.inner.take() {
            let _ = tokio::time::timeout(DOCKER_WAIT_MAX, container.rm()).await;
        }
    }

    /// Resumes it, lets it stop (SIGTERM, then SIGKILL after `grace`), removes it.
    pub async fn stop(&mut self, grace: Duration) {
        if let Some(container) = self.inner.as_ref() {
            if self.paused.swap(false, Ordering::SeqCst) {
                let _ = tokio::time::timeout(DOCKER_WAIT_MAX, container.unpause()).await;
            }
            let seconds = grace.as_secs().max(1) as i32;
            let _ = tokio::time::timeout(grace + DOCKER_WAIT_MAX, container.stop_with_timeout(Some(seconds))).await;
        }
        self.kill().await;
    }
}

/// Runs `future` to its end from synchronous code inside the harness's (multi-thread)
/// runtime; none outside one.
pub fn block_on<F: std::future::Future>(future: F) -> Option<F::Output> {
    let handle = tokio::runtime::Handle::try_current().ok()?;
    if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return None;
    }
    Some(tokio::task::block_in_place(|| handle.block_on(future)))
}

fn label_filter(key: &str, value: &str) -> bollard::query_parameters::ListContainersOptions {
    let filters = HashMap::from([("label".to_string(), vec![format!("{key}={value}")])]);
    bollard::query_parameters::ListContainersOptionsBuilder::new().all(true).filters(&filters).build()
}

async fn remove(client: &bollard::Docker, id: &str) -> bool {
    let options = bollard::query_parameters::RemoveContainerOptionsBuilder::new().force(true).v(true).build();
    matches!(tokio::time::timeout(DOCKER_WAIT_MAX, client.remove_container(id, Some(options))).await, Ok(Ok(())))
}

/// Removes every container labelled `key=value`; how many were removed.
async fn remove_labelled(client: &bollard::Docker, key: &str, value: &str) -> usize {
    let listed = tokio::time::timeout(DOCKER_WAIT_MAX, client.list_containers(Some(label_filter(key, value)))).await;
    let mut removed = 0;
    for summary in listed.ok().and_then(Result::ok).unwrap_or_default() {
        if let Some(id) = summary.id {
            removed += usize::from(remove(client, &id).await);
        }
    }
    removed
}

/// The containers of run folder `run` (any state), by id.
pub async fn of_run(run: &Path) -> Result<Vec<String>, StartError> {
    let client = docker().await?;
    let listed = tokio::time::timeout(
        DOCKER_WAIT_MAX,
        client.list_containers(Some(label_filter(LABEL_RUN, &run.display().to_string()))),
    )
    .await
    .map_err(|_| StartError::Failed("the Docker daemon did not list containers in time".into()))?
    .map_err(|error| StartError::Failed(error.to_string()))?;
    Ok(listed.into_iter().filter_map(|summary| summary.id).collect())
}

/// Removes every container of this harness process (for the panic hook: blocking, bounded).
pub fn remove_own_blocking() -> usize {
    if !STARTED.load(Ordering::SeqCst) {
        return 0;
    }
    let pid = std::process::id().to_string();
    let work = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        runtime.block_on(async {
            let client = docker().await.ok()?;
            Some(remove_labelled(&client, LABEL_PID, &pid).await)
        })
    });
    work.join().ok().flatten().unwrap_or(0)
}

/// Removes the containers of harness processes that are gone (a harness killed with
/// SIGKILL cannot remove its own); says so on stderr and answers how many.
pub async fn sweep_dead(client: &bollard::Docker) -> usize {
    let filters = HashMap::from([("label".to_string(), vec![LABEL_PID.to_string()])]);
    let options = bollard::query_parameters::ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
    let Ok(Ok(listed)) = tokio::time::timeout(DOCKER_WAIT_MAX, client.list_containers(Some(options))).await else {
        return 0;
    };
    let mut removed = Vec::new();
    for summary in listed {
        let labels = summary.labels.unwrap_or_default();
        let pid = labels.get(LABEL_PID).and_then(|pid| pid.parse::<u32>().ok());
        let started = labels.get(LABEL_PID_START).and_then(|ticks| ticks.parse::<u64>().ok());
        let alive = pid.is_some_and(|pid| start_ticks(pid).is_some() && start_ticks(pid) == started);
        if alive {
            continue;
        }
        if let Some(id) = summary.id.filter(|_| pid.is_some()) {
            if remove(client, &id).await {
                let run = labels.get(LABEL_RUN).cloned().unwrap_or_default();
                removed.push(format!("{} ({}, pid {})", &id[..id.len().min(12)], run, pid.unwrap_or(0)));
            }
        }
    }
    if !removed.is_empty() {
        eprintln!(
            "fencelab: removed {} container(s) left by runs whose harness is gone: {}",
            removed.len(),
            removed.join(", ")
        );
    }
    removed.len()
}

/// Why an image cannot take libfaketime through `LD_PRELOAD`, or why that is not known.
#[derive(Debug, thiserror::Error)]
pub enum PreloadError {
    #[error(transparent)]
    Docker(#[from] StartError),
    #[error("the Docker daemon did not create a container of `{image}` in time")]
    CreateTimeout { image: String },
    #[error("cannot look into image `{image}`: {why}")]
    Create { image: String, why: String },
    #[error(
        "image `{image}` holds no dynamic loader ({}): its programs are statically linked or it has no \
         glibc, so LD_PRELOAD of libfaketime cannot move their clocks",
        LOADERS.join(", ")
    )]
    NoLoader { image: String },
}

/// Whether `image` can take libfaketime through `LD_PRELOAD`: it must hold a dynamic loader
/// (a statically linked image ignores `LD_PRELOAD`). Looked at in a container that is
/// created, never started, and removed.
pub async fn can_preload(image: &str) -> Result<(), PreloadError> {
    use futures::StreamExt;
    let client = docker().await?;
    let body = bollard::models::ContainerCreateBody {
        image: Some(image.to_string()),
        labels: Some(own_labels().into_iter().collect()),
        // Never started: any command will do for an image that has none.
        cmd: Some(vec!["/fencelab-never-run".to_string()]),
        ..Default::default()
    };
    let created = tokio::time::timeout(DOCKER_WAIT_MAX, client.create_container(None, body))
        .await
        .map_err(|_| PreloadError::CreateTimeout { image: image.to_string() })?
        .map_err(|error| PreloadError::Create { image: image.to_string(), why: error.to_string() })?;
    let mut found = None;
    for loader in LOADERS {
        let options = bollard::query_parameters::DownloadFromContainerOptionsBuilder::new().path(loader).build();
        let mut stream = client.download_from_container(&created.id, Some(options));
        if let Ok(Some(Ok(_))) = tokio::time::timeout(DOCKER_WAIT_MAX, stream.next()).await {
            found = Some(loader);
            break;
        }
    }
    remove(&client, &created.id).await;
    match found {
        Some(_) => Ok(()),
        None => Err(PreloadError::NoLoader { image: image.to_string() }),
    }
}

/// Longest wait for a Toxiproxy container's API (20 s).
const TOXIPROXY_READY_MAX: Duration = Duration::from_secs(20);

/// Runs a Toxiproxy server from `image` on a free loopback port (`--host=127.0.0.1
/// --port=PORT`, the flags of Shopify's `toxiproxy` and of `fencelab toxiproxy`) and waits,
/// bounded, until `GET /version` answers; its output goes to `dir/toxiproxy.log`.
pub async fn start_toxiproxy(image: &str, dir: &Path) -> Result<(super::Proc, String), StartError> {
    let where_ = format!("--toxiproxy-image {image}");
    let name = ImageName::parse(image).map_err(|why| StartError::Named(format!("{where_}: {why}")))?;
    std::fs::create_dir_all(dir).map_err(|error| StartError::Failed(format!("{}: {error}", dir.display())))?;
    let port = super::launch::free_port().map_err(|error| StartError::Failed(error.to_string()))?;
    let log = dir.join("toxiproxy.log");
    let spec = Spec {
        image: name,
        command: vec!["--host=127.0.0.1".to_string(), format!("--port={port}")],
        env: vec![],
        mounts: vec![],
        files: vec![],
        run: dir.parent().unwrap_or(dir).to_path_buf(),
        role: "toxiproxy".to_string(),
        log: log.clone(),
    };
    let container = Container::start(spec, &where_).await?;
    let mut proc = super::Proc::container(container, "toxiproxy".to_string());
    let deadline = tokio::time::Instant::now() + TOXIPROXY_READY_MAX;
    loop {
        if super::launch::http_ready(port, "/version").await {
            return Ok((proc, format!("http://127.0.0.1:{port}")));
        }
        let why = match proc.exited().await {
            Some(why) => Some(why),
            None if tokio::time::Instant::now() >= deadline => {
                Some(format!("GET http://127.0.0.1:{port}/version did not answer within {TOXIPROXY_READY_MAX:?}"))
            }
            None => None,
        };
        if let Some(why) = why {
            tokio::time::sleep(Duration::from_millis(300)).await;
            proc.kill().await;
            return Err(StartError::Failed(format!("{where_}: {why}{}", super::launch::log_tail(&log))));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_read_as_name_and_tag() {
        let read = |text: &str| ImageName::parse(text).map(|image| (image.name, image.tag));
        assert_eq!(read("fencelab-lab:local"), Ok(("fencelab-lab".into(), "local".into())));
        assert_eq!(read("ghcr.io/shopify/toxiproxy"), Ok(("ghcr.io/shopify/toxiproxy".into(), "latest".into())));
        assert_eq!(read("localhost:5000/lab:2.1"), Ok(("localhost:5000/lab".into(), "2.1".into())));
        assert_eq!(read("localhost:5000/lab"), Ok(("localhost:5000/lab".into(), "latest".into())));
        for bad in ["", "a b", "lab@sha256:00"] {
            assert_eq!(ImageName::parse(bad), Err(ImageNameError::NotAName(bad.into())), "{bad:?}");
        }
        assert_eq!(ImageName::parse("lab:"), Err(ImageNameError::EmptyTag("lab:".into())));
    }
}
