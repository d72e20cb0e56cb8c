//! A chaos run: start the lab and its proxies, run the client's jobs and the nemesis for
//! the time limit, recover (heal, reconcile, settle), collect every record, stop every
//! process, and leave a run folder with the whole history.

pub mod cluster;
pub mod config;
pub mod nemesis;
pub mod operator;
pub mod recorder;

use history::{Op, Process};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use history::EventType;
use protocol::{JobSpec, JobState, JobView, SubmitJob};
use tokio::sync::Mutex;
use workloads::jobs::PlannedJob;

use cluster::Cluster;
use config::RunConfig;
use recorder::Recorder;

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
}

pub type Shared = Arc<State>;

/// What a finished run reports.
pub struct RunEnd {
    pub folder: PathBuf,
    pub complete: bool,
    pub jobs: Vec<JobView>,
    pub events: usize,
    pub healthy_ms: u64,
    pub faults: usize,
}

/// Creates `store/<test>/<start-time>/`; an unwritable store is bad input.
pub fn create_folder(config: &RunConfig) -> Result<PathBuf, String> {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ").to_string();
    let folder = config.store.join(&config.test_name).join(stamp);
    std::fs::create_dir_all(&folder).map_err(|error| format!("--store {}: {error}", config.store.display()))?;
    Ok(folder)
}

/// Points `store/latest` at the newest run folder.
pub(crate) fn link_latest(store: &Path, folder: &Path) {
    let latest = store.join("latest");
    let _ = std::fs::remove_file(&latest);
    let relative = folder.strip_prefix(store).unwrap_or(folder);
    let _ = std::os::unix::fs::symlink(relative, &latest);
}

pub(crate) fn write_json(path: &Path, value: &impl serde::Serialize) -> std::io::Result<()> {
    std::fs::write(path, serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?)
}

pub async fn execute(
    config: RunConfig,
    folder: PathBuf,
    interrupt: impl std::future::Future<Output = ()>,
) -> anyhow::Result<RunEnd> {
    let system = crate::system::SystemFile::of_config(&config)?;
    let not_run = system.faults_not_run(&config.nemesis, &system.clock_control(), config.db);
    let schedule = config.fault_schedule_without(&not_run.iter().map(|not| not.fault).collect::<Vec<_>>());
    let jobs = workloads::jobs::plan(config.seed, &config.job_options());
    write_json(&folder.join("schedule.json"), &schedule)?;
    write_json(&folder.join("jobs.json"), &jobs)?;
    let recorder = Recorder::create(&folder.join("history.jsonl"))?;
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339();
    let command = config.command_in(&folder);
    let cluster =
        tokio::time::timeout(HEALTHY_WAIT_MAX, Cluster::start(&config, &folder.join("lab"), &std::env::current_exe()?))
            .await
            .map_err(|_| anyhow::anyhow!("the cluster was not healthy within {HEALTHY_WAIT_MAX:?}"))??;
    let healthy_ms = started.elapsed().as_millis() as u64;
    let file = config::ConfigFile {
        run: config.clone(),
        clock_control: cluster.clock.clone(),
        system: cluster.info.clone(),
        healthy_ms: Some(healthy_ms),
        scenario: None,
    };
    let full_config = serde_json::to_value(&file)?;
    write_json(&folder.join("config.json"), &full_config)?;
    recorder.record(Process::HARNESS, EventType::Ok, Op::Config, |event| event.value = Some(full_config.clone()));
    let shared: Shared = Arc::new(State {
        config: Arc::new(config),
        recorder,
        cluster: Arc::new(Mutex::new(cluster)),
        active: Mutex::new(vec![]),
        submitted: AtomicU64::new(0),
    });
    let faults = schedule.len();
    let operator = tokio::spawn(operator::run(shared.clone()));
    let progress = tokio::spawn(progress(shared.clone()));
    let client = tokio::spawn(client(shared.clone(), jobs));
    let nemesis = tokio::spawn(nemesis::run(shared.clone(), schedule));
    let stoppable = [client.abort_handle(), nemesis.abort_handle()];
    let (complete, interrupted) = tokio::select! {
        complete = chaos_then_recovery(&shared, &stoppable) => (complete, false),
        _ = interrupt => (false, true),
    };
    for task in [operator, progress, client, nemesis] {
        task.abort();
        let _ = task.await;
    }
    let outcome = finish(&shared, folder, complete, interrupted, healthy_ms, faults).await?;
    let meta = crate::check::RunMeta {
        command,
        started_at,
        duration_ms: started.elapsed().as_millis() as u64,
        complete: outcome.complete,
    };
    write_json(&outcome.folder.join("run.json"), &meta)?;
    Ok(outcome)
}

