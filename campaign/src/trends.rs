//! Nightly trends: reading earlier suite outputs (`--history DIR`) into the nights that
//! `results::trends` renders on the index page. Each folder of DIR holding a `suite.json` is
//! one night; nights are ordered by folder name (name them by date) and bounded to the last N.

use std::path::{Path, PathBuf};

use results::trends::{Night, NightResult, NightRun};

use crate::suite::{read_result, SuiteResult};
use crate::CampaignError;

/// Most earlier nights `--history-limit` may ask for.
pub const MAX_HISTORY_LIMIT: usize = 365;

/// Where to read earlier nights from, and how many.
#[derive(Clone, Debug)]
pub struct History {
    pub dir: PathBuf,
    pub limit: usize,
}

/// Checks `--history DIR` / `--history-limit N` before anything runs.
pub fn validate(dir: Option<PathBuf>, limit: usize) -> Result<Option<History>, CampaignError> {
    if !(1..=MAX_HISTORY_LIMIT).contains(&limit) {
        return Err(CampaignError::HistoryLimit(limit));
    }
    match dir {
        None => Ok(None),
        Some(dir) if dir.is_dir() => Ok(Some(History { dir, limit })),
        Some(dir) => Err(CampaignError::NotHistory(dir)),
    }
}

/// The earlier nights in `history.dir`: its sub-folders with a readable `suite.json`, by
/// folder name, the last `history.limit`; `out` (tonight's folder) is never one of them.
/// Folders whose suite.json cannot be read are skipped with a warning on stderr.
pub fn read_nights(history: &History, out: &Path) -> Result<Vec<Night>, CampaignError> {
    let listing = std::fs::read_dir(&history.dir).map_err(|error| CampaignError::io(&history.dir, error))?;
    let tonight = std::fs::canonicalize(out).ok();
    let mut folders: Vec<(String, PathBuf)> = listing
        .filter_map(|item| item.ok())
        .map(|item| (item.file_name().to_string_lossy().into_owned(), item.path()))
        .filter(|(_, path)| path.join("suite.json").is_file())
        .filter(|(_, path)| tonight.is_none() || std::fs::canonicalize(path).ok() != tonight)
        .collect();
    folders.sort();
    let skip = folders.len().saturating_sub(history.limit);
    let mut nights = Vec::new();
    for (name, path) in folders.into_iter().skip(skip) {
        match read_result(&path) {
            Ok(result) => nights.push(night(&name, &result)),
            Err(message) => eprintln!("fencelab: skipping an earlier night: {message}"),
        }
    }
    Ok(nights)
}

/// A suite result as one night.
pub fn night(label: &str, result: &SuiteResult) -> Night {
    let runs = result
        .entries
        .iter()
        .map(|entry| NightRun {
            name: entry.name.clone(),
            seed: entry.seed,
            outcome: NightResult::of(entry.passed, &entry.verdict),
            verdict: entry.verdict.clone(),
            bugs: entry.bugs.clone(),
            checkers: entry.checkers.clone(),
        })
        .collect();
    Night { label: label.to_string(), runs }
}

/// The trends section for tonight's result after the earlier nights (empty without history).
pub fn section(earlier: Option<Vec<Night>>, tonight: &SuiteResult, out: &Path) -> String {
    let Some(mut nights) = earlier else { return String::new() };
    let label = out.file_name().map_or_else(|| "tonight".to_string(), |name| name.to_string_lossy().into_owned());
    nights.push(night(&label, tonight));
    results::trends::trends_html(&nights)
}
