//! The PostgreSQL store beyond the rules every store shares: its state survives reopening,
//! concurrent transactions on separate connections (as from several control-plane replicas)
//! keep every rule, the lab runs on it as real processes, and the throwaway cluster cleans
//! up after a process that was killed.

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use history::{Decision, Op};
use lab::control::store::Principal;
use lab::control::{Now, Policy, RuleError, Rules};
use lab::demo::{is_terminal, LabOptions, LocalLab};
use protocol::*;

use crate::world::{fresh_schema, postgres_or_skip, postgres_store, refused_code, OPERATOR};

#[test]
fn the_postgres_store_survives_reopening() {
    if !postgres_or_skip() {
        return;
    }
    let schema = fresh_schema();
    let open = || Rules::new(postgres_store(&schema, 1), Policy::default(), Default::default(), b"s");
    let rules = open();
    rules.create_project(&OPERATOR, &CreateProject { id: "p".into() }).unwrap();
    drop(rules);
    let code = refused_code(open().create_project(&OPERATOR, &CreateProject { id: "p".into() }).unwrap_err());
    assert_eq!(code, "exists");
    let elsewhere = Rules::new(postgres_store(&fresh_schema(), 1), Policy::default(), Default::default(), b"s");
    elsewhere.create_project(&OPERATOR, &CreateProject { id: "p".into() }).expect("another schema is another store");
}

/// Threads racing, each with its own store (its own connection), like replicas.
const RACERS: usize = 8;
/// Claim rounds on the one deployment key.
const ROUNDS: usize = 6;

fn runner_of(index: usize) -> Principal {
    Principal::Runner { id: format!("r{index}"), project: "p".into() }
}

/// Runs `work(index)` on every racer at once (after a barrier) and returns the answers in order.
fn race<T: Send + 'static>(
    stores: &[Arc<Rules<lab::control::Postgres>>],
    work: impl Fn(&Rules<lab::control::Postgres>, usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let barrier = Arc::new(Barrier::new(stores.len()));
    let work = Arc::new(work);
    let threads: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(index, rules)| {
            let (rules, barrier, work) = (rules.clone(), barrier.clone(), work.clone());
            std::thread::spawn(move || {
                barrier.wait();
                work(&rules, index)
            })
        })
        .collect();
    threads.into_iter().map(|thread| thread.join().expect("a racer finishes")).collect()
}

/// Claims on one key and reports on one attempt, from `RACERS` connections at once: never two
/// running attempts on the key, fences unique and increasing in ledger order, one result.
#[test]
fn concurrent_claims_and_reports_from_separate_connections_keep_every_rule() {
    if !postgres_or_skip() {
        return;
    }
    let schema = fresh_schema();
    let policy = Policy { lease_ms: 60_000, capability_ttl_ms: 60_000 };
    let stores: Vec<Arc<Rules<lab::control::Postgres>>> = (0..RACERS)
        .map(|_| Arc::new(Rules::new(postgres_store(&schema, 1), policy.clone(), Default::default(), b"s")))
        .collect();
    let setup = &stores[0];
    setup.create_project(&OPERATOR, &CreateProject { id: "p".into() }).unwrap();
    for index in 0..RACERS {
        setup
            .register_runner(&OPERATOR, &RegisterRunner { project: Some("p".into()), id: format!("r{index}") })
            .unwrap();
    }
    for index in 0..ROUNDS {
        let submit = SubmitJob {
            project: "p".into(),
            id: Some(format!("j{index}")),
            deployment_key: "prod".into(),
            spec: JobSpec { steps: 1, step_ms: 1 },
        };
        setup.submit(&OPERATOR, &submit, Now::read()).unwrap();
    }

    let mut fences = vec![];
    for round in 0..ROUNDS {
        let grants: Vec<Option<Grant>> = race(&stores, |rules, index| {
            let request = ClaimRequest { runner: format!("r{index}"), observed_ms: 0 };
            rules.claim(&runner_of(index), &request, Now::read()).expect("a claim answers").grant
        });
        let granted: Vec<&Grant> = grants.iter().flatten().collect();
        assert_eq!(granted.len(), 1, "round {round}: one key, so exactly one grant: {granted:?}");
        let running: Vec<JobView> =
            setup.jobs(&OPERATOR).unwrap().into_iter().filter(|job| job.state == JobState::Running).collect();
        assert_eq!(running.len(), 1, "round {round}: two running attempts on one key: {running:?}");
        let claim = granted[0].claim.clone();
        fences.push(claim.fence);
        let holder = claim.runner.trim_start_matches('r').parse::<usize>().unwrap();
        if round + 1 < ROUNDS {
            let done = ResultRequest { claim, outcome: Outcome::Succeeded, observed_ms: 0, detail: None };
            let verdict = setup.result(&runner_of(holder), &done, Now::read()).unwrap();
            assert_eq!(verdict.decision, Decision::Accepted);
            continue;
        }
        // The last attempt: every racer reports on it at once — heartbeats and results from
        // the holder's token (a runner retrying over several links), with both outcomes.
        let answers: Vec<(Op, Result<Ruling, RuleError>)> = race(&stores, move |rules, index| {
            let now = Now::read();
            if index % 3 == 2 {
                let beat = HeartbeatRequest { claim: claim.clone(), observed_ms: 0 };
                return (Op::Heartbeat, rules.heartbeat(&runner_of(holder), &beat, now));
            }
            let outcome = if index % 2 == 0 { Outcome::Succeeded } else { Outcome::Failed };
            let result = ResultRequest { claim: claim.clone(), outcome, observed_ms: 0, detail: None };
            (Op::Result, rules.result(&runner_of(holder), &result, now))
        });
        let accepted: Vec<&Ruling> = answers
            .iter()
            .filter(|(op, _)| *op == Op::Result)
            .map(|(_, ruling)| ruling.as_ref().expect("a result answers"))
            .filter(|ruling| ruling.decision == Decision::Accepted)
            .collect();
        assert_eq!(accepted.len(), 1, "exactly one result is accepted: {answers:?}");
    }

    let unique: std::collections::BTreeSet<u64> = fences.iter().copied().collect();
    assert_eq!(unique.len(), fences.len(), "fences are unique: {fences:?}");
    let ledger = setup.ledger(&OPERATOR, 0, 10_000).unwrap();
    let seqs: Vec<u64> = ledger.iter().map(|entry| entry.seq).collect();
    assert_eq!(seqs, (1..=ledger.len() as u64).collect::<Vec<_>>(), "the ledger is gapless, in order");
    let claimed: Vec<u64> =
        ledger.iter().filter(|entry| entry.kind == Op::Claim).filter_map(|entry| entry.fence).collect();
    assert!(claimed.windows(2).all(|pair| pair[0] < pair[1]), "fences increase in ledger order: {claimed:?}");
    assert_eq!(claimed, fences, "every grant is in the ledger, in order");
    let last = setup.job_view(&OPERATOR, &format!("j{}", ROUNDS - 1)).unwrap();
    let results: Vec<_> = last.ledger.iter().filter(|entry| entry.kind == Op::Result).collect();
    assert_eq!(results.len(), answers_of_results(), "every result report is in the ledger");
    let accepted = results.iter().filter(|entry| entry.decision == Some(Decision::Accepted)).count();
    assert_eq!(accepted, 1);
    assert!(is_terminal(&last), "{last:?}");
}

