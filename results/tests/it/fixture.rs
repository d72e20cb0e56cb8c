//! A small literal history (three jobs, two runners, one fault window) and a `Run` over it with
//! one invalid, one valid and one unknown checker; plus a large generated history.

use checkers::{Anomaly, CheckerResult, Verdict};
use history::{Decision, Event, EventType, Op, Process, Reason};
use results::Run;
use serde_json::json;

const BASE_MS: i64 = 1_700_000_000_000;

/// An event at `ms` milliseconds into the run.
fn ev(ms: u64, process: &str, kind: EventType, f: &str) -> Event {
    let process = Process::parse(process).expect("a known process");
    Event::new(ms * 1_000_000, process, kind, Op::parse(f).expect("a known op"))
}

fn code(reason: &str) -> Option<Reason> {
    Some(Reason::parse(reason).expect("a known reason"))
}

/// A ledger entry for a claim, received at `ms` with a lease of `lease_ms` (0: none).
fn ledger(ms: u64, f: &str, claim: (&str, &str, &str, u64), lease_ms: i64) -> Event {
    let mut e = ev(ms, "control-plane", EventType::Ledger, f).with_claim(claim.0, claim.1, claim.2, claim.3);
    e.received_ms = Some(BASE_MS + ms as i64);
    if lease_ms > 0 {
        e.lease_expires_ms = Some(BASE_MS + ms as i64 + lease_ms);
    }
    e
}

fn step(ms: u64, claim: (&str, &str, &str, u64), applied: bool, reason: Option<Reason>) -> Event {
    let decision = if applied { Decision::Accepted } else { Decision::Rejected };
    let mut e = ev(ms, "target", EventType::Step, "step").with_claim(claim.0, claim.1, claim.2, claim.3);
    e.key = Some("k1".into());
    e.value = Some(json!({"seq": ms, "step": 1, "steps": 2, "revision": 1, "highest_fence_before": 1}));
    e.with_decision(decision, reason)
}

fn nemesis(ms: u64, kind: EventType, phase: &str) -> Event {
    let mut e = ev(ms, "nemesis", kind, "delayed-heartbeats");
    e.runner = Some("r1".into());
    e.value = Some(json!({"kind": "delayed-heartbeats", "phase": phase}));
    e
}

fn final_state(ms: u64, job: &str, outcome: &str) -> Event {
    let mut e = ev(ms, "harness", EventType::Ok, "final").with_job(job);
    e.outcome = Some(outcome.into());
    e
}

