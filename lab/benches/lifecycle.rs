//! Full job lifecycles against the control plane over loopback HTTP: submit, claim,
//! capability, two heartbeats, result — by C concurrent runners — on the SQLite store and
//! on the PostgreSQL store (a throwaway cluster; skipped when PostgreSQL is not installed).
//! Prints lifecycles per second for each concurrency and store, with one control plane
//! and with three replicas on the same store. Each runner has a project and a deployment
//! key of its own, so on PostgreSQL the replicas' transactions lock rows no other runner
//! touches and wait for each other only for the ledger's sequence number (one statement and
//! COMMIT each): the three-replica column shows how the store scales with replicas, and
//! the last column is PostgreSQL's three replicas as a ratio of SQLite's. Every column is
//! measured three times, interleaved, and each cell is the median.
//! Run: `cargo bench -p lab --bench lifecycle`. With `FENCELAB_BENCH_SMOKE=1` (CI: `cargo
//! test --benches`) each level lasts a tenth of a second: it checks the bench runs, not speed.

use std::path::Path;
use std::time::{Duration, Instant};

use lab::demo::{LabOptions, LocalLab};
use protocol::client::Client;
use protocol::*;

/// How long each concurrency level runs.
const MEASURE: Duration = Duration::from_secs(4);

/// How long each level lasts: [`MEASURE`], or a tenth of a second in smoke mode.
fn level_duration() -> Duration {
    match std::env::var_os("FENCELAB_BENCH_SMOKE") {
        Some(_) => Duration::from_millis(100),
        None => MEASURE,
    }
}

/// Each runner has a project of its own, so that its claims find exactly its jobs.
async fn lifecycle(operator: &Client, runner: &Client, runner_id: &str, job: &str) {
    let submit = SubmitJob {
        project: runner_id.into(),
        id: Some(job.into()),
        deployment_key: format!("key-{runner_id}"),
        spec: JobSpec { steps: 1, step_ms: 1 },
    };
    operator.submit(&submit).await.expect("submit");
    let grant = runner
        .claim(&ClaimRequest { runner: runner_id.into(), observed_ms: 0 })
        .await
        .expect("claim")
        .grant
        .expect("a grant");
    let claim = grant.claim;
    runner.capability(&CapabilityRequest { claim: claim.clone(), observed_ms: 0 }).await.expect("capability");
    for _ in 0..2 {
        runner.heartbeat(&HeartbeatRequest { claim: claim.clone(), observed_ms: 0 }).await.expect("heartbeat");
    }
    let verdict = runner
        .result(&ResultRequest { claim, outcome: Outcome::Succeeded, observed_ms: 0, detail: None })
        .await
        .expect("result");
    assert_eq!(verdict.decision, history::Decision::Accepted);
}

