//! Whole histories: the seed's walk-through (valid, and with the late report accepted),
//! and one realistic correct run that no checker may accuse.

use crate::builder::{claim, H};
use crate::{all_valid, check};
use checkers::Verdict;
use history::Decision::{Accepted, Conflict, Duplicate, Rejected};
use history::{Op, Reason};

/// The seed's walk-through: A1 (fence 7) expires, is reconciled as stopped, A2 (fence 8)
/// runs, and R1's late report for A1 arrives — rejected as a late observation, or, with
/// `accept_late`, accepted as the current completion.
pub fn walk_through(accept_late: bool) -> Vec<history::Event> {
    let mut h = H::new();
    let (a1, a2) = (claim("j1", "j1-a1", "r1", 7), claim("j1", "j1-a2", "r2", 8));
    h.config("fenced");
    h.submit("j1", "prod", 900);
    h.ledger_claim(&a1, 1_000, 3_000);
    h.heartbeat(&a1, 1_500, 1_480, Accepted, Some(3_500));
    h.capability(&a1, 1_600, 1_590, Accepted, Some(3_500));
    h.step(&a1, 1_610, Accepted, None);
    h.expire(&a1, 3_550, 3_500, "uncertain");
    h.reconcile(&a1, 4_000, "stopped", None);
    h.ledger_claim(&a2, 4_100, 6_100);
    h.capability(&a2, 4_200, 4_200, Accepted, Some(6_100));
    h.step(&a2, 4_210, Accepted, None);
    if accept_late {
        h.result(&a1, 4_500, 4_300, "succeeded", Accepted, None);
    } else {
        h.result(&a1, 4_500, 4_300, "succeeded", Rejected, Some(Reason::Superseded));
    }
    h.heartbeat_refused(&a1, 4_510, 4_310, Reason::Superseded);
    h.step(&a1, 4_520, Rejected, Some(Reason::StaleFence));
    h.step(&a2, 4_600, Accepted, None);
    h.result(&a2, 5_000, 5_000, "succeeded", Accepted, None);
    h.final_state("j1", Some("j1-a2"), "succeeded");
    h.build()
}

#[test]
fn the_walk_through_is_valid_for_every_checker() {
    all_valid(&walk_through(false));
}

#[test]
fn the_walk_through_with_the_late_report_accepted_is_a_stale_completion() {
    let events = walk_through(true);
    let anomalies = check(&events, "stale-completion", &["superseded-result-accepted", "late-result-acknowledged"]);
    let ledger = &anomalies.iter().find(|anomaly| anomaly.kind == "superseded-result-accepted").unwrap();
    assert_eq!(ledger.job.as_deref(), Some("j1"));
    assert_eq!(ledger.attempts, ["j1-a1", "j1-a2"]);
    assert_eq!(ledger.runners, ["r1", "r2"]);
    assert_eq!(ledger.fences, [7, 8]);
    assert_eq!(
        ledger.message,
        "late report for j1-a1 (fence 7) accepted as current completion while j1-a2 (fence 8) was current"
    );
    let claim_a2 =
        events.iter().find(|e| e.f == Op::Claim && e.kind == history::EventType::Ledger && e.fence == Some(8));
    assert!(ledger.events.contains(&claim_a2.unwrap().index));
}

