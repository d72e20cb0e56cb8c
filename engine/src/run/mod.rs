//! A chaos run: start the lab and its proxies, run the client's jobs and the nemesis for
//! the time limit, recover (heal, reconcile, settle), collect every record, stop every
//! process, and leave a run folder with the whole history.

pub mod cluster;

pub mod driver;
pub mod nemesis;
pub mod operator;
pub mod recorder;

use crate::error::RunError;
use history::{Op, Process};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use history::EventType;
use protocol::{JobSpec, JobState, JobView, SubmitJob};
use tokio::sync::Mutex;
use workloads::jobs::PlannedJob;

use cluster::Cluster;
use recorder::Recorder;
use runfolder::config::RunConfig;

/// Longest wait for the cluster to be up and healthy (150 s: a system file may give each
/// server up to 120 s to become ready).
pub const HEALTHY_WAIT_MAX: Duration = Duration::from_secs(150);
/// Longest wait for any collection request at the end (10 s each).
pub const COLLECT_WAIT_MAX: Duration = Duration::from_secs(10);

pub struct State {
    pub config: Arc<RunConfig>,
    pub recorder: Recorder,
    pub cluster: Arc<Mutex<Cluster>>,
    /// Labels of the faults in effect now, for the progress line.
    pub active: Mutex<Vec<String>>,
    pub submitted: AtomicU64,
    /// The operator's client and the project as last read from the cluster, for a submit
    /// that finds the cluster busy (a fault in progress holds it): the client submits on
    /// its own schedule, not when the harness's nemesis lets it.
    pub submit_to: std::sync::Mutex<Option<(protocol::client::Client, String)>>,
    /// The running claims as the faults that wait for one last read them.
    pub claims: Mutex<nemesis::ClaimsView>,
}

pub type Shared = Arc<State>;

/// A chaos run of `config` in `folder`: its jobs and fault schedule planned from the seed
/// (without the faults the system cannot take), driven by the one driver.
pub async fn execute(
    config: RunConfig,
    folder: PathBuf,
    program: &Path,
    interrupt: impl std::future::Future<Output = ()>,
) -> Result<driver::Driven, RunError> {
    let system = system::SystemFile::of_choice(config.system.as_deref())?;
    let not_run = faults_not_run(&config, &system, &system.clock_control());
    let partitions = workloads::faults::FaultKind::Partition;
    if config.nemesis.contains(&partitions) && !not_run.iter().any(|not| not.fault == partitions) {
        // Rules on lo left by a harness killed with SIGKILL go before this run adds its own.
        let _ = tokio::task::spawn_blocking(system::packets::sweep_dead).await;
    }
    let schedule = config.fault_schedule_without(&not_run);
    let jobs = workloads::jobs::plan(config.seed, &config.job_options());
    driver::drive(config, folder, program, Chaos { jobs, schedule }, interrupt).await
}

/// A chaos run's part of a driven run: the client submits the planned jobs and the nemesis
/// executes the fault schedule for the time limit; then every fault is healed and the jobs
/// settle.
struct Chaos {
    jobs: Vec<PlannedJob>,
    schedule: Vec<workloads::faults::Fault>,
}

impl driver::Work for Chaos {
    fn command(&self, config: &RunConfig, folder: &runfolder::folder::RunFolder) -> String {
        folder.repeat_command(config)
    }

    fn write_plan(&self, folder: &runfolder::folder::RunFolder) -> Result<usize, runfolder::folder::FolderError> {
        folder.write_schedule(&self.schedule)?;
        folder.write_jobs(&self.jobs)?;
        Ok(self.schedule.len())
    }

    async fn prepare(&self, _: &cluster::Cluster) -> Option<runfolder::config::ScenarioInfo> {
        None
    }

    async fn go(self, shared: &Shared, interrupt: impl std::future::Future<Output = ()>) -> driver::Ended {
        chaos(shared, self.jobs, self.schedule, interrupt).await
    }
}

