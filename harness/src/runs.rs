//! Running `fencelab run` as a child process and reading back its verdict: what the matrix
//! and the suites are made of. Each run gets a store of its own, so runs can go side by side.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lab::bugs::Bug;
use serde::{Deserialize, Serialize};

/// What to run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub test_name: String,
    pub bugs: Vec<Bug>,
    pub nemesis: String,
    pub seed: u64,
    pub time_limit: u64,
    /// Further `fencelab run` flags, verbatim.
    pub extra: Vec<String>,
}

impl RunSpec {
    pub fn args(&self, store: &Path) -> Vec<String> {
        let mut args = vec!["run".to_string(), "--test-name".into(), self.test_name.clone()];
        args.extend(["--seed".into(), self.seed.to_string(), "--time-limit".into(), self.time_limit.to_string()]);
        args.extend(["--nemesis".into(), self.nemesis.clone(), "--store".into(), store.display().to_string()]);
        for bug in &self.bugs {
            args.extend(["--bug".into(), bug.name().to_string()]);
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// One finished run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub test_name: String,
    /// The planted bug, or `None` for the correct lab.
    pub bug: Option<String>,
    pub nemesis: String,
    pub seed: u64,
    /// `valid`, `invalid`, `unknown`, or `error: ...` when the run itself failed.
    pub verdict: String,
    /// Checkers that found anomalies.
    pub checkers: Vec<String>,
    /// Seconds into the run of the earliest moment an anomaly's evidence was complete.
    pub first_anomaly_s: Option<f64>,
    pub folder: Option<PathBuf>,
    pub command: String,
}

impl Cell {
    pub fn detected(&self) -> bool {
        self.verdict == "invalid"
    }
}

/// A `fencelab` child with the lab's process hygiene: a process group of its own, and
/// killed when this process dies (`PR_SET_PDEATHSIG`), so no child outlives an interrupted
/// matrix, suite, replay or shrink. Its output is captured.
pub fn child(program: &Path, args: &[String]) -> tokio::process::Command {
    let mut command = lab::launch::command(program, args, None).expect("no log file to open");
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    command
}

/// Runs `spec` as `fencelab run` in the store `store/<test-name>-s<seed>`, bounded in time.
pub async fn run_child(program: &Path, store: &Path, spec: &RunSpec) -> Cell {
    let store = store.join(format!("{}-s{}", spec.test_name, spec.seed));
    let args = spec.args(&store);
    let mut cell = Cell {
        test_name: spec.test_name.clone(),
        bug: spec.bugs.first().map(|bug| bug.name().to_string()),
        nemesis: spec.nemesis.clone(),
        seed: spec.seed,
        verdict: String::new(),
        checkers: vec![],
        first_anomaly_s: None,
        folder: None,
        command: format!("fencelab {}", args.join(" ")),
    };
    let bound = Duration::from_secs(spec.time_limit + 180);
    let output = child(program, &args).output();
    match tokio::time::timeout(bound, output).await {
        Ok(Ok(_)) => read_results(&store.join("latest"), &mut cell),
        Ok(Err(error)) => cell.verdict = format!("error: {error}"),
        Err(_) => cell.verdict = format!("error: no verdict within {bound:?}"),
    }
    cell
}

/// The (checker, anomaly kind) pairs a run folder's results hold, in order.
pub fn anomaly_kinds(folder: &Path) -> Option<std::collections::BTreeSet<(String, String)>> {
    let text = std::fs::read_to_string(folder.join("results.json")).ok()?;
    let results: serde_json::Value = serde_json::from_str(&text).ok()?;
    let mut kinds = std::collections::BTreeSet::new();
    for checker in results["checkers"].as_array()? {
        for anomaly in checker["anomalies"].as_array().into_iter().flatten() {
            let name = checker["checker"].as_str().unwrap_or("?").to_string();
            kinds.insert((name, anomaly["kind"].as_str().unwrap_or("?").to_string()));
        }
    }
    Some(kinds)
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
/// folder holds no readable results.json.
pub fn found(folder: &Path) -> Result<Vec<Found>, String> {
    let text = std::fs::read_to_string(folder.join("results.json"))
        .map_err(|_| format!("no results.json in {}", folder.display()))?;
    let results =
        serde_json::from_str::<serde_json::Value>(&text).map_err(|_| "unreadable results.json".to_string())?;
    let events = crate::check::read_history(&folder.join("history.jsonl")).unwrap_or_default();
    let time_of = |index: u64| events.get(index as usize).map(|event| event.time_ns as f64 / 1e9);
    let mut found = Vec::new();
    for checker in results["checkers"].as_array().into_iter().flatten() {
        let anomalies = checker["anomalies"].as_array().cloned().unwrap_or_default();
        if anomalies.is_empty() {
            continue;
        }
        let complete_at = |anomaly: &serde_json::Value| {
            let indices = anomaly["events"].as_array()?.iter().filter_map(|index| index.as_u64());
            indices.filter_map(time_of).reduce(f64::max)
        };
        found.push(Found {
            checker: checker["checker"].as_str().unwrap_or("?").to_string(),
            first_s: anomalies.iter().filter_map(complete_at).reduce(f64::min),
            jobs: anomalies.iter().filter_map(|anomaly| anomaly["job"].as_str().map(str::to_string)).collect(),
        });
    }
    Ok(found)
}

/// Reads a run folder's verdict, the checkers that found anomalies, and when the first
/// anomaly's evidence was complete (the latest of its proving events).
pub fn read_results(folder: &Path, cell: &mut Cell) {
    let Ok(text) = std::fs::read_to_string(folder.join("results.json")) else {
        cell.verdict = format!("error: no results.json in {}", folder.display());
        return;
    };
    let Ok(results) = serde_json::from_str::<serde_json::Value>(&text) else {
        cell.verdict = "error: unreadable results.json".into();
        return;
    };
    cell.folder = std::fs::canonicalize(folder).ok();
    cell.verdict = results["overall"].as_str().unwrap_or("unknown").to_string();
    for checker in found(folder).unwrap_or_default() {
        cell.checkers.push(checker.checker);
        cell.first_anomaly_s = match (cell.first_anomaly_s, checker.first_s) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}
