//! Scenario files: an incident scripted step by step against the real lab
//! (`fencelab scenario run FILE`, format in `docs/scenarios.md`). The run starts the same
//! cluster as `fencelab run`, executes the steps in order, collects and checks the history
//! like a run, and then asserts every `[[expect]]`.

pub mod conditions;
pub use workloads::scenario as format;
mod player;
mod steps;
/// What a submit pinned to a runner waits, once the other idle runners are stopped, before
/// it submits (`fencelab import` places such a submit this much before its claim).
pub(crate) use steps::SETTLE;

use crate::run::driver::Ended;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::task::JoinSet;

use crate::run::cluster::Cluster;
use crate::run::operator;
use crate::run::Shared;
use conditions::{describe, evaluate, View};
use format::{OperatorMode, Scenario};
use runfolder::config::RunConfig;

/// Why a scenario could not be run to a verdict.
#[derive(Debug)]
pub enum ScenarioError {
    /// The file is unreadable or not a valid scenario: nothing was started (exit 254).
    Bad(String),
    /// Something broke while running it (exit 255).
    Internal(crate::error::RunError),
}

/// What a scenario run found.
pub struct Report {
    pub folder: PathBuf,
    /// Every step ran and every expectation held, on evidence that could all be read.
    pub passed: bool,
    /// Valid: passed; invalid: a step or an expectation failed; unknown: a record could not
    /// be read (or the run was interrupted), so no expectation can be trusted.
    pub outcome: history::Exit,
    /// The report's lines: each expectation's, then each record that could not be read.
    pub lines: Vec<String>,
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
    let scenario = format::parse(&text, &checker_names()).map_err(|error| bad(error.to_string()))?;
    // The planted bugs are the lab's vocabulary, which the pure format does not know.
    for bug in &scenario.bugs {
        bug.parse::<lab::bugs::Bug>().map_err(|error| bad(format!("bugs: {error}")))?;
    }
    Ok(scenario)
}

fn config(scenario: &Scenario, store: &Path, system: &SystemChoice) -> Result<RunConfig, ScenarioError> {
    let bad = |message: String| ScenarioError::Bad(message);
    let bugs = scenario.bugs.iter().map(|bug| bug.parse::<lab::bugs::Bug>().map_err(|error| format!("--bug: {error}")));
    let mut config = RunConfig {
        test_name: format!("scenario-{}", scenario.name),
        seed: scenario.seed,
        runners: scenario.runners,
        nemesis: Vec::new(),
        bugs: bugs.collect::<Result<Vec<_>, String>>().map_err(bad)?,
        target_mode: scenario.target_mode,
        store: store.to_path_buf(),
        db: system::SystemFile::store_of(
            system.system.as_deref(),
            scenario.db.as_deref().map(str::parse).transpose().map_err(bad)?,
        )
        .map_err(|error| bad(format!("--system {error}")))?,
        system: system.system.clone(),
        variants: system.variants.clone(),
        control_planes: scenario.control_planes,
        ..RunConfig::default()
    }
    .with_lease(scenario.lease_ms, scenario.heartbeat_interval_ms, scenario.reconcile_after_ms)
    .validate()
    .map_err(|error| bad(error.to_string()))?;
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
#[derive(Clone, Debug, Default)]
pub struct SystemChoice {
    pub system: Option<std::path::PathBuf>,
    pub variants: Vec<String>,
}

impl SystemChoice {
    /// The flags of `fencelab scenario run` that name it again (`--system`, `--variant`):
    /// the one writer of them, for a shrink's tries and the command a scenario prints.
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(system) = &self.system {
            args.extend(["--system".to_string(), system.display().to_string()]);
        }
        for variant in &self.variants {
            args.extend(["--variant".to_string(), variant.clone()]);
        }
        args
    }

    /// [`SystemChoice::args`], each preceded by a space.
    pub fn words(&self) -> String {
        self.args().iter().map(|word| format!(" {word}")).collect()
    }
}

/// Runs a scenario file into `store`; `program` is the `fencelab` binary. `interrupt`
/// ends it early (Ctrl-C): it is still collected and written, and its answer is unknown.
pub async fn run_file(
    file: &Path,
    store: &Path,
    program: &Path,
    system: &SystemChoice,
    interrupt: impl std::future::Future<Output = ()>,
) -> Result<Report, ScenarioError> {
    let scenario = load(file)?;
    let config = config(&scenario, store, system)?;
    let folder = runfolder::folder::RunFolder::create(&config)
        .map_err(|error| ScenarioError::Bad(error.to_string()))?
        .into_path();
    eprintln!("fencelab scenario: {} — run folder {}", scenario.name, folder.display());
    let work = Steps { scenario: &scenario, file };
    let driven =
        crate::run::driver::drive(config, folder, program, work, interrupt).await.map_err(ScenarioError::Internal)?;
    let jobs = driven.records.jobs.iter().map(|job| (job.id.clone(), job.clone())).collect();
    let view = View { jobs, steps: driven.records.steps.clone(), checkers: driven.run.checkers.clone() };
    // A fault of the scenario's steps (its run's nemesis is exactly those, `config`) that
    // this host cannot act on — no libfaketime, a process in a container, another store —
    // leaves what it was to show unjudged.
    let idle: Vec<String> = (driven.system.faults_not_run.iter())
        .map(|not| format!("{} did not take effect: {}", not.fault.name(), not.why))
        .collect();
    let (expects_passed, mut lines) = expectations(&scenario, &view, &idle);
    let evidence = &driven.records.unreadable;
    lines.extend(evidence.iter().map(|why| format!("  unknown {why}")));
    let passed = driven.steps_passed && expects_passed;
    if !passed {
        lines.extend(idle.iter().map(|why| format!("  unknown {why}; an expectation that needs it cannot be judged")));
    }
    let outcome = match (passed, evidence.is_empty(), idle.is_empty()) {
        (_, false, _) | (false, true, false) => history::Exit::Unknown,
        (passed, true, _) => history::Exit::passed(passed),
    };
    Ok(Report { folder: driven.folder, passed: outcome == history::Exit::Valid, outcome, lines })
}

