//! Shrink: cut a run that found an anomaly down to the smallest scenario that still finds
//! it. A case is the run's jobs (submit steps at their times), its faults (nemesis fault
//! steps at their times) and its runners, played by the scenario engine with the run's
//! automatic operator. Every try writes the case as a scenario file and runs it as a real
//! `fencelab scenario run`; the anomaly persists when the scenario's expectation (the target
//! checkers answer invalid) holds. The history says where to cut first (`story`): each
//! target anomaly's jobs, the runners that held them and the faults that touched them, a few
//! seconds long, is tried alone (then with what was beside it); only when none reproduces
//! does the shrink fall back to cutting everything after the anomaly was complete. Then
//! rounds of removing faults, keeping only the jobs the anomaly names, removing jobs,
//! starting earlier (so later tries are shorter) and removing runners, until a round
//! removes nothing. A bounded number of tries; then the smallest case is confirmed by
//! running it again, falling back to a larger accepted case when it does not reproduce.

mod story;

use history::{Op, Process};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use workloads::faults::Fault;
use workloads::jobs::PlannedJob;
use workloads::scenario::{Action, Condition, OperatorMode, Scenario, Step};

use runfolder::folder::RunFolder;

use crate::runs::found;
use crate::CampaignError;

/// Most tries a shrink may make.
pub const TRIES_MAX: u32 = 500;
/// Most confirmation runs of the result.
pub const CONFIRM_MAX: u32 = 20;
/// Steps start at least this long after the scenario began, so the cluster is up.
const WARM_UP_MS: u64 = 500;
/// Most anomalies whose stories are tried alone before the wider cuts.
const STORIES_MAX: usize = 3;
/// Runs a story must reproduce on, one after another, to be taken: a story taken on one
/// lucky run would be cut further and end up a scenario that rarely reproduces.
const STORY_RUNS: u32 = 3;
/// Claims are pinned only in cases of at most this many jobs: a pinned submit holds the
/// idle runners for a moment, which many pinned jobs would turn into a different workload.
const PIN_JOBS_MAX: usize = 8;

/// What a shrink is asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    pub folder: PathBuf,
    pub tries: u32,
    /// The checkers whose anomalies must persist (default: the first to find one).
    pub checkers: Vec<String>,
    pub out: PathBuf,
    /// Where the tries' scenario files and run folders go.
    pub work: PathBuf,
    pub confirm: u32,
}

/// The parts of the run's configuration a scenario carries.
#[derive(Clone, Debug, Serialize)]
pub struct Header {
    pub name: String,
    pub source: String,
    pub seed: u64,
    pub lease_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub reconcile_after_ms: u64,
    pub settle_within_ms: u64,
    pub target_mode: history::TargetMode,
    pub bugs: Vec<String>,
    pub db: String,
    pub control_planes: u32,
}

/// One candidate: runners, jobs and faults, and which runner is to claim which job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Case {
    pub runners: u32,
    pub jobs: Vec<PlannedJob>,
    pub faults: Vec<Fault>,
    /// Job → the runner (0-based) that claimed its first attempt in the run, for the jobs
    /// whose submit pins its claim (`runner` on a `submit` step).
    pub pins: BTreeMap<String, u32>,
}

/// How big a case is.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Size {
    pub runners: u32,
    pub jobs: usize,
    pub faults: usize,
    pub steps: usize,
    /// When the last fault ends (or the last job is submitted), ms after the start.
    pub span_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Faults,
    Jobs,
}

impl Case {
    pub fn size(&self) -> Size {
        let jobs = self.jobs.iter().map(|job| job.at_ms);
        let faults = self.faults.iter().map(|fault| fault.at_ms + fault.duration_ms);
        Size {
            runners: self.runners,
            jobs: self.jobs.len(),
            faults: self.faults.len(),
            steps: self.jobs.len() + self.faults.len(),
            span_ms: jobs.chain(faults).max().unwrap_or(0),
        }
    }

    fn len(&self, part: Part) -> usize {
        match part {
            Part::Faults => self.faults.len(),
            Part::Jobs => self.jobs.len(),
        }
    }

    fn without(&self, part: Part, range: Range<usize>) -> Case {
        let mut case = self.clone();
        match part {
            Part::Faults => drop(case.faults.drain(range)),
            Part::Jobs => drop(case.jobs.drain(range)),
        }
        case
    }

    /// Only what happened up to `at_ms`: later jobs and faults cannot have caused an
    /// anomaly whose evidence was complete by then.
    fn until(&self, at_ms: u64) -> Case {
        Case {
            runners: self.runners,
            jobs: self.jobs.iter().filter(|job| job.at_ms <= at_ms).cloned().collect(),
            faults: self.faults.iter().filter(|fault| fault.at_ms <= at_ms).cloned().collect(),
            pins: self.pins.clone(),
        }
    }

