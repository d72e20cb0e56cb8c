//! `results.json`: the machine-readable summary of a run (schema `fencelab.results/1`,
//! documented field by field in `docs/results.md`).

use crate::model::{self, Attempt};
use crate::story::{self, Story};
use crate::{anomalies_of, verdict_name, Overall, Run};
use checkers::{Anomaly, Verdict};
use history::{Decision, Event, EventType};
use history::{Op, Process};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

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

/// Reads `results.json` text back into its types; refuses another schema.
pub fn read_results(text: &str) -> Result<ResultsDoc, String> {
    let doc: ResultsDoc = serde_json::from_str(text).map_err(|error| format!("not a results.json: {error}"))?;
    if doc.schema != SCHEMA {
        return Err(format!("results.json schema `{}`, expected `{SCHEMA}`", doc.schema));
    }
    Ok(doc)
}

/// Renders `results.json` (pretty-printed, ending in a newline).
pub fn results_json(run: &Run, events: &[Event]) -> String {
    let overall = run.overall();
    let checkers: Vec<CheckerDoc> = run.checkers.iter().map(checker_out).collect();
    let attempts = model::attempts(events);
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
        sources: history::sources_of(events).iter().map(|source| source.as_str().to_string()).collect(),
        anomaly_count: checkers.iter().map(|c| c.anomaly_count).sum(),
        anomaly_groups: crate::anomaly_groups(run),
        checkers,
        config: run.config.clone(),
        schedule: run.schedule.clone(),
        counts: counts(events, &attempts),
        timings: timings(run, events, &attempts),
        stories: story::stories(run, events),
        fault_coverage: crate::coverage::coverage(&run.schedule, events),
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

fn bump(counter: &mut Counter, key: &str) {
    *counter.entry(key.to_string()).or_default() += 1;
}

fn counts(events: &[Event], attempts: &[Attempt]) -> Counts {
    let mut by_process = Counter::new();
    let mut by_type = Counter::new();
    let mut by_both: BTreeMap<String, Counter> = BTreeMap::new();
    let mut reports: BTreeMap<String, Counter> = BTreeMap::new();
    let mut finals = Counter::new();
    let mut jobs_seen = BTreeSet::new();
    let mut jobs_final = BTreeSet::new();
    let mut steps = Steps::default();
    for e in events {
        let kind = name_of(&e.kind);
        bump(&mut by_process, &e.process.to_string());
        bump(&mut by_type, &kind);
        bump(by_both.entry(e.process.to_string()).or_default(), &kind);
        if let Some(job) = &e.job {
            jobs_seen.insert(job.as_str());
        }
        match (e.kind, e.decision) {
            (EventType::Ledger, Some(d)) => bump(reports.entry(e.f.to_string()).or_default(), &name_of(&d)),
            (EventType::Step, Some(Decision::Accepted)) => steps.applied += 1,
            (EventType::Step, Some(_)) => {
                steps.refused += 1;
                bump(&mut steps.refused_by_reason, e.reason.as_deref().unwrap_or("unspecified"));
            }
            _ => {}
        }
        if e.process == Process::HARNESS && e.f == Op::Final {
            if let Some(job) = &e.job {
                if jobs_final.insert(job.as_str()) {
                    bump(&mut finals, e.outcome.as_deref().unwrap_or("unspecified"));
                }
            }
        }
    }
    let unrecorded = jobs_seen.difference(&jobs_final).count() as u64;
    if unrecorded > 0 {
        finals.insert("no_final_event".to_string(), unrecorded);
    }
    Counts {
        events: events.len() as u64,
        events_by_process: by_process,
        events_by_type: by_type,
        events_by_process_and_type: by_both,
        jobs: jobs_seen.union(&jobs_final).count() as u64,
        jobs_by_final_state: finals,
        attempts: attempts.len() as u64,
        reports_by_decision: reports,
        steps,
    }
}

fn timings(run: &Run, events: &[Event], attempts: &[Attempt]) -> Timings {
    let first = events.iter().map(|e| e.time_ns).min();
    let last = events.iter().map(|e| e.time_ns).max();
    let horizon = model::horizon_ns(events, run.duration_ms, &run.schedule);
    let windows = model::fault_windows(&run.schedule, events, horizon);
    let fault_ns: u64 = windows.iter().map(|w| w.end_ns.saturating_sub(w.start_ns)).sum();
    let mut closed: Vec<u64> =
        attempts.iter().filter_map(|a| a.end_ns.map(|end| end.saturating_sub(a.start_ns) / 1_000_000)).collect();
    closed.sort_unstable();
    let pick = |q: f64| closed.get(((closed.len() as f64 - 1.0) * q).round() as usize).copied();
    Timings {
        history_first_ns: first,
        history_last_ns: last,
        history_span_ms: last.zip(first).map(|(l, f)| (l - f) / 1_000_000).unwrap_or(0),
        fault_windows: windows.len(),
        fault_time_ms: fault_ns / 1_000_000,
        attempt_ms: AttemptTimes {
            closed: closed.len(),
            open: attempts.len() - closed.len(),
            min: closed.first().copied(),
            median: pick(0.5),
            p99: pick(0.99),
            max: closed.last().copied(),
        },
    }
}