/// Runs `concurrency` runners for [`MEASURE`]; runner i (and its operator requests) goes
/// to replica i modulo the number of `replicas` (control-plane URLs on one store).
async fn measure(lab: &LocalLab, replicas: &[String], concurrency: usize, round: usize) -> f64 {
    let mut tasks = Vec::new();
    let started = Instant::now();
    for index in 0..concurrency {
        let runner_id = format!("c{concurrency}-r{index}");
        lab.operator.create_project(&runner_id).await.expect("project");
        let request = RegisterRunner { project: Some(runner_id.clone()), id: runner_id.clone() };
        let token = lab.operator.register_runner(&request).await.expect("register").token;
        let operator = lab.operator.at(&replicas[index % replicas.len()]);
        let runner = operator.with_token(&token);
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            while started.elapsed() < level_duration() {
                lifecycle(&operator, &runner, &runner_id, &format!("{runner_id}-{round}-{done}")).await;
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("a bench task");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// Concurrency levels measured.
const LEVELS: [usize; 3] = [1, 4, 16];

/// Lifecycles per second at each level, on a lab whose control plane uses `database_url`
/// (SQLite when `None`), with `replicas` control planes on that store; `round` names the
/// PostgreSQL schema, one a measurement.
async fn rates(database_url: Option<String>, replicas: usize, round: usize) -> Vec<f64> {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut options = LabOptions::new(Path::new(env!("CARGO_BIN_EXE_fencelab-lab")), dir.path());
    options.lease_ms = 30_000;
    // Each measurement on PostgreSQL gets a schema of its own on the one cluster.
    options.schema = database_url.as_ref().map(|_| format!("bench_{replicas}_replicas_{round}"));
    options.database_url = database_url;
    let lab = LocalLab::start(options).await.expect("lab starts");
    let mut others = Vec::new();
    for _ in 1..replicas {
        others.push(lab.start_replica().await.expect("a replica starts"));
    }
    let mut urls = vec![lab.control_url()];
    urls.extend(others.iter().map(|replica| format!("http://{}", replica.addr.expect("a server has an address"))));
    let mut rates = vec![];
    for (level, concurrency) in LEVELS.into_iter().enumerate() {
        rates.push(measure(&lab, &urls, concurrency, round * LEVELS.len() + level).await);
    }
    for mut replica in others {
        replica.stop(Duration::from_secs(2)).await;
    }
    lab.shutdown().await;
    rates
}

/// Rounds of every column, interleaved so that a slow spell of the machine falls on every
/// column alike; each cell is the median of its rounds (one round in smoke mode).
fn rounds() -> usize {
    match std::env::var_os("FENCELAB_BENCH_SMOKE") {
        Some(_) => 1,
        None => 3,
    }
}

/// The median of `values` (the upper one of an even count); `None` when there are none.
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

/// The medians, level by level, of the rounds' rates.
fn medians(rounds: &[Vec<f64>]) -> Vec<f64> {
    (0..LEVELS.len())
        .filter_map(|level| {
            median(&mut rounds.iter().filter_map(|rates| rates.get(level).copied()).collect::<Vec<_>>())
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let cluster = match procs::pg::unavailable() {
        None => {
            Some(tokio::task::spawn_blocking(procs::pg::TempCluster::start).await.unwrap().expect("cluster starts"))
        }
        Some(why) => {
            eprintln!("PostgreSQL column skipped: {why}");
            None
        }
    };
    let mut columns: [Vec<Vec<f64>>; 4] = Default::default();
    for round in 0..rounds() {
        columns[0].push(rates(None, 1, round).await);
        columns[1].push(rates(None, 3, round).await);
        if let Some(cluster) = &cluster {
            columns[2].push(rates(Some(cluster.url()), 1, round).await);
            columns[3].push(rates(Some(cluster.url()), 3, round).await);
        }
    }
    let [sqlite, sqlite_3, postgres, postgres_3] = columns.map(|column| medians(&column));
    println!(
        "lifecycles/s (submit, claim, capability, 2 heartbeats, result), {:.1} s a level, median of {} rounds",
        level_duration().as_secs_f64(),
        rounds()
    );
    println!(
        "{:>12} {:>12} {:>14} {:>12} {:>16} {:>22}",
        "concurrency", "sqlite", "sqlite 3 rep.", "postgres", "postgres 3 rep.", "pg 3 rep./sqlite 3 rep."
    );
    let cell =
        |rates: &[f64], index: usize| rates.get(index).map_or_else(|| "-".to_string(), |rate| format!("{rate:.0}"));
    for (index, concurrency) in LEVELS.into_iter().enumerate() {
        let ratio = match (postgres_3.get(index), sqlite_3.get(index)) {
            (Some(postgres), Some(sqlite)) => format!("{:.2}", postgres / sqlite),
            _ => "-".to_string(),
        };
        println!(
            "{concurrency:>12} {:>12} {:>14} {:>12} {:>16} {ratio:>22}",
            cell(&sqlite, index),
            cell(&sqlite_3, index),
            cell(&postgres, index),
            cell(&postgres_3, index)
        );
    }
    if let Some(cluster) = cluster {
        tokio::task::spawn_blocking(move || drop(cluster)).await.unwrap();
    }
}