    /// The runner a kept job's claim is pinned to.
    fn pin(&self, job: &str) -> Option<u32> {
        self.jobs.iter().any(|kept| kept.id == job).then(|| self.pins.get(job).copied()).flatten()
    }

    /// The runners that matter (hit by a fault, or pinned), renumbered r1.. in order, and
    /// `runners` of them.
    fn with_runners(&self, runners: u32) -> Case {
        let needed: Vec<u32> = self.needed_runners().into_iter().collect();
        let renumber = |runner: u32| needed.iter().position(|&old| old == runner).unwrap_or(0) as u32;
        let mut case = self.clone();
        case.runners = runners;
        for fault in &mut case.faults {
            fault.runner = fault.runner.map(renumber);
        }
        case.pins = self.jobs.iter().filter_map(|job| Some((job.id.clone(), renumber(self.pin(&job.id)?)))).collect();
        case
    }

    fn needed_runners(&self) -> BTreeSet<u32> {
        let pinned = self.jobs.iter().filter_map(|job| self.pin(&job.id));
        self.faults.iter().filter_map(|fault| fault.runner).chain(pinned).collect()
    }

    /// Every step `shift_ms` earlier.
    fn earlier(&self, shift_ms: u64) -> Case {
        let mut case = self.clone();
        case.jobs.iter_mut().for_each(|job| job.at_ms -= shift_ms);
        case.faults.iter_mut().for_each(|fault| fault.at_ms -= shift_ms);
        case
    }

    fn first_ms(&self) -> u64 {
        let jobs = self.jobs.iter().map(|job| job.at_ms);
        jobs.chain(self.faults.iter().map(|fault| fault.at_ms)).min().unwrap_or(0)
    }
}

/// The case as a scenario file, written through the scenario's own types: the run's
/// configuration in the header, the jobs and faults as steps in time order, and one
/// `[[expect]]` per target checker: invalid.
pub fn scenario_text(header: &Header, case: &Case, checkers: &[String]) -> String {
    let size = case.size();
    let description = format!(
        "{} planted; {} with {} job(s), {} fault(s) and {} runner(s)",
        if header.bugs.is_empty() { "no bug".to_string() } else { header.bugs.join(", ") },
        checkers.join(", "),
        size.jobs,
        size.faults,
        size.runners
    );
    let mut steps: Vec<(u64, Action)> =
        case.jobs.iter().map(|job| (job.at_ms, submit_step(job, case.pin(&job.id)))).collect();
    steps.extend(case.faults.iter().map(|fault| (fault.at_ms, fault_step(fault))));
    steps.sort_by_key(|(at_ms, _)| *at_ms);
    let expect = |checker: &String| Condition {
        checker: Some(checker.clone()),
        verdict: Some("invalid".into()),
        ..Condition::default()
    };
    let scenario = Scenario {
        name: header.name.clone(),
        description,
        seed: header.seed,
        runners: case.runners,
        idle: Vec::new(),
        lease_ms: header.lease_ms,
        target_mode: header.target_mode,
        bugs: header.bugs.clone(),
        // `sqlite` is what a scenario without `db` runs on with any system file that
        // took `sqlite`; another store is named.
        db: (header.db != "sqlite").then(|| header.db.clone()),
        control_planes: header.control_planes,
        operator: OperatorMode::Automatic,
        heartbeat_interval_ms: Some(header.heartbeat_interval_ms),
        reconcile_after_ms: Some(header.reconcile_after_ms),
        settle_within_ms: header.settle_within_ms,
        settle_quiet_ms: None,
        steps: steps
            .into_iter()
            .enumerate()
            .map(|(index, (at_ms, action))| Step {
                index,
                line: 0,
                at_ms: Some(at_ms),
                action,
                if_attempt_exists: false,
            })
            .collect(),
        expects: checkers.iter().map(expect).collect(),
    };
    format!("# Shrunk by `fencelab shrink` from {}.\n{}", header.source, scenario.to_toml())
}

fn runner_name(runner: u32) -> String {
    format!("r{}", runner + 1)
}

fn submit_step(job: &PlannedJob, pin: Option<u32>) -> Action {
    Action::Submit {
        job: job.id.clone(),
        key: job.deployment_key.clone(),
        steps: job.steps,
        step_ms: job.step_ms,
        runner: pin.map(runner_name),
    }
}

/// A fault as a scenario's step: its parameters read from the variant's own serialised
/// fields, so that every variant's `latency_ms` and `offset_ms` reach the step.
fn fault_step(fault: &Fault) -> Action {
    let parameters = serde_json::to_value(&fault.variant).unwrap_or_default();
    let latency_ms = parameters.get("latency_ms").and_then(serde_json::Value::as_u64);
    let offset_ms = parameters.get("offset_ms").and_then(serde_json::Value::as_i64);
    Action::Fault {
        fault: Some(fault.kind),
        how: fault.variant.name().to_string(),
        runner: fault.runner.filter(|_| fault.kind.on_runner()).map(runner_name),
        replica: fault.variant.replica().map(|replica| replica + 1),
        duration_ms: fault.duration_ms,
        latency_ms,
        offset_ms,
    }
}

