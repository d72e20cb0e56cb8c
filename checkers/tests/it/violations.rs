//! One violation at a time: each test starts from a small correct history, breaks one
//! rule, and expects exactly the anomaly kinds of the checker that owns that rule.

use crate::builder::{claim, C, H};
use crate::check;
use history::Decision::{Accepted, Conflict, Duplicate, Rejected};
use history::{Event, EventType, Op, Process, Reason};

/// j1 on `prod`: A1 (r1, fence 7) claimed at 1000 with a lease to 3000.
fn start() -> (H, C) {
    let mut h = H::new();
    let a1 = claim("j1", "j1-a1", "r1", 7);
    h.submit("j1", "prod", 900);
    h.ledger_claim(&a1, 1_000, 3_000);
    (h, a1)
}

/// The rest of a correct run for A1: a step and an accepted result, then the final state.
fn finish(mut h: H, a1: &C) -> Vec<history::Event> {
    h.capability(a1, 1_100, 1_100, Accepted, Some(3_000));
    h.step(a1, 1_110, Accepted, None);
    h.result(a1, 1_200, 1_200, "succeeded", Accepted, None);
    h.final_state("j1", Some("j1-a1"), "succeeded");
    h.build()
}

#[test]
fn the_small_correct_history_is_valid() {
    let (h, a1) = start();
    crate::all_valid(&finish(h, &a1));
}

#[test]
fn stale_completion_after_expiry_from_the_ledger() {
    let (mut h, a1) = start();
    let expired = h.expire(&a1, 3_050, 3_000, "uncertain");
    h.result(&a1, 3_100, 2_900, "succeeded", Accepted, None);
    h.final_state("j1", Some("j1-a1"), "succeeded");
    let anomalies = check(&h.build(), "stale-completion", &["expired-result-accepted"]);
    assert!(anomalies[0].events.contains(&expired));
    assert_eq!((anomalies[0].fences.as_slice(), anomalies[0].runners.as_slice()), (&[7][..], &["r1".to_string()][..]));
}

#[test]
fn stale_completion_acknowledged_to_a_runner_only() {
    // The ledger is silent (e.g. truncated) but the runner was told `accepted` after A2's claim.
    let (mut h, a1) = start();
    let a2 = claim("j1", "j1-a2", "r2", 8);
    h.runner_claim(&a2, 6_000);
    h.answer(Op::Result, &a1, 4_000, Some("succeeded"), Accepted, 99);
    check(&h.build(), "stale-completion", &["late-result-acknowledged"]);
}

#[test]
fn heartbeat_resurrection_after_expiry_and_after_lease_end() {
    let (mut h, a1) = start();
    h.expire(&a1, 3_010, 3_000, "uncertain");
    h.heartbeat(&a1, 3_020, 3_020, Accepted, Some(5_020));
    h.heartbeat(&a1, 3_500, 3_500, Accepted, Some(5_500)); // the same revival: reported once
    let events = h.build();
    let anomalies = check(&events, "heartbeat-resurrection", &["heartbeat-after-expiry"]);
    assert!(anomalies[0].message.contains("j1-a1 (fence 7)"), "{}", anomalies[0].message);

    let (mut h, a1) = start();
    h.heartbeat(&a1, 3_000, 2_000, Accepted, Some(5_000));
    check(&h.build(), "heartbeat-resurrection", &["heartbeat-after-lease-end"]);
}

#[test]
fn heartbeat_for_a_superseded_claim() {
    let (mut h, a1) = start();
    h.expire(&a1, 3_010, 3_000, "uncertain");
    h.reconcile(&a1, 3_100, "stopped", None);
    let a2 = claim("j1", "j1-a2", "r2", 8);
    h.ledger_claim(&a2, 3_200, 5_200);
    // Not expired by the ledger (say the expire entry was lost) — superseded anyway.
    let mut events = h.build();
    events.retain(|event| event.f != Op::Expire);
    let mut h2 = H::new();
    for event in events {
        h2.push(event);
    }
    h2.heartbeat(&a1, 2_500, 2_500, Accepted, Some(4_500));
    check(&h2.build(), "heartbeat-resurrection", &["heartbeat-for-superseded-claim"]);
}

#[test]
fn single_owner_two_attempts_of_one_job() {
    let (mut h, _a1) = start();
    let a2 = claim("j1", "j1-a2", "r2", 8);
    h.ledger_claim(&a2, 2_000, 4_000);
    let anomalies = check(&h.build(), "single-owner", &["two-attempts-one-job"]);
    assert_eq!(anomalies[0].attempts, ["j1-a1", "j1-a2"]);
}

#[test]
fn single_owner_two_jobs_on_one_key_and_a_resurrected_lease() {
    let (mut h, a1) = start();
    h.submit("j2", "prod", 950);
    h.expire(&a1, 3_000, 3_000, "requeued");
    let b1 = claim("j2", "j2-a1", "r2", 8);
    h.ledger_claim(&b1, 3_100, 5_100);
    check(&h.build(), "single-owner", &[]);

    let (mut h, a1) = start();
    h.submit("j2", "prod", 950);
    h.expire(&a1, 3_000, 3_000, "requeued");
    h.ledger_claim(&b1, 3_100, 5_100);
    h.heartbeat(&a1, 3_200, 2_900, Accepted, Some(5_200)); // revived: holds prod again
    check(&h.build(), "single-owner", &["two-jobs-one-key"]);
}

#[test]
fn single_owner_ignores_a_claim_received_before_the_result_that_released_its_key() {
    let (mut h, a1) = start();
    h.submit("j2", "prod", 950);
    h.result(&a1, 1_500, 1_500, "succeeded", Accepted, None);
    h.ledger_claim(&claim("j2", "j2-a1", "r2", 8), 1_499, 3_499);
    check(&h.build(), "single-owner", &[]);
}