/// Lets the client and the nemesis run for the time limit, stops them, heals every fault,
/// and waits for the jobs to settle; true when every job settled in time.
async fn chaos_then_recovery(shared: &Shared, stoppable: &[tokio::task::AbortHandle]) -> bool {
    tokio::time::sleep(Duration::from_millis(shared.config.time_limit_ms)).await;
    for task in stoppable {
        task.abort();
    }
    if let Err(error) = nemesis::heal_all(&shared.cluster, &shared.config).await {
        shared.recorder.record(Process::NEMESIS, EventType::Info, Op::HealAll, |event| event.reason = Some(error));
    }
    shared.active.lock().await.clear();
    settle(shared).await
}

/// Submits the planned jobs at their times.
async fn client(shared: Shared, jobs: Vec<PlannedJob>) {
    for job in jobs {
        let wait_ms = job.at_ms.saturating_sub(shared.recorder.now_ms());
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        let _ = submit(&shared, &job).await;
    }
}

/// Submits one job as the client, recording the request and its answer.
pub(crate) async fn submit(shared: &Shared, job: &PlannedJob) -> Result<(), String> {
    let (operator, project) = {
        let cluster = shared.cluster.lock().await;
        (cluster.system.operator.clone(), cluster.system.launch.file.project.clone())
    };
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

/// Waits (bounded by the recovery limit) until every job is terminal.
pub(crate) async fn settle(shared: &Shared) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(shared.config.recovery_limit_ms);
    loop {
        let operator = shared.cluster.lock().await.system.operator.clone();
        if let Ok(jobs) = operator.jobs().await {
            if jobs.iter().all(settled) {
                return true;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
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

/// Collects the ledger, the step log and the final state, stops everything and writes the
/// whole history. An interrupted run never reached its end: it gets no `final` events, so
/// the checkers that need them answer unknown instead of reading an unsettled job as lost.
async fn finish(
    shared: &Shared,
    folder: PathBuf,
    complete: bool,
    interrupted: bool,
    healthy_ms: u64,
    faults: usize,
) -> anyhow::Result<RunEnd> {
    let (operator, steps) = {
        let mut cluster = shared.cluster.lock().await;
        // A runner that exited on its own is a worker the system lost: said in the history.
        for (runner, status) in cluster.exited_runners().await {
            shared.recorder.record(Process::HARNESS, EventType::Ok, Op::RunnerExited, |event| {
                event.runner = Some(runner);
                event.reason = Some(status);
            });
        }
        // No runner may report after the ledger is read: every answer it got is in the ledger.
        cluster.stop_runners().await;
        (cluster.system.operator.clone(), cluster.target_steps(COLLECT_WAIT_MAX).await.unwrap_or_default())
    };
    // What could not be read is said in the history (an `unreadable` event: every verdict
    // unknown, with the reason), never taken as empty: a database that died mid-run
    // leaves a control plane answering 503 here.
    let has_ledger = !shared.cluster.lock().await.info.absent.contains(&crate::system::Feature::Ledger);
    let mut unread: Vec<String> = Vec::new();
    let ledger = match operator.ledger(10_000_000).await {
        Ok(ledger) => ledger,
        Err(error) => {
            if has_ledger {
                unread.push(format!("the control plane's ledger could not be read: {error}"));
            }
            vec![]
        }
    };
    let mut jobs = Vec::new();
    let listed = operator.jobs().await.unwrap_or_else(|error| {
        unread.push(format!("the control plane's jobs could not be read: {error}"));
        vec![]
    });
    for job in listed {
        match operator.job(&job.id).await {
            Ok(view) => jobs.push(view),
            Err(error) => {
                unread.push(format!("job `{}` could not be read: {error}", job.id));
                jobs.push(job);
            }
        }
    }
    let mut finals: Vec<history::Event> = if interrupted { vec![] } else { jobs.iter().map(final_event).collect() };
    for why in unread {
        let mut event = history::Event::new(0, Process::HARNESS, EventType::Info, Op::Unreadable);
        event.reason = Some(why);
        finals.push(event);
    }
    let logs = shared.cluster.lock().await.runner_logs();
    shared.cluster.lock().await.stop().await;
    let events = shared.recorder.finish(&logs, &ledger, &steps, finals)?;
    link_latest(&shared.config.store, &folder);
    Ok(RunEnd { folder, complete: complete && !ledger.is_empty(), jobs, events, healthy_ms, faults })
}

pub fn final_event(job: &JobView) -> history::Event {
    let state = serde_json::to_value(job.state).ok().and_then(|value| value.as_str().map(str::to_string));
    let mut event = history::Event::new(0, Process::HARNESS, EventType::Ok, Op::Final);
    event.job = Some(job.id.clone());
    event.key = Some(job.deployment_key.clone());
    event.attempt = job.current_attempt.clone();
    event.outcome = state;
    let attempts: Vec<serde_json::Value> = job
        .attempts
        .iter()
        .map(|a| serde_json::json!({"attempt": a.id, "runner": a.runner, "fence": a.fence, "state": a.state, "closed_by": a.closed_by}))
        .collect();
    event.value = Some(serde_json::json!({ "attempts": attempts }));
    event
}