/// The faults of `config` that the system (`file`, with runner clocks moved by `clock`),
/// this host or the run's fault proxy cannot take, each with why.
pub fn faults_not_run(
    config: &RunConfig,
    file: &system::SystemFile,
    clock: &system::ClockControl,
) -> Vec<system::NotRun> {
    let mut not_run = file.faults_not_run(&config.nemesis, clock, config.db);
    let embedded_proxy = config.toxiproxy_url.is_none() && config.toxiproxy_image.is_none();
    not_run.extend(system::host_faults_not_run(&config.nemesis, embedded_proxy));
    not_run
}

/// The middle of a chaos run: the operator, the progress line, the client and the nemesis,
/// until the time limit and recovery end or `interrupt` comes.
async fn chaos(
    shared: &Shared,
    jobs: Vec<PlannedJob>,
    schedule: Vec<workloads::faults::Fault>,
    interrupt: impl std::future::Future<Output = ()>,
) -> driver::Ended {
    // The plan's times (`at_ms` of its jobs and faults) count from here, where the time
    // limit does: a start that took long must not leave them overdue, to fire in a burst.
    let origin_ms = shared.recorder.now_ms();
    let operator = tokio::spawn(operator::run(shared.clone()));
    let progress = tokio::spawn(progress(shared.clone()));
    let client = tokio::spawn(client(shared.clone(), jobs, origin_ms));
    let nemesis = tokio::spawn(nemesis::run(shared.clone(), schedule, origin_ms));
    let stoppable = [client.abort_handle(), nemesis.abort_handle()];
    let ((settled, stopped_at_first), interrupted) = tokio::select! {
        ended = chaos_then_recovery(shared, &stoppable) => (ended, false),
        _ = interrupt => ((false, false), true),
    };
    for task in [operator, progress, client, nemesis] {
        task.abort();
        let _ = task.await;
    }
    // A partition's rules went with its aborted task; none may outlive the run's work.
    if shared.config.nemesis.contains(&workloads::faults::FaultKind::Partition) {
        let _ = tokio::task::spawn_blocking(system::packets::remove_own).await;
    }
    driver::Ended { settled, interrupted, steps_passed: true, recovery: true, stopped_at_first }
}

/// Lets the client and the nemesis run for the time limit, stops them, heals every fault,
/// and waits for the jobs to settle: whether every job settled in time, and whether the
/// run stopped at its first anomaly instead (`--stop-at-first`: then nothing settles, the
/// verdict stands on the anomaly).
async fn chaos_then_recovery(shared: &Shared, stoppable: &[tokio::task::AbortHandle]) -> (bool, bool) {
    let limit = tokio::time::sleep(Duration::from_millis(shared.config.time_limit_ms));
    let mut stopped = false;
    if shared.config.stop_at_first {
        tokio::select! {
            () = limit => {}
            found = first_anomaly(shared) => {
                println!("stopped      at the first anomaly the live records showed ({found}); checking the whole history");
                shared.recorder.record(Process::HARNESS, EventType::Info, Op::StopAtFirst, |event| {
                    event.reason = Some(found);
                });
                stopped = true;
            }
        }
    } else {
        limit.await;
    }
    for task in stoppable {
        task.abort();
    }
    if let Err(error) = nemesis::heal_all(&shared.cluster).await {
        shared.recorder.record(Process::NEMESIS, EventType::Info, Op::HealAll, |event| event.reason = Some(error));
    }
    shared.active.lock().await.clear();
    if stopped {
        return (false, true);
    }
    (settle(shared).await, false)
}