#[test]
fn fence_order_reuse_decrease_and_mismatched_reports() {
    let (mut h, a1) = start();
    h.submit("j2", "stage", 950);
    h.expire(&a1, 3_010, 3_000, "uncertain");
    h.reconcile(&a1, 3_100, "stopped", None);
    h.ledger_claim(&claim("j1", "j1-a2", "r2", 6), 3_200, 5_200);
    h.ledger_claim(&claim("j2", "j2-a1", "r3", 6), 3_300, 5_300);
    check(&h.build(), "fence-order", &["fence-not-increasing", "fence-reused"]);

    let (mut h, a1) = start();
    h.heartbeat(&claim("j1", "j1-a1", "r1", 9), 1_500, 1_500, Accepted, Some(3_500));
    h.result(&claim("j1", "j1-a1", "r9", 7), 1_600, 1_600, "succeeded", Accepted, None);
    let anomalies = check(&h.build(), "fence-order", &["report-claim-mismatch", "report-claim-mismatch"]);
    assert!(anomalies[0].message.contains("fence 9 instead of 7"), "{}", anomalies[0].message);
    assert!(anomalies[1].message.contains("runner r9 instead of r1"), "{}", anomalies[1].message);
    let _ = a1;
}

#[test]
fn fence_order_catches_a_report_matched_by_bare_fence_across_jobs() {
    let (mut h, _a1) = start();
    h.submit("j2", "stage", 950);
    let b1 = claim("j2", "j2-a1", "r2", 8);
    h.ledger_claim(&b1, 1_100, 3_100);
    // j2's runner reports against j1 with its own fence 8 >= 7: accepted under unscoped-fence.
    h.result(&claim("j1", "j2-a1", "r2", 8), 1_500, 1_500, "failed", Accepted, None);
    check(&h.build(), "fence-order", &["report-claim-mismatch"]);
}

#[test]
fn terminal_stability_replaced_outcome_and_final_differs() {
    let (mut h, a1) = start();
    h.result(&a1, 1_200, 1_200, "succeeded", Accepted, None);
    h.result(&a1, 1_300, 1_300, "failed", Accepted, None);
    h.final_state("j1", Some("j1-a1"), "failed");
    check(&h.build(), "terminal-stability", &["committed-outcome-replaced", "final-differs-from-commit"]);
}

#[test]
fn terminal_stability_conflict_and_duplicate_answered_wrongly() {
    let (mut h, a1) = start();
    h.result(&a1, 1_200, 1_200, "succeeded", Accepted, None);
    h.result(&a1, 1_300, 1_300, "failed", Rejected, Some(Reason::NotCurrent)); // should be a conflict
    h.result(&a1, 1_400, 1_400, "succeeded", Rejected, Some(Reason::NotCurrent)); // should be a duplicate
    h.result(&a1, 1_500, 1_500, "succeeded", Duplicate, None);
    h.result(&a1, 1_600, 1_600, "failed", Conflict, None);
    h.final_state("j1", Some("j1-a1"), "succeeded");
    check(&h.build(), "terminal-stability", &["conflict-not-recorded", "duplicate-not-acknowledged"]);
}

#[test]
fn explicit_uncertainty_requeue_and_reclaim_without_reconcile() {
    let (mut h, a1) = start();
    h.expire(&a1, 3_010, 3_000, "requeued");
    h.ledger_claim(&claim("j1", "j1-a2", "r2", 8), 3_100, 5_100);
    let anomalies = check(&h.build(), "explicit-uncertainty", &["expiry-not-uncertain", "reclaimed-without-reconcile"]);
    assert_eq!(anomalies[1].attempts, ["j1-a1", "j1-a2"]);
    assert_eq!(anomalies[1].fences, [7, 8]);
}

#[test]
fn clock_authority_accepts_on_the_runners_clock() {
    for f in [Op::Heartbeat, Op::Capability, Op::Result] {
        let (mut h, a1) = start();
        match f {
            Op::Heartbeat => drop(h.heartbeat(&a1, 3_200, 2_900, Accepted, Some(5_200))),
            Op::Capability => drop(h.capability(&a1, 3_200, 2_900, Accepted, Some(3_000))),
            _ => drop(h.result(&a1, 3_200, 2_900, "succeeded", Accepted, None)),
        }
        let anomalies = check(&h.build(), "clock-authority", &["runner-clock-trusted"]);
        assert!(anomalies[0].message.contains("runner's clock, which said 2900 ms"), "{}", anomalies[0].message);
    }
    // Past the lease on both clocks: not a clock-authority anomaly (heartbeat-resurrection's).
    let (mut h, a1) = start();
    h.heartbeat(&a1, 3_200, 3_100, Accepted, Some(5_200));
    check(&h.build(), "clock-authority", &[]);
}

#[test]
fn clock_authority_split_clock_between_replicas() {
    // A replica whose clock is 30 s behind the others decides the second heartbeat.
    let (mut h, a1) = start();
    h.heartbeat(&a1, 1_500, 1_500, Accepted, Some(3_500));
    h.heartbeat(&a1, 1_600 - 30_000, 1_600, Accepted, Some(3_600 - 30_000));
    h.heartbeat(&a1, 1_700, 1_700, Accepted, Some(3_700));
    let anomalies = check(&h.build(), "clock-authority", &["split-clock"]);
    assert!(anomalies[0].message.contains("29900 ms before entry 3"), "{}", anomalies[0].message);
    // Decided out of receipt order by less than a lease: one clock.
    let (mut h, a1) = start();
    h.heartbeat(&a1, 1_500, 1_500, Accepted, Some(3_500));
    h.heartbeat(&a1, 1_500 - 1_900, 1_600, Accepted, Some(3_600 - 1_900));
    check(&h.build(), "clock-authority", &[]);
}