/// A recorded run, read for shrinking.
pub struct Original {
    pub header: Header,
    pub case: Case,
    pub checkers: Vec<String>,
    /// When the target anomalies' evidence was complete, ms after the start.
    pub complete_ms: Option<u64>,
    /// The jobs the target anomalies name.
    pub jobs: BTreeSet<String>,
    /// Job → the runner (0-based) that claimed its first attempt.
    pub claims: BTreeMap<String, u32>,
    /// `--system FILE` and `--variant NAME` words for every try: the system the run attacked.
    pub system_args: Vec<String>,
    /// What the history says about each target anomaly, the smallest first.
    pub stories: Vec<story::Story>,
}

/// Reads a run folder: its configuration, jobs, schedule and anomalies. `checkers` names
/// the anomalies to keep; empty means the first checker to find one.
pub fn read_original(folder: &Path, checkers: &[String]) -> Result<Original, CampaignError> {
    let run_folder = RunFolder::at(folder);
    let file = run_folder.run_config()?;
    let config = file.run;
    if file.scenario.is_some() {
        return Err(CampaignError::ScenarioFolder(folder.to_path_buf()));
    }
    let jobs: Vec<PlannedJob> = run_folder.required_jobs()?;
    let faults: Vec<Fault> = run_folder.required_schedule()?;
    let found = found(folder)?;
    if found.is_empty() {
        return Err(CampaignError::NoAnomaly(folder.to_path_buf()));
    }
    let targets: Vec<String> = if checkers.is_empty() {
        let first = found.iter().min_by(|a, b| a.first_s.unwrap_or(f64::MAX).total_cmp(&b.first_s.unwrap_or(f64::MAX)));
        first.map(|found| found.checker.clone()).into_iter().collect()
    } else {
        checkers.to_vec()
    };
    let mut complete_s: Option<f64> = Some(0.0);
    let mut named = BTreeSet::new();
    for target in &targets {
        let Some(hit) = found.iter().find(|found| &found.checker == target) else {
            let found = found.iter().map(|found| found.checker.clone()).collect();
            return Err(CampaignError::CheckerFoundNothing { checker: target.clone(), found });
        };
        complete_s = complete_s.zip(hit.first_s).map(|(a, b)| a.max(b));
        named.extend(hit.jobs.iter().cloned());
    }
    let header = Header {
        name: format!("shrunk-{}-s{}", config.test_name, config.seed),
        source: folder.display().to_string(),
        seed: config.seed,
        lease_ms: config.lease_ms,
        heartbeat_interval_ms: config.heartbeat_interval_ms,
        reconcile_after_ms: config.reconcile_after_ms,
        settle_within_ms: config.recovery_limit_ms,
        target_mode: config.target_mode,
        bugs: config.bugs.iter().map(|bug| bug.name().to_string()).collect(),
        db: config.db.name().to_string(),
        control_planes: config.control_planes,
    };
    let runners = config.runners;
    let choice = engine::scenario::SystemChoice { system: config.system.clone(), variants: config.variants.clone() };
    let system_args = choice.args();
    let stories = stories(folder, &targets, &jobs, &faults, config.lease_ms)?;
    Ok(Original {
        system_args,
        stories,
        header,
        case: Case { runners, jobs, faults, pins: BTreeMap::new() },
        claims: first_claims(folder)?,
        checkers: targets,
        complete_ms: complete_s.map(|seconds| (seconds * 1_000.0).ceil() as u64),
        jobs: named,
    })
}

/// The stories of the target checkers' anomalies: the smallest first (fewest jobs, runners
/// and faults), one per set of jobs; an anomaly whose jobs the history does not show has
/// none.
fn stories(
    folder: &Path,
    targets: &[String],
    planned: &[PlannedJob],
    schedule: &[Fault],
    lease_ms: u64,
) -> Result<Vec<story::Story>, CampaignError> {
    let events = RunFolder::at(folder).history()?;
    let timeline = story::Timeline::read(&events, schedule);
    let doc = crate::runs::results_of(folder)?;
    let anomalies = doc.checkers.iter().filter(|checker| targets.contains(&checker.checker));
    let mut stories: Vec<story::Story> = anomalies
        .flat_map(|checker| checker.anomalies.iter())
        .filter_map(|anomaly| timeline.story(anomaly, planned, lease_ms))
        .collect();
    stories.sort_by_key(|story| (story.jobs.len(), story.runners.len(), story.touching.len(), story.until_ms));
    let mut seen = BTreeSet::new();
    stories.retain(|story| seen.insert(story.jobs.clone()));
    Ok(stories)
}

