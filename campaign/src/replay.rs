//! Replay: run a recorded run again — its config and its realised fault schedule — and say
//! whether the same anomalies appeared.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use runfolder::folder::RunFolder;

use crate::runs::{anomaly_kinds, read_results, Cell};
use crate::CampaignError;

/// What one replay found.
#[derive(Debug)]
pub struct Replayed {
    pub cell: Cell,
    /// Checkers with anomalies in the replay.
    pub checkers: BTreeSet<String>,
    pub reproduced: bool,
}

/// The checkers that found anomalies in a run folder.
pub fn invalid_checkers(folder: &Path) -> Option<BTreeSet<String>> {
    Some(anomaly_kinds(folder)?.into_iter().map(|(checker, _)| checker).collect())
}

/// The `fencelab run` command's words of a recorded run, written from its typed
/// `config.json`, with its realised schedule and a new store.
pub fn replay_args(folder: &Path, store: &Path) -> Result<Vec<String>, CampaignError> {
    let run_folder = RunFolder::at(folder);
    let config = run_folder.run_config()?;
    let schedule = run_folder.schedule_path();
    let schedule = std::fs::canonicalize(&schedule).map_err(|error| CampaignError::io(&schedule, error))?;
    Ok(config.run.command_words(Some(store), Some(&schedule)))
}

/// Replays the run in `folder` once, into `store`.
pub async fn replay(program: &Path, folder: &Path, store: PathBuf) -> Result<Replayed, CampaignError> {
    let original = invalid_checkers(folder).ok_or_else(|| CampaignError::NothingToReplay(folder.to_path_buf()))?;
    let args = replay_args(folder, &store)?;
    let output = crate::runs::child(program, &args).output();
    let bound = std::time::Duration::from_secs(24 * 3_600);
    tokio::time::timeout(bound, output)
        .await
        .map_err(|_| CampaignError::ReplayDidNotEnd)?
        .map_err(CampaignError::Child)?;
    let mut cell = Cell {
        test_name: String::new(),
        bug: None,
        nemesis: String::new(),
        seed: 0,
        verdict: results::RunVerdict::Error("not run".into()),
        checkers: vec![],
        first_anomaly_s: None,
        folder: None,
        command: runfolder::config::command_line(&args),
    };
    read_results(&store.join("latest"), &mut cell);
    let checkers: BTreeSet<String> = cell.checkers.iter().cloned().collect();
    let reproduced =
        if original.is_empty() { cell.verdict.is(results::Overall::Valid) } else { original.is_subset(&checkers) };
    Ok(Replayed { cell, checkers, reproduced })
}
