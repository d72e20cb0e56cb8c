//! The PostgreSQL store's row locks, from several connections at once as from control-plane
//! replicas: the claims of one deployment key never both take it, and rule transactions of
//! every kind on shared keys and jobs never wait for each other in a cycle (a deadlock would
//! be a store error here).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use lab::control::store::Principal;
use lab::control::{Now, Policy, Postgres, RuleError, Rules};
use protocol::*;

use crate::world::{at, fresh_schema, observed, postgres_or_skip, postgres_store, Kind, World, LEASE_MS, OPERATOR};

type Replica = Arc<Rules<Postgres>>;

/// `count` rule sets on one fresh schema, each with a connection of its own (like replicas).
fn replicas(count: usize, lease_ms: u64) -> Vec<Replica> {
    let schema = fresh_schema();
    let policy = Policy { lease_ms, capability_ttl_ms: 60_000 };
    (0..count)
        .map(|_| Arc::new(Rules::new(postgres_store(&schema, 1), policy.clone(), Default::default(), b"s")))
        .collect()
}

fn runner(id: &str, project: &str) -> Principal {
    Principal::Runner { id: id.into(), project: project.into() }
}

fn setup(rules: &Rules<Postgres>, projects: &[&str], runners: &[(&str, &str)]) {
    for project in projects {
        rules.create_project(&OPERATOR, &CreateProject { id: project.to_string() }).unwrap();
    }
    for (id, project) in runners {
        let request = RegisterRunner { project: Some(project.to_string()), id: id.to_string() };
        rules.register_runner(&OPERATOR, &request).unwrap();
    }
}

fn submit(rules: &Rules<Postgres>, job: &str, project: &str, key: &str) {
    let request = SubmitJob {
        project: project.into(),
        id: Some(job.into()),
        deployment_key: key.into(),
        spec: JobSpec { steps: 1, step_ms: 1 },
    };
    rules.submit(&OPERATOR, &request, Now::read()).unwrap();
}

/// Every rule takes its locks in the store's one order, which the PostgreSQL store checks (a
/// wait out of order is a `LockOrder` error): a heartbeat that expires its own job's lapsed
/// attempt, a sweep (a transaction per job), a reconcile, a claim of a job a reconcile
/// requeued, a result, a view.
#[test]
fn every_rule_takes_its_locks_in_the_stores_order() {
    Kind::Postgres.run(|| {
        let world = World::new(&[]);
        let runner = world.runner("r1");
        for index in 0..3 {
            world.submit(&format!("j{index}"), &format!("k{index}"), 0);
        }
        let claims: Vec<ClaimRef> = (0..3).map(|_| world.claim(&runner, 0).expect("claimable").claim).collect();
        let late = world.heartbeat(&runner, &claims[0], LEASE_MS + 1, observed(LEASE_MS + 1));
        assert_eq!(late.reason.map(|reason| reason.as_str()), Some("expired"));
        let ledger = world.rules.ledger(&OPERATOR, 0, 100).unwrap();
        let expired: Vec<&str> =
            ledger.iter().filter(|entry| entry.kind == history::Op::Expire).map(|entry| entry.job.as_str()).collect();
        assert_eq!(expired, ["j0"], "the heartbeat's transaction expired its own job's lapsed attempt");
        assert_eq!(world.rules.expire(at(LEASE_MS + 2)).unwrap(), 2, "the sweep expires the others");
        world.reconcile("j1", &claims[1].attempt, Finding::Stopped, None, LEASE_MS + 3).expect("reconciled");
        let again = world.claim(&runner, LEASE_MS + 4).expect("j1 is claimable again").claim;
        assert_eq!(
            world.result(&runner, &again, Outcome::Succeeded, LEASE_MS + 5).decision,
            history::Decision::Accepted
        );
        world.submit("j3", "k1", LEASE_MS + 6);
        world.claim(&runner, LEASE_MS + 7).expect("k1 is free again");
        assert_eq!(world.rules.expire(at(3 * LEASE_MS)).unwrap(), 1);
        assert_eq!(world.view("j3").state, JobState::Uncertain);
    });
}