/// Job → the runner (0-based) that claimed its first attempt, from the run's final events;
/// a history that cannot be read is an error (the run cannot be shrunk on a guess).
fn first_claims(folder: &Path) -> Result<BTreeMap<String, u32>, CampaignError> {
    let events = RunFolder::at(folder).history()?;
    let finals = events.into_iter().filter(|event| event.process == Process::HARNESS && event.f == Op::Final);
    Ok(finals
        .filter_map(|event| {
            let value = event.value?;
            let runner = value["attempts"].get(0)?["runner"].as_str()?.strip_prefix('r')?.parse::<u32>().ok()?;
            Some((event.job?, runner.checked_sub(1)?))
        })
        .collect())
}

/// One try and what it found.
#[derive(Clone, Debug, Serialize)]
pub struct Try {
    pub number: u32,
    pub pass: &'static str,
    pub size: Size,
    pub reproduced: bool,
    pub seconds: f64,
    pub scenario: PathBuf,
    pub folder: Option<PathBuf>,
}

/// What a shrink found: written to `shrink.json` in the work folder.
#[derive(Debug, Serialize)]
pub struct Shrunk {
    pub source: PathBuf,
    pub checkers: Vec<String>,
    pub before: Size,
    pub after: Option<Size>,
    pub tries: Vec<Try>,
    /// Confirmation runs of the written scenario: how many reproduced, of how many.
    pub confirmed: (u32, u32),
    pub scenario: Option<PathBuf>,
    pub command: Option<String>,
}

struct Shrinker<'a> {
    program: &'a Path,
    options: &'a Options,
    original: &'a Original,
    best: Case,
    /// Every case that reproduced, smallest last.
    accepted: Vec<Case>,
    /// Every case tried: none is tried twice.
    tried: Vec<Case>,
    tries: Vec<Try>,
}