#[test]
fn stale_side_effect_on_fenced_and_unfenced_targets() {
    for mode in ["fenced", "unfenced"] {
        let (mut h, a1) = start();
        h.config(mode);
        let a2 = claim("j1", "j1-a2", "r2", 8);
        h.step(&a1, 1_100, Accepted, None);
        h.step(&a2, 3_300, Accepted, None);
        h.step(&a1, 3_310, Accepted, None);
        h.step(&a1, 3_320, Accepted, None); // the same stale attempt: reported once
        let expected = if mode == "fenced" { "stale-step-applied" } else { "stale-step-applied-unfenced-target" };
        // A1's lease ended at 3000 too: its late step is also one after its lease.
        let late = if mode == "fenced" { "step-after-lease" } else { "step-after-lease-unfenced-target" };
        let anomalies = check(&h.build(), "stale-side-effect", &[expected, late]);
        assert_eq!(anomalies[0].fences, [7, 8]);
        assert_eq!(mode == "unfenced", anomalies[0].message.contains("residual risk of an unfenced target"));
    }
}

#[test]
fn stale_side_effect_a_step_applied_after_its_lease_ended() {
    for mode in ["fenced", "unfenced"] {
        // A1's lease ends at 3000; its step lands at 3100, no newer fence on the key.
        let (mut h, a1) = start();
        h.config(mode);
        h.capability(&a1, 1_100, 1_100, Accepted, Some(3_000));
        let late = h.step(&a1, 3_100, Accepted, None);
        h.step(&a1, 3_200, Accepted, None); // the same attempt: reported once
        let expected = if mode == "fenced" { "step-after-lease" } else { "step-after-lease-unfenced-target" };
        let anomalies = check(&h.build(), "stale-side-effect", &[expected]);
        assert!(anomalies[0].events.contains(&late), "{:?}", anomalies[0]);
        // The builder's events are a microsecond apart, not on the records' clocks: only the
        // records' own readings and their gap are this history's (instants.rs pins the rest).
        let message = &anomalies[0].message;
        assert!(message.contains("(target clock 3100 ms), 100 ms after its lease ended at "), "{message}");
        assert!(message.contains(" (server clock 3000 ms)"), "{message}");
    }
    // Renewed before the step, refused, or within the clocks' tolerance: nothing.
    let (mut h, a1) = start();
    h.heartbeat(&a1, 2_000, 2_000, Accepted, Some(4_000));
    h.step(&a1, 3_100, Accepted, None);
    h.step(&a1, 4_500, Rejected, Some(Reason::Expired));
    h.step(&a1, 4_000 + checkers::stale_side_effect::CLOCK_TOLERANCE_MS, Accepted, None);
    check(&h.build(), "stale-side-effect", &[]);
    // A renewal received after the step does not excuse it.
    let (mut h, a1) = start();
    h.step(&a1, 3_100, Accepted, None);
    h.heartbeat(&a1, 3_150, 3_150, Accepted, Some(5_150));
    check(&h.build(), "stale-side-effect", &["step-after-lease"]);
}

#[test]
fn lost_work_missing_job_lost_result_and_unsettled_job() {
    let (mut h, a1) = start();
    h.submit("j2", "stage", 950);
    h.submit("j3", "other", 960);
    h.result(&a1, 1_200, 1_200, "succeeded", Accepted, None);
    h.nemesis_restart();
    h.final_state("j1", Some("j1-a1"), "running");
    h.final_state("j3", None, "queued");
    check(
        &h.build(),
        "lost-work",
        &["acknowledged-job-missing", "acknowledged-result-lost", "not-settled", "not-settled", "job-wedged"],
    );
}

/// The verdict of one checker alone.
fn verdict_of(events: &[Event], checker: &str) -> checkers::Verdict {
    checkers::check_one(checker, events).expect("a checker").verdict
}

/// j1 on `prod` expired at 3050 and left `running`; j2 queued behind it on `prod`; the
/// recovery limit passed with both unsettled.
fn wedged_by_expiry() -> (H, C, u64) {
    let (mut h, a1) = start();
    h.submit("j2", "prod", 950);
    let expired = h.expire(&a1, 3_050, 3_000, "uncertain");
    h.recovery_unsettled("2 of 2 jobs were not terminal after the 30000 ms recovery limit: j1 (running), j2 (queued)");
    (h, a1, expired)
}

#[test]
fn lost_work_a_running_job_whose_attempt_expired_is_wedged_after_recovery() {
    let (mut h, _, expired) = wedged_by_expiry();
    h.final_state("j1", Some("j1-a1"), "running");
    let queued = h.final_state("j2", None, "queued");
    let events = h.build();
    let anomalies = check(&events, "lost-work", &["job-wedged"]);
    let wedged = &anomalies[0];
    assert_eq!((wedged.job.as_deref(), wedged.key.as_deref()), (Some("j1"), Some("prod")));
    assert_eq!((wedged.attempts.clone(), wedged.fences.clone()), (vec!["j1-a1".to_string()], vec![7]));
    assert!(wedged.events.contains(&expired) && wedged.events.contains(&queued), "{wedged:?}");
    for words in
        ["ended `running` after recovery", "expired its current attempt j1-a1 (fence 7) at", "j2 stayed queued"]
    {
        assert!(wedged.message.contains(words), "{words}: {}", wedged.message);
    }
    // The same records, the final state against the ledger's: uncertain, not running.
    let anomalies = check(&events, "rules-model", &["final-not-the-ledgers"]);
    assert!(anomalies[0].message.contains("ended `running` but its ledger replays to `uncertain`"), "{anomalies:?}");
}

#[test]
fn lost_work_a_backlog_still_moving_at_the_recovery_limit_is_unknown() {
    // j1's attempt renewed its lease and is open; j2 waits behind it: nothing is wedged.
    let (mut h, a1) = start();
    h.submit("j2", "prod", 950);
    h.heartbeat(&a1, 2_000, 2_000, Accepted, Some(4_000));
    h.step(&a1, 2_100, Accepted, None);
    h.recovery_unsettled("2 of 2 jobs were not terminal after the 30000 ms recovery limit");
    h.final_state("j1", Some("j1-a1"), "running");
    h.final_state("j2", None, "queued");
    let events = h.build();
    let verdict = verdict_of(&events, "lost-work");
    assert!(
        matches!(&verdict, checkers::Verdict::Unknown { reason } if reason.contains("the run did not complete")
            && reason.contains("j1-a1 (fence 7) claimed at 0.") && reason.contains("its last step at 0.")
            && reason.contains("no expiry of it is recorded")),
        "{verdict:?}"
    );
    check(&events, "rules-model", &[]);
}

