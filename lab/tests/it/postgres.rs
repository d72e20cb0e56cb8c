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
/// Projects the racers are spread over (two racers each): racers of one project race for
/// one job, racers of different projects for different jobs on the one key.
const PROJECTS: usize = RACERS / 2;

fn project_of(index: usize) -> String {
    format!("p{}", index % PROJECTS)
}

fn runner_of(index: usize) -> Principal {
    Principal::Runner { id: format!("r{index}"), project: project_of(index) }
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

type Racers = Vec<Arc<Rules<lab::control::Postgres>>>;

/// `RACERS` rule sets on one fresh schema, each with a connection of its own (like
/// replicas), `PROJECTS` projects and a runner `r<i>` per racer.
fn racers() -> Racers {
    let schema = fresh_schema();
    let policy = Policy { lease_ms: 60_000, capability_ttl_ms: 60_000 };
    let stores: Racers = (0..RACERS)
        .map(|_| Arc::new(Rules::new(postgres_store(&schema, 1), policy.clone(), Default::default(), b"s")))
        .collect();
    for project in 0..PROJECTS {
        stores[0].create_project(&OPERATOR, &CreateProject { id: project_of(project) }).unwrap();
    }
    for index in 0..RACERS {
        let request = RegisterRunner { project: Some(project_of(index)), id: format!("r{index}") };
        stores[0].register_runner(&OPERATOR, &request).unwrap();
    }
    stores
}

fn submit(rules: &Rules<lab::control::Postgres>, job: &str, project: &str, key: &str) {
    let submit = SubmitJob {
        project: project.into(),
        id: Some(job.into()),
        deployment_key: key.into(),
        spec: JobSpec { steps: 1, step_ms: 1 },
    };
    rules.submit(&OPERATOR, &submit, Now::read()).unwrap();
}

/// Claims on one key from `RACERS` connections at once, round after round: never two running
/// attempts on the key, one grant a round, fences unique and increasing in ledger order.
#[test]
fn concurrent_claims_on_one_key_grant_it_once() {
    if !postgres_or_skip() {
        return;
    }
    let stores = racers();
    let setup = &stores[0];
    for index in 0..ROUNDS * PROJECTS {
        submit(setup, &format!("j{index}"), &project_of(index), "prod");
    }
    let mut fences = vec![];
    for round in 0..ROUNDS {
        let answers: Vec<Result<Option<Grant>, RuleError>> = race(&stores, |rules, index| {
            let request = ClaimRequest { runner: format!("r{index}"), observed_ms: 0 };
            rules.claim(&runner_of(index), &request, Now::read()).map(|answer| answer.grant)
        });
        let running: Vec<JobView> =
            setup.jobs(&OPERATOR).unwrap().into_iter().filter(|job| job.state == JobState::Running).collect();
        let jobs: Vec<&str> = running.iter().map(|job| job.id.as_str()).collect();
        assert!(running.len() <= 1, "round {round}: {} running attempts on one key: {jobs:?}", running.len());
        let failed: Vec<String> =
            answers.iter().filter_map(|answer| answer.as_ref().err()).map(|e| e.to_string()).collect();
        assert!(failed.is_empty(), "round {round}: claims failed: {failed:?}");
        let granted: Vec<&Grant> = answers.iter().flatten().flatten().collect();
        assert_eq!(granted.len(), 1, "round {round}: one key, so exactly one grant: {granted:?}");
        let claim = granted[0].claim.clone();
        fences.push(claim.fence);
        let holder = claim.runner.trim_start_matches('r').parse::<usize>().unwrap();
        let done = ResultRequest { claim, outcome: Outcome::Succeeded, observed_ms: 0, detail: None };
        assert_eq!(setup.result(&runner_of(holder), &done, Now::read()).unwrap().decision, Decision::Accepted);
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
}

/// Heartbeats and results for one attempt from `RACERS` connections at once (a runner
/// retrying over several links, with both outcomes): exactly one result is accepted, the
/// job's outcome is that one, and every report is in the ledger.
#[test]
fn concurrent_reports_on_one_attempt_accept_one_result() {
    if !postgres_or_skip() {
        return;
    }
    let stores = racers();
    let setup = &stores[0];
    for round in 0..ROUNDS {
        let job = format!("j{round}");
        submit(setup, &job, &project_of(0), &format!("key-{round}"));
        let request = ClaimRequest { runner: "r0".into(), observed_ms: 0 };
        let claim = setup.claim(&runner_of(0), &request, Now::read()).unwrap().grant.expect("a grant").claim;
        let answers: Vec<(Op, Result<Ruling, RuleError>)> = race(&stores, move |rules, index| {
            let now = Now::read();
            if index % 3 == 2 {
                let beat = HeartbeatRequest { claim: claim.clone(), observed_ms: 0 };
                return (Op::Heartbeat, rules.heartbeat(&runner_of(0), &beat, now));
            }
            let outcome = if index % 2 == 0 { Outcome::Succeeded } else { Outcome::Failed };
            let result = ResultRequest { claim: claim.clone(), outcome, observed_ms: 0, detail: None };
            (Op::Result, rules.result(&runner_of(0), &result, now))
        });
        let failed: Vec<String> =
            answers.iter().filter_map(|(_, answer)| answer.as_ref().err()).map(|e| e.to_string()).collect();
        assert!(failed.is_empty(), "round {round}: reports failed: {failed:?}");
        let accepted: Vec<&Ruling> = answers
            .iter()
            .filter(|(op, _)| *op == Op::Result)
            .filter_map(|(_, ruling)| ruling.as_ref().ok())
            .filter(|ruling| ruling.decision == Decision::Accepted)
            .collect();
        assert_eq!(accepted.len(), 1, "round {round}: exactly one result is accepted: {answers:?}");
        let view = setup.job_view(&OPERATOR, &job).unwrap();
        let results: Vec<_> = view.ledger.iter().filter(|entry| entry.kind == Op::Result).collect();
        assert_eq!(results.len(), (0..RACERS).filter(|index| index % 3 != 2).count(), "every result is in the ledger");
        let committed = results.iter().find(|entry| entry.decision == Some(Decision::Accepted)).expect("accepted");
        assert_eq!(view.outcome.map(history::OutcomeWord::from), committed.outcome, "{view:?}");
        assert!(is_terminal(&view), "{view:?}");
    }
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
    let orphan = procs::pg::TempCluster::start_in(parent.path()).unwrap();
    let port = orphan.port();
    // Its owner "dies": renamed after a pid that cannot be running, and never dropped.
    let stale = parent.path().join("cluster-999999999-1-0");
    std::fs::rename(orphan.dir(), &stale).unwrap();
    std::mem::forget(orphan);
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(), "the orphan still serves");
    let fresh = procs::pg::TempCluster::start_in(parent.path()).unwrap();
    assert!(!stale.exists(), "the stale cluster's folder is removed");
    let still_listening = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    assert!(!still_listening, "the stale cluster's server is stopped");
    let fresh_dir = fresh.dir().to_path_buf();
    drop(fresh);
    assert!(!fresh_dir.exists(), "a dropped cluster removes its folder");
}

/// A role that may connect but not create a schema: opening the store is a clear error that
/// names the schema and the server's reason, and the control plane exits 255 saying it.
#[test]
fn a_database_user_without_the_right_to_create_the_schema_is_a_clear_error() {
    if !postgres_or_skip() {
        return;
    }
    let url = crate::world::cluster_url();
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).expect("the cluster's superuser connects");
    admin.batch_execute("DROP ROLE IF EXISTS fencelab_limited; CREATE ROLE fencelab_limited LOGIN").unwrap();
    admin.batch_execute("REVOKE CREATE ON DATABASE postgres FROM PUBLIC").unwrap();
    let limited = url.replace("postgres://postgres@", "postgres://fencelab_limited@");
    assert_ne!(limited, url, "the cluster's URL names its user: {url}");
    let schema = fresh_schema();
    let error = lab::control::Postgres::open(&lab::control::PgOptions::new(&limited, &schema), "operator")
        .err()
        .expect("the schema cannot be created");
    let text = error.to_string();
    assert!(text.contains(&format!("creating schema `{schema}`")) && text.contains("permission denied"), "{text}");
    let code = lab::cli::main_from(
        ["fencelab-lab", "control-plane", "--listen=127.0.0.1:0", "--operator-token=o", "--secret=s"]
            .map(std::ffi::OsString::from)
            .into_iter()
            .chain([format!("--database-url={limited}"), format!("--schema={schema}")].map(std::ffi::OsString::from)),
    );
    assert_eq!(code, std::process::ExitCode::from(255));
    let exists = admin.query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema]).unwrap();
    assert!(exists.is_none(), "nothing was created");
}

