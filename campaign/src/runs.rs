//! Running `fencelab run` as a child process and reading back its verdict: what the matrix
//! and the suites are made of. Each run gets a store of its own, so runs can go side by side.

use std::path::{Path, PathBuf};
use std::time::Duration;

use runfolder::config::{command_line, RunConfig};
use serde::{Deserialize, Serialize};

/// What to run: a validated configuration, whose command line its one writer
/// (`RunConfig::command_words`) gives the child, and the faults as they were asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSpec {
    pub config: RunConfig,
    /// The faults as the matrix or suite names them (`all`, a list): what a cell shows.
    pub nemesis: String,
}

/// One finished run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub test_name: String,
    /// The planted bug or the variant, or `None` for the correct system.
    pub bug: Option<String>,
    pub nemesis: String,
    pub seed: u64,
    /// The checked verdict, or `error: ...` when the run itself failed.
    pub verdict: results::RunVerdict,
    /// Checkers that found anomalies.
    pub checkers: Vec<String>,
    /// Seconds into the run of the earliest moment an anomaly's evidence was complete.
    pub first_anomaly_s: Option<f64>,
    pub folder: Option<PathBuf>,
    pub command: String,
}

impl Cell {
    /// The cell of `spec` before it ran, with the command that runs it.
    pub fn not_run(spec: &RunSpec, command: String) -> Cell {
        let config = &spec.config;
        let bug = config.bugs.first().map(|bug| bug.name().to_string()).or_else(|| config.variants.first().cloned());
        Cell {
            test_name: config.test_name.clone(),
            bug,
            nemesis: spec.nemesis.clone(),
            seed: config.seed,
            verdict: results::RunVerdict::Error("not run".into()),
            checkers: vec![],
            first_anomaly_s: None,
            folder: None,
            command,
        }
    }

    pub fn detected(&self) -> bool {
        self.verdict.is(results::Overall::Invalid)
    }
}

/// A `fencelab` child with the lab's process hygiene: a process group of its own, and
/// killed when this process dies (`PR_SET_PDEATHSIG`), so no child outlives an interrupted
/// matrix, suite, replay or shrink. Its output is captured.
pub fn child(program: &Path, args: &[String]) -> tokio::process::Command {
    let mut command = procs::launch::command(program, args, None).expect("no log file to open");
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    command
}

/// Runs `spec` as `fencelab run` in the store `store/<test-name>-s<seed>`, bounded in time.
pub async fn run_child(program: &Path, store: &Path, spec: &RunSpec) -> Cell {
    let store = store.join(format!("{}-s{}", spec.config.test_name, spec.config.seed));
    let config = RunConfig { store: store.clone(), ..spec.config.clone() };
    let args = config.command_words(Some(&store), None);
    let mut cell = Cell::not_run(spec, command_line(&args));
    let bound = Duration::from_secs(config.time_limit_ms / 1_000 + 180);
    let output = child(program, &args).output();
    match tokio::time::timeout(bound, output).await {
        Ok(Ok(output)) => {
            read_results(&store.join("latest"), &mut cell);
            agree(&mut cell, output.status.code());
        }
        Ok(Err(error)) => cell.verdict = results::RunVerdict::Error(error.to_string()),
        Err(_) => cell.verdict = results::RunVerdict::Error(format!("no verdict within {bound:?}")),
    }
    cell
}

/// A run whose `results.json` says another verdict than its process's exit code answered
/// has no verdict: the one exit table makes them equal, so a difference is a broken run.
fn agree(cell: &mut Cell, code: Option<i32>) {
    if let results::RunVerdict::Checked(overall) = cell.verdict {
        let written = i32::from(overall.exit().code());
        if code != Some(written) {
            let said = code.map_or_else(|| "no exit code (a signal)".to_string(), |code| format!("exit code {code}"));
            cell.verdict = results::RunVerdict::Error(format!(
                "results.json says {overall} ({written}) but the run ended with {said}"
            ));
        }
    }
}

/// A run folder's `results.json`, read back through the types that wrote it.
pub fn results_of(folder: &Path) -> Result<results::ResultsDoc, crate::CampaignError> {
    runfolder::folder::RunFolder::at(folder)
        .results()?
        .ok_or_else(|| crate::CampaignError::NoResults(folder.to_path_buf()))
}

/// The (checker, anomaly kind) pairs a run folder's results hold, in order.
pub fn anomaly_kinds(folder: &Path) -> Option<std::collections::BTreeSet<(String, String)>> {
    let doc = results_of(folder).ok()?;
    let pairs = doc
        .checkers
        .iter()
        .flat_map(|checker| checker.anomalies.iter().map(|anomaly| (checker.checker.clone(), anomaly.kind.clone())));
    Some(pairs.collect())
}