/// What `--stop-at-first` stops on: the checkers, each with the anomaly kinds (all of them
/// when none is named) that stand in the whole history once found in the live records read
/// in the watch's order — the harness's own events, then the runners' logs, then the
/// target's step log, then the ledger. Each names something that happened (a decision, a
/// step, an act), or an answer the records read after it must hold and do not (a runner's
/// answer absent from the ledger, read later). Left out: kinds that stand on something
/// missing at the end (a job lost, no progress) or on counts a later record can change
/// (`applied-more-than-sent`, and `foreign-report-applied`, the same count when a report sent
/// with another runner's token is among them: a report sent after the watch read the
/// runners' logs and the harness's events, and applied before it read the ledger, is an
/// entry no read record sent yet).
const WATCHED: [(&str, &[&str]); 10] = [
    ("rules-model", &[]),
    ("single-owner", &[]),
    ("fence-order", &[]),
    ("terminal-stability", &[]),
    ("stale-completion", &[]),
    ("heartbeat-resurrection", &[]),
    ("stale-side-effect", &["stale-step-applied", "step-after-lease"]),
    ("progress", &["refusal-unjustified"]),
    (
        "ledger-completeness",
        &["answer-differs-from-ledger", "answer-missing-from-ledger", "result-not-ruled", "report-not-ruled"],
    ),
    ("runner-contract", &["acted-past-deadline", "acted-after-refusal", "result-unbacked"]),
];
/// Kinds of the checkers in [`WATCHED`] that stand on a record of the harness's own missing
/// before a later-read one: an operator's reconcile decision made after the watch took the
/// harness's events, whose reconcile the ledger read next already holds, would read as a
/// reconcile no operator decided (`reconcile-unauthorised`), and the run would stop on it.
const UNWATCHED: [(&str, &str); 1] = [("rules-model", "reconcile-unauthorised")];
/// How often `--stop-at-first` reads the live records.
const WATCH_EVERY: Duration = Duration::from_millis(1_000);
/// Ledger entries asked for per page by the watch.
const WATCH_PAGE_ENTRIES: u64 = 1_000;
/// Most ledger entries the watch holds (each turn checks everything read again): past it,
/// the run goes on to its time limit.
const WATCH_ENTRIES_MAX: usize = 100_000;

/// Every [`WATCH_EVERY`], reads the live records in the order [`WATCHED`] relies on — the
/// harness's own events, the runners' logs, the target's new steps, the ledger's new
/// entries — merges them as the end of the run does, and checks them; returns the first
/// anomaly of a watched kind, in words. Never returns past [`WATCH_ENTRIES_MAX`] entries.
async fn first_anomaly(shared: &Shared) -> String {
    let (operator, target, logs, has_ledger) = {
        let cluster = shared.cluster.lock().await;
        let target = cluster.system.target_url().map(|url| protocol::client::Client::new(&url, None, WATCH_EVERY));
        let has_ledger = !cluster.info.absent.contains(&system::Feature::Ledger);
        (cluster.system.operator.clone(), target, cluster.runner_logs(), has_ledger)
    };
    let wanted: Vec<&str> = WATCHED.iter().map(|(checker, _)| *checker).collect();
    let (mut ledger, mut steps) = (Vec::new(), Vec::new());
    let mut after = 0;
    while ledger.len() <= WATCH_ENTRIES_MAX {
        tokio::time::sleep(WATCH_EVERY).await;
        let own = shared.recorder.snapshot();
        let runners = recorder::read_runner_logs(&shared.recorder, &logs).await;
        // A page that cannot be read now (a restart in progress) is read at the next turn.
        if let Some(target) = &target {
            while let Ok(page) = target.steps_after(steps.len()).await {
                if page.is_empty() {
                    break;
                }
                steps.extend(page);
            }
        }
        // The ledger is read to its end, or this turn checks nothing: the runners' logs just
        // read may hold answers whose entries a ledger read short (a page refused or timed
        // out on a loaded machine, a restart in progress) lacks, and would be judged missing.
        let mut to_end = false;
        while let Ok(page) = operator.ledger_page(after, WATCH_PAGE_ENTRIES).await {
            after = page.iter().map(|entry| entry.seq).max().unwrap_or(after).max(after);
            let full = page.len() as u64 >= WATCH_PAGE_ENTRIES;
            ledger.extend(page);
            if !full {
                to_end = true;
                break;
            }
        }
        if has_ledger && (ledger.is_empty() || !to_end) {
            continue;
        }
        let events = shared.recorder.partial(own, runners, &ledger, &steps);
        if let Some(anomaly) = first_watched(&checkers::check_named(&wanted, &events)) {
            let at = shared.recorder.now_ms();
            return format!("{}/{} at {at} ms: {}", anomaly.checker, anomaly.kind, anomaly.message);
        }
    }
    std::future::pending().await
}