/// On PostgreSQL every lease is measured on the database's clock: a replica whose clock is a
/// minute behind grants the same lease as one whose clock is right. Under the planted
/// `replica-clock` the replica's own clock decides, and its lease ended a minute ago.
#[test]
fn the_database_clock_is_the_lease_authority() {
    if !postgres_or_skip() {
        return;
    }
    for bugs in [lab::bugs::Bugs::none(), lab::bugs::Bugs::of([lab::bugs::Bug::ReplicaClock])] {
        let mut options = lab::control::PgOptions::new(&crate::world::cluster_url(), &fresh_schema());
        options.pool_size = 1;
        let store = lab::control::Postgres::open(&options, "operator").unwrap();
        let buggy = bugs.has(lab::bugs::Bug::ReplicaClock);
        let policy = Policy { lease_ms: 5_000, capability_ttl_ms: 30_000 };
        let rules = Rules::new(store, policy, bugs, b"s");
        rules.create_project(&OPERATOR, &CreateProject { id: "p".into() }).unwrap();
        rules.register_runner(&OPERATOR, &RegisterRunner { project: Some("p".into()), id: "r0".into() }).unwrap();
        submit(&rules, "j1", "p", "prod");
        let true_now = Now::read();
        let behind = Now { ms: true_now.ms - 60_000, mono_ns: true_now.mono_ns };
        let request = ClaimRequest { runner: "r0".into(), observed_ms: 0 };
        let runner = Principal::Runner { id: "r0".into(), project: "p".into() };
        let grant = rules.claim(&runner, &request, behind).unwrap().grant.expect("a grant");
        let decided_on = if buggy { behind.ms } else { true_now.ms };
        let off_ms = grant.lease_expires_ms - (decided_on + 5_000);
        assert!((-1_000..=5_000).contains(&off_ms), "buggy {buggy}: the lease ends {off_ms} ms off");
        let entry = rules.ledger(&OPERATOR, 0, 100).unwrap().into_iter().find(|e| e.kind == Op::Claim).unwrap();
        assert_eq!(entry.lease_expires_ms, Some(grant.lease_expires_ms));
        assert_eq!(entry.received_ms + 5_000, grant.lease_expires_ms, "the entry says the instant it was decided at");
    }
}

