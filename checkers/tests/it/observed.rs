//! An observed system's history (Buildbot's shape): a ledger recorded from the system's own
//! records, with claims that carry no lease, no runner logs, and the system's own requeue
//! of a lost attempt. What stands on leases is unknown with why; what the ledger and the
//! target's log prove is still judged.

use crate::builder::{claim, C, H};
use crate::check;
use checkers::Verdict;
use history::Decision::Accepted;
use history::{Event, EventType, Op, Process};
use serde_json::json;

/// A claim as an observed system's recorder writes it: no `lease_expires_ms`.
fn leaseless_claim(h: &mut H, c: &C, at_ms: i64) {
    let mut entry = Event::new(0, Process::CONTROL_PLANE, EventType::Ledger, Op::Claim)
        .with_claim(&c.job, &c.attempt, &c.runner, c.fence);
    entry.key = Some("prod".into());
    entry.project = Some("demo".into());
    entry.received_ms = Some(at_ms);
    entry.decision = Some(Accepted);
    h.ledger(entry);
}

/// The system's own end of an attempt it lost: `expire`, recorded as `recorded_as`.
fn system_expire(h: &mut H, c: &C, at_ms: i64, recorded_as: &str) {
    let mut entry = Event::new(0, Process::CONTROL_PLANE, EventType::Ledger, Op::Expire)
        .with_claim(&c.job, &c.attempt, &c.runner, c.fence);
    entry.key = Some("prod".into());
    entry.received_ms = Some(at_ms);
    entry.value = Some(json!({ "recorded_as": recorded_as }));
    h.ledger(entry);
}

/// j1's build b1 (r1) is lost and requeued by the system; b2 (r2) runs it again while b1's
/// worker still writes the target; b2 succeeds.
fn requeued_while_still_writing() -> Vec<Event> {
    let mut h = H::new();
    h.config_lacking(&["capabilities", "reconcile", "runner-log", "lease"]);
    h.submit("j1", "prod", 1_000);
    let b1 = claim("j1", "j1-b1", "r1", 1);
    let b2 = claim("j1", "j1-b2", "r2", 2);
    leaseless_claim(&mut h, &b1, 1_000);
    h.step(&b1, 1_100, Accepted, None);
    system_expire(&mut h, &b1, 2_000, "requeued");
    leaseless_claim(&mut h, &b2, 3_000);
    h.step(&b2, 3_100, Accepted, None);
    h.step(&b1, 3_200, Accepted, None);
    h.step(&b2, 3_300, Accepted, None);
    h.result(&b2, 4_000, 4_000, "succeeded", Accepted, None);
    h.final_with_attempts("j1", Some("j1-b2"), "succeeded", &[("j1-b1", "failed"), ("j1-b2", "succeeded")]);
    let without_runner_logs =
        history::Source::ALL.iter().copied().filter(|source| *source != history::Source::RunnerLogs);
    history::cut(&h.build_undeclared(), &without_runner_logs.collect())
}

#[test]
fn claims_without_a_lease_are_read_and_the_rules_on_leases_are_unknown_with_why() {
    let events = requeued_while_still_writing();
    for result in checkers::check_all(&events) {
        if let Verdict::Unknown { reason } = &result.verdict {
            assert!(!reason.contains("cannot be checked"), "{}: {reason}", result.checker);
        }
    }
    for name in ["single-owner", "heartbeat-resurrection", "clock-authority"] {
        let result = checkers::check_one(name, &events).expect("a checker");
        let Verdict::Unknown { reason } = &result.verdict else { panic!("{name}: {:?}", result.verdict) };
        assert!(reason.contains("grants no lease"), "{name}: {reason}");
    }
}

#[test]
fn the_systems_own_requeue_and_the_old_attempts_step_after_the_new_ones_are_found() {
    let events = requeued_while_still_writing();
    check(&events, "explicit-uncertainty", &["expiry-not-uncertain", "reclaimed-without-reconcile"]);
    let anomalies = check(&events, "rules-model", &["expiry-not-uncertain"]);
    assert!(anomalies[0].message.contains("requeued"), "{}", anomalies[0].message);
    check(&events, "stale-side-effect", &["stale-step-applied"]);
}
