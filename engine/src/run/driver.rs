//! The one driver of runs and scenarios. Both start the system and its proxies the same way,
//! write the same run folder, keep one history through one recorder, heal every fault, and
//! end through the one collector (`system::collect`) and the one check (`verdict::check`).
//! What differs is the work in the middle ([`Work`]): a chaos run's client and nemesis for
//! the time limit and then recovery (`run::Chaos`), or a scenario's steps in order
//! (`scenario::Steps`); the driver knows neither.
//!
//! ```text
//! drive ─► start (Cluster::start) ─► config.json ─► work: Chaos | Steps ─► finish
//!                                                                           │
//!     collect (system::collect) ◄── stop runners ◄── runner-exited events ◄─┘
//!        └─► Recorder::finish (history.jsonl) ─► run.json ─► check::check_folder
//! ```

use crate::error::RunError;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use history::{EventType, Op, Process};
use tokio::sync::Mutex;

use super::cluster::Cluster;
use super::recorder::Recorder;
use super::{Shared, State, COLLECT_WAIT_MAX, HEALTHY_WAIT_MAX};
use runfolder::config::{ConfigFile, RunConfig, ScenarioInfo};
use runfolder::folder::{Endpoints, FolderError, RunFolder, RunMeta};

/// What a driven run does between the start of its system and the collection of its
/// records: a chaos run (the client submits the planned jobs and the nemesis executes the
/// fault schedule for the time limit; then every fault is healed and the jobs settle), or a
/// scenario (its steps in order; then, with background work, the jobs settle).
pub(crate) trait Work {
    /// The command that repeats the run of `config` in `folder`.
    fn command(&self, config: &RunConfig, folder: &RunFolder) -> String;
    /// Writes the plan the work follows (a chaos run's fault schedule and jobs, a
    /// scenario's empty schedule); answers how many faults it schedules.
    fn write_plan(&self, folder: &RunFolder) -> Result<usize, FolderError>;
    /// Readies the started system before `config.json` is written; answers what that file
    /// says of a scenario (nothing for a chaos run).
    async fn prepare(&self, cluster: &Cluster) -> Option<ScenarioInfo>;
    /// The work itself, until it ends or `interrupt` resolves.
    async fn go(self, shared: &Shared, interrupt: impl Future<Output = ()>) -> Ended;
}

/// What a driven run reports.
pub struct Driven {
    pub folder: PathBuf,
    /// Not interrupted, every job settled, every record read.
    pub complete: bool,
    /// Why the run is not complete, in words (`None` when it is).
    pub incomplete: Option<String>,
    /// A scenario's steps all ran (always true for a chaos run).
    pub steps_passed: bool,
    pub records: system::collect::Records,
    pub events: usize,
    pub healthy_ms: u64,
    /// Faults in the schedule (a chaos run's).
    pub faults: usize,
    /// The run as checked: every checker's verdict.
    pub run: results::Run,
    /// What the system is, and the faults asked for that it could not take (and why).
    pub system: system::SystemInfo,
}

/// Drives one run in `folder`: `program` is the `fencelab` binary; `interrupt` ends the
/// work early (Ctrl-C), after which the run is still collected and written, incomplete.
pub(crate) async fn drive(
    config: RunConfig,
    folder: PathBuf,
    program: &Path,
    work: impl Work,
    interrupt: impl Future<Output = ()>,
) -> Result<Driven, RunError> {
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339();
    let run_folder = RunFolder::at(&folder);
    let command = work.command(&config, &run_folder);
    let faults = work.write_plan(&run_folder)?;
    let recorder = Recorder::create(&run_folder.history_path()).map_err(RunError::io("creating the history"))?;
    let cluster = tokio::time::timeout(HEALTHY_WAIT_MAX, Cluster::start(&config, &run_folder.lab_path(), program))
        .await
        .map_err(|_| RunError::Unhealthy(HEALTHY_WAIT_MAX))??;
    let healthy_ms = started.elapsed().as_millis() as u64;
    let scenario = work.prepare(&cluster).await;
    let file = ConfigFile {
        run: config.clone(),
        clock_control: cluster.clock.clone(),
        system: cluster.info.clone(),
        healthy_ms: scenario.is_none().then_some(healthy_ms),
        scenario,
    };
    let replicas = 0..cluster.system.ports.len();
    let endpoints = Endpoints {
        control_urls: replicas.map(|replica| format!("http://{}", cluster.system.replica_addr(replica))).collect(),
        target_url: cluster.system.target_url(),
    };
    run_folder.write_endpoints(&endpoints)?;
    run_folder.write_config(&file)?;
    let said = file.said().event();
    recorder.record(said.process, said.kind, said.f, |event| event.value = said.value.clone());
    let shared: Shared = Arc::new(State {
        config: Arc::new(config),
        recorder,
        cluster: Arc::new(Mutex::new(cluster)),
        active: Mutex::new(vec![]),
        submitted: AtomicU64::new(0),
        submit_to: std::sync::Mutex::new(None),
        claims: Mutex::new(Default::default()),
    });
    let ended = work.go(&shared, interrupt).await;
    let (records, events) = finish(&shared, &ended).await?;
    run_folder.link_latest(&shared.config.store);
    let info = shared.cluster.lock().await.info.clone();
    let has_ledger = !info.absent.contains(&system::Feature::Ledger);
    let incomplete = incompleteness(&ended, &records, has_ledger, shared.config.recovery_limit_ms);
    let complete = incomplete.is_none();
    let meta = RunMeta { command, started_at, duration_ms: started.elapsed().as_millis() as u64, complete };
    run_folder.write_meta(&meta)?;
    let (_, run) = verdict::check::check_folder(&folder).map_err(RunError::Check)?;
    let steps_passed = ended.steps_passed;
    Ok(Driven { folder, complete, incomplete, steps_passed, records, events, healthy_ms, faults, run, system: info })
}

