//! The engine's one error: why a run or a scenario could not be driven to a verdict. A
//! verdict (valid, invalid, unknown) is not an error; this is a system that would not start,
//! a proxy or a link that would not carry traffic, a run folder that could not be written.

use std::time::Duration;

use runfolder::folder::FolderError;

/// Why a run could not be driven.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The system could not start: a wrong name is the user's, any other failure internal.
    #[error(transparent)]
    Start(#[from] system::StartError),
    /// A run folder's file could not be written or read back.
    #[error(transparent)]
    Folder(#[from] FolderError),
    /// The started system did not answer healthy in time.
    #[error("the cluster was not healthy within {0:?}")]
    Unhealthy(Duration),
    /// The fault proxy refused or could not be reached.
    #[error("the fault proxy: {0}")]
    Proxy(#[from] proxy::ClientError),
    /// The run's own folder could not be checked at its end.
    #[error("checking the run folder: {0}")]
    Check(#[source] FolderError),
    /// A file of the run (its history, a clock file) could not be written.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Anything else that broke, said in words.
    #[error("{0}")]
    Failed(String),
}

impl RunError {
    /// An I/O failure, named by what was being done.
    pub fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> RunError {
        move |source| RunError::Io { what, source }
    }
}