/// A realistic correct run: two keys, four jobs, duplicates, a conflict, late
/// observations, an expiry reconciled `stopped`, one reconciled `completed`, one left
/// uncertain, clock skew within the lease, an unfenced target with no stale step, a
/// control-plane restart, and a claim whose receipt precedes the reconcile it waited for.
pub fn realistic() -> Vec<history::Event> {
    let mut h = H::new();
    h.config("unfenced");
    for (job, key, at) in [("j1", "prod", 100), ("j2", "prod", 110), ("j3", "stage", 120), ("j4", "stage", 130)] {
        h.submit(job, key, at);
    }
    let j1 = claim("j1", "j1-a1", "r1", 1);
    let j3 = claim("j3", "j3-a1", "r2", 2);
    h.ledger_claim(&j1, 1_000, 3_000);
    h.ledger_claim(&j3, 1_010, 3_010);
    // r1's clock runs 400 ms ahead, r2's 300 ms behind: recorded, never used.
    h.heartbeat(&j1, 1_900, 2_300, Accepted, Some(3_900));
    h.heartbeat(&j3, 1_950, 1_650, Accepted, Some(3_950));
    for (at, step) in [(2_000, 0), (2_100, 1)] {
        h.capability(&j1, at, at + 400, Accepted, Some(3_900));
        h.step(&j1, at + 5 + step, Accepted, None);
    }
    h.capability(&j3, 2_050, 1_750, Accepted, Some(3_950));
    h.step(&j3, 2_060, Accepted, None);
    h.result(&j1, 2_200, 2_600, "succeeded", Accepted, None);
    h.result(&j1, 2_300, 2_700, "succeeded", Duplicate, None); // a retried result
                                                               // j2 on prod after j1 released it.
    let j2 = claim("j2", "j2-a1", "r2", 3);
    h.ledger_claim(&j2, 2_400, 4_400);
    h.capability(&j2, 2_500, 2_200, Accepted, Some(4_400));
    h.step(&j2, 2_510, Accepted, None);
    // j3's runner is cut off: its lease expires, the job is uncertain, then reconciled.
    h.expire(&j3, 3_960, 3_950, "uncertain");
    h.heartbeat(&j3, 4_000, 3_700, Rejected, None);
    h.reconcile(&j3, 4_100, "still-running", None);
    // j2's runner also vanishes; its attempt is left uncertain at the end.
    h.expire(&j2, 4_450, 4_400, "uncertain");
    // j3: observed stopped; the retry's claim was received before the reconcile committed.
    let j3b = claim("j3", "j3-a2", "r1", 4);
    let reconcile_seq_slot = h.len();
    h.ledger_claim(&j3b, 4_195, 6_195);
    h.reconcile(&j3, 4_200, "stopped", None);
    swap_ledger_seqs(&mut h, reconcile_seq_slot);
    h.capability(&j3b, 4_300, 4_700, Accepted, Some(6_195));
    h.step(&j3b, 4_310, Accepted, None);
    h.result(&j3, 4_400, 4_100, "succeeded", Rejected, Some(Reason::Superseded)); // late observation
    h.result(&j3b, 4_500, 4_900, "failed", Accepted, None);
    // j4: expires after its last step, found completed by the operator.
    let j4 = claim("j4", "j4-a1", "r2", 5);
    h.ledger_claim(&j4, 4_600, 6_600);
    h.capability(&j4, 4_700, 4_400, Accepted, Some(6_600));
    h.step(&j4, 4_710, Accepted, None);
    h.expire(&j4, 6_650, 6_600, "uncertain");
    h.reconcile(&j4, 6_700, "completed", Some("succeeded"));
    h.result(&j4, 6_800, 6_500, "succeeded", Rejected, Some(Reason::NotCurrent));
    h.nemesis_restart();
    h.result(&j1, 9_000, 9_400, "succeeded", Duplicate, None); // duplicate long after the lease
    h.result(&j1, 9_100, 9_500, "failed", Conflict, None); // conflicting result, recorded
    h.final_state("j1", Some("j1-a1"), "succeeded");
    h.final_state("j2", Some("j2-a1"), "uncertain");
    h.final_state("j3", Some("j3-a2"), "failed");
    h.final_state("j4", Some("j4-a1"), "succeeded");
    h.build()
}

/// Gives the claim written at `slot` the seq of the reconcile written after it, and vice
/// versa: the claim was received first but committed second.
fn swap_ledger_seqs(h: &mut H, slot: u64) {
    h.swap_seq_with_next_ledger(slot);
}

#[test]
fn a_realistic_correct_history_is_valid_for_every_checker() {
    all_valid(&realistic());
}

#[test]
fn in_history_order_the_early_claim_would_look_like_a_reclaim_without_reconcile() {
    let mut events = realistic();
    for event in &mut events {
        if let Some(value) = event.value.as_mut().and_then(|value| value.as_object_mut()) {
            value.remove("seq");
        }
    }
    check(&events, "explicit-uncertainty", &["reclaimed-without-reconcile"]);
}

#[test]
fn a_history_without_finals_is_unknown_to_lost_work_and_says_why() {
    let mut without_finals: std::collections::BTreeSet<_> = history::Source::ALL.iter().copied().collect();
    without_finals.remove(&history::Source::Finals);
    let events = history::cut(&walk_through(false), &without_finals);
    let result = checkers::check_one("lost-work", &events).unwrap();
    let Verdict::Unknown { reason } = result.verdict else { panic!("{result:?}") };
    assert!(reason.contains("no `final` events"), "{reason}");
}

#[test]
fn a_malformed_history_is_unknown_not_a_panic() {
    let mut events = walk_through(true);
    events[3].fence = None;
    events[5].index = 99;
    for result in checkers::check_all(&events) {
        assert!(matches!(result.verdict, Verdict::Unknown { .. }), "{result:?}");
    }
}

/// A declaration of sources naming a source the vocabulary does not hold makes every
/// verdict unknown: a history is never judged on sources guessed in place of a typo.
#[test]
fn a_declaration_of_unknown_sources_makes_the_history_unknown() {
    let mut events = walk_through(false);
    let last = events.last_mut().expect("the builder declares its sources last");
    assert_eq!(last.f, Op::Sources);
    last.value = Some(serde_json::json!({"sources": ["ledger", "tea-leaves"]}));
    for result in checkers::check_all(&events) {
        let Verdict::Unknown { reason } = &result.verdict else { panic!("{}: {:?}", result.checker, result.verdict) };
        assert!(reason.contains("declares sources outside the vocabulary"), "{reason}");
    }
}