#[test]
fn lost_work_an_expiry_undone_by_an_accepted_heartbeat_leaves_the_attempt_live() {
    // The ledger revived j1-a1 (a heartbeat accepted after its expiry): rules-model judges
    // that heartbeat; the job is not wedged, its attempt being live as far as the ledger says.
    let (mut h, a1, _) = wedged_by_expiry();
    h.heartbeat(&a1, 3_100, 3_100, Accepted, Some(5_100));
    h.final_state("j1", Some("j1-a1"), "running");
    h.final_state("j2", None, "queued");
    assert!(matches!(verdict_of(&h.build(), "lost-work"), checkers::Verdict::Unknown { .. }));
}

#[test]
fn lost_work_an_uncertain_job_is_the_operators_but_one_whose_attempt_closed_is_wedged() {
    // Expired and uncertain: an operator's reconcile settles it; not wedged.
    let (mut h, _, _) = wedged_by_expiry();
    h.final_state("j1", Some("j1-a1"), "uncertain");
    h.final_state("j2", None, "queued");
    assert!(matches!(verdict_of(&h.build(), "lost-work"), checkers::Verdict::Unknown { .. }));
    // Closed by its own result, yet shown uncertain: nothing can reconcile it.
    let (mut h, a1) = start();
    h.result(&a1, 1_200, 1_200, "succeeded", Accepted, None);
    h.recovery_unsettled("1 of 1 jobs were not terminal after the 30000 ms recovery limit");
    h.final_state("j1", Some("j1-a1"), "uncertain");
    let anomalies = check(&h.build(), "lost-work", &["job-wedged", "acknowledged-result-lost"]);
    let wedged = anomalies.iter().find(|anomaly| anomaly.kind == "job-wedged").unwrap();
    assert!(wedged.message.contains("closed its current attempt"), "{}", wedged.message);
}

#[test]
fn lost_work_an_open_attempt_without_a_lease_is_not_accused() {
    // A system that grants no lease (an observed Buildbot): its build is open in the
    // ledger; nothing there says it stopped, so the job stays unjudged.
    let mut h = H::new();
    h.config_lacking(&["lease", "runner_log"]);
    let a1 = claim("j1", "j1-b1", "r1", 1);
    h.submit("j1", "prod", 900);
    let mut entry =
        Event::new(0, Process::CONTROL_PLANE, EventType::Ledger, Op::Claim).with_claim("j1", "j1-b1", "r1", 1);
    entry.received_ms = Some(1_000);
    entry.decision = Some(Accepted);
    h.ledger(entry);
    h.recovery_unsettled("1 of 1 jobs were not terminal after the 30000 ms recovery limit: j1 (running)");
    h.final_state("j1", Some(&a1.attempt), "running");
    let events = h.build();
    let verdict = verdict_of(&events, "lost-work");
    let checkers::Verdict::Unknown { reason } = &verdict else { panic!("{verdict:?}") };
    for words in [
        "leaves open the current attempts",
        "j1-b1 (fence 1) claimed at 0.000 s, no step on the target",
        "grants no lease",
    ] {
        assert!(reason.contains(words), "{words}: {reason}");
    }
    assert!(matches!(verdict_of(&events, "rules-model"), checkers::Verdict::Unknown { .. }));
}

#[test]
fn lost_work_a_wedged_job_in_a_run_that_settled_is_also_not_settled() {
    let (mut h, a1) = start();
    h.expire(&a1, 3_050, 3_000, "uncertain");
    h.final_state("j1", Some("j1-a1"), "running");
    let anomalies = check(&h.build(), "lost-work", &["not-settled", "job-wedged"]);
    let wedged = anomalies.iter().find(|anomaly| anomaly.kind == "job-wedged").unwrap();
    assert!(wedged.message.contains("ended `running` at the end"), "{}", wedged.message);
}

#[test]
fn rules_model_compares_every_final_state_with_the_ledger_complete_run_or_not() {
    // Queued in the final state while the ledger has it claimed and running.
    let (mut h, _) = start();
    h.recovery_unsettled("1 of 1 jobs were not terminal after the 30000 ms recovery limit");
    h.final_state("j1", Some("j1-a1"), "queued");
    let anomalies = check(&h.build(), "rules-model", &["final-not-the-ledgers"]);
    assert!(anomalies[0].message.contains("ended `queued` but its ledger replays to `running`"), "{anomalies:?}");
    // Uncertain in the final state with no expiry in the ledger.
    let (mut h, _) = start();
    h.final_state("j1", Some("j1-a1"), "uncertain");
    check(&h.build(), "rules-model", &["final-not-the-ledgers"]);
    // The job agrees, its attempt does not: shown running after the ledger expired it.
    let (mut h, _, _) = wedged_by_expiry();
    h.final_with_attempts("j1", Some("j1-a1"), "uncertain", &[("j1-a1", "running")]);
    h.final_state("j2", None, "queued");
    let anomalies = check(&h.build(), "rules-model", &["final-attempt-not-the-ledgers"]);
    assert!(anomalies[0].message.contains("j1-a1 (fence 7) ended `running` but its ledger left it `uncertain`"));
    // A job the ledger never named is judged only when its final state is terminal.
    let (mut h, a1) = start();
    h.final_state("j9", None, "queued");
    check(&finish(h, &a1), "rules-model", &[]);
}