/// A report expires its own job's lapsed attempt in its transaction, read on the database's
/// clock, and only its own: another job's lapsed attempt waits for its own report or the
/// sweeper.
#[test]
fn a_report_expires_only_its_own_jobs_lapsed_attempt() {
    if !postgres_or_skip() {
        return;
    }
    let mut options = lab::control::PgOptions::new(&crate::world::cluster_url(), &fresh_schema());
    options.pool_size = 1;
    let store = lab::control::Postgres::open(&options, "operator").unwrap();
    let policy = Policy { lease_ms: 200, capability_ttl_ms: 30_000 };
    let rules = Rules::new(store, policy, lab::bugs::Bugs::none(), b"s");
    rules.create_project(&OPERATOR, &CreateProject { id: "p".into() }).unwrap();
    let mut claims = vec![];
    for (index, key) in ["prod", "staging"].into_iter().enumerate() {
        let id = format!("r{index}");
        rules.register_runner(&OPERATOR, &RegisterRunner { project: Some("p".into()), id: id.clone() }).unwrap();
        submit(&rules, &format!("j{index}"), "p", key);
        let runner = Principal::Runner { id: id.clone(), project: "p".into() };
        let request = ClaimRequest { runner: id, observed_ms: 0 };
        let grant = rules.claim(&runner, &request, Now::read()).unwrap().grant.expect("a grant");
        claims.push((runner, grant.claim));
    }
    // Both leases (200 ms) end well within this wait on the database's clock.
    std::thread::sleep(Duration::from_millis(1_000));
    let (runner, claim) = &claims[0];
    let request = HeartbeatRequest { claim: claim.clone(), observed_ms: 0 };
    let ruling = rules.heartbeat(runner, &request, Now::read()).unwrap();
    assert_eq!((ruling.decision, ruling.reason.map(|word| word.as_str())), (Decision::Rejected, Some("expired")));
    let state = |job: &str| rules.job_view(&OPERATOR, job).unwrap().attempts[0].state;
    assert_eq!(state("j0"), AttemptState::Uncertain, "the report expired its own job's attempt");
    assert_eq!(state("j1"), AttemptState::Running, "another job's attempt is left to its report or the sweeper");
    assert_eq!(rules.expire(Now::read()).unwrap(), 1, "the sweeper expires the other one");
    assert_eq!(state("j1"), AttemptState::Uncertain);
}

/// A replica opening a schema that is complete takes no table lock: a transaction that
/// writes the jobs table (as every running replica's rules do) does not hold it up, and it
/// does not hold that transaction up (a restart among running replicas once deadlocked one).
#[test]
fn opening_a_complete_schema_waits_for_no_writer() {
    if !postgres_or_skip() {
        return;
    }
    let schema = fresh_schema();
    let mut options = lab::control::PgOptions::new(&crate::world::cluster_url(), &schema);
    options.pool_size = 1;
    drop(lab::control::Postgres::open(&options, "operator").unwrap());
    let mut writer = postgres::Client::connect(&crate::world::cluster_url(), postgres::NoTls).unwrap();
    let mut held = writer.transaction().unwrap();
    held.batch_execute(&format!("LOCK TABLE {schema}.jobs IN ROW EXCLUSIVE MODE")).unwrap();
    // A lock wait would end in a lock timeout at once: opening succeeds only without one.
    options.lock_wait = Duration::from_millis(1);
    let reopened = lab::control::Postgres::open(&options, "operator");
    assert!(reopened.is_ok(), "{:?}", reopened.err());
    held.rollback().unwrap();
}
