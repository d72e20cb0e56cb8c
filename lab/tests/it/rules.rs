//! Every rule of the control plane at the store level, with the server's clock controlled.

use history::{Decision, Op, RecordedAs};
use protocol::*;

use crate::world::{at, observed, on_every_store, refused_code, World, LEASE_MS};

on_every_store! {
    fn fences_strictly_increase_across_attempts_and_jobs() {
        let (world, runner, first, second) = World::two_claims();
        world.rules.expire(at(LEASE_MS)).unwrap();
        world.reconcile("j1", &first.attempt, Finding::Stopped, None, LEASE_MS).unwrap();
        let retry = world.claim(&runner, LEASE_MS + 1).unwrap().claim;
        assert_eq!(retry.job, "j1");
        assert!(first.fence < second.fence && second.fence < retry.fence, "{first:?} {second:?} {retry:?}");
        assert_ne!(first.attempt, retry.attempt);
    }

    fn claim_never_hands_out_a_key_held_by_a_running_or_uncertain_attempt() {
        let world = World::new(&[]);
        let runner = world.runner("r1");
        world.submit("j1", "prod", 0);
        world.submit("j2", "prod", 0);
        world.submit("j3", "staging", 0);
        assert_eq!(world.claim(&runner, 0).unwrap().claim.job, "j1");
        assert_eq!(world.claim(&runner, 1).unwrap().claim.job, "j3", "prod is held by a running attempt");
        assert!(world.claim(&runner, 2).is_none());
        world.rules.expire(at(LEASE_MS + 5)).unwrap();
        assert_eq!(world.view("j1").state, JobState::Uncertain);
        assert!(world.claim(&runner, LEASE_MS + 6).is_none(), "prod is held by an uncertain attempt");
    }

    fn heartbeat_extends_only_the_current_unexpired_claim() {
        let (world, runner, claim) = World::claimed(&[]);
        let verdict = world.heartbeat(&runner, &claim, 900, observed(900));
        assert_eq!(verdict.decision, Decision::Accepted);
        assert_eq!(verdict.lease_expires_ms, Some(at(900).ms + LEASE_MS));
        let wrong_fence = ClaimRef { fence: claim.fence + 1, ..claim.clone() };
        assert_eq!(
            world.heartbeat(&runner, &wrong_fence, 950, observed(950)).reason.map(|word| word.as_str()),
            Some("not_current")
        );
        let unknown = ClaimRef { attempt: "j1-a9".into(), ..claim.clone() };
        assert_eq!(
            world.heartbeat(&runner, &unknown, 950, observed(950)).reason.map(|word| word.as_str()),
            Some("unknown")
        );
        let late = world.heartbeat(&runner, &claim, 900 + LEASE_MS, observed(900));
        assert_eq!((late.decision, late.reason.map(|word| word.as_str())), (Decision::Rejected, Some("expired")));
        let attempt = world.attempt("j1", &claim.attempt);
        assert_eq!(attempt.state, AttemptState::Uncertain);
        assert_eq!(attempt.lease_expires_ms, Some(at(900).ms + LEASE_MS), "a refused heartbeat renews nothing");
    }

    fn heartbeat_of_a_superseded_attempt_is_refused_as_superseded() {
        let world = World::new(&[]);
        let (r1, a1, _, a2) = world.superseded();
        let verdict = world.heartbeat(&r1, &a1, LEASE_MS + 10, observed(LEASE_MS + 10));
        assert_eq!(verdict.reason.map(|word| word.as_str()), Some("superseded"));
        assert!(world.attempt("j", &a2.attempt).current);
    }

    fn lease_expiry_names_uncertainty_and_never_requeues() {
        let (world, runner, claim) = World::claimed(&[]);
        assert_eq!(world.rules.expire(at(LEASE_MS - 1)).unwrap(), 0, "not yet");
        assert_eq!(world.rules.expire(at(LEASE_MS)).unwrap(), 1);
        let view = world.view("j1");
        assert_eq!(view.state, JobState::Uncertain);
        assert_eq!(view.current_attempt.as_deref(), Some(claim.attempt.as_str()));
        assert_eq!(view.attempts[0].state, AttemptState::Uncertain);
        assert!(world.claim(&runner, LEASE_MS + 1).is_none(), "an uncertain job is not handed out again");
        let expire = view.ledger.iter().find(|entry| entry.kind == Op::Expire).expect("expiry is in the ledger");
        assert_eq!(expire.recorded_as.map(|word| word.as_str()), Some("uncertain"));
    }

    fn result_is_accepted_once_then_duplicates_are_acknowledged_and_conflicts_recorded() {
        let (world, runner, claim) = World::claimed(&[]);
        assert_eq!(world.result(&runner, &claim, Outcome::Succeeded, 100).decision, Decision::Accepted);
        let lease_after_commit = world.attempt("j1", &claim.attempt).lease_expires_ms;
        let duplicate = world.result(&runner, &claim, Outcome::Succeeded, 5 * LEASE_MS);
        assert_eq!(duplicate.decision, Decision::Duplicate, "acknowledged even after the lease passed");
        assert_eq!(world.attempt("j1", &claim.attempt).lease_expires_ms, lease_after_commit, "a duplicate renews nothing");
        let conflict = world.result(&runner, &claim, Outcome::Failed, 5 * LEASE_MS + 1);
        assert_eq!((conflict.decision, conflict.reason.map(|word| word.as_str())), (Decision::Conflict, Some("conflict")));
        let view = world.view("j1");
        assert_eq!((view.state, view.outcome), (JobState::Succeeded, Some(Outcome::Succeeded)));
        let recorded: Vec<_> = view
            .ledger
            .iter()
            .filter(|entry| entry.kind == Op::Result)
            .map(|entry| (entry.decision, entry.recorded_as))
            .collect();
        assert_eq!(
            recorded,
            vec![
                (Some(Decision::Accepted), None),
                (Some(Decision::Duplicate), None),
                (Some(Decision::Conflict), Some(RecordedAs::Conflict))
            ]
        );
    }

    fn stale_completion_is_kept_as_a_late_observation_and_changes_nothing() {
        let world = World::new(&[]);
        let (r1, a1, _, a2) = world.superseded();
        let verdict = world.result(&r1, &a1, Outcome::Succeeded, LEASE_MS + 20);
        assert_eq!((verdict.decision, verdict.reason.map(|word| word.as_str())), (Decision::Rejected, Some("superseded")));
        let view = world.view("j");
        assert_eq!((view.state, view.outcome), (JobState::Running, None));
        assert_eq!(view.current_attempt.as_deref(), Some(a2.attempt.as_str()));
        let old = world.attempt("j", &a1.attempt);
        assert_eq!((old.state, old.closed_by.map(|word| word.as_str())), (AttemptState::Failed, Some("observed-stopped")));
        let late = view.ledger.iter().find(|entry| entry.seq == verdict.ledger_seq).unwrap();
        assert_eq!(late.recorded_as.map(|word| word.as_str()), Some("late_observation"));
        assert_eq!(late.outcome.map(|word| word.as_str()), Some("succeeded"));
    }

    fn result_after_expiry_but_before_reconciliation_is_a_late_observation() {
        let (world, runner, claim) = World::claimed(&[]);
        let verdict = world.result(&runner, &claim, Outcome::Succeeded, LEASE_MS + 1);
        assert_eq!(verdict.reason.map(|word| word.as_str()), Some("expired"));
        assert_eq!(world.view("j1").state, JobState::Uncertain);
    }

    fn reconcile_findings_close_or_keep_the_uncertain_attempt() {
        let (world, _, first, second) = World::two_claims();
        let code = refused_code(world.reconcile("j1", &first.attempt, Finding::Stopped, None, 10).unwrap_err());
        assert_eq!(code, "not_uncertain", "a running attempt cannot be reconciled");
        world.rules.expire(at(LEASE_MS)).unwrap();
        let still = world.reconcile("j1", &first.attempt, Finding::StillRunning, None, LEASE_MS + 1).unwrap();
        assert_eq!(still.state, JobState::Uncertain);
        let done =
            world.reconcile("j2", &second.attempt, Finding::Completed, Some(Outcome::Succeeded), LEASE_MS + 2).unwrap();
        assert_eq!((done.state, done.outcome), (JobState::Succeeded, Some(Outcome::Succeeded)));
        let stopped = world.reconcile("j1", &first.attempt, Finding::Stopped, None, LEASE_MS + 3).unwrap();
        assert_eq!(stopped.state, JobState::Queued);
        assert_eq!(stopped.attempts[0].state, AttemptState::Failed);
    }

    fn runner_clock_is_recorded_apart_and_never_decides_the_lease() {
        let (world, runner, claim) = World::claimed(&[]);
        let skew_ms = -120_000;
        let within = world.heartbeat(&runner, &claim, 500, observed(500) + skew_ms);
        assert_eq!(within.decision, Decision::Accepted, "a skewed clock does not refuse a live claim");
        let past = world.heartbeat(&runner, &claim, 500 + LEASE_MS + 1, observed(0));
        assert_eq!(
            past.reason.map(|word| word.as_str()),
            Some("expired"),
            "the runner's early clock does not extend the lease"
        );
        let entry = world.view("j1").ledger.into_iter().find(|entry| entry.seq == within.ledger_seq).unwrap();
        assert_eq!(entry.received_ms, at(500).ms);
        assert_eq!(entry.observed_ms, Some(observed(500) + skew_ms));
    }

    fn capability_is_signed_for_the_current_claim_only() {
        let world = World::new(&[]);
        let (r1, a1, r2, a2) = world.superseded();
        let request = |claim: &ClaimRef| CapabilityRequest { claim: claim.clone(), observed_ms: 0 };
        let granted = world.rules.capability(&r2, &request(&a2), at(LEASE_MS + 10)).unwrap();
        let capability = granted.capability.expect("a capability");
        assert!(lab::capability::verify(b"secret", &capability));
        assert_eq!((capability.fence, capability.attempt.as_str()), (a2.fence, a2.attempt.as_str()));
        assert_eq!(Some(capability.expires_ms), granted.lease_expires_ms, "the capability dies with the lease");
        let stale = world.rules.capability(&r1, &request(&a1), at(LEASE_MS + 10)).unwrap();
        assert_eq!(
            (stale.decision, stale.reason.map(|word| word.as_str()), stale.capability),
            (Decision::Rejected, Some("superseded"), None)
        );
    }

    fn reports_are_scoped_to_the_runner_and_its_project() {
        let world = World::new(&[]);
        let runner = world.runner("r1");
        let outsider = world.runner_in("x1", "other");
        world.submit("j1", "k", 0);
        let claim = world.claim(&runner, 0).unwrap().claim;
        let as_other = protocol::ClaimRef { runner: "x1".into(), ..claim.clone() };
        let code = refused_code(world.try_result(&outsider, &as_other, Outcome::Succeeded, 10, 0).unwrap_err());
        assert_eq!(code, "unknown_job", "another project's runner cannot see the job");
        let code = refused_code(world.try_result(&outsider, &claim, Outcome::Succeeded, 10, 0).unwrap_err());
        assert_eq!(code, "runner_mismatch");
        assert_eq!(world.view("j1").state, JobState::Running);
    }

    fn generated_job_ids_skip_ids_that_callers_chose() {
        let world = World::new(&[]);
        world.submit("j1", "k", 0);
        let request =
            SubmitJob { project: "p".into(), id: None, deployment_key: "k".into(), spec: JobSpec { steps: 1, step_ms: 1 } };
        let first = world.rules.submit(&crate::world::OPERATOR, &request, at(1)).unwrap().id;
        let second = world.rules.submit(&crate::world::OPERATOR, &request, at(2)).unwrap().id;
        assert_eq!((first.as_str(), second.as_str()), ("j2", "j3"));
    }
}

