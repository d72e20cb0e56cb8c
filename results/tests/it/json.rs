//! results.json: parsed back and checked field by field; `Overall` and `Run` round trips.

use crate::fixture::{self, COMMAND, MESSAGE, UNKNOWN_REASON};
use checkers::{CheckerResult, Verdict};
use history::Op;
use results::{results_json, Overall, Run};
use serde_json::{json, Value};

fn rendered() -> (Vec<history::Event>, Value) {
    let events = fixture::history();
    let run = fixture::run(&events);
    let doc: Value = serde_json::from_str(&results_json(&run, &events)).expect("valid JSON");
    (events, doc)
}

#[test]
fn header_fields_and_verdict() {
    let (_, doc) = rendered();
    assert_eq!(doc["schema"], "fencelab.results/1");
    assert_eq!(doc["test_name"], "stale-write");
    assert_eq!(doc["seed"], 42);
    assert_eq!(doc["command"], COMMAND);
    assert_eq!(doc["started_at"], "2026-01-02T03:04:05Z");
    assert_eq!(doc["duration_ms"], 6000);
    assert_eq!(doc["overall"], "invalid");
    assert_eq!(doc["exit_code"], 1);
    assert_eq!(doc["anomaly_count"], 1);
}

#[test]
fn checkers_carry_verdicts_and_anomalies() {
    let (events, doc) = rendered();
    let checkers = doc["checkers"].as_array().expect("array");
    let verdicts: Vec<&str> = checkers.iter().map(|c| c["verdict"].as_str().unwrap()).collect();
    assert_eq!(verdicts, ["invalid", "valid", "unknown"]);
    assert_eq!(checkers[0]["anomaly_count"], 1);
    let anomaly = &checkers[0]["anomalies"][0];
    assert_eq!(anomaly["message"], MESSAGE);
    assert_eq!(anomaly["events"], json!(fixture::anomaly(&events).events));
    assert_eq!(anomaly["fences"], json!([1, 3]));
    assert_eq!(checkers[1]["anomalies"], json!([]));
    assert!(checkers[1].get("reason").is_none());
    assert_eq!(checkers[2]["reason"], UNKNOWN_REASON);
    assert_eq!(checkers[2]["description"], "No accepted heartbeat outside a lease.");
}

#[test]
fn config_and_schedule_verbatim() {
    let (events, doc) = rendered();
    let run = fixture::run(&events);
    assert_eq!(doc["config"], run.config);
    assert_eq!(doc["schedule"], run.schedule);
}

#[test]
fn counts() {
    let (events, doc) = rendered();
    let c = &doc["counts"];
    assert_eq!(c["events"], events.len());
    assert_eq!(c["events_by_process"]["control-plane"], 13);
    assert_eq!(c["events_by_process"]["client"], 6);
    assert_eq!(c["events_by_type"]["step"], 3);
    assert_eq!(c["events_by_process_and_type"]["nemesis"], json!({"invoke": 2, "ok": 2}));
    assert_eq!(c["jobs"], 3);
    assert_eq!(c["jobs_by_final_state"], json!({"failed": 1, "queued": 1, "succeeded": 1}));
    assert_eq!(c["attempts"], 3);
    assert_eq!(
        c["reports_by_decision"]["result"],
        json!({"accepted": 1, "conflict": 1, "duplicate": 1, "rejected": 1})
    );
    assert_eq!(c["reports_by_decision"]["heartbeat"], json!({"accepted": 3, "rejected": 1}));
    assert_eq!(c["steps"], json!({"applied": 2, "refused": 1, "refused_by_reason": {"stale_fence": 1}}));
}

#[test]
fn timings() {
    let (_, doc) = rendered();
    let t = &doc["timings"];
    assert_eq!(t["history_first_ns"], 0);
    assert_eq!(t["history_last_ns"], 6_000_000_000u64);
    assert_eq!(t["history_span_ms"], 6000);
    assert_eq!(t["fault_windows"], 1);
    assert_eq!(t["fault_time_ms"], 2800);
    // j1-a1: 11 → expire 4100; j2-a1: 300 → reconcile 2600; j1-a2: 4200 → accepted 5000.
    assert_eq!(t["attempt_ms"], json!({"closed": 3, "open": 0, "min": 800, "median": 2300, "p99": 4089, "max": 4089}));
}

#[test]
fn deterministic_and_newline_terminated() {
    let events = fixture::history();
    let run = fixture::run(&events);
    let a = results_json(&run, &events);
    assert_eq!(a, results_json(&run, &events));
    assert!(a.ends_with("}\n"));
}

#[test]
fn jobs_without_final_event_are_counted() {
    let mut events = fixture::history();
    events.retain(|e| e.f != Op::Final);
    let run = fixture::run(&events);
    let doc: Value = serde_json::from_str(&results_json(&run, &events)).unwrap();
    assert_eq!(doc["counts"]["jobs_by_final_state"], json!({"no_final_event": 3}));
}

