//! Checking a run folder: read its history, run every checker, and write `results.json`,
//! `report.html` and `junit.xml` next to it. Used at the end of `fencelab run` and by
//! `fencelab check FOLDER`. A history that cannot be read is checked as unknown, with the
//! line that could not be read, never as valid.
//!
//! Only `history.jsonl` is required, so that records gathered by hand after an incident can
//! be checked (`docs/history.md`, "The minimal evidence folder"). The other files are
//! optional, each with its default: `config.json` `{}` (no configuration: the rules that
//! stand on it answer unknown), `schedule.json` `[]` (no faults), `run.json` the command
//! `fencelab check FOLDER`, no start time, a duration of 0 and `complete: true` (a folder of
//! records says nothing of a recovery; a `recovery` event in the history does). A file that
//! is there but not what it should be is bad input, named with its line.

use std::path::Path;

use results::{Overall, Run};

/// What `run.json` holds: how the run was made, written when it ends.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RunMeta {
    pub command: String,
    pub started_at: String,
    pub duration_ms: u64,
    pub complete: bool,
}

/// Why a folder could not be checked.
#[derive(Debug)]
pub enum FolderError {
    /// A file of the folder is missing where it is required, or is not what it should be
    /// (named with its line): bad input, nothing was written.
    Bad(String),
    /// The reports could not be written.
    Write(String),
}

impl std::fmt::Display for FolderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FolderError::Bad(message) | FolderError::Write(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for FolderError {}

/// An optional JSON file of the folder read through its type, `default` when absent.
fn optional<T: serde::de::DeserializeOwned>(path: &Path, default: impl FnOnce() -> T) -> Result<T, FolderError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(default()),
        Err(error) => return Err(FolderError::Bad(format!("{}: {error}", path.display()))),
    };
    serde_json::from_str(&text).map_err(|error| FolderError::Bad(format!("{}: {error}", path.display())))
}

/// Reads a history file through the typed vocabulary; the error names the file and line.
pub fn read_history(path: &Path) -> Result<Vec<history::Event>, String> {
    let file = std::fs::File::open(path).map_err(|error| format!("{}: {error}", path.display()))?;
    history::read(file).map_err(|error| format!("{}: {error}", path.display()))
}

/// Checks the history in `folder` and writes the three reports; returns the verdict.
pub fn check_folder(folder: &Path) -> Result<(Overall, Run), FolderError> {
    let history = folder.join("history.jsonl");
    if !history.is_file() {
        return Err(FolderError::Bad(format!("{} holds no history.jsonl", folder.display())));
    }
    let config: serde_json::Value = optional(&folder.join("config.json"), || serde_json::json!({}))?;
    let meta: RunMeta = optional(&folder.join("run.json"), || RunMeta {
        command: format!("fencelab check {}", folder.display()),
        started_at: String::new(),
        duration_ms: 0,
        complete: true,
    })?;
    let (events, checkers) = match read_history(&history) {
        Ok(events) => {
            let checkers = checkers::check_all(&events);
            (events, checkers)
        }
        Err(why) => (Vec::new(), checkers::unreadable(&why)),
    };
    let run = run_of(folder, &events, checkers, config, meta)?;
    Ok((run.overall(), run))
}

/// The checked run of a folder's history, its three reports written into `folder`.
pub fn run_of(
    folder: &Path,
    events: &[history::Event],
    checkers: Vec<checkers::CheckerResult>,
    config: serde_json::Value,
    meta: RunMeta,
) -> Result<Run, FolderError> {
    let schedule: serde_json::Value = optional(&folder.join("schedule.json"), || serde_json::json!([]))?;
    let run = Run {
        test_name: config["test_name"].as_str().unwrap_or("evidence").to_string(),
        seed: config["seed"].as_u64().unwrap_or(0),
        command: meta.command,
        started_at: meta.started_at,
        duration_ms: meta.duration_ms,
        config,
        schedule,
        checkers,
        complete: meta.complete,
    };
    let write = |name: &str, text: String| {
        std::fs::write(folder.join(name), text)
            .map_err(|error| FolderError::Write(format!("{}: {error}", folder.join(name).display())))
    };
    write("results.json", results::results_json(&run, events))?;
    write("report.html", results::report_html(&run, events))?;
    write("junit.xml", results::junit_xml_with_stories(&run, events))?;
    Ok(run)
}