/// The first anomaly of `results` that `--stop-at-first` stops on ([`WATCHED`], less
/// [`UNWATCHED`]).
fn first_watched(results: &[checkers::CheckerResult]) -> Option<&checkers::Anomaly> {
    results.iter().find_map(|result| {
        let checkers::Verdict::Invalid { anomalies } = &result.verdict else { return None };
        let kinds = WATCHED.iter().find(|(checker, _)| *checker == result.checker)?.1;
        anomalies.iter().find(|anomaly| {
            let named = kinds.is_empty() || kinds.contains(&anomaly.kind.as_str());
            named && !UNWATCHED.contains(&(anomaly.checker.as_str(), anomaly.kind.as_str()))
        })
    })
}

/// Most submits the client has in flight at once: a slow control plane delays the
/// schedule's later jobs instead of piling up requests.
const SUBMITS_IN_FLIGHT_MAX: usize = 64;

/// Submits the planned jobs at their times from `origin_ms` (the history's ms when the
/// workload began), each without waiting for the previous one's answer (at most
/// [`SUBMITS_IN_FLIGHT_MAX`] at once), so that the rate holds when an answer takes longer
/// than the gap between two jobs. Aborting the client aborts the submits in flight with it.
async fn client(shared: Shared, jobs: Vec<PlannedJob>, origin_ms: u64) {
    let mut in_flight = tokio::task::JoinSet::new();
    for job in jobs {
        let wait_ms = (origin_ms + job.at_ms).saturating_sub(shared.recorder.now_ms());
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        while in_flight.len() >= SUBMITS_IN_FLIGHT_MAX {
            in_flight.join_next().await;
        }
        let shared = shared.clone();
        in_flight.spawn(async move {
            let _ = submit(&shared, &job).await;
        });
        while in_flight.try_join_next().is_some() {}
    }
    while in_flight.join_next().await.is_some() {}
}

/// Submits one job as the client, recording the request and its answer.
pub(crate) async fn submit(shared: &Shared, job: &PlannedJob) -> Result<(), String> {
    let cached = shared.submit_to.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
    let (operator, project) = match (shared.cluster.try_lock(), cached) {
        (Err(_), Some(cached)) => cached,
        (Ok(cluster), _) => (cluster.system.operator.clone(), cluster.system.launch.file.project.clone()),
        (Err(_), None) => {
            let cluster = shared.cluster.lock().await;
            (cluster.system.operator.clone(), cluster.system.launch.file.project.clone())
        }
    };
    *shared.submit_to.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
        Some((operator.clone(), project.clone()));
    let fill = |event: &mut history::Event| {
        event.job = Some(job.id.clone());
        event.key = Some(job.deployment_key.clone());
    };
    shared.recorder.record(Process::CLIENT, EventType::Invoke, Op::Submit, fill);
    let request = SubmitJob {
        project,
        id: Some(job.id.clone()),
        deployment_key: job.deployment_key.clone(),
        spec: JobSpec { steps: job.steps, step_ms: job.step_ms },
    };
    let answer = operator.submit(&request).await;
    let kind = match &answer {
        Ok(_) => EventType::Ok,
        Err(error) if error.outcome_unknown() => EventType::Info,
        Err(_) => EventType::Fail,
    };
    shared.recorder.record(Process::CLIENT, kind, Op::Submit, |event| {
        fill(event);
        event.reason = answer.as_ref().err().map(|error| error.to_string());
    });
    shared.submitted.fetch_add(1, Ordering::Relaxed);
    answer.map(drop).map_err(|error| error.to_string())
}

fn settled(job: &JobView) -> bool {
    matches!(job.state, JobState::Succeeded | JobState::Failed)
}

/// How a wait for the jobs to settle ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Settling {
    /// Every job is terminal.
    Settled,
    /// No job changed (state, attempts, ledger) for the quiet window: nothing moves the
    /// jobs still open, named with their states.
    Quiet { quiet_ms: u64, open: Vec<String> },
    /// The recovery limit passed with jobs still moving or open.
    TimedOut,
}

/// What of a job moves when anything acts on it: its id, state, current attempt, and how
/// many attempts and ledger entries it has.
type Signature = (String, JobState, Option<String>, usize, usize);