/// The history: j1 is claimed by r1 (fence 1), heartbeats, applies a step, is delayed by the
/// nemesis, expires, is re-claimed by r2 (fence 3) whose step is applied while r1's late step
/// is refused; r1's late result is rejected, r2's accepted, then replayed (duplicate) and
/// contradicted (conflict). j2 is claimed by r2 (fence 2) and reconciled. j3 stays queued.
pub fn history() -> Vec<Event> {
    let a1 = ("j1", "j1-a1", "r1", 1);
    let a2 = ("j1", "j1-a2", "r2", 3);
    let a3 = ("j2", "j2-a1", "r2", 2);
    let mut events = vec![
        ev(0, "client", EventType::Invoke, "submit").with_job("j1"),
        ev(1, "client", EventType::Ok, "submit").with_job("j1"),
        ev(2, "client", EventType::Invoke, "submit").with_job("j2"),
        ev(3, "client", EventType::Ok, "submit").with_job("j2"),
        ev(4, "client", EventType::Invoke, "submit").with_job("j3"),
        ev(5, "client", EventType::Ok, "submit").with_job("j3"),
        ev(10, "runner:r1", EventType::Request, "claim"),
        ledger(11, "claim", a1, 1500),
        ev(12, "runner:r1", EventType::Response, "claim").with_claim("j1", "j1-a1", "r1", 1),
        ledger(300, "claim", a3, 1500),
        ledger(500, "heartbeat", a1, 1500).with_decision(Decision::Accepted, None),
        ledger(800, "heartbeat", a3, 1500).with_decision(Decision::Accepted, None),
        ledger(1000, "heartbeat", a1, 1500).with_decision(Decision::Accepted, None),
        step(1100, a1, true, None),
        nemesis(1200, EventType::Invoke, "start"),
        nemesis(1201, EventType::Ok, "start"),
        ev(2500, "operator", EventType::Invoke, "reconcile").with_claim("j2", "j2-a1", "r2", 2),
        ledger(2600, "reconcile", a3, 0),
        ev(2601, "operator", EventType::Ok, "reconcile").with_claim("j2", "j2-a1", "r2", 2),
        ledger(3500, "heartbeat", a1, 0).with_decision(Decision::Rejected, code("expired")),
        nemesis(4000, EventType::Invoke, "heal"),
        nemesis(4001, EventType::Ok, "heal"),
        ledger(4100, "expire", a1, 0),
        ledger(4200, "claim", a2, 1500),
        step(4300, a1, false, code("stale_fence")),
        step(4400, a2, true, None),
        ledger(4500, "result", a1, 0).with_decision(Decision::Rejected, code("expired")),
        ledger(5000, "result", a2, 0).with_decision(Decision::Accepted, None),
        ledger(5101, "result", a2, 0).with_decision(Decision::Duplicate, None),
        ledger(5201, "result", a2, 0).with_decision(Decision::Conflict, code("conflict")),
        final_state(6000, "j1", "succeeded"),
        final_state(6000, "j2", "failed"),
        final_state(6000, "j3", "queued"),
    ];
    events[17].outcome = Some("stopped".into());
    events[22].value = Some(json!({"seq": 9, "recorded_as": "uncertain"}));
    events[27].outcome = Some("succeeded".into());
    events[29].outcome = Some("failed".into());
    number(&mut events);
    events
}

pub fn number(events: &mut [Event]) {
    for (i, e) in events.iter_mut().enumerate() {
        e.index = i as u64;
    }
}

/// The index of the first event matching `pred`.
pub fn index_of(events: &[Event], pred: impl Fn(&Event) -> bool) -> u64 {
    events.iter().find(|e| pred(e)).expect("fixture has the event").index
}

/// The message of the fixture's anomaly: it has markup, an ampersand and both quotes.
pub const MESSAGE: &str = "step of j1-a1 <fence 1> applied & \"accepted\" after 'j1-a2' took fence 3";
pub const COMMAND: &str = "fencelab run --seed 42 --test 'stale & <late>' --config \"lab.toml\"";
pub const UNKNOWN_REASON: &str = "history incomplete: runner r3's log torn at line 7 <eof>";

/// The anomaly: r1's step after its attempt expired (events: expire, the refused step, the
/// late rejected result).
pub fn anomaly(events: &[Event]) -> Anomaly {
    Anomaly {
        checker: "stale-write".into(),
        kind: "stale-step-applied".into(),
        job: Some("j1".into()),
        attempts: vec!["j1-a1".into(), "j1-a2".into()],
        runners: vec!["r1".into(), "r2".into()],
        fences: vec![1, 3],
        key: Some("k1".into()),
        events: vec![
            index_of(events, |e| e.f == Op::Expire),
            index_of(events, |e| e.kind == EventType::Step && e.decision == Some(Decision::Rejected)),
            index_of(events, |e| e.f == Op::Result && e.decision == Some(Decision::Rejected)),
        ],
        message: MESSAGE.into(),
    }
}

pub fn run(events: &[Event]) -> Run {
    run_with(vec![anomaly(events)])
}