#[test]
fn ledger_completeness_a_report_sent_with_another_runners_token_applied() {
    // r2 reports r1's claim as failed with its own token; the ledger records it as r1's.
    let (mut h, a1) = start();
    let sent = h.nemesis_result(&a1, "failed", "r2");
    let applied = h.ledger_report(Op::Result, &a1, 1_150, 1_150, Accepted, None, Some("failed"), None, None);
    h.result(&a1, 1_200, 1_200, "succeeded", Conflict, None);
    h.final_state("j1", Some("j1-a1"), "failed");
    let anomalies = check(&h.build(), "ledger-completeness", &["foreign-report-applied"]);
    assert!(anomalies[0].events.contains(&sent), "{:?}", anomalies[0]);
    assert!(anomalies[0].message.contains("another runner's token"), "{}", anomalies[0].message);
    let _ = applied;
    // Refused unrecorded, as the contract says: nothing to report.
    let (mut h, a1) = start();
    h.nemesis_result(&a1, "failed", "r2");
    crate::all_valid(&finish(h, &a1));
    // The claim's own runner's token: a resend like any other (a duplicate, counted as sent).
    let (mut h, a1) = start();
    h.nemesis_result(&a1, "succeeded", "r1");
    h.capability(&a1, 1_100, 1_100, Accepted, Some(3_000));
    h.step(&a1, 1_110, Accepted, None);
    h.result(&a1, 1_200, 1_200, "succeeded", Accepted, None);
    h.ledger_report(Op::Result, &a1, 1_250, 1_250, Duplicate, None, Some("succeeded"), None, None);
    h.final_state("j1", Some("j1-a1"), "succeeded");
    check(&h.build(), "ledger-completeness", &[]);
}

#[test]
fn ledger_completeness_counts_a_borrowed_claims_reports_by_their_kind() {
    // r2 presents r1's attempt under its own id: a heartbeat and a capability request, each
    // refused and recorded. Each is a sent report of its own kind, so the ledger holds no
    // more heartbeats or capabilities than were sent; counted as results they would be.
    let borrowed = |h: &mut H| {
        let b = claim("j1", "j1-a1", "r2", 7);
        for report in [Op::Heartbeat, Op::Capability] {
            h.nemesis_borrowed(&b, report);
            h.ledger_report(report, &b, 1_050, 1_050, Rejected, Some(Reason::NotCurrent), None, None, None);
        }
    };
    let (mut h, a1) = start();
    borrowed(&mut h);
    check(&finish(h, &a1), "ledger-completeness", &[]);
    // The same history with the reports' kind left out reads them as results.
    let (mut h, a1) = start();
    borrowed(&mut h);
    let mut events = finish(h, &a1);
    for event in events.iter_mut().filter(|event| event.process == Process::NEMESIS) {
        event.value = Some(serde_json::json!({ "token_of": "r2" }));
    }
    check(&events, "ledger-completeness", &["applied-more-than-sent", "applied-more-than-sent"]);
}

#[test]
fn ledger_completeness_an_entry_recorded_before_its_runner_sent_anything_is_no_ones() {
    // r2 reports r1's claim with its own token and the ledger records it; r1's own result
    // goes out later and never gets an answer: counted over the whole run the two match,
    // but the entry was there before r1 had sent a report.
    let (mut h, a1) = start();
    h.nemesis_result(&a1, "failed", "r2");
    h.ledger_report(Op::Result, &a1, 1_150, 1_150, Accepted, None, Some("failed"), None, None);
    for observed_ms in [1_300, 1_400] {
        let mut unanswered =
            Event::new(0, Process::runner("r1"), EventType::Request, Op::Result).with_claim("j1", "j1-a1", "r1", 1);
        unanswered.outcome = Some("failed".into());
        unanswered.observed_ms = Some(observed_ms);
        h.push(unanswered.clone());
        h.push(Event { kind: EventType::Info, reason: Some("no answer".into()), ..unanswered });
    }
    h.final_state("j1", Some("j1-a1"), "failed");
    let anomalies = check(&h.build(), "ledger-completeness", &["foreign-report-applied"]);
    assert!(anomalies[0].message.contains("when its runner had sent 0"), "{}", anomalies[0].message);
}

#[test]
fn ledger_completeness_entries_committed_out_of_receipt_order_are_no_finding() {
    // A submit received first commits after r1's capability: in `seq` order the capability's
    // entry takes the submit's slot, ahead of r1's request. Its receipt is still after it.
    let (mut h, a1) = start();
    let slot = h.len();
    h.submit("j2", "other", 1_050);
    let submit_seq = h.seq_at(slot).unwrap();
    h.capability(&a1, 1_100, 1_100, Accepted, Some(3_000));
    h.swap_seq_with_next_ledger(slot);
    h.answer_names(submit_seq);
    check(&finish(h, &a1), "ledger-completeness", &[]);
}

#[test]
fn ledger_completeness_answer_without_its_entry() {
    let (mut h, a1) = start();
    // ack-before-commit: the answer names seq N, the ledger gave N to the next entry.
    let next = h.len();
    h.answer(Op::Result, &a1, 1_200, Some("succeeded"), Accepted, 3);
    h.heartbeat(&a1, 1_300, 1_300, Rejected, None);
    h.answer(Op::Heartbeat, &a1, 1_400, None, Accepted, 42);
    h.final_state("j1", Some("j1-a1"), "uncertain");
    let anomalies =
        check(&h.build(), "ledger-completeness", &["answer-differs-from-ledger", "answer-missing-from-ledger"]);
    assert!(anomalies.iter().any(|anomaly| anomaly.events.contains(&(next + 1))));
}

#[test]
fn ledger_completeness_a_claim_granted_twice_for_one_request() {
    // r1 asked once and was told j1-a1; the ledger also granted it j2-a1 — a claim
    // transaction run again after its COMMIT's answer was lost.
    let twice = |h: &mut H| {
        h.submit("j2", "stage", 950);
        h.ledger_claim_untold(&claim("j2", "j2-a1", "r1", 8), 1_001, 3_001)
    };
    let (mut h, a1) = start();
    let untold = twice(&mut h);
    let anomalies = check(&finish(h, &a1), "ledger-completeness", &["applied-more-than-sent"]);
    assert_eq!(anomalies[0].events, vec![untold]);
    assert!(anomalies[0].message.contains("r1 1 attempt it was never told of (j2-a1) when only 0 of its 1"));
    // One of r1's claims went unanswered: that one may have made j2-a1.
    let (mut h, a1) = start();
    h.runner_claim_unanswered("r1");
    twice(&mut h);
    check(&finish(h, &a1), "ledger-completeness", &[]);
    // A scenario played j2-a1's claim as r1 and was granted it: told, though not in r1's log.
    let (mut h, a1) = start();
    twice(&mut h);
    let mut played = Event::new(0, Process::SCENARIO, EventType::Ok, Op::Claim).with_claim("j2", "j2-a1", "r1", 8);
    played.key = Some("stage".into());
    h.push(played);
    check(&finish(h, &a1), "ledger-completeness", &[]);
}

