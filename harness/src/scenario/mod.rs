//! Scenario files: an incident scripted step by step against the real lab
//! (`fencelab scenario run FILE`, format in `docs/scenarios.md`). The run starts the same
//! cluster as `fencelab run`, executes the steps in order, collects and checks the history
//! like a run, and then asserts every `[[expect]]`.

pub mod conditions;
pub use workloads::scenario as format;
mod player;
mod steps;

use crate::run::{link_latest, write_json};
use history::{Op, Process};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use history::EventType;
use tokio::sync::Mutex;
use tokio::task::JoinSet;

use crate::run::cluster::Cluster;
use crate::run::config::{validate, ConfigFile, RunArgs, RunConfig, ScenarioInfo};
use crate::run::operator;
use crate::run::recorder::Recorder;
use crate::run::{Shared, State};
use conditions::{describe, evaluate, View};
use format::{OperatorMode, Scenario};

/// Why a scenario could not be run to a verdict.
#[derive(Debug)]
pub enum ScenarioError {
    /// The file is unreadable or not a valid scenario: nothing was started (exit 254).
    Bad(String),
    /// Something broke while running it (exit 255).
    Internal(anyhow::Error),
}

/// What a scenario run found.
pub struct Report {
    pub folder: PathBuf,
    pub passed: bool,
}

/// The checkers an expectation may name.
pub fn checker_names() -> Vec<&'static str> {
    checkers::names().iter().map(|(name, _)| *name).collect()
}

/// Reads and validates a scenario file.
pub fn load(file: &Path) -> Result<Scenario, ScenarioError> {
    let text =
        std::fs::read_to_string(file).map_err(|error| ScenarioError::Bad(format!("{}: {error}", file.display())))?;
    let bad = |message: String| ScenarioError::Bad(format!("{}: {message}", file.display()));
    let scenario = format::parse(&text, &checker_names()).map_err(bad)?;
    // The planted bugs are the lab's vocabulary, which the pure format does not know.
    for bug in &scenario.bugs {
        bug.parse::<lab::bugs::Bug>().map_err(|error| bad(format!("bugs: {error}")))?;
    }
    Ok(scenario)
}

fn config(scenario: &Scenario, store: &Path, system: &SystemChoice) -> Result<RunConfig, ScenarioError> {
    let mut args =
        RunArgs::from(&RunConfig { nemesis: Vec::new(), store: store.to_path_buf(), ..RunConfig::default() });
    args.test_name = format!("scenario-{}", scenario.name);
    args.seed = Some(scenario.seed);
    args.runners = scenario.runners;
    args.lease_ms = scenario.lease_ms;
    args.bugs = scenario.bugs.clone();
    args.system = system.system.clone();
    args.variants = system.variants.clone();
    args.heartbeat_interval_ms = scenario.heartbeat_interval_ms;
    args.reconcile_after_ms = scenario.reconcile_after_ms;
    args.target_mode = clap::ValueEnum::from_str(&scenario.target_mode, true).map_err(ScenarioError::Bad)?;
    args.db = clap::ValueEnum::from_str(&scenario.db, true).map_err(ScenarioError::Bad)?;
    args.control_planes = scenario.control_planes;
    let mut config = validate(&args, scenario.seed).map_err(ScenarioError::Bad)?;
    config.recovery_limit_ms = scenario.settle_within_ms;
    // The faults its steps play: the cluster is set up for them (a target or replica clock
    // that can be moved, a database link through a proxy).
    for step in &scenario.steps {
        if let Ok(fault) = workloads::scenario::fault_of(&step.action, 0, scenario.runners) {
            if !config.nemesis.contains(&fault.kind) {
                config.nemesis.push(fault.kind);
            }
        }
    }
    Ok(config)
}

/// The system a scenario runs against: a system file and its variants (none: the lab).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct SystemChoice {
    /// The system under test: a system file (`docs/system.md`; default: the lab).
    #[arg(long)]
    pub system: Option<std::path::PathBuf>,
    /// A variant the system file declares (repeatable).
    #[arg(long = "variant")]
    pub variants: Vec<String>,
}

