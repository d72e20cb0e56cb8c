//! The executable model of the rules (`rules-model`): each test breaks one rule in a small
//! correct history and expects exactly the divergence that names it.

use crate::builder::{claim, C, H};
use crate::check;
use history::Decision::{Accepted, Duplicate, Rejected};
use history::{Event, EventType, Op, Process, Reason};

/// j1 on `prod`: A1 (r1, fence 7) claimed at 1000 with the policy's 2000 ms lease.
fn start() -> (H, C) {
    let mut h = H::new();
    h.config("fenced");
    h.submit("j1", "prod", 900);
    let a1 = claim("j1", "j1-a1", "r1", 7);
    h.ledger_claim(&a1, 1_000, 3_000);
    (h, a1)
}

fn ledger_entry(f: Op, c: &C, at_ms: i64) -> Event {
    let mut entry =
        Event::new(0, Process::CONTROL_PLANE, EventType::Ledger, f).with_claim(&c.job, &c.attempt, &c.runner, c.fence);
    entry.key = Some("prod".into());
    entry.project = Some("demo".into());
    entry.received_ms = Some(at_ms);
    entry
}

#[test]
fn the_model_replays_a_correct_lifecycle_without_divergence() {
    let (mut h, a1) = start();
    h.heartbeat(&a1, 1_500, 1_500, Accepted, Some(3_500));
    h.capability(&a1, 1_600, 1_600, Accepted, Some(3_500));
    h.step(&a1, 1_610, Accepted, None);
    h.result(&a1, 1_700, 1_700, "succeeded", Accepted, None);
    h.result(&a1, 9_000, 9_000, "succeeded", Duplicate, None);
    h.final_state("j1", Some("j1-a1"), "succeeded");
    check(&h.build(), "rules-model", &[]);
}

#[test]
fn a_heartbeat_accepted_after_the_lease_ended_diverges_even_without_an_expiry() {
    let (mut h, a1) = start();
    h.heartbeat(&a1, 3_200, 3_200, Accepted, Some(5_200));
    let anomalies = check(&h.build(), "rules-model", &["heartbeat-accepted-wrongly"]);
    assert!(anomalies[0].message.contains("the rules decide rejected (expired)"), "{}", anomalies[0].message);
}

#[test]
fn a_refused_result_that_is_not_kept_as_a_late_observation_diverges() {
    let (mut h, a1) = start();
    h.expire(&a1, 3_100, 3_000, "uncertain");
    let seq =
        h.ledger_report(Op::Result, &a1, 3_200, 3_200, Rejected, Some(Reason::Expired), Some("succeeded"), None, None);
    assert!(seq > 0);
    check(&h.build(), "rules-model", &["recorded-as"]);
}

#[test]
fn an_identical_retry_refused_as_late_diverges_from_a_duplicate() {
    let (mut h, a1) = start();
    h.result(&a1, 1_700, 1_700, "succeeded", Accepted, None);
    h.result(&a1, 3_500, 3_500, "succeeded", Rejected, Some(Reason::NotCurrent));
    let anomalies = check(&h.build(), "rules-model", &["refused-wrongly"]);
    assert!(anomalies[0].message.contains("the rules decide duplicate"), "{}", anomalies[0].message);
}

#[test]
fn a_reconcile_no_operator_decided_is_unauthorised() {
    let (mut h, a1) = start();
    h.expire(&a1, 3_100, 3_000, "uncertain");
    let mut entry = ledger_entry(Op::Reconcile, &a1, 3_200);
    entry.outcome = Some("stopped".into());
    h.ledger(entry);
    check(&h.build(), "rules-model", &["reconcile-unauthorised"]);
}

#[test]
fn a_reconcile_of_a_running_attempt_diverges() {
    let (mut h, a1) = start();
    h.reconcile(&a1, 1_500, "stopped", None);
    check(&h.build(), "rules-model", &["reconcile-not-uncertain"]);
}

#[test]
fn an_expiry_before_the_lease_ends_diverges() {
    let (mut h, a1) = start();
    h.expire(&a1, 2_500, 3_000, "uncertain");
    check(&h.build(), "rules-model", &["expired-early"]);
}