fn result(verdict: Verdict) -> CheckerResult {
    CheckerResult { checker: "c".into(), description: "d".into(), verdict }
}

#[test]
fn overall_from_checkers() {
    let invalid = result(Verdict::Invalid { anomalies: vec![] });
    let unknown = result(Verdict::Unknown { reason: "r".into() });
    let valid = result(Verdict::Valid);
    assert_eq!(Overall::from_checkers(&[valid.clone(), unknown.clone(), invalid]), Overall::Invalid);
    assert_eq!(Overall::from_checkers(&[valid.clone(), unknown]), Overall::Unknown);
    assert_eq!(Overall::from_checkers(&[valid]), Overall::Valid);
    assert_eq!(Overall::from_checkers(&[]), Overall::Unknown);
    let codes = [Overall::Valid, Overall::Invalid, Overall::Unknown].map(|overall| overall.exit().code());
    assert_eq!(codes, [0, 1, 2]);
    assert_eq!(serde_json::to_value(Overall::Unknown).unwrap(), "unknown");
}

#[test]
fn an_incomplete_run_is_unknown_unless_an_anomaly_stands_and_the_file_says_so() {
    let mut run = fixture::run_with(vec![]);
    run.checkers = vec![result(Verdict::Valid)];
    run.complete = false;
    assert_eq!(run.overall(), Overall::Unknown, "valid checkers of an unsettled run prove nothing");
    let doc = results::read_results(&results::results_json(&run, &[])).unwrap();
    assert_eq!(
        (doc.overall, doc.exit_code, doc.complete),
        (Overall::Unknown, 2, false),
        "results.json is the process's"
    );
    run.checkers.push(result(Verdict::Invalid { anomalies: vec![] }));
    assert_eq!(run.overall(), Overall::Invalid, "an anomaly stands on its own");
    run.complete = true;
    run.checkers.truncate(1);
    assert_eq!(run.overall(), Overall::Valid);
}

#[test]
fn run_round_trips_through_serde() {
    let events = fixture::history();
    let run = fixture::run(&events);
    let back: Run = serde_json::from_str(&serde_json::to_string(&run).unwrap()).unwrap();
    assert_eq!(back, run);
}

#[test]
fn results_read_back_through_the_same_types_stories_included() {
    let events = fixture::history();
    let run = fixture::run(&events);
    let text = results_json(&run, &events);
    let doc = results::read_results(&text).expect("typed read-back");
    assert_eq!(serde_json::to_string_pretty(&doc).unwrap() + "\n", text, "read back and written again: same bytes");
    assert_eq!((doc.overall, doc.anomaly_count), (Overall::Invalid, 1));
    assert_eq!(doc.checkers[0].anomalies[0], fixture::anomaly(&events));
    assert_eq!(doc.stories.len(), 1);
    let lines = doc.stories[0].lines();
    println!("{}", lines.join("\n"));
    assert_eq!(lines, STORY);
    let proofs: Vec<u64> = doc.stories[0].steps.iter().filter(|s| s.proof).filter_map(|s| s.event).collect();
    assert_eq!(proofs, fixture::anomaly(&events).events);
    let other = text.replace("fencelab.results/1", "fencelab.results/9");
    assert!(
        matches!(results::read_results(&other), Err(results::ReadError::Schema { found }) if found == "fencelab.results/9")
    );
}

/// The fixture anomaly's story, as `Story::lines` gives it.
pub const STORY: [&str; 8] = [
    "t+0.000 s  r1 claimed j1-a1 with fence 1, lease 1500 ms",
    "t+1.190 s  fault delayed-heartbeats on r1 begins",
    "t+3.489 s  r1's heartbeat for j1-a1 refused (expired)",
    "t+3.990 s  fault delayed-heartbeats on r1 healed",
    "t+4.089 s  j1-a1's lease expired, job j1 uncertain",
    "t+4.189 s  r2 claimed j1-a2 with fence 3, lease 1500 ms",
    "t+4.289 s  the target refused step 1 of j1-a1 (fence 1) (stale_fence)",
    "t+4.489 s  r1's result for j1-a1 refused (expired), kept as a late observation — the rule broken: No step of a superseded attempt is applied.",
];

/// A history without the nemesis's events falls back to the schedule, which numbers
/// runners from 0 (`schedule.json` as a run writes it): the story names the runner.
#[test]
fn a_scheduled_fault_is_told_on_the_runner_the_schedule_numbers_from_zero() {
    let keep: std::collections::BTreeSet<_> =
        history::Source::ALL.iter().copied().filter(|source| *source != history::Source::Nemesis).collect();
    let events = history::cut(&fixture::history(), &keep);
    let mut run = fixture::run(&events);
    run.schedule = json!([{"at_ms": 1200, "duration_ms": 2800, "kind": "delayed-heartbeats", "runner": 0}]);
    let doc = results::read_results(&results_json(&run, &events)).unwrap();
    let story = doc.stories.first().expect("the anomaly's story").lines().join("\n");
    assert!(story.contains("fault delayed-heartbeats on r1 begins"), "{story}");
}