impl SystemChoice {
    /// The flags that name it again, each preceded by a space.
    pub fn words(&self) -> String {
        let mut out = String::new();
        if let Some(system) = &self.system {
            out.push_str(&format!(" --system {}", system.display()));
        }
        for variant in &self.variants {
            out.push_str(&format!(" --variant {variant}"));
        }
        out
    }
}

/// Runs a scenario file into `store`; `program` is the `fencelab` binary.
pub async fn run_file(
    file: &Path,
    store: &Path,
    program: &Path,
    system: &SystemChoice,
) -> Result<Report, ScenarioError> {
    let scenario = load(file)?;
    let config = config(&scenario, store, system)?;
    let folder = crate::run::create_folder(&config).map_err(ScenarioError::Bad)?;
    eprintln!("fencelab scenario: {} — run folder {}", scenario.name, folder.display());
    execute(&scenario, &config, &folder, file, program).await.map_err(ScenarioError::Internal)
}

async fn execute(
    scenario: &Scenario,
    config: &RunConfig,
    folder: &Path,
    file: &Path,
    program: &Path,
) -> anyhow::Result<Report> {
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339();
    let recorder = Recorder::create(&folder.join("history.jsonl"))?;
    let cluster =
        tokio::time::timeout(crate::run::HEALTHY_WAIT_MAX, Cluster::start(config, &folder.join("lab"), program))
            .await
            .map_err(|_| anyhow::anyhow!("the cluster was not healthy in time"))??;
    for runner in &scenario.idle {
        cluster.signal_runner(format::runner_index(runner, scenario.runners).unwrap_or(0), libc::SIGSTOP);
    }
    if !scenario.idle.is_empty() {
        tokio::time::sleep(steps::SETTLE).await;
    }
    let info =
        ScenarioInfo { name: scenario.name.clone(), description: scenario.description.clone(), file: file.into() };
    let file_config = ConfigFile {
        run: config.clone(),
        clock_control: cluster.clock.clone(),
        system: cluster.info.clone(),
        healthy_ms: None,
        scenario: Some(info),
    };
    let full_config = serde_json::to_value(&file_config)?;
    write_json(&folder.join("config.json"), &full_config)?;
    write_json(&folder.join("schedule.json"), &serde_json::json!([]))?;
    recorder.record(Process::HARNESS, EventType::Ok, Op::Config, |event| event.value = Some(full_config.clone()));
    let shared: Shared = Arc::new(State {
        config: Arc::new(config.clone()),
        recorder,
        cluster: Arc::new(Mutex::new(cluster)),
        active: Mutex::new(vec![]),
        submitted: AtomicU64::new(0),
    });
    let operator = (scenario.operator == OperatorMode::Automatic).then(|| tokio::spawn(operator::run(shared.clone())));
    let steps_passed = run_steps(scenario, &shared).await;
    let settled = if steps_passed && scenario.background() { settle(&shared).await } else { true };
    if let Some(operator) = operator {
        operator.abort();
        let _ = operator.await;
    }
    let view = collect(&shared).await?;
    link_latest(&config.store, folder);
    let meta = crate::check::RunMeta {
        command: format!("fencelab scenario run {}", file.display()),
        started_at,
        duration_ms: started.elapsed().as_millis() as u64,
        complete: settled,
    };
    write_json(&folder.join("run.json"), &meta)?;
    let (_, run) = crate::check::check_folder(folder)?;
    let view = View { checkers: run.checkers, ..view };
    let expects_passed = expectations(scenario, &view);
    Ok(Report { folder: folder.to_path_buf(), passed: steps_passed && expects_passed })
}

/// Runs the steps in order, stopping at the first that fails; then lets the faults the
/// steps started run out their windows (bounded) and heals whatever is left of them.
async fn run_steps(scenario: &Scenario, shared: &Shared) -> bool {
    let mut driver = steps::Driver { shared: shared.clone(), capabilities: BTreeMap::new(), faults: JoinSet::new() };
    let mut passed = true;
    for step in &scenario.steps {
        if let Err(error) = driver.step(step).await {
            println!("  FAILED step {} (line {}): {error}", step.index, step.line);
            passed = false;
            break;
        }
    }
    if driver.faults.is_empty() {
        return passed;
    }
    if passed {
        let bound = faults_bound(scenario, &shared.config);
        if tokio::time::timeout(bound, async { while driver.faults.join_next().await.is_some() {} }).await.is_err() {
            println!("  FAILED the faults the steps started did not end within {} ms", bound.as_millis());
            passed = false;
        }
    }
    driver.faults.shutdown().await;
    if let Err(error) = crate::run::nemesis::heal_all(&shared.cluster, &shared.config).await {
        println!("  FAILED healing the faults: {error}");
        passed = false;
    }
    passed
}