fn signature(job: &JobView) -> Signature {
    (job.id.clone(), job.state, job.current_attempt.clone(), job.attempts.len(), job.ledger.len())
}

/// Waits (bounded by the recovery limit) until every job is terminal.
pub(crate) async fn settle(shared: &Shared) -> bool {
    settle_or_quiet(shared, None).await == Settling::Settled
}

/// Waits (bounded by the recovery limit) until every job is terminal; with `quiet_ms`, ends
/// as soon as no job has changed for that long (jobs nothing moves on never settle: a
/// claim held by a runner a scenario plays, a job uncertain with no operator to decide).
pub(crate) async fn settle_or_quiet(shared: &Shared, quiet_ms: Option<u64>) -> Settling {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(shared.config.recovery_limit_ms);
    let mut last: Option<(Vec<Signature>, tokio::time::Instant)> = None;
    loop {
        let operator = shared.cluster.lock().await.system.operator.clone();
        if let Ok(jobs) = operator.jobs().await {
            if jobs.iter().all(settled) {
                return Settling::Settled;
            }
            let now = tokio::time::Instant::now();
            let signatures: Vec<_> = jobs.iter().map(signature).collect();
            match (&last, quiet_ms) {
                (Some((previous, since)), Some(quiet_ms)) if *previous == signatures => {
                    if now.duration_since(*since) >= Duration::from_millis(quiet_ms) {
                        let open = jobs
                            .iter()
                            .filter(|job| !settled(job))
                            .map(|job| format!("{} {}", job.id, format!("{:?}", job.state).to_lowercase()))
                            .collect();
                        return Settling::Quiet { quiet_ms, open };
                    }
                }
                _ => last = Some((signatures, now)),
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Settling::TimedOut;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One line a second on stderr: elapsed time, jobs, faults in effect.
async fn progress(shared: Shared) {
    let limit_s = shared.config.time_limit_ms / 1_000;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let elapsed_s = shared.recorder.now_ms() / 1_000;
        let phase = if elapsed_s < limit_s { "chaos" } else { "recovery" };
        let active = shared.active.lock().await.join(" ");
        let submitted = shared.submitted.load(Ordering::Relaxed);
        let operator = shared.cluster.lock().await.system.operator.clone();
        let done = operator.jobs().await.map_or(0, |jobs| jobs.iter().filter(|job| settled(job)).count());
        eprintln!(
            "[{phase}] {elapsed_s}s/{limit_s}s  jobs done {done}/{submitted}  faults: {}",
            if active.is_empty() { "-" } else { &active }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anomaly(checker: &str, kind: &str) -> checkers::Anomaly {
        checkers::Anomaly {
            checker: checker.into(),
            kind: kind.into(),
            job: None,
            attempts: vec![],
            runners: vec![],
            fences: vec![],
            key: None,
            events: vec![],
            message: format!("{checker}/{kind}"),
        }
    }

    fn invalid(checker: &str, kinds: &[&str]) -> checkers::CheckerResult {
        let anomalies = kinds.iter().map(|kind| anomaly(checker, kind)).collect();
        checkers::CheckerResult {
            checker: checker.into(),
            description: String::new(),
            verdict: checkers::Verdict::Invalid { anomalies },
        }
    }

    /// The watch passes over a reconcile it cannot yet tie to the operator's decision, and
    /// over kinds its checker does not stand on, and stops on the next one it does.
    #[test]
    fn the_watch_stops_on_watched_kinds_only() {
        let results = [
            invalid("rules-model", &["reconcile-unauthorised"]),
            invalid("lost-work", &["lost"]),
            invalid(
                "ledger-completeness",
                &["applied-more-than-sent", "foreign-report-applied", "answer-missing-from-ledger"],
            ),
        ];
        let found = first_watched(&results).map(|anomaly| anomaly.message.as_str());
        assert_eq!(found, Some("ledger-completeness/answer-missing-from-ledger"));
        assert_eq!(first_watched(&results[..2]), None);
        let both = [invalid("rules-model", &["reconcile-unauthorised", "result-accepted-wrongly"])];
        assert_eq!(first_watched(&both).map(|anomaly| anomaly.kind.as_str()), Some("result-accepted-wrongly"));
    }
}