/// Rounds of two claims raced on two replicas.
const KEY_ROUNDS: usize = 60;

/// Two jobs of two projects on one new key each round; a runner of each project claims at
/// once, each on its own replica: exactly one of them is granted the key.
#[test]
fn two_claims_of_one_key_on_two_replicas_never_both_take_it() {
    if !postgres_or_skip() {
        return;
    }
    let replicas = replicas(2, 60_000);
    setup(&replicas[0], &["p0", "p1"], &[("r0", "p0"), ("r1", "p1")]);
    let barrier = Arc::new(Barrier::new(2));
    for round in 0..KEY_ROUNDS {
        let key = format!("key-{round}");
        submit(&replicas[0], &format!("j{round}-0"), "p0", &key);
        submit(&replicas[1], &format!("j{round}-1"), "p1", &key);
        let threads: Vec<_> = (0..2)
            .map(|index| {
                let (rules, barrier) = (replicas[index].clone(), barrier.clone());
                std::thread::spawn(move || {
                    let (id, project) = (format!("r{index}"), format!("p{index}"));
                    let request = ClaimRequest { runner: id.clone(), observed_ms: 0 };
                    barrier.wait();
                    rules.claim(&runner(&id, &project), &request, Now::read()).map(|answer| answer.grant)
                })
            })
            .collect();
        let answers: Vec<Result<Option<Grant>, RuleError>> =
            threads.into_iter().map(|thread| thread.join().expect("a claim finishes")).collect();
        let granted: Vec<&Grant> =
            answers.iter().flat_map(|answer| answer.as_ref().expect("a claim answers")).collect();
        assert_eq!(granted.len(), 1, "round {round}: one key, two claims, exactly one grant: {granted:?}");
    }
}

/// How long the mixed workload runs at most.
const MIXED_RUN_MAX: Duration = Duration::from_secs(30);
/// Runners, each on a replica (a connection) of its own.
const MIXED_RUNNERS: usize = 8;
/// Jobs, over `MIXED_KEYS` keys.
const MIXED_JOBS: usize = 96;
const MIXED_KEYS: usize = 6;
/// The lease: short, so that leases lapse while reports for them are on their way.
const MIXED_LEASE_MS: u64 = 40;

/// Every store error any thread met, with what it was doing.
type Errors = Arc<Mutex<Vec<String>>>;

fn note<T>(errors: &Errors, what: &str, answer: Result<T, RuleError>) -> Option<T> {
    match answer {
        Ok(value) => Some(value),
        Err(RuleError::Refused { .. }) => None,
        Err(error) => {
            errors.lock().unwrap().push(format!("{what}: {error}"));
            None
        }
    }
}

/// A runner: claims, asks for a capability, heartbeats and reports — every other claim only
/// after its lease has lapsed, so expiries meet its reports.
fn work(rules: &Rules<Postgres>, index: usize, done: &AtomicBool, errors: &Errors) {
    let (id, principal) = (format!("r{index}"), runner(&format!("r{index}"), "p"));
    let mut claims = 0usize;
    while !done.load(Ordering::Relaxed) {
        let request = ClaimRequest { runner: id.clone(), observed_ms: 0 };
        let Some(answer) = note(errors, "claim", rules.claim(&principal, &request, Now::read())) else { continue };
        let Some(grant) = answer.grant else {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        };
        claims += 1;
        let claim = grant.claim;
        let capability = CapabilityRequest { claim: claim.clone(), observed_ms: 0 };
        note(errors, "capability", rules.capability(&principal, &capability, Now::read()));
        if claims.is_multiple_of(2) {
            std::thread::sleep(Duration::from_millis(MIXED_LEASE_MS + 5));
        }
        let beat = HeartbeatRequest { claim: claim.clone(), observed_ms: 0 };
        note(errors, "heartbeat", rules.heartbeat(&principal, &beat, Now::read()));
        let result = ResultRequest { claim, outcome: Outcome::Succeeded, observed_ms: 0, detail: None };
        note(errors, "result", rules.result(&principal, &result, Now::read()));
    }
}