/// How long the faults of a scenario may take to end after its last step: the longest
/// window, plus the bounded waits a fault makes before it starts, plus a margin.
fn faults_bound(scenario: &Scenario, config: &RunConfig) -> Duration {
    let longest_ms = scenario
        .steps
        .iter()
        .filter_map(|step| match &step.action {
            format::Action::Fault { duration_ms, .. } => Some(*duration_ms),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    Duration::from_millis(longest_ms + 10 * config.lease_ms + 30_000)
}

/// With background work, waits (bounded by `settle_within_ms`) for every job to settle,
/// as the recovery of a run does; says whether they did.
async fn settle(shared: &Shared) -> bool {
    let settled = crate::run::settle(shared).await;
    if !settled {
        println!("  note: not every job settled within {} ms", shared.config.recovery_limit_ms);
    }
    settled
}

/// Stops the runners, reads every record, stops everything and writes the whole history.
async fn collect(shared: &Shared) -> anyhow::Result<View> {
    let mut cluster = shared.cluster.lock().await;
    cluster.stop_runners().await;
    let wait = crate::run::COLLECT_WAIT_MAX;
    let operator = cluster.system.operator.clone();
    let ledger = operator.ledger(10_000_000).await.unwrap_or_default();
    let steps = cluster.target_steps(wait).await.unwrap_or_default();
    let mut jobs = BTreeMap::new();
    for job in operator.jobs().await.unwrap_or_default() {
        let full = operator.job(&job.id).await.unwrap_or(job);
        jobs.insert(full.id.clone(), full);
    }
    let finals = jobs.values().map(crate::run::final_event).collect();
    let logs = cluster.runner_logs();
    cluster.stop().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    shared.recorder.finish(&logs, &ledger, &steps, finals)?;
    Ok(View { jobs, steps, checkers: vec![] })
}

/// Checks every expectation, printing each; true when all hold.
fn expectations(scenario: &Scenario, view: &View) -> bool {
    let mut passed = true;
    for (index, expect) in scenario.expects.iter().enumerate() {
        match evaluate(expect, view) {
            Ok(()) => println!("  ok      expect {}: {}", index + 1, describe(expect)),
            Err(found) => {
                passed = false;
                println!("  FAILED  expect {}: expected {}\n          found {found}", index + 1, describe(expect));
            }
        }
    }
    passed
}

/// `fencelab scenario run FILE`: 0 every expectation held, 1 one failed, 254 a bad file,
/// 255 an internal error.
pub fn main(file: &Path, store: &Path, system: &SystemChoice) -> std::process::ExitCode {
    let program = match crate::cli::program("scenario") {
        Ok(program) => program,
        Err(code) => return code,
    };
    if let Err(ScenarioError::Bad(message)) = load(file) {
        eprintln!("fencelab scenario: {message}");
        return crate::exit::Exit::BadArguments.into();
    }
    let runtime = match crate::cli::runtime("scenario") {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(run_file(file, store, &program, system)) {
        Ok(report) => {
            let word = if report.passed { "passed" } else { "FAILED" };
            println!("scenario     {word} (report: {})", report.folder.join("report.html").display());
            if !report.passed {
                println!("repeat with  fencelab scenario run {}{}", file.display(), system.words());
            }
            crate::exit::Exit::passed(report.passed).into()
        }
        Err(ScenarioError::Bad(message)) => {
            eprintln!("fencelab scenario: {message}");
            crate::exit::Exit::BadArguments.into()
        }
        Err(ScenarioError::Internal(error)) => {
            eprintln!("fencelab scenario: {error:#}");
            crate::exit::Exit::Internal.into()
        }
    }
}