#[test]
fn an_expiry_of_an_attempt_the_ledger_never_granted_says_so() {
    let mut h = H::new();
    h.config("fenced");
    h.submit("j1", "prod", 900);
    let a1 = claim("j1", "j1-a1", "r1", 7);
    h.expire(&a1, 3_100, 3_000, "uncertain");
    let anomalies = check(&h.build(), "rules-model", &["expired-not-running"]);
    assert!(anomalies[0].message.contains("the ledger holds no claim of it"), "{}", anomalies[0].message);
    let (mut h, a1) = start();
    h.expire(&a1, 3_100, 3_000, "uncertain");
    h.expire(&a1, 3_200, 3_000, "uncertain");
    let anomalies = check(&h.build(), "rules-model", &["expired-not-running"]);
    assert!(anomalies[0].message.contains("while it was not running"), "{}", anomalies[0].message);
}

#[test]
fn a_claim_on_a_key_an_uncertain_job_holds_diverges() {
    let (mut h, a1) = start();
    h.expire(&a1, 3_100, 3_000, "uncertain");
    h.submit("j2", "prod", 3_150);
    let b1 = claim("j2", "j2-a1", "r2", 8);
    h.ledger_claim(&b1, 3_200, 5_200);
    let anomalies = check(&h.build(), "rules-model", &["claim-key-held"]);
    assert!(anomalies[0].message.contains("held by job j1 (uncertain)"), "{}", anomalies[0].message);
}

#[test]
fn a_lease_longer_than_the_policy_diverges() {
    let (mut h, a1) = start();
    h.heartbeat(&a1, 1_500, 1_500, Accepted, Some(9_500));
    check(&h.build(), "rules-model", &["lease-not-the-policys"]);
}

#[test]
fn a_wrong_reason_diverges() {
    let (mut h, a1) = start();
    h.heartbeat_refused(&a1, 1_500, 1_500, Reason::Superseded);
    let anomalies = check(&h.build(), "rules-model", &["refused-wrongly"]);
    assert!(anomalies[0].message.contains("the rules decide accepted"), "{}", anomalies[0].message);
    let (mut h, a1) = start();
    h.expire(&a1, 3_100, 3_000, "uncertain");
    h.heartbeat_refused(&a1, 3_200, 3_200, Reason::Superseded);
    check(&h.build(), "rules-model", &["reason"]);
}

#[test]
fn a_final_state_the_ledger_does_not_replay_to_diverges() {
    let (mut h, a1) = start();
    h.result(&a1, 1_700, 1_700, "failed", Accepted, None);
    h.final_state("j1", Some("j1-a1"), "succeeded");
    let anomalies = check(&h.build(), "rules-model", &["final-not-the-ledgers"]);
    assert!(anomalies[0].message.contains("replays to `failed`"), "{}", anomalies[0].message);
}

#[test]
fn an_attempt_that_ends_in_another_state_than_its_close_diverges() {
    // Its result committed `succeeded`; the final state says the attempt failed.
    let (mut h, a1) = start();
    h.result(&a1, 1_700, 1_700, "succeeded", Accepted, None);
    h.final_with_attempts("j1", Some("j1-a1"), "succeeded", &[("j1-a1", "failed")]);
    let anomalies = check(&h.build(), "rules-model", &["final-attempt-not-the-ledgers"]);
    assert!(
        anomalies[0].message.contains("ended `failed` but its ledger closed it `succeeded`"),
        "{}",
        anomalies[0].message
    );
    // Reconciled as stopped: the attempt ends failed, and says so.
    let (mut h, a1) = start();
    h.expire(&a1, 3_100, 3_000, "uncertain");
    h.reconcile(&a1, 3_500, "stopped", None);
    h.final_with_attempts("j1", None, "queued", &[("j1-a1", "failed")]);
    check(&h.build(), "rules-model", &[]);
    let (mut h, a1) = start();
    h.expire(&a1, 3_100, 3_000, "uncertain");
    h.reconcile(&a1, 3_500, "stopped", None);
    h.final_with_attempts("j1", None, "queued", &[("j1-a1", "succeeded")]);
    check(&h.build(), "rules-model", &["final-attempt-not-the-ledgers"]);
}