/// One checker's anomalies in a run folder.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub checker: String,
    /// Seconds into the run at which the first of its anomalies had all its evidence (the
    /// latest of its proving events).
    pub first_s: Option<f64>,
    /// The jobs its anomalies name.
    pub jobs: std::collections::BTreeSet<String>,
}

/// The checkers of a run folder that found anomalies, in results order; an error when the
/// folder holds no readable results.json. When its history cannot be read, when each
/// anomaly's evidence was complete is not known (`first_s` is none), never taken as zero.
pub fn found(folder: &Path) -> Result<Vec<Found>, crate::CampaignError> {
    let doc = results_of(folder)?;
    let events = runfolder::folder::RunFolder::at(folder).history().ok();
    let time_of = |index: u64| events.as_ref()?.get(index as usize).map(|event| event.time_ns as f64 / 1e9);
    let complete_at = |anomaly: &checkers::Anomaly| anomaly.events.iter().copied().filter_map(time_of).reduce(f64::max);
    let found = doc
        .checkers
        .iter()
        .filter(|checker| !checker.anomalies.is_empty())
        .map(|checker| Found {
            checker: checker.checker.clone(),
            first_s: checker.anomalies.iter().filter_map(complete_at).reduce(f64::min),
            jobs: checker.anomalies.iter().filter_map(|anomaly| anomaly.job.clone()).collect(),
        })
        .collect();
    Ok(found)
}

/// Reads a run folder's verdict, the checkers that found anomalies, and when the first
/// anomaly's evidence was complete (the latest of its proving events).
pub fn read_results(folder: &Path, cell: &mut Cell) {
    let doc = match results_of(folder) {
        Ok(doc) => doc,
        Err(why) => {
            cell.verdict = results::RunVerdict::Error(why.to_string());
            return;
        }
    };
    let found = match found(folder) {
        Ok(found) => found,
        Err(why) => {
            cell.verdict = results::RunVerdict::Error(why.to_string());
            return;
        }
    };
    cell.folder = std::fs::canonicalize(folder).ok();
    cell.verdict = results::RunVerdict::Checked(doc.overall);
    for checker in found {
        cell.checkers.push(checker.checker);
        cell.first_anomaly_s = match (cell.first_anomaly_s, checker.first_s) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell() -> Cell {
        Cell {
            test_name: "t".into(),
            bug: None,
            nemesis: "all".into(),
            seed: 1,
            verdict: results::RunVerdict::Error("not run".into()),
            checkers: vec![],
            first_anomaly_s: None,
            folder: None,
            command: "fencelab run".into(),
        }
    }

    /// A run whose checkers all passed but whose jobs did not settle, as `fencelab run`
    /// writes its results.json.
    fn unsettled_run(folder: &Path) {
        let run = results::Run {
            test_name: "t".into(),
            seed: 1,
            command: "fencelab run --seed 1".into(),
            started_at: "2026-12-04T00:00:00Z".into(),
            duration_ms: 1_000,
            config: serde_json::json!({}),
            schedule: serde_json::json!([]),
            checkers: vec![checkers::CheckerResult {
                checker: "lost-work".into(),
                description: "d".into(),
                verdict: checkers::Verdict::Valid,
            }],
            complete: false,
        };
        std::fs::create_dir_all(folder).unwrap();
        let json = results::results_json(&run, &[]);
        runfolder::folder::RunFolder::at(folder).write_reports(json, String::new(), String::new()).unwrap();
    }

    #[test]
    fn a_suite_entry_whose_run_did_not_settle_does_not_pass() {
        let dir = tempfile::tempdir().unwrap();
        unsettled_run(dir.path());
        let mut cell = cell();
        read_results(dir.path(), &mut cell);
        agree(&mut cell, Some(2));
        assert_eq!(cell.verdict, results::RunVerdict::Checked(results::Overall::Unknown), "{}", cell.verdict);
        assert!(!cell.verdict.is(results::Overall::Valid), "an entry expecting valid does not pass");
    }

    #[test]
    fn a_results_file_that_disagrees_with_its_exit_code_is_no_verdict() {
        let dir = tempfile::tempdir().unwrap();
        unsettled_run(dir.path());
        let mut cell = cell();
        read_results(dir.path(), &mut cell);
        agree(&mut cell, Some(0));
        assert!(
            matches!(cell.verdict, results::RunVerdict::Error(ref why) if why.contains("exit code 0")),
            "{}",
            cell.verdict
        );
    }
}