/// The operator: reconciles every uncertain job as stopped (its attempt read first, as a
/// person would), and ends the run once every job is terminal.
fn operate(rules: &Rules<Postgres>, done: &AtomicBool, errors: &Errors) {
    let started = Instant::now();
    while started.elapsed() < MIXED_RUN_MAX {
        let Some(jobs) = note(errors, "jobs", rules.jobs(&OPERATOR)) else { continue };
        if jobs.iter().all(|job| matches!(job.state, JobState::Succeeded | JobState::Failed)) {
            break;
        }
        for job in jobs.iter().filter(|job| job.state == JobState::Uncertain) {
            let Some(view) = note(errors, "job view", rules.job_view(&OPERATOR, &job.id)) else { continue };
            let Some(attempt) = view.current_attempt else { continue };
            let request = ReconcileRequest {
                job: job.id.clone(),
                attempt,
                finding: Finding::Stopped,
                outcome: None,
                evidence: None,
            };
            note(errors, "reconcile", rules.reconcile(&OPERATOR, &request, Now::read()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    done.store(true, Ordering::Relaxed);
}

/// Claims, capabilities, heartbeats, results, sweeps and reconciles on shared keys and jobs
/// from `MIXED_RUNNERS + 2` connections at once, with leases lapsing all along: no store
/// error (a deadlock, a lock timeout), every job terminal, the ledger gapless.
#[test]
fn rule_transactions_of_every_kind_never_wait_in_a_cycle() {
    if !postgres_or_skip() {
        return;
    }
    let replicas = replicas(MIXED_RUNNERS + 2, MIXED_LEASE_MS);
    let runners: Vec<(String, &str)> = (0..MIXED_RUNNERS).map(|index| (format!("r{index}"), "p")).collect();
    let runners: Vec<(&str, &str)> = runners.iter().map(|(id, project)| (id.as_str(), *project)).collect();
    setup(&replicas[0], &["p"], &runners);
    for index in 0..MIXED_JOBS {
        submit(&replicas[0], &format!("j{index}"), "p", &format!("k{}", index % MIXED_KEYS));
    }
    let (done, errors): (Arc<AtomicBool>, Errors) = Default::default();
    std::thread::scope(|scope| {
        for (index, rules) in replicas.iter().take(MIXED_RUNNERS).enumerate() {
            let (done, errors) = (&done, &errors);
            scope.spawn(move || work(rules, index, done, errors));
        }
        let (sweeper, done_ref, errors_ref) = (&replicas[MIXED_RUNNERS], &done, &errors);
        scope.spawn(move || {
            while !done_ref.load(Ordering::Relaxed) {
                note(errors_ref, "sweep", sweeper.expire(Now::read()));
                std::thread::sleep(Duration::from_millis(3));
            }
        });
        operate(&replicas[MIXED_RUNNERS + 1], &done, &errors);
    });
    let errors = errors.lock().unwrap();
    assert!(errors.is_empty(), "{} store errors, the first: {:?}", errors.len(), &errors[..errors.len().min(5)]);
    let jobs = replicas[0].jobs(&OPERATOR).unwrap();
    let open: Vec<&str> = jobs
        .iter()
        .filter(|job| !matches!(job.state, JobState::Succeeded | JobState::Failed))
        .map(|job| job.id.as_str())
        .collect();
    assert!(open.is_empty(), "every job ended within {MIXED_RUN_MAX:?}: {open:?}");
    let ledger = replicas[0].ledger(&OPERATOR, 0, 10_000).unwrap();
    let seqs: Vec<u64> = ledger.iter().map(|entry| entry.seq).collect();
    assert_eq!(seqs, (1..=ledger.len() as u64).collect::<Vec<_>>(), "the ledger is gapless, in order");
    assert!(ledger.iter().any(|entry| entry.kind == history::Op::Expire), "leases lapsed along the way");
}