#[test]
fn ledger_completeness_judges_no_runner_whose_log_is_missing() {
    // r2's log was not gathered (evidence from r1 alone): its claim and heartbeat in the
    // ledger have no requests to be counted against, which says nothing of them.
    let (mut h, a1) = start();
    let b = claim("j2", "j2-a1", "r2", 8);
    h.submit("j2", "stage", 950);
    h.ledger_claim_untold(&b, 1_001, 3_001);
    h.ledger_report(Op::Heartbeat, &b, 1_500, 1_500, Accepted, None, None, Some(3_500), None);
    check(&finish(h, &a1), "ledger-completeness", &[]);
}

/// Issue 39: the nemesis's own reports are answered like a runner's, and each answer is held
/// against the ledger: an acknowledged duplicate is an entry.
#[test]
fn ledger_completeness_the_nemesis_answers_are_held_against_the_ledger() {
    // A replay of j1-a1's accepted result: recorded as a duplicate, answered with its entry.
    let replayed = |h: &mut H, a1: &C| {
        h.capability(a1, 1_100, 1_100, Accepted, Some(3_000));
        h.step(a1, 1_110, Accepted, None);
        let accepted = h.result(a1, 1_200, 1_200, "succeeded", Accepted, None);
        h.nemesis_result(a1, "succeeded", "r1");
        accepted
    };
    let (mut h, a1) = start();
    replayed(&mut h, &a1);
    let duplicate = h.ledger_report(Op::Result, &a1, 1_300, 1_300, Duplicate, None, Some("succeeded"), None, None);
    h.nemesis_answer(&a1, Op::Result, "r1", Ok((Duplicate, duplicate)));
    h.final_state("j1", Some("j1-a1"), "succeeded");
    crate::all_valid(&h.build());
    // Acknowledged with no entry of its own, naming the accepted result's entry.
    let (mut h, a1) = start();
    let accepted = replayed(&mut h, &a1);
    let answer = h.nemesis_answer(&a1, Op::Result, "r1", Ok((Duplicate, accepted)));
    h.final_state("j1", Some("j1-a1"), "succeeded");
    let anomalies = check(&h.build(), "ledger-completeness", &["answer-missing-from-ledger"]);
    assert_eq!(anomalies[0].events, [answer]);
    let said = &anomalies[0].message;
    assert!(said.starts_with("the nemesis was answered `duplicate` to a result for j1-a1"), "{said}");
    assert!(said.contains("no entry of its own"), "{said}");
    // Naming it before any other answer did (the runner's was lost): the entry says
    // `accepted`, not `duplicate`.
    let (mut h, a1) = start();
    h.capability(&a1, 1_100, 1_100, Accepted, Some(3_000));
    h.step(&a1, 1_110, Accepted, None);
    let mut sent =
        Event::new(0, Process::runner("r1"), EventType::Request, Op::Result).with_claim("j1", "j1-a1", "r1", 7);
    sent.outcome = Some("succeeded".into());
    h.push(sent.clone());
    let accepted = h.ledger_report(Op::Result, &a1, 1_200, 1_200, Accepted, None, Some("succeeded"), None, None);
    h.push(Event { kind: EventType::Info, reason: Some("no answer from http://cp: timed out".into()), ..sent });
    h.nemesis_result(&a1, "succeeded", "r1");
    h.nemesis_answer(&a1, Op::Result, "r1", Ok((Duplicate, accepted)));
    h.final_state("j1", Some("j1-a1"), "succeeded");
    check(&h.build(), "ledger-completeness", &["answer-differs-from-ledger"]);
    // ... or naming an entry the ledger never holds.
    let (mut h, a1) = start();
    replayed(&mut h, &a1);
    h.nemesis_answer(&a1, Op::Result, "r1", Ok((Duplicate, 0)));
    h.final_state("j1", Some("j1-a1"), "succeeded");
    check(&h.build(), "ledger-completeness", &["answer-missing-from-ledger"]);
    // Without the runners' logs the rule is not judged: unknown, never valid.
    let (mut h, a1) = start();
    replayed(&mut h, &a1);
    h.nemesis_answer(&a1, Op::Result, "r1", Ok((Duplicate, 0)));
    h.final_state("j1", Some("j1-a1"), "succeeded");
    let keep = [history::Source::Ledger, history::Source::Nemesis].into_iter().collect();
    let result = checkers::check_one("ledger-completeness", &history::cut(&h.build(), &keep)).unwrap();
    assert!(matches!(result.verdict, checkers::Verdict::Unknown { .. }), "{result:?}");
}