#[test]
fn the_store_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.sqlite");
    let open = || {
        let store = lab::control::Sqlite::open(&path, "operator").unwrap();
        lab::control::Rules::new(store, Default::default(), Default::default(), b"s")
    };
    let rules = open();
    rules.create_project(&crate::world::OPERATOR, &CreateProject { id: "p".into() }).unwrap();
    drop(rules);
    let code =
        refused_code(open().create_project(&crate::world::OPERATOR, &CreateProject { id: "p".into() }).unwrap_err());
    assert_eq!(code, "exists");
}

/// With the process's clock (as the control plane opens SQLite), a decision's instant is
/// read once the transaction holds the store, not taken from the request's receipt: a
/// request that waited for the store is judged when it is decided.
#[test]
fn sqlite_with_the_process_clock_decides_at_the_transactions_own_instant() {
    let dir = tempfile::tempdir().unwrap();
    let store = lab::control::Sqlite::open(&dir.path().join("control.sqlite"), "operator").unwrap();
    let rules = lab::control::Rules::new(store.with_process_clock(), Default::default(), Default::default(), b"s");
    rules.create_project(&crate::world::OPERATOR, &CreateProject { id: "p".into() }).unwrap();
    let submit = SubmitJob {
        project: "p".into(),
        id: Some("j1".into()),
        deployment_key: "prod".into(),
        spec: JobSpec { steps: 1, step_ms: 1 },
    };
    // Received a minute before it is decided (a request queued behind others).
    let before = lab::control::Now::read();
    let received = lab::control::Now { ms: before.ms - 60_000, mono_ns: before.mono_ns };
    rules.submit(&crate::world::OPERATOR, &submit, received).unwrap();
    let entry = rules.ledger(&crate::world::OPERATOR, 0, 10).unwrap().pop().expect("the submit's entry");
    assert!(entry.received_ms >= before.ms, "decided at {} ms, not at receipt ({} ms)", entry.received_ms, received.ms);
}
