//! Each planted bug of the control plane breaks exactly the rule it names: the scenario's
//! protection holds on the correct lab and fails with the bug switched on. (The bugs that
//! need a process — `ack-before-commit`, `target-ignores-fence` — are in `processes.rs`.)

use history::Decision;
use lab::bugs::Bug;
use protocol::*;

use crate::world::{at, observed, on_every_store, World, LEASE_MS};

/// Runs `scenario` (true when the protection held) on the correct lab and with `bug` on.
fn breaks(bug: Bug, scenario: fn(&World) -> bool) {
    assert!(scenario(&World::new(&[])), "the correct lab broke the rule that `{bug}` removes");
    assert!(!scenario(&World::new(&[bug])), "switching on `{bug}` did not break its rule");
}

fn stale_completion_refused(world: &World) -> bool {
    let (r1, a1, _, a2) = world.superseded();
    let verdict = world.result(&r1, &a1, Outcome::Succeeded, LEASE_MS + 20);
    let view = world.view("j");
    verdict.decision == Decision::Rejected
        && view.state == JobState::Running
        && view.current_attempt == Some(a2.attempt)
}

fn expired_heartbeat_refused(world: &World) -> bool {
    let runner = world.runner("r1");
    world.submit("j", "k", 0);
    let claim = world.claim(&runner, 0).unwrap().claim;
    world.rules.expire(at(LEASE_MS + 1)).unwrap();
    let verdict = world.heartbeat(&runner, &claim, LEASE_MS + 100, observed(LEASE_MS + 100));
    verdict.decision == Decision::Rejected && world.view("j").state == JobState::Uncertain
}

on_every_store! {
    fn accept_stale_result_accepts_the_seeds_late_report() {
        breaks(Bug::AcceptStaleResult, stale_completion_refused);
    }

    fn blind_retry_on_zero_rows_accepts_the_seeds_late_report() {
        breaks(Bug::BlindRetryOnZeroRows, stale_completion_refused);
    }

    fn blind_retry_on_zero_rows_revives_an_expired_heartbeat() {
        breaks(Bug::BlindRetryOnZeroRows, expired_heartbeat_refused);
    }

    fn heartbeat_revives_expired_extends_a_lapsed_lease() {
        breaks(Bug::HeartbeatRevivesExpired, expired_heartbeat_refused);
    }

    fn requeue_on_expiry_returns_the_job_to_the_queue() {
        breaks(Bug::RequeueOnExpiry, |world| {
            let (r1, r2) = (world.runner("r1"), world.runner("r2"));
            world.submit("j", "prod", 0);
            world.claim(&r1, 0).unwrap();
            world.rules.expire(at(LEASE_MS)).unwrap();
            world.view("j").state == JobState::Uncertain && world.claim(&r2, LEASE_MS + 1).is_none()
        });
    }

    fn trust_runner_clock_lets_a_slow_clock_extend_the_lease() {
        breaks(Bug::TrustRunnerClock, |world| {
            let runner = world.runner("r1");
            world.submit("j", "k", 0);
            let claim = world.claim(&runner, 0).unwrap().claim;
            let verdict = world.heartbeat(&runner, &claim, 2 * LEASE_MS, observed(LEASE_MS / 2));
            verdict.decision == Decision::Rejected
        });
    }

    fn overwrite_terminal_result_replaces_the_committed_outcome() {
        breaks(Bug::OverwriteTerminalResult, |world| {
            let runner = world.runner("r1");
            world.submit("j", "k", 0);
            let claim = world.claim(&runner, 0).unwrap().claim;
            world.result(&runner, &claim, Outcome::Succeeded, 10);
            let verdict = world.result(&runner, &claim, Outcome::Failed, 20);
            verdict.decision == Decision::Conflict && world.view("j").outcome == Some(Outcome::Succeeded)
        });
    }

    fn unscoped_fence_accepts_another_attempts_report_with_a_higher_fence() {
        breaks(Bug::UnscopedFence, |world| {
            let (r1, r2) = (world.runner("r1"), world.runner("r2"));
            world.submit("j1", "k1", 0);
            world.submit("j2", "k2", 0);
            world.claim(&r1, 0).unwrap();
            let theirs = world.claim(&r2, 0).unwrap().claim;
            let crossed = ClaimRef { job: "j1".into(), ..theirs };
            let verdict = world.result(&r2, &crossed, Outcome::Succeeded, 10);
            verdict.decision == Decision::Rejected && world.view("j1").state == JobState::Running
        });
    }

    fn refuse_duplicate_result_refuses_an_identical_retry_as_late() {
        breaks(Bug::RefuseDuplicateResult, |world| {
            let runner = world.runner("r1");
            world.submit("j", "k", 0);
            let claim = world.claim(&runner, 0).unwrap().claim;
            world.result(&runner, &claim, Outcome::Succeeded, 10);
            let verdict = world.result(&runner, &claim, Outcome::Succeeded, 3 * LEASE_MS);
            verdict.decision == Decision::Duplicate
        });
    }

    fn self_reconcile_finds_an_expired_attempt_stopped_on_its_own() {
        breaks(Bug::SelfReconcile, |world| {
            let runner = world.runner("r1");
            world.submit("j", "k", 0);
            world.claim(&runner, 0).unwrap();
            world.rules.expire(at(LEASE_MS + 1)).unwrap();
            let view = world.view("j");
            let reconciled = view.ledger.iter().any(|entry| entry.kind == history::Op::Reconcile);
            view.state == JobState::Uncertain && !reconciled
        });
    }

    fn expiry_leaves_job_running_wedges_the_job_and_its_key() {
        breaks(Bug::ExpiryLeavesJobRunning, |world| {
            let (r1, r2) = (world.runner("r1"), world.runner("r2"));
            world.submit("j", "prod", 0);
            world.submit("next", "prod", 0);
            world.claim(&r1, 0).unwrap();
            world.rules.expire(at(LEASE_MS + 1)).unwrap();
            let view = world.view("j");
            let attempt_uncertain = view.attempts.iter().any(|attempt| attempt.state == AttemptState::Uncertain);
            attempt_uncertain && view.state == JobState::Uncertain && world.claim(&r2, LEASE_MS + 2).is_none()
        });
    }

    fn capability_outlives_lease_signs_a_capability_past_the_lease() {
        breaks(Bug::CapabilityOutlivesLease, |world| {
            let runner = world.runner("r1");
            world.submit("j", "k", 0);
            let claim = world.claim(&runner, 0).unwrap().claim;
            let request = CapabilityRequest { claim, observed_ms: 0 };
            let granted = world.rules.capability(&runner, &request, at(10)).unwrap();
            granted.capability.is_some_and(|capability| Some(capability.expires_ms) <= granted.lease_expires_ms)
        });
    }

    fn expire_early_expires_a_lease_before_it_ends() {
        breaks(Bug::ExpireEarly, |world| {
            let runner = world.runner("r1");
            world.submit("j", "k", 0);
            world.claim(&runner, 0).unwrap();
            world.rules.expire(at(LEASE_MS - 1)).unwrap();
            world.view("j").state == JobState::Running
        });
    }
}