impl Shrinker<'_> {
    fn tries_left(&self) -> bool {
        (self.tries.len() as u32) < self.options.tries
    }

    /// Runs the case once as a scenario; keeps it as the best when it reproduced.
    async fn attempt(&mut self, pass: &'static str, case: Case) -> bool {
        if !self.tries_left() || case.jobs.is_empty() || self.tried.contains(&case) {
            return false;
        }
        self.tried.push(case.clone());
        let number = self.tries.len() as u32 + 1;
        let mut found = self.run(&case, &format!("try-{number:03}")).await;
        let reproduced = found.reproduced;
        found.pass = pass;
        self.tries.push(found);
        let size = case.size();
        println!(
            "try {number:>3}/{}  {pass:<9} runners {} jobs {:>3} faults {:>3} steps {:>3} span {:>6} ms  {}",
            self.options.tries,
            size.runners,
            size.jobs,
            size.faults,
            size.steps,
            size.span_ms,
            if reproduced { "reproduced" } else { "gone" }
        );
        if reproduced {
            self.best = case.clone();
            self.accepted.push(case);
        }
        reproduced
    }

    /// Writes the case as `NAME.toml` in the work folder and runs it, bounded.
    async fn run(&self, case: &Case, name: &str) -> Try {
        let text = scenario_text(&self.original.header, case, &self.original.checkers);
        let scenario = self.options.work.join(format!("{name}.toml"));
        let store = self.options.work.join(name);
        let started = Instant::now();
        let mut found = Try {
            number: self.tries.len() as u32 + 1,
            pass: "",
            size: case.size(),
            reproduced: false,
            seconds: 0.0,
            scenario: scenario.clone(),
            folder: None,
        };
        if std::fs::write(&scenario, text).is_err() {
            return found;
        }
        let mut args = vec![
            "scenario".into(),
            "run".into(),
            scenario.display().to_string(),
            "--store".into(),
            store.display().to_string(),
        ];
        args.extend(self.original.system_args.iter().cloned());
        let mut command = crate::runs::child(self.program, &args);
        // The try's output goes to its log; nothing reads a pipe while the try runs.
        command.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        if let Ok(log) = std::fs::File::create(self.options.work.join(format!("{name}.log"))) {
            if let Ok(copy) = log.try_clone() {
                command.stdout(copy).stderr(log);
            }
        }
        let size = case.size();
        let bound_ms = size.span_ms + self.original.header.settle_within_ms + 20 * self.original.header.lease_ms;
        let bound = Duration::from_millis(bound_ms + 120_000);
        let status = match command.spawn() {
            Ok(mut child) => tokio::time::timeout(bound, child.wait()).await.ok().and_then(Result::ok),
            Err(_) => None,
        };
        found.reproduced = status.is_some_and(|status| status.success());
        found.seconds = started.elapsed().as_secs_f64();
        found.folder = std::fs::canonicalize(store.join("latest")).ok();
        found
    }

    /// Removes chunks of the part, halving the chunk size down to single entries.
    async fn remove(&mut self, pass: &'static str, part: Part) {
        let mut chunk = self.best.len(part).div_ceil(2);
        while chunk >= 1 && self.tries_left() {
            let mut start = 0;
            while start < self.best.len(part) && self.tries_left() {
                let end = (start + chunk).min(self.best.len(part));
                let candidate = self.best.without(part, start..end);
                if !self.attempt(pass, candidate).await {
                    start += chunk;
                }
            }
            if chunk == 1 {
                break;
            }
            chunk = chunk.div_ceil(2);
        }
    }

    /// Tries fewer runners, fewest first: as few as matter (at least one).
    async fn fewer_runners(&mut self) {
        let least = (self.best.needed_runners().len() as u32).max(1);
        for runners in least..self.best.runners {
            if self.attempt("runners", self.best.with_runners(runners)).await {
                return;
            }
        }
    }

    /// Pins every kept job's claim to the runner that claimed it in the run, once the case
    /// is small (and before runners are removed): the same runner then meets the same fault.
    async fn pin_claims(&mut self) {
        // The run's claims name its own runners: pin before any runner is removed.
        let renumbered = self.best.runners != self.original.case.runners;
        if renumbered || !self.best.pins.is_empty() || self.best.jobs.len() > PIN_JOBS_MAX || self.best.runners < 2 {
            return;
        }
        let mut candidate = self.best.clone();
        candidate.pins = self.original.claims.clone();
        if candidate.jobs.iter().any(|job| candidate.pin(&job.id).is_some_and(|runner| runner >= candidate.runners)) {
            return;
        }
        if candidate.jobs.iter().any(|job| candidate.pin(&job.id).is_some()) {
            self.attempt("pin", candidate).await;
        }
    }

    /// Keeps only the jobs the anomaly names.
    async fn named_jobs(&mut self) {
        let mut candidate = self.best.clone();
        candidate.jobs.retain(|job| self.original.jobs.contains(&job.id));
        if candidate.jobs.len() < self.best.jobs.len() {
            self.attempt("named", candidate).await;
        }
    }

    /// Starts the case earlier, keeping its steps' spacing: as early as the warm-up allows,
    /// else half as much earlier.
    async fn earlier(&mut self) {
        let shift_ms = self.best.first_ms().saturating_sub(WARM_UP_MS);
        if shift_ms > 0 && !self.attempt("earlier", self.best.earlier(shift_ms)).await && shift_ms / 2 > 0 {
            self.attempt("earlier", self.best.earlier(shift_ms / 2)).await;
        }
    }

    /// The first case that reproduces, narrowest first: each story alone (at most
    /// [`STORIES_MAX`]), the first story with what was beside it, everything up to the
    /// anomaly's completion, the whole run.
    async fn start(&mut self) {
        let original = self.original;
        let (planned, lease_ms) = (&original.case.jobs, original.header.lease_ms);
        for story in original.stories.iter().take(STORIES_MAX) {
            println!("story     {} on {}", story.about, story.jobs.iter().cloned().collect::<Vec<_>>().join(", "));
            let case = story.focus(planned, lease_ms);
            if self.attempt("story", case.clone()).await && self.steady(&case).await {
                return;
            }
        }
        if let Some(story) = original.stories.first() {
            if self.attempt("beside", story.context(planned, lease_ms, original.case.runners)).await {
                return;
            }
        }
        if let Some(complete_ms) = original.complete_ms {
            if self.attempt("cut", original.case.until(complete_ms)).await {
                return;
            }
        }
        self.attempt("whole", original.case.clone()).await;
    }

    /// Runs the case just accepted again until it has reproduced [`STORY_RUNS`] times in a
    /// row; at the first run that does not, it is no longer accepted.
    async fn steady(&mut self, case: &Case) -> bool {
        for run in 2..=STORY_RUNS {
            let found = self.run(case, &format!("try-{:03}-again-{run}", self.tries.len())).await;
            if !found.reproduced {
                println!("again     reproduced {} of {run}: not steady", run - 1);
                self.accepted.pop();
                self.best = self.original.case.clone();
                return false;
            }
        }
        println!("again     reproduced {STORY_RUNS} of {STORY_RUNS}");
        true
    }

    /// Confirms the smallest accepted case; when it does not reproduce in every
    /// confirmation run, the next larger accepted case is confirmed instead (at most two
    /// steps back), then the first case accepted. When none reproduces every time, the one
    /// that reproduced most often is chosen.
    async fn confirm(&mut self) -> Option<(Case, (u32, u32))> {
        let runs = self.options.confirm;
        let mut candidates: Vec<Case> = self.accepted.iter().rev().take(3).cloned().collect();
        if let Some(first) = self.accepted.first().filter(|first| !candidates.contains(first)) {
            candidates.push(first.clone());
        }
        if candidates.is_empty() {
            return None;
        }
        if runs == 0 {
            return Some((candidates.remove(0), (0, 0)));
        }
        let mut fallback = None;
        for (rank, case) in candidates.into_iter().enumerate() {
            let mut reproduced = 0;
            for run in 1..=runs {
                let found = self.run(&case, &format!("confirm-{}-{run}", rank + 1)).await;
                reproduced += u32::from(found.reproduced);
            }
            println!("confirm   steps {:>3}: reproduced {reproduced} of {runs}", case.size().steps);
            if reproduced == runs {
                return Some((case, (reproduced, runs)));
            }
            // Of cases that do not reproduce every time, the most reliable; the smaller on a tie.
            if fallback.as_ref().is_none_or(|(_, (best, _)): &(Case, (u32, u32))| reproduced > *best) {
                fallback = Some((case, (reproduced, runs)));
            }
        }
        fallback
    }
}

