//! `results.json`: the machine-readable summary of a run (schema `fencelab.results/1`,
//! documented field by field in `docs/results.md`).

use crate::model::{self, Attempt};
use crate::{anomalies_of, verdict_name, Run};
use checkers::{Anomaly, Verdict};
use history::{Decision, Event, EventType};
use history::{Op, Process};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The schema identifier written as `"schema"`; bumped on any incompatible change.
pub const SCHEMA: &str = "fencelab.results/1";

type Counter = BTreeMap<String, u64>;

#[derive(Serialize)]
struct Doc<'a> {
    schema: &'static str,
    test_name: &'a str,
    seed: u64,
    command: &'a str,
    started_at: &'a str,
    duration_ms: u64,
    overall: &'static str,
    exit_code: i32,
    anomaly_count: usize,
    checkers: Vec<CheckerOut<'a>>,
    config: &'a serde_json::Value,
    schedule: &'a serde_json::Value,
    counts: Counts,
    timings: Timings,
}

#[derive(Serialize)]
struct CheckerOut<'a> {
    checker: &'a str,
    description: &'a str,
    verdict: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    anomaly_count: usize,
    anomalies: &'a [Anomaly],
}

#[derive(Serialize)]
struct Counts {
    events: u64,
    events_by_process: Counter,
    events_by_type: Counter,
    events_by_process_and_type: BTreeMap<String, Counter>,
    jobs: u64,
    jobs_by_final_state: Counter,
    attempts: u64,
    reports_by_decision: BTreeMap<String, Counter>,
    steps: Steps,
}

#[derive(Serialize, Default)]
struct Steps {
    applied: u64,
    refused: u64,
    refused_by_reason: Counter,
}

#[derive(Serialize)]
struct Timings {
    history_first_ns: Option<u64>,
    history_last_ns: Option<u64>,
    history_span_ms: u64,
    fault_windows: usize,
    fault_time_ms: u64,
    attempt_ms: AttemptTimes,
}

#[derive(Serialize)]
struct AttemptTimes {
    closed: usize,
    open: usize,
    min: Option<u64>,
    median: Option<u64>,
    p99: Option<u64>,
    max: Option<u64>,
}

/// Renders `results.json` (pretty-printed, ending in a newline).
pub fn results_json(run: &Run, events: &[Event]) -> String {
    let overall = run.overall();
    let checkers: Vec<CheckerOut> = run.checkers.iter().map(checker_out).collect();
    let attempts = model::attempts(events);
    let doc = Doc {
        schema: SCHEMA,
        test_name: &run.test_name,
        seed: run.seed,
        command: &run.command,
        started_at: &run.started_at,
        duration_ms: run.duration_ms,
        overall: overall.as_str(),
        exit_code: overall.exit_code(),
        anomaly_count: checkers.iter().map(|c| c.anomaly_count).sum(),
        checkers,
        config: &run.config,
        schedule: &run.schedule,
        counts: counts(events, &attempts),
        timings: timings(run, events, &attempts),
    };
    let mut out = serde_json::to_string_pretty(&doc).expect("results serialise");
    out.push('\n');
    out
}

fn checker_out(result: &checkers::CheckerResult) -> CheckerOut<'_> {
    let anomalies = anomalies_of(result);
    CheckerOut {
        checker: &result.checker,
        description: &result.description,
        verdict: verdict_name(&result.verdict),
        reason: match &result.verdict {
            Verdict::Unknown { reason } => Some(reason),
            _ => None,
        },
        anomaly_count: anomalies.len(),
        anomalies,
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