/// A scenario's part of a driven run: its steps in order (`file` is where they were read).
struct Steps<'a> {
    scenario: &'a Scenario,
    file: &'a Path,
}

impl crate::run::driver::Work for Steps<'_> {
    fn command(&self, _: &runfolder::config::RunConfig, _: &runfolder::folder::RunFolder) -> String {
        format!("fencelab scenario run {}", self.file.display())
    }

    fn write_plan(&self, folder: &runfolder::folder::RunFolder) -> Result<usize, runfolder::folder::FolderError> {
        folder.write_schedule(&[])?;
        Ok(0)
    }

    async fn prepare(&self, cluster: &Cluster) -> Option<runfolder::config::ScenarioInfo> {
        hold_idle(self.scenario, cluster).await;
        let (name, description) = (self.scenario.name.clone(), self.scenario.description.clone());
        Some(runfolder::config::ScenarioInfo { name, description, file: self.file.to_path_buf() })
    }

    async fn go(self, shared: &Shared, interrupt: impl std::future::Future<Output = ()>) -> Ended {
        play(self.scenario, shared, interrupt).await
    }
}

/// Holds the runners a scenario names idle (SIGSTOP) before its first step, and gives a
/// request each had already sent time to land.
async fn hold_idle(scenario: &Scenario, cluster: &Cluster) {
    for runner in &scenario.idle {
        cluster.signal_runner(format::runner_index(runner, scenario.runners).unwrap_or(0), libc::SIGSTOP);
    }
    if !scenario.idle.is_empty() {
        tokio::time::sleep(steps::SETTLE).await;
    }
}

/// The middle of a scenario run: the automatic operator (if the scenario asks for one), the
/// steps, and with background work the settling of every job; or `interrupt`.
async fn play(scenario: &Scenario, shared: &Shared, interrupt: impl std::future::Future<Output = ()>) -> Ended {
    let operator = (scenario.operator == OperatorMode::Automatic).then(|| tokio::spawn(operator::run(shared.clone())));
    let played = async {
        let steps_passed = run_steps(scenario, shared).await;
        // Background work left by a step that failed was never waited for: not settled.
        let settled = match (steps_passed, scenario.background()) {
            (true, true) => settle(scenario, shared).await,
            (false, true) => false,
            (_, false) => true,
        };
        (steps_passed, settled)
    };
    let ended = tokio::select! {
        (steps_passed, settled) = played => {
            Ended {
                settled,
                interrupted: false,
                steps_passed,
                recovery: scenario.background(),
                stopped_at_first: false,
            }
        }
        _ = interrupt => Ended {
            settled: false,
            interrupted: true,
            steps_passed: false,
            recovery: false,
            stopped_at_first: false,
        },
    };
    if let Some(operator) = operator {
        operator.abort();
        let _ = operator.await;
    }
    ended
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
    if let Err(error) = crate::run::nemesis::heal_all(&shared.cluster).await {
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
/// as the recovery of a run does, ending early once no job has moved for the scenario's
/// quiet window (what is still open then stays so); says whether every job settled.
async fn settle(scenario: &Scenario, shared: &Shared) -> bool {
    match crate::run::settle_or_quiet(shared, Some(scenario.settle_quiet_ms())).await {
        crate::run::Settling::Settled => true,
        crate::run::Settling::Quiet { quiet_ms, open } => {
            println!("  note: not every job settled; none changed for {quiet_ms} ms: {}", open.join(", "));
            false
        }
        crate::run::Settling::TimedOut => {
            println!("  note: not every job settled within {} ms", shared.config.recovery_limit_ms);
            false
        }
    }
}

/// Checks every expectation: true when all hold, and one line (or two) each. With faults
/// that did not take effect (`idle`), an expectation that does not hold is not judged: it
/// says `unknown` and why, not FAILED.
fn expectations(scenario: &Scenario, view: &View, idle: &[String]) -> (bool, Vec<String>) {
    let mut passed = true;
    let mut lines = Vec::new();
    let word = if idle.is_empty() { "FAILED " } else { "unknown" };
    for (index, expect) in scenario.expects.iter().enumerate() {
        match evaluate(expect, view) {
            Ok(()) => lines.push(format!("  ok      expect {}: {}", index + 1, describe(expect))),
            Err(found) => {
                passed = false;
                let because = idle.first().map(|why| format!("\n          not judged: {why}")).unwrap_or_default();
                lines.push(format!(
                    "  {word} expect {}: expected {}\n          found {found}{because}",
                    index + 1,
                    describe(expect)
                ));
            }
        }
    }
    (passed, lines)
}
