//! The one error of a campaign: why a run folder, a suite, its shards or its history could
//! not be read, or a campaign's outputs not written. Each prints the message the command
//! line shows; the harness decides which exit code it is.

use std::path::PathBuf;

/// Why a campaign step could not go on.
#[derive(Debug, thiserror::Error)]
pub enum CampaignError {
    /// A run folder's file, missing or not what it should be, or not written.
    #[error(transparent)]
    Folder(#[from] runfolder::folder::FolderError),
    /// A file or folder that could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A suite file that is not TOML of a suite's shape.
    #[error("{}: {source}", path.display())]
    Toml {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    /// A `suite.json` that is not a suite's result.
    #[error("{}: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A system file that cannot be used, or a variant it does not declare.
    #[error(transparent)]
    System(#[from] system::file::FileError),
    /// The store that could not be made, or `matrix.json` not written into it.
    #[error("{0}")]
    Store(#[source] std::io::Error),
    /// A cell's task that did not finish: it panicked or was cancelled.
    #[error("{0}")]
    Cell(#[source] tokio::task::JoinError),
    /// A campaign's own record that could not be serialised.
    #[error("{0}")]
    Serialise(#[source] serde_json::Error),
    /// An error within the file at `path`, named by it.
    #[error("{}: {source}", path.display())]
    In {
        path: PathBuf,
        #[source]
        source: Box<CampaignError>,
    },
    #[error("no results.json in {}", .0.display())]
    NoResults(PathBuf),
    #[error("{} is not a run folder: cannot read its results.json (there is none)", .0.display())]
    NotARunFolder(PathBuf),
    #[error("{} holds no results.json", .0.display())]
    NothingToReplay(PathBuf),
    #[error("the replay did not end")]
    ReplayDidNotEnd,
    /// The replay's child could not be run.
    #[error("{0}")]
    Child(#[source] std::io::Error),
    #[error("{} is a scenario's run folder: shrink takes a `fencelab run` folder", .0.display())]
    ScenarioFolder(PathBuf),
    #[error("the run in {} found no anomaly: nothing to shrink", .0.display())]
    NoAnomaly(PathBuf),
    /// `--checker` names a checker that found nothing; `found` are those that did.
    #[error("--checker {checker}: found no anomaly in this run (these did: {})", found.join(", "))]
    CheckerFoundNothing { checker: String, found: Vec<String> },
    #[error("run `{0}` needs seeds and expect = valid|invalid")]
    RunNeedsSeeds(String),
    /// A suite's run whose flags do not make a configuration.
    #[error("run `{run}`: {message}")]
    RunConfig { run: String, message: String },
    #[error("--shard `{0}`: expected I/N with 1 <= I <= N")]
    Shard(String),
    #[error("nothing to merge")]
    NothingToMerge,
    #[error("shards of different suites: `{suite}` and `{other}` ({})", folder.display())]
    DifferentSuites { suite: String, other: String, folder: PathBuf },
    #[error("two shards ran entry {index} (`{name}`, seed {seed}): {} and {}", first.display(), second.display())]
    EntryTwice { index: usize, name: String, seed: u64, first: PathBuf, second: PathBuf },
    #[error("--history-limit {0}: expected 1..={max}", max = crate::trends::MAX_HISTORY_LIMIT)]
    HistoryLimit(usize),
    #[error("--history {}: not a folder of earlier suite outputs", .0.display())]
    NotHistory(PathBuf),
}

impl CampaignError {
    /// `source` met reading or writing `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> CampaignError {
        CampaignError::Io { path: path.into(), source }
    }
}
