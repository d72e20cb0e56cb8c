//! `results.json`: the machine-readable summary of a run (schema `fencelab.results/1`,
//! documented field by field in `docs/results.md`).

use crate::model;
use crate::story::{self, Story};
use crate::{anomalies_of, verdict_name, Overall, Run};
use checkers::{Anomaly, Verdict};
use history::Event;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The schema identifier written as `"schema"`; bumped on any incompatible change.
pub const SCHEMA: &str = "fencelab.results/1";

pub type Counter = BTreeMap<String, u64>;

/// `results.json` as written and as read back (see `docs/results.md`, field by field).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultsDoc {
    pub schema: String,
    pub test_name: String,
    pub seed: u64,
    pub command: String,
    pub started_at: String,
    pub duration_ms: u64,
    pub overall: Overall,
    /// The exit code of the process that checked it: `overall`'s, from the one table.
    pub exit_code: i32,
    /// Whether the run reached its end (absent in older files: read as complete).
    #[serde(default = "complete_default")]
    pub complete: bool,
    /// The sources of evidence the history holds (`docs/history.md`, "Sources"): what the
    /// verdicts stand on (absent in older files).
    #[serde(default)]
    pub sources: Vec<String>,
    pub anomaly_count: usize,
    /// The anomalies grouped by what they share, one group per broken rule instance
    /// (absent in older files).
    #[serde(default)]
    pub anomaly_groups: Vec<crate::AnomalyGroup>,
    pub checkers: Vec<CheckerDoc>,
    /// The run's config, verbatim.
    pub config: serde_json::Value,
    /// The realised fault schedule, verbatim.
    pub schedule: serde_json::Value,
    pub counts: Counts,
    pub timings: Timings,
    /// The stories of the first [`story::MAX_STORIES`] anomalies (absent in older files).
    #[serde(default)]
    pub stories: Vec<Story>,
    /// Per fault variant: scheduled, took effect, tries that found nothing (absent in
    /// older files).
    #[serde(default)]
    pub fault_coverage: BTreeMap<String, crate::coverage::FaultCoverage>,
    /// For a history too long to draw whole, what the stories and the report's drawings
    /// stand on (absent when they stand on every event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drawn_from: Option<DrawnFrom>,
}

/// The sample a long history's report is drawn from (`counts` and `timings` stay exact).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DrawnFrom {
    /// Events drawn from.
    pub events: u64,
    /// Events in the history.
    pub of: u64,
    /// One job in this many is drawn whole, besides every job an anomaly names.
    pub jobs_one_in: u64,
}

fn complete_default() -> bool {
    true
}

/// One checker's result in `results.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckerDoc {
    pub checker: String,
    pub description: String,
    /// `valid`, `invalid` or `unknown`.
    pub verdict: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub anomaly_count: usize,
    pub anomalies: Vec<Anomaly>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub events: u64,
    pub events_by_process: Counter,
    pub events_by_type: Counter,
    pub events_by_process_and_type: BTreeMap<String, Counter>,
    pub jobs: u64,
    pub jobs_by_final_state: Counter,
    pub attempts: u64,
    pub reports_by_decision: BTreeMap<String, Counter>,
    pub steps: Steps,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Steps {
    pub applied: u64,
    pub refused: u64,
    pub refused_by_reason: Counter,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub history_first_ns: Option<u64>,
    pub history_last_ns: Option<u64>,
    pub history_span_ms: u64,
    pub fault_windows: usize,
    pub fault_time_ms: u64,
    pub attempt_ms: AttemptTimes,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptTimes {
    pub closed: usize,
    pub open: usize,
    pub min: Option<u64>,
    pub median: Option<u64>,
    pub p99: Option<u64>,
    pub max: Option<u64>,
}

/// Why a text is not a `results.json` this build reads.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("not a results.json: {0}")]
    NotResults(#[from] serde_json::Error),
    #[error("results.json schema `{found}`, expected `{SCHEMA}`")]
    Schema { found: String },
}

/// Reads `results.json` text back into its types; refuses another schema.
pub fn read_results(text: &str) -> Result<ResultsDoc, ReadError> {
    let doc: ResultsDoc = serde_json::from_str(text)?;
    if doc.schema != SCHEMA {
        return Err(ReadError::Schema { found: doc.schema });
    }
    Ok(doc)
}

/// Renders `results.json` (pretty-printed, ending in a newline) of a history held whole.
pub fn results_json(run: &Run, events: &[Event]) -> String {
    let digest = crate::Digest::of(events);
    results_json_of(run, &crate::View { events, digest: &digest, one_in: None })
}

/// Renders `results.json` from a [`crate::View`]: counts and timings from its digest, the
/// stories and fault coverage from its events.
pub fn results_json_of(run: &Run, view: &crate::View) -> String {
    let events = view.events;
    let overall = run.overall();
    let checkers: Vec<CheckerDoc> = run.checkers.iter().map(checker_out).collect();
    let doc = ResultsDoc {
        schema: SCHEMA.to_string(),
        test_name: run.test_name.clone(),
        seed: run.seed,
        command: run.command.clone(),
        started_at: run.started_at.clone(),
        duration_ms: run.duration_ms,
        overall,
        exit_code: i32::from(overall.exit().code()),
        complete: run.complete,
        sources: view.digest.sources().iter().map(|source| source.as_str().to_string()).collect(),
        anomaly_count: checkers.iter().map(|c| c.anomaly_count).sum(),
        anomaly_groups: crate::anomaly_groups(run),
        checkers,
        config: run.config.clone(),
        schedule: run.schedule.clone(),
        counts: view.digest.counts(),
        timings: timings(run, view),
        stories: story::stories(run, events),
        fault_coverage: crate::coverage::coverage(&run.schedule, events),
        drawn_from: view.one_in.map(|one_in| DrawnFrom {
            events: events.len() as u64,
            of: view.digest.events(),
            jobs_one_in: one_in,
        }),
    };
    let mut out = serde_json::to_string_pretty(&doc).expect("results serialise");
    out.push('\n');
    out
}

fn checker_out(result: &checkers::CheckerResult) -> CheckerDoc {
    let anomalies = anomalies_of(result);
    CheckerDoc {
        checker: result.checker.clone(),
        description: result.description.clone(),
        verdict: verdict_name(&result.verdict).to_string(),
        reason: match &result.verdict {
            Verdict::Unknown { reason } => Some(reason.clone()),
            _ => None,
        },
        anomaly_count: anomalies.len(),
        anomalies: anomalies.to_vec(),
    }
}

/// The snake_case name of an event type or decision, as in the history.
pub(crate) fn name_of<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

fn timings(run: &Run, view: &crate::View) -> Timings {
    let (first, last) = view.digest.span_ns();
    let horizon = model::horizon_ns(view.events, run.duration_ms, &run.schedule).max(last.unwrap_or(0));
    let windows = model::fault_windows(&run.schedule, view.events, horizon);
    let fault_ns: u64 = windows.iter().map(|w| w.end_ns.saturating_sub(w.start_ns)).sum();
    Timings {
        history_first_ns: first,
        history_last_ns: last,
        history_span_ms: last.zip(first).map(|(l, f)| (l - f) / 1_000_000).unwrap_or(0),
        fault_windows: windows.len(),
        fault_time_ms: fault_ns / 1_000_000,
        attempt_ms: view.digest.attempt_times(),
    }
}