/// Why a run is incomplete: interrupted, jobs that did not settle (which, and in which
/// state), records that could not be read, or a ledger the system keeps that came back
/// empty. `None` when it is complete.
fn incompleteness(
    ended: &Ended,
    records: &system::collect::Records,
    has_ledger: bool,
    recovery_limit_ms: u64,
) -> Option<String> {
    let mut why = Vec::new();
    if ended.interrupted {
        why.push("interrupted".to_string());
    } else if !ended.settled {
        why.push(unsettled(records, ended, recovery_limit_ms));
    }
    if !records.unreadable.is_empty() {
        why.push(format!("{} records could not be read", records.unreadable.len()));
    }
    if has_ledger && records.ledger.is_empty() {
        why.push("the control plane's ledger came back empty".to_string());
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// How the work in the middle ended.
pub struct Ended {
    /// Every job settled within the recovery limit (or nothing had to settle).
    pub settled: bool,
    /// Whether a recovery phase ran (a chaos run's, a scenario's with background work).
    pub recovery: bool,
    pub interrupted: bool,
    pub steps_passed: bool,
    /// The run stopped at its first anomaly (`--stop-at-first`) and skipped recovery.
    pub stopped_at_first: bool,
}

/// Says which runners exited on their own, stops the runners (none may report after the
/// records are read), collects every record, stops everything and writes the whole
/// history. An interrupted run gets no `final` events: it never reached its end, so the
/// checkers that need them answer unknown instead of reading an unsettled job as lost.
async fn finish(shared: &Shared, ended: &Ended) -> Result<(system::collect::Records, usize), RunError> {
    let interrupted = ended.interrupted;
    let mut cluster = shared.cluster.lock().await;
    for (runner, status) in cluster.exited_runners().await {
        shared.recorder.record(Process::HARNESS, EventType::Ok, Op::RunnerExited, |event| {
            event.runner = Some(runner);
            event.reason = Some(status);
        });
    }
    cluster.stop_runners().await;
    let records = system::collect::collect(&cluster.system, COLLECT_WAIT_MAX).await;
    if ended.recovery && !interrupted {
        recovery(shared, ended, &records);
    }
    let sources = held(&cluster, interrupted);
    // An observed system's runners keep no fencelab log: none is read.
    let logs = if sources.contains(&history::Source::RunnerLogs) { cluster.runner_logs() } else { vec![] };
    cluster.stop().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut closing = records.closing_events(!interrupted);
    closing.push(history::sources_event(&sources));
    let events = shared
        .recorder
        .finish(&logs, &records.ledger, &records.steps, closing)
        .map_err(RunError::io("writing the history"))?;
    Ok((records, events))
}

/// The most unsettled jobs a `recovery` event names.
const UNSETTLED_NAMED_MAX: usize = 10;

/// Says in the history whether recovery settled every job, and if not which jobs were left
/// in which state: such a run is incomplete, and its unsettled jobs are not judged lost.
fn recovery(shared: &Shared, ended: &Ended, records: &system::collect::Records) {
    let kind = if ended.settled { EventType::Ok } else { EventType::Info };
    shared.recorder.record(Process::HARNESS, kind, Op::Recovery, |event| {
        if !ended.settled {
            event.reason = Some(unsettled(records, ended, shared.config.recovery_limit_ms));
        }
    });
}

/// Which jobs were not terminal after the recovery limit, and in which state.
fn unsettled(records: &system::collect::Records, ended: &Ended, recovery_limit_ms: u64) -> String {
    let terminal =
        |job: &&protocol::JobView| matches!(job.state, protocol::JobState::Succeeded | protocol::JobState::Failed);
    let left: Vec<String> = records
        .jobs
        .iter()
        .filter(|job| !terminal(job))
        .map(|job| format!("{} ({})", job.id, format!("{:?}", job.state).to_lowercase()))
        .collect();
    let named = left.iter().take(UNSETTLED_NAMED_MAX).cloned().collect::<Vec<_>>().join(", ");
    let more = left.len().saturating_sub(UNSETTLED_NAMED_MAX);
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    let when = if ended.stopped_at_first {
        "when the run stopped at its first anomaly (--stop-at-first: no recovery)".to_string()
    } else if !ended.steps_passed && !ended.interrupted {
        "when the scenario stopped at a step that failed (no recovery)".to_string()
    } else {
        format!("after the {recovery_limit_ms} ms recovery limit")
    };
    format!("{} of {} jobs were not terminal {when}: {named}{more}", left.len(), records.jobs.len())
}

/// The sources of evidence a driven run's history holds: the harness was the client, the
/// operator and the nemesis, and read the config; the runners' logs, the ledger and the
/// target's step log when the system has them; the final states unless the run was
/// interrupted. (Whether the ledger holds leases the config says: `system.absent`.)
fn held(cluster: &Cluster, interrupted: bool) -> std::collections::BTreeSet<history::Source> {
    use history::Source;
    let mut sources =
        std::collections::BTreeSet::from([Source::Operator, Source::Nemesis, Source::Client, Source::Config]);
    if !cluster.info.absent.contains(&system::Feature::RunnerLog) {
        sources.insert(Source::RunnerLogs);
    }

    if !cluster.info.absent.contains(&system::Feature::Ledger) {
        sources.insert(Source::Ledger);
    }
    if cluster.system.target_url().is_some() {
        sources.insert(Source::TargetLog);
    }
    if !interrupted {
        sources.insert(Source::Finals);
    }
    sources
}