/// The fixture's run, its invalid checker carrying `anomalies`.
pub fn run_with(anomalies: Vec<Anomaly>) -> Run {
    Run {
        test_name: "stale-write".into(),
        seed: 42,
        command: COMMAND.into(),
        started_at: "2026-01-02T03:04:05Z".into(),
        duration_ms: 6000,
        config: json!({
            "control_plane": "http://127.0.0.1:8080",
            "runners": ["r1", "r2"],
            "keys": ["k1", "k2"],
            "timings": {"lease_ms": 1500, "heartbeat_ms": 500},
            "nemesis": ["delayed-heartbeats"],
            "bugs": [],
        }),
        complete: true,
        schedule: json!([
            {"at_ms": 1200, "duration_ms": 2800, "kind": "delayed-heartbeats", "runner": "r1", "variant": "3x"}
        ]),
        checkers: vec![
            CheckerResult {
                checker: "stale-write".into(),
                description: "No step of a superseded attempt is applied.".into(),
                verdict: Verdict::Invalid { anomalies },
            },
            CheckerResult {
                checker: "single-completion".into(),
                description: "At most one result per job is accepted.".into(),
                verdict: Verdict::Valid,
            },
            CheckerResult {
                checker: "lease-safety".into(),
                description: "No accepted heartbeat outside a lease.".into(),
                verdict: Verdict::Unknown { reason: UNKNOWN_REASON.into() },
            },
        ],
    }
}

/// A generated history of about `target` events: a 30-minute run, 50 runners, jobs of ~20
/// events each (claim, heartbeats, steps, result), and a re-claim of every 97th job.
pub fn large(target: usize) -> Vec<Event> {
    let mut events = Vec::with_capacity(target + 64);
    let span_ms: u64 = 30 * 60 * 1000;
    let mut fence = 0;
    let mut job = 0;
    while events.len() < target {
        let start = (job as u64 * 7919) % (span_ms - 60_000);
        let id = format!("job-{job:05}");
        let runner = format!("r{}", job % 50);
        fence += 1;
        let claim = (id.as_str(), "", runner.as_str(), fence);
        let attempt = format!("{id}-a1");
        let claim = (claim.0, attempt.as_str(), claim.2, claim.3);
        events.push(ev(start, "client", EventType::Invoke, "submit").with_job(&id));
        events.push(ledger(start + 5, "claim", claim, 3000));
        for h in 1..=12 {
            events.push(ledger(start + 5 + h * 1000, "heartbeat", claim, 3000).with_decision(Decision::Accepted, None));
        }
        for s in 0..4 {
            events.push(step(start + 100 + s * 2000, claim, s != 3, (s == 3).then_some(Reason::StaleFence)));
        }
        let decision = if job % 97 == 0 { Decision::Rejected } else { Decision::Accepted };
        events.push(ledger(start + 14_000, "result", claim, 0).with_decision(decision, None));
        events.push(final_state(span_ms, &id, "succeeded"));
        job += 1;
    }
    events.sort_by_key(|e| e.time_ns);
    number(&mut events);
    events
}

/// A run over a large history with `n` anomalies spread over its jobs, and 100 fault windows.
pub fn large_run(events: &[Event], n: usize) -> Run {
    let results: Vec<&Event> = events.iter().filter(|e| e.f == Op::Result).collect();
    let anomalies: Vec<Anomaly> = (0..n)
        .map(|i| {
            let e = results[i * results.len() / n];
            Anomaly {
                checker: "stale-write".into(),
                kind: "late".into(),
                job: e.job.clone(),
                attempts: vec![],
                runners: vec![],
                fences: vec![],
                key: None,
                events: vec![e.index],
                message: format!("anomaly {i}"),
            }
        })
        .collect();
    let schedule: Vec<_> = (0..100u64)
        .map(|i| json!({"at_ms": i * 17_000, "duration_ms": 5000, "kind": "partition", "runner": format!("r{}", i % 50)}))
        .collect();
    let mut run = run_with(anomalies);
    run.duration_ms = 30 * 60 * 1000;
    run.schedule = serde_json::Value::Array(schedule);
    run
}