fn answers_of_results() -> usize {
    (0..RACERS).filter(|index| index % 3 != 2).count()
}

/// Every wait on a condition in the process test (generous: the machine may be loaded).
const WAIT_MAX: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn a_local_lab_on_postgres_pushes_jobs_through_runners_and_survives_a_restart() {
    if !postgres_or_skip() {
        return;
    }
    let url = tokio::task::spawn_blocking(crate::world::cluster_url).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut options = LabOptions::new(Path::new(env!("CARGO_BIN_EXE_fencelab-lab")), dir.path());
    options.database_url = Some(url);
    options.schema = Some(fresh_schema());
    let mut lab = LocalLab::start(options).await.unwrap();
    for id in ["r1", "r2"] {
        lab.spawn_runner(id, &[]).await.unwrap();
    }
    let spec = JobSpec { steps: 2, step_ms: 5 };
    for index in 0..6 {
        lab.submit(&format!("j{index}"), &format!("key-{}", index % 2), spec.clone()).await.unwrap();
    }
    for index in 0..6 {
        let view = lab.wait_job(&format!("j{index}"), WAIT_MAX, is_terminal).await.unwrap();
        assert_eq!(view.state, JobState::Succeeded, "{view:?}");
    }
    assert!(!dir.path().join("control.sqlite").exists(), "the control plane used PostgreSQL, not SQLite");
    lab.restart_control().await.unwrap();
    let jobs = lab.operator.jobs().await.unwrap();
    assert_eq!(jobs.iter().filter(|job| job.state == JobState::Succeeded).count(), 6, "{jobs:?}");
    lab.shutdown().await;
}

#[test]
fn the_control_plane_refuses_a_database_url_with_a_sqlite_file() {
    let code = lab::cli::main_from(
        ["fencelab-lab", "control-plane", "--db=x.sqlite", "--database-url=postgres://127.0.0.1:1/x"]
            .map(std::ffi::OsString::from),
    );
    assert_eq!(code, std::process::ExitCode::from(254));
    let code = lab::cli::main_from(["fencelab-lab", "control-plane", "--schema=s"].map(std::ffi::OsString::from));
    assert_eq!(code, std::process::ExitCode::from(254), "--schema needs --database-url");
}

#[test]
fn an_unreachable_database_is_a_clear_error() {
    let mut options = lab::control::PgOptions::new("postgres://postgres@127.0.0.1:1/postgres", "fencelab");
    options.connect_timeout = Duration::from_secs(2);
    let error = lab::control::Postgres::open(&options, "operator").err().expect("nothing listens on port 1");
    assert!(error.to_string().contains("cannot connect to the database"), "{error}");
}

/// A cluster whose process is gone (SIGKILL) is stopped and removed by the next start.
#[test]
fn a_cluster_left_by_a_killed_process_is_removed_by_the_next_start() {
    if !postgres_or_skip() {
        return;
    }
    let parent = tempfile::Builder::new().prefix("fencelab-pg-stale").tempdir().unwrap();
    // The server runs as `postgres` when we are root: it must be able to reach the folder.
    std::fs::set_permissions(parent.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let orphan = lab::pg::TempCluster::start_in(parent.path()).unwrap();
    let port = orphan.port();
    // Its owner "dies": renamed after a pid that cannot be running, and never dropped.
    let stale = parent.path().join("cluster-999999999-1-0");
    std::fs::rename(orphan.dir(), &stale).unwrap();
    std::mem::forget(orphan);
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(), "the orphan still serves");
    let fresh = lab::pg::TempCluster::start_in(parent.path()).unwrap();
    assert!(!stale.exists(), "the stale cluster's folder is removed");
    let still_listening = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    assert!(!still_listening, "the stale cluster's server is stopped");
    let fresh_dir = fresh.dir().to_path_buf();
    drop(fresh);
    assert!(!fresh_dir.exists(), "a dropped cluster removes its folder");
}