/// Shrinks the run in `options.folder` with `program` (the `fencelab` binary).
pub async fn shrink(program: &Path, options: &Options) -> Result<Shrunk, CampaignError> {
    let original = read_original(&options.folder, &options.checkers)?;
    std::fs::create_dir_all(&options.work).map_err(|error| CampaignError::io(&options.work, error))?;
    let before = original.case.size();
    println!(
        "shrinking {}: {} invalid; runners {} jobs {} faults {} steps {} span {} ms",
        options.folder.display(),
        original.checkers.join(", "),
        before.runners,
        before.jobs,
        before.faults,
        before.steps,
        before.span_ms
    );
    let mut shrinker = Shrinker {
        program,
        options,
        original: &original,
        best: original.case.clone(),
        accepted: vec![],
        tried: vec![],
        tries: vec![],
    };
    shrinker.start().await;
    if !shrinker.accepted.is_empty() {
        // Rounds until one removes nothing: fewer runners can let fewer jobs reproduce.
        loop {
            let accepted = shrinker.accepted.len();
            shrinker.remove("faults", Part::Faults).await;
            shrinker.named_jobs().await;
            shrinker.remove("jobs", Part::Jobs).await;
            shrinker.pin_claims().await;
            shrinker.earlier().await;
            shrinker.fewer_runners().await;
            if shrinker.accepted.len() == accepted || !shrinker.tries_left() {
                break;
            }
        }
    }
    let chosen = shrinker.confirm().await;
    let mut shrunk = Shrunk {
        source: options.folder.clone(),
        checkers: original.checkers.clone(),
        before,
        after: None,
        tries: shrinker.tries,
        confirmed: (0, 0),
        scenario: None,
        command: None,
    };
    if let Some((case, confirmed)) = chosen {
        let text = scenario_text(&original.header, &case, &original.checkers);
        std::fs::write(&options.out, text).map_err(|error| CampaignError::io(&options.out, error))?;
        shrunk.after = Some(case.size());
        shrunk.confirmed = confirmed;
        shrunk.scenario = Some(options.out.clone());
        let system = original.system_args.iter().map(|word| format!(" {word}")).collect::<String>();
        shrunk.command = Some(format!("fencelab scenario run {}{system}", options.out.display()));
    }
    let report = options.work.join("shrink.json");
    let json = serde_json::to_vec_pretty(&shrunk).map_err(CampaignError::Serialise)?;
    std::fs::write(&report, json).map_err(|error| CampaignError::io(&report, error))?;
    Ok(shrunk)
}