/// Issue 39: an answered refusal of any code is a ruling the ledger keeps. A report of a
/// claim answered with an error the contract does not answer reports with, or with one of
/// the errors before a ruling where the history shows it untrue, was decided and kept nowhere.
#[test]
fn ledger_completeness_a_refusal_of_any_code_is_a_ruling_kept_somewhere() {
    let refused = |sender: &str, report: Op, said: &str| {
        let (mut h, a1) = start();
        let b = claim("j1", "j1-a1", "r2", 7);
        match sender {
            "runner" => {
                let mut request =
                    Event::new(0, Process::runner("r1"), EventType::Request, report).with_claim("j1", "j1-a1", "r1", 7);
                request.outcome = (report == Op::Result).then(|| "failed".to_string());
                h.push(request.clone());
                h.push(Event { kind: EventType::Response, reason: Some(said.into()), ..request });
            }
            "borrowed" => {
                h.nemesis_borrowed(&b, report);
                h.nemesis_answer(&b, report, "r2", Err(said));
            }
            _ => {
                h.nemesis_result(&a1, "failed", "r2");
                h.nemesis_answer(&a1, report, "r2", Err(said));
            }
        }
        let mut kinds: Vec<String> = match checkers::check_one("ledger-completeness", &finish(h, &a1)).unwrap().verdict
        {
            checkers::Verdict::Invalid { anomalies } => anomalies.into_iter().map(|anomaly| anomaly.kind).collect(),
            _ => Vec::new(),
        };
        kinds.dedup();
        kinds
    };
    let gone = "410 stale_report: the attempt no longer takes results";
    assert_eq!(refused("runner", Op::Result, gone), ["result-not-ruled"]);
    assert_eq!(refused("borrowed", Op::Result, gone), ["result-not-ruled"]);
    assert_eq!(refused("borrowed", Op::Heartbeat, "422 late_heartbeat: too late"), ["report-not-ruled"]);
    assert_eq!(refused("runner", Op::Capability, "409 expired: the lease ended"), ["report-not-ruled"]);
    assert_eq!(
        refused("runner", Op::Result, "unexpected answer 410 from http://cp/v1/result: gone"),
        ["result-not-ruled"]
    );
    // Errors before a ruling that the history shows untrue.
    assert_eq!(refused("runner", Op::Result, "403 forbidden: not yours"), ["result-not-ruled"]);
    assert_eq!(refused("borrowed", Op::Result, "403 runner_mismatch: not r2"), ["result-not-ruled"]);
    assert_eq!(refused("runner", Op::Result, "404 unknown_job: no job j1 in demo"), ["result-not-ruled"]);
    // The contract's own answers: another runner's token, a body it refuses, no decision made.
    assert!(refused("impersonated", Op::Result, "403 runner_mismatch: token belongs to r2").is_empty());
    assert!(refused("runner", Op::Result, "400 invalid_field: fence").is_empty());
    assert!(refused("runner", Op::Result, "401 unauthorized: the bearer token is not known").is_empty());
    assert!(refused("borrowed", Op::Result, "500 internal: the store failed").is_empty());
    assert!(refused("runner", Op::Heartbeat, "503 unavailable: no database").is_empty());
    // A job the ledger does not hold in the runner's project: `unknown_job` is the answer.
    let (mut h, a1) = start();
    let mut request =
        Event::new(0, Process::runner("r1"), EventType::Request, Op::Result).with_claim("j9", "j9-a1", "r1", 7);
    request.outcome = Some("failed".into());
    h.push(request.clone());
    h.push(Event { kind: EventType::Response, reason: Some("404 unknown_job: no job j9".into()), ..request });
    check(&finish(h, &a1), "ledger-completeness", &[]);
}

/// Issue 39: the operator's reconcile answers are held against the ledger too: the entry the
/// answer names, or (when it names none) a reconcile entry of its attempt with its finding.
#[test]
fn ledger_completeness_the_operators_reconciles_are_held_against_the_ledger() {
    let answered = |seq: Option<u64>, recorded: bool| {
        let (mut h, a1) = start();
        h.expire(&a1, 3_050, 3_000, "uncertain");
        let mut op =
            Event::new(0, Process::OPERATOR, EventType::Invoke, Op::Reconcile).with_claim("j1", "j1-a1", "r1", 7);
        op.outcome = Some("stopped".into());
        h.push(op.clone());
        if recorded {
            let mut entry = Event::new(0, Process::CONTROL_PLANE, EventType::Ledger, Op::Reconcile)
                .with_claim("j1", "j1-a1", "r1", 7);
            entry.key = Some("prod".into());
            entry.received_ms = Some(3_100);
            entry.outcome = Some("stopped".into());
            h.ledger(entry);
        }
        let mut ok = Event { kind: EventType::Ok, ..op };
        ok.value = seq.map(|seq| serde_json::json!({ "ledger_seq": seq }));
        h.push(ok);
        h.final_state("j1", Some("j1-a1"), "queued");
        h.build()
    };
    // Submit 1, claim 2, expire 3, reconcile 4.
    check(&answered(Some(4), true), "ledger-completeness", &[]);
    check(&answered(None, true), "ledger-completeness", &[]);
    let anomalies = check(&answered(Some(3), true), "ledger-completeness", &["answer-missing-from-ledger"]);
    assert!(anomalies[0].message.contains("ledger entry 3, which is no entry of its own"), "{}", anomalies[0].message);
    let anomalies = check(&answered(None, false), "ledger-completeness", &["answer-missing-from-ledger"]);
    assert!(
        anomalies[0].message.starts_with("the operator was answered the finding `stopped`"),
        "{}",
        anomalies[0].message
    );
    check(&answered(Some(4), false), "ledger-completeness", &["answer-missing-from-ledger"]);
}

