//! `progress`: refusals the record does not justify, successes nobody worked for, and runs
//! in which nothing succeeded.

use crate::builder::{claim, C, H};
use crate::check;
use history::Decision::{Accepted, Rejected};
use history::Reason;

#[test]
fn a_stale_fence_refusal_of_the_highest_fence_is_unjustified() {
    let mut h = H::new();
    h.submit("j1", "prod", 900);
    let a1 = claim("j1", "j1-a1", "r1", 7);
    h.ledger_claim(&a1, 1_000, 3_000);
    h.step(&a1, 1_100, Accepted, None);
    h.step(&a1, 1_200, Rejected, Some(Reason::StaleFence));
    h.result(&a1, 1_300, 1_300, "failed", Accepted, None);
    h.submit("j2", "prod", 1_400);
    let b1 = claim("j2", "j2-a1", "r1", 8);
    h.ledger_claim(&b1, 1_500, 3_500);
    h.step(&b1, 1_600, Accepted, None);
    h.step(&a1, 1_700, Rejected, Some(Reason::StaleFence)); // justified: 7 < 8
    h.result(&b1, 1_800, 1_800, "succeeded", Accepted, None);
    h.final_state("j1", Some("j1-a1"), "failed");
    h.final_state("j2", Some("j2-a1"), "succeeded");
    let anomalies = check(&h.build(), "progress", &["refusal-unjustified"]);
    assert!(anomalies[0].message.contains("highest fence applied on the key was 7"), "{}", anomalies[0].message);
}

#[test]
fn an_accepted_success_without_its_attempts_steps_is_work_nobody_did() {
    let mut h = H::new();
    h.submit("j1", "prod", 900);
    let a1 = claim("j1", "j1-a1", "r1", 7);
    h.ledger_claim(&a1, 1_000, 3_000);
    h.result(&a1, 1_300, 1_300, "succeeded", Accepted, None);
    h.final_state("j1", Some("j1-a1"), "succeeded");
    check(&h.build(), "progress", &["success-without-work"]);
}

#[test]
fn a_system_without_a_target_is_not_blamed_for_successes_without_steps() {
    let mut h = H::new();
    h.config_lacking(&["target"]);
    h.submit("j1", "prod", 900);
    let a1 = claim("j1", "j1-a1", "r1", 7);
    h.ledger_claim(&a1, 1_000, 3_000);
    h.result(&a1, 1_300, 1_300, "succeeded", Accepted, None);
    h.final_state("j1", Some("j1-a1"), "succeeded");
    check(&h.build(), "progress", &[]);
}

/// Three jobs, each on its own key, each claimed by r1 (fences 7, 8, 9).
fn three_claimed_jobs(h: &mut H) -> Vec<C> {
    let mut claims = Vec::new();
    for (number, fence) in [(1, 7), (2, 8), (3, 9)] {
        let job = format!("j{number}");
        h.submit(&job, &format!("k{number}"), 900);
        let c = claim(&job, &format!("{job}-a1"), "r1", fence);
        h.ledger_claim(&c, 1_000, 3_000);
        claims.push(c);
    }
    claims
}

#[test]
fn acknowledged_jobs_none_of_which_succeeded_are_no_progress() {
    let mut h = H::new();
    for c in three_claimed_jobs(&mut h) {
        let job = c.job.clone();
        h.step(&c, 1_100, Rejected, Some(Reason::BadSignature));
        h.result(&c, 1_300, 1_300, "failed", Accepted, None);
        h.final_state(&job, Some(&format!("{job}-a1")), "failed");
    }
    check(&h.build(), "progress", &["no-progress"]);
}

#[test]
fn an_interrupted_history_without_final_states_is_not_judged_for_progress() {
    let mut h = H::new();
    three_claimed_jobs(&mut h);
    let result = checkers::check_one("progress", &h.build()).unwrap();
    assert!(matches!(result.verdict, checkers::Verdict::Unknown { .. }), "{result:?}");
}

#[test]
fn a_target_revision_that_does_not_move_by_one_per_applied_step_is_named() {
    let mut h = H::new();
    h.submit("j1", "prod", 900);
    let a1 = claim("j1", "j1-a1", "r1", 7);
    h.ledger_claim(&a1, 1_000, 3_000);
    h.step(&a1, 1_100, Accepted, None);
    let mut events = h.build();
    let steps: Vec<usize> = (0..events.len()).filter(|&i| events[i].kind == history::EventType::Step).collect();
    // One applied step leaving the revision at 1 is right; at 0 it did not move.
    events[steps[0]].value = Some(serde_json::json!({"step": 0, "steps": 2, "revision": 1}));
    let result = checkers::check_one("progress", &events).unwrap();
    assert!(!format!("{result:?}").contains("revision-not-moved-by-one"), "{result:?}");
    events[steps[0]].value = Some(serde_json::json!({"step": 0, "steps": 2, "revision": 0}));
    let result = checkers::check_one("progress", &events).unwrap();
    assert!(format!("{result:?}").contains("revision-not-moved-by-one"), "{result:?}");
}