/// The before/after table `fencelab shrink` prints.
pub fn table(shrunk: &Shrunk) -> String {
    let before = shrunk.before;
    let mut text = format!("{:<10} {:>8} {:>8}\n", "size", "before", "after");
    let after = |value: fn(&Size) -> String| shrunk.after.as_ref().map_or("-".to_string(), value);
    let rows: [(&str, String, String); 5] = [
        ("runners", before.runners.to_string(), after(|size| size.runners.to_string())),
        ("jobs", before.jobs.to_string(), after(|size| size.jobs.to_string())),
        ("faults", before.faults.to_string(), after(|size| size.faults.to_string())),
        ("steps", before.steps.to_string(), after(|size| size.steps.to_string())),
        (
            "span (s)",
            format!("{:.1}", before.span_ms as f64 / 1e3),
            after(|size| format!("{:.1}", size.span_ms as f64 / 1e3)),
        ),
    ];
    for (name, before, after) in rows {
        text += &format!("{name:<10} {before:>8} {after:>8}\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::scenario::format::{fault_of, parse, Action};
    use workloads::faults::{FaultKind, Variant};

    /// Every fault a seeded all-faults schedule realises, written as a scenario's step and
    /// read back, is the same fault: its parameters (a target's skew, a latency) reach the
    /// scenario, which refuses a step that lacks one, and a fault on the control plane or
    /// the target names no runner, which the scenario refuses too.
    #[test]
    fn every_scheduled_fault_survives_its_scenario_step() {
        let mut kinds = FaultKind::ALL.to_vec();
        kinds.extend(FaultKind::REPLICAS.iter().chain(FaultKind::DATABASE.iter()).copied());
        let options = workloads::faults::ScheduleOptions {
            kinds,
            time_limit_ms: 60_000,
            runners: 3,
            lease_ms: 1_000,
            replicas: 3,
            without: vec![],
        };
        let schedule = workloads::faults::schedule(7, &options);
        let mut seen = BTreeSet::new();
        for fault in &schedule {
            let back =
                fault_of(&fault_step(fault), fault.at_ms, 3).unwrap_or_else(|error| panic!("{fault:?}: {error}"));
            // A fault not on a runner is dealt into a runner's lane, and names no runner.
            let expected = Fault { runner: fault.runner.filter(|_| fault.kind.on_runner()), ..fault.clone() };
            assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(&expected).unwrap());
            seen.insert(fault.variant.name());
        }
        assert!(seen.contains("target-skew") && seen.contains("latency"), "{seen:?}");
    }

    fn job(id: &str, at_ms: u64) -> PlannedJob {
        PlannedJob { at_ms, id: id.into(), deployment_key: "key-1".into(), steps: 4, step_ms: 200 }
    }

    fn fault(at_ms: u64, runner: Option<u32>, variant: Variant) -> Fault {
        Fault { at_ms, duration_ms: 3_000, kind: variant.kind(), runner, variant }
    }

    fn header() -> Header {
        Header {
            name: "shrunk-chaos-s7".into(),
            source: "store/chaos/x".into(),
            seed: 7,
            lease_ms: 1_000,
            heartbeat_interval_ms: 250,
            reconcile_after_ms: 1_000,
            settle_within_ms: 30_000,
            target_mode: history::TargetMode::Fenced,
            bugs: vec!["accept-stale-result".into()],
            db: "sqlite".into(),
            control_planes: 1,
        }
    }

    fn case() -> Case {
        Case {
            runners: 3,
            jobs: vec![job("j1", 100), job("j2", 2_500), job("j3", 9_000)],
            faults: vec![
                fault(2_000, Some(2), Variant::CutLinks),
                fault(6_000, Some(1), Variant::StaticSkew { offset_ms: -90_000 }),
                fault(7_000, None, Variant::RestartControl),
                fault(8_000, Some(1), Variant::DelayedStep { latency_ms: 4_000 }),
            ],
            pins: BTreeMap::new(),
        }
    }

    #[test]
    fn faults_on_replicas_and_the_store_survive_the_scenario_file() {
        let header = Header { db: "postgres".into(), control_planes: 3, ..header() };
        let on_replica =
            |at_ms, variant: Variant| Fault { at_ms, duration_ms: 1_000, kind: variant.kind(), runner: None, variant };
        let faults = vec![
            on_replica(2_000, Variant::ReplicaSkew { replica: Some(2), offset_ms: -45_000 }),
            on_replica(4_000, Variant::DbLatency { replica: Some(0), latency_ms: 83 }),
            on_replica(6_000, Variant::DbCut { replica: 1 }),
            on_replica(8_000, Variant::CommitCut { replica: Some(2) }),
            on_replica(10_000, Variant::KillReplica { replica: 1 }),
            // On every replica's link, as the nemesis deals them.
            on_replica(12_000, Variant::DbLatency { replica: None, latency_ms: 83 }),
            on_replica(14_000, Variant::CommitCut { replica: None }),
            on_replica(16_000, Variant::ReplicaSkew { replica: None, offset_ms: 60_000 }),
        ];
        let case = Case { faults: faults.clone(), ..case() };
        let text = scenario_text(&header, &case, &["rules-model".to_string()]);
        let scenario = parse(&text, &engine::scenario::checker_names()).unwrap();
        assert_eq!((scenario.db.as_deref(), scenario.control_planes), (Some("postgres"), 3), "{text}");
        let read: Vec<Fault> = scenario
            .steps
            .iter()
            .filter(|step| matches!(step.action, Action::Fault { .. }))
            .map(|step| fault_of(&step.action, step.at_ms.unwrap(), 3).unwrap())
            .collect();
        assert_eq!(read, faults, "{text}");
        let beyond = text.replace("control_planes = 3", "control_planes = 2");
        let error = parse(&beyond, &engine::scenario::checker_names()).unwrap_err().to_string();
        assert!(error.contains("replica = 3: the scenario has control_planes = 2"), "{error}");
    }

    #[test]
    fn a_case_becomes_a_scenario_that_parses_back_to_the_same_jobs_and_faults() {
        let checkers = vec!["stale-completion".to_string()];
        let scenario =
            parse(&scenario_text(&header(), &case(), &checkers), &engine::scenario::checker_names()).unwrap();
        assert_eq!((scenario.runners, scenario.lease_ms, scenario.seed), (3, 1_000, 7));
        assert_eq!((scenario.heartbeat_interval_ms, scenario.reconcile_after_ms), (Some(250), Some(1_000)));
        assert_eq!(scenario.bugs, vec!["accept-stale-result".to_string()]);
        assert!(scenario.background());
        assert_eq!(scenario.steps.len(), 7);
        let at: Vec<u64> = scenario.steps.iter().map(|step| step.at_ms.unwrap()).collect();
        assert_eq!(at, vec![100, 2_000, 2_500, 6_000, 7_000, 8_000, 9_000]);
        let faults: Vec<Fault> = scenario
            .steps
            .iter()
            .filter(|step| matches!(step.action, Action::Fault { .. }))
            .map(|step| fault_of(&step.action, step.at_ms.unwrap(), 3).unwrap())
            .collect();
        assert_eq!(faults, case().faults);
        let submitted: Vec<String> = scenario
            .steps
            .iter()
            .filter_map(|step| match &step.action {
                Action::Submit { job, key, steps, step_ms, .. } => Some(format!("{job} {key} {steps} {step_ms}")),
                _ => None,
            })
            .collect();
        assert_eq!(submitted, vec!["j1 key-1 4 200", "j2 key-1 4 200", "j3 key-1 4 200"]);
        assert_eq!(scenario.expects.len(), 1);
        assert_eq!(scenario.expects[0].checker.as_deref(), Some("stale-completion"));
        assert_eq!(scenario.expects[0].verdict.as_deref(), Some("invalid"));
    }

    #[test]
    fn sizes_count_steps_and_the_span_ends_with_the_last_fault() {
        let size = case().size();
        assert_eq!((size.runners, size.jobs, size.faults, size.steps), (3, 3, 4, 7));
        assert_eq!(size.span_ms, 11_000);
    }

    #[test]
    fn cutting_keeps_what_happened_up_to_the_anomaly() {
        let cut = case().until(6_000);
        assert_eq!(cut.jobs.iter().map(|job| job.id.as_str()).collect::<Vec<_>>(), vec!["j1", "j2"]);
        assert_eq!(cut.faults.len(), 2);
        let without = case().without(Part::Faults, 1..3);
        assert_eq!(without.faults.iter().map(|fault| fault.at_ms).collect::<Vec<_>>(), vec![2_000, 8_000]);
    }

    #[test]
    fn fewer_runners_renumber_the_runners_the_faults_hit() {
        let fewer = case().with_runners(2);
        assert_eq!(fewer.runners, 2);
        let runners: Vec<Option<u32>> = fewer.faults.iter().map(|fault| fault.runner).collect();
        assert_eq!(runners, vec![Some(1), Some(0), None, Some(0)]);
        assert_eq!(fewer.faults[1].kind, FaultKind::ClockSkew);
    }

    #[test]
    fn pinned_claims_are_written_on_submits_and_renumbered_with_the_runners() {
        let mut pinned = case().without(Part::Jobs, 2..3);
        pinned.pins = BTreeMap::from([("j1".into(), 0), ("j2".into(), 2), ("j3".into(), 1)]);
        assert_eq!(pinned.needed_runners(), BTreeSet::from([0, 1, 2]), "j3 is not kept: its pin does not count");
        let text = scenario_text(&header(), &pinned, &["stale-completion".into()]);
        let scenario = parse(&text, &engine::scenario::checker_names()).unwrap();
        let runners: Vec<Option<String>> = scenario
            .steps
            .iter()
            .filter_map(|step| match &step.action {
                Action::Submit { runner, .. } => Some(runner.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(runners, vec![Some("r1".to_string()), Some("r3".to_string())]);
        let mut fewer = pinned.clone();
        fewer.faults.retain(|fault| fault.runner != Some(1));
        let fewer = fewer.with_runners(2);
        assert_eq!(fewer.pins, BTreeMap::from([("j1".into(), 0), ("j2".into(), 1)]));
        assert_eq!(fewer.faults.iter().map(|fault| fault.runner).collect::<Vec<_>>(), vec![Some(1), None]);
    }

    #[test]
    fn starting_earlier_keeps_the_spacing() {
        let earlier = case().earlier(100);
        assert_eq!(earlier.first_ms(), 0);
        assert_eq!(earlier.faults[0].at_ms, 1_900);
        assert_eq!(earlier.size().span_ms, case().size().span_ms - 100);
    }
}