/// Issue 39: every expiry the rules imply has its entry. A report refused (or a reconcile)
/// on a job whose current attempt's lease had ended, with no expiry before it in the ledger:
/// the transaction that decided it expired nothing, or dropped what it expired.
#[test]
fn rules_model_a_decision_on_a_lapsed_attempt_with_no_expiry_recorded() {
    // Refused as expired at 3050, the lease having ended at 3000: the expiry comes first.
    let (mut h, a1) = start();
    h.expire(&a1, 3_050, 3_000, "uncertain");
    h.heartbeat_refused(&a1, 3_050, 3_040, Reason::Expired);
    check(&h.build(), "rules-model", &[]);
    // Without it: the expiry the rules imply is missing, once per attempt.
    let (mut h, a1) = start();
    h.heartbeat_refused(&a1, 3_050, 3_040, Reason::Expired);
    h.heartbeat_refused(&a1, 3_060, 3_050, Reason::Expired);
    let anomalies = check(&h.build(), "rules-model", &["expiry-not-recorded"]);
    assert!(anomalies[0].message.contains("j1-a1 (fence 7)'s lease had ended"), "{}", anomalies[0].message);
    assert_eq!(anomalies[0].attempts, ["j1-a1"]);
    // A report naming j1 with another job's attempt decides on j1 all the same.
    let (mut h, _) = start();
    let a2 = claim("j2", "j2-a1", "r2", 8);
    h.submit("j2", "staging", 950);
    h.ledger_claim(&a2, 1_100, 3_100);
    let crossed = claim("j1", "j2-a1", "r2", 8);
    h.ledger_report(
        Op::Result,
        &crossed,
        3_050,
        3_050,
        Rejected,
        Some(Reason::NotCurrent),
        Some("succeeded"),
        None,
        Some("late_observation"),
    );
    let anomalies = check(&h.build(), "rules-model", &["expiry-not-recorded"]);
    assert_eq!(anomalies[0].attempts, ["j1-a1"]);
    // An accepted report on a lapsed lease is its own finding, not this one.
    let (mut h, a1) = start();
    h.heartbeat(&a1, 3_050, 3_050, Accepted, Some(5_050));
    check(&h.build(), "rules-model", &["heartbeat-accepted-wrongly"]);
    // A system that grants no lease has nothing to lapse.
    let mut h = H::new();
    h.config_lacking(&["lease"]);
    let a1 = claim("j1", "j1-a1", "r1", 7);
    h.submit("j1", "prod", 900);
    h.ledger_claim(&a1, 1_000, 3_000);
    h.heartbeat_refused(&a1, 3_050, 3_040, Reason::Expired);
    let result = checkers::check_one("rules-model", &h.build()).unwrap();
    let checkers::Verdict::Unknown { reason } = result.verdict else { panic!("{result:?}") };
    assert!(reason.contains("`expiry-not-recorded` needs the control plane's leases"), "{reason}");
}

#[test]
fn ledger_completeness_counts_the_stale_requests_a_fault_sends_at_its_heal() {
    // After j1-a1 closed, a pause's heal sends a heartbeat and a capability request for it in
    // r1's name (`value.report`, `value.stale`); each is refused and recorded. They are sent
    // reports of their kinds, and their answers are held against the ledger.
    let stale = |h: &mut H, a1: &C, answered_seq: Option<u64>| {
        for report in [Op::Heartbeat, Op::Capability] {
            let value = serde_json::json!({"variant": {"how": "pause"}, "token_of": "r1", "report": report.as_str(), "stale": true});
            let sent = Event::new(0, Process::NEMESIS, EventType::Invoke, Op::DelayedHeartbeats).with_claim(
                &a1.job,
                &a1.attempt,
                &a1.runner,
                a1.fence,
            );
            h.push(Event { value: Some(value.clone()), ..sent.clone() });
            let seq = h.ledger_report(report, a1, 1_300, 1_300, Rejected, Some(Reason::NotCurrent), None, None, None);
            let mut answer = Event { kind: EventType::Ok, value: Some(value), ..sent }
                .with_decision(Rejected, Some(Reason::NotCurrent));
            answer.value.as_mut().unwrap()["ledger_seq"] = serde_json::json!(answered_seq.unwrap_or(seq));
            h.push(answer);
        }
    };
    let run = |answered_seq: Option<u64>| {
        let (mut h, a1) = start();
        h.capability(&a1, 1_100, 1_100, Accepted, Some(3_000));
        h.step(&a1, 1_110, Accepted, None);
        h.result(&a1, 1_200, 1_200, "succeeded", Accepted, None);
        stale(&mut h, &a1, answered_seq);
        h.final_state("j1", Some("j1-a1"), "succeeded");
        h.build()
    };
    crate::all_valid(&run(None));
    // Answered naming an entry the ledger never holds.
    check(&run(Some(99)), "ledger-completeness", &["answer-missing-from-ledger", "answer-missing-from-ledger"]);
}

#[test]
fn stale_side_effect_a_step_applied_twice() {
    // The runner sent step 1 twice (its answer lost); the fenced target applied both.
    let (mut h, a1) = start();
    h.capability(&a1, 1_100, 1_100, Accepted, Some(3_000));
    h.runner_step_sent(&a1, 0);
    h.step_numbered(&a1, 1_110, 0, Accepted, None);
    h.runner_step_sent(&a1, 1);
    let first = h.step_numbered(&a1, 1_200, 1, Accepted, None);
    h.runner_step_sent(&a1, 1);
    let second = h.step_numbered(&a1, 1_500, 1, Accepted, None);
    h.step_numbered(&a1, 1_600, 1, Accepted, None); // a third time: reported once
    let anomalies = check(&h.build(), "stale-side-effect", &["step-applied-twice"]);
    assert_eq!(anomalies[0].events, [first, second], "{:?}", anomalies[0]);
    let message = &anomalies[0].message;
    assert!(message.contains("step 1 of j1-a1 a second time: r1 sent it 2 times by its own log"), "{message}");

    // Each step once, a refused re-send, and another attempt's same step: nothing.
    let (mut h, a1) = start();
    let a2 = claim("j1", "j1-a2", "r2", 8);
    h.step_numbered(&a1, 1_110, 0, Accepted, None);
    h.step_numbered(&a1, 1_120, 1, Accepted, None);
    h.step_numbered(&a1, 1_130, 1, Rejected, Some(Reason::Duplicate));
    h.step_numbered(&a2, 3_300, 0, Accepted, None);
    check(&h.build(), "stale-side-effect", &[]);

    // An idempotent target promises each step of a job once, across attempts.
    let (mut h, a1) = start();
    h.config("idempotent");
    let a2 = claim("j1", "j1-a2", "r2", 8);
    h.step_numbered(&a1, 1_110, 0, Accepted, None);
    h.step_numbered(&a2, 1_120, 0, Accepted, None);
    let anomalies = check(&h.build(), "stale-side-effect", &["step-applied-twice"]);
    assert!(
        anomalies[0].message.contains("an idempotent target applies each step of a job once"),
        "{}",
        anomalies[0].message
    );
}
