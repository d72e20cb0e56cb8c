//! The scenario file format (`docs/scenarios.md`): a header, `[[step]]` entries run in
//! order and `[[expect]]` entries checked at the end. Parsing validates everything before
//! anything starts; every error names the step or expectation and its line.

use serde::{Deserialize, Serialize};

/// Longest bound a `wait` may give (2 minutes).
pub const WITHIN_MAX_MS: u64 = 120_000;

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub seed: u64,
    pub runners: u32,
    pub idle: Vec<String>,
    pub lease_ms: u64,
    pub target_mode: history::TargetMode,
    pub bugs: Vec<String>,
    /// The control plane's store (`sqlite` or `postgres`, as `--db`); none: as `--db` left
    /// out, the system file's one store if it declares one, else `sqlite`.
    pub db: Option<String>,
    /// Replicas of the control plane (as `--control-planes`).
    pub control_planes: u32,
    /// `automatic`: the run's operator reconciles uncertain attempts in the background.
    pub operator: OperatorMode,
    pub heartbeat_interval_ms: Option<u64>,
    pub reconcile_after_ms: Option<u64>,
    /// With background work (an automatic operator or `fault` steps): the longest wait,
    /// after the last step and the faults it started, for every job to settle.
    pub settle_within_ms: u64,
    /// With background work: settling ends early once no job has changed (state, attempts,
    /// ledger) for this long, the jobs left unsettled then being ones nothing moves on.
    /// `None`: [`Scenario::settle_quiet_ms`]'s default.
    pub settle_quiet_ms: Option<u64>,
    pub steps: Vec<Step>,
    pub expects: Vec<Condition>,
}

/// One step and where it is in the file.
#[derive(Debug, Clone)]
pub struct Step {
    pub index: usize,
    pub line: usize,
    /// Not before this many ms after the scenario started (the history's time 0).
    pub at_ms: Option<u64>,
    pub action: Action,
    /// Skipped, not failed, when the attempt the step names does not exist (a `wait`: once
    /// its job is settled without it, or at its bound): an attempt that exists only where
    /// the system retried the job, as an imported incident's buggy system did.
    pub if_attempt_exists: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorMode {
    /// Only the scenario's `reconcile` steps reconcile.
    Scripted,
    /// The operator of `fencelab run`: it stops, inspects and reconciles every uncertain attempt.
    Automatic,
}

/// A scenario as its file says it, for writing one through serde (`Scenario::to_toml`).
#[derive(Serialize)]
struct ScenarioFile<'a> {
    name: &'a str,
    description: &'a str,
    seed: u64,
    runners: u32,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    idle: &'a [String],
    lease_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    heartbeat_interval_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reconcile_after_ms: Option<u64>,
    settle_within_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    settle_quiet_ms: Option<u64>,
    target_mode: &'a str,
    bugs: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    db: Option<&'a str>,
    #[serde(skip_serializing_if = "is_one")]
    control_planes: u32,
    operator: OperatorMode,
    step: Vec<StepFile<'a>>,
    expect: &'a [Condition],
}

#[derive(Serialize)]
struct StepFile<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    at_ms: Option<u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    if_attempt_exists: bool,
    #[serde(flatten)]
    action: &'a Action,
}

impl Scenario {
    /// The scenario as a file that [`parse`] reads back to the same scenario.
    pub fn to_toml(&self) -> String {
        let file = ScenarioFile {
            name: &self.name,
            description: &self.description,
            seed: self.seed,
            runners: self.runners,
            idle: &self.idle,
            lease_ms: self.lease_ms,
            heartbeat_interval_ms: self.heartbeat_interval_ms,
            reconcile_after_ms: self.reconcile_after_ms,
            settle_within_ms: self.settle_within_ms,
            settle_quiet_ms: self.settle_quiet_ms,
            target_mode: self.target_mode.as_str(),
            bugs: &self.bugs,
            db: self.db.as_deref(),
            control_planes: self.control_planes,
            operator: self.operator,
            step: self
                .steps
                .iter()
                .map(|step| StepFile {
                    at_ms: step.at_ms,
                    if_attempt_exists: step.if_attempt_exists,
                    action: &step.action,
                })
                .collect(),
            expect: &self.expects,
        };
        toml::to_string(&file).expect("a scenario is plain TOML")
    }

    /// How long settling waits with no job changing before it ends: the file's
    /// `settle_quiet_ms`, else five leases and at least 3 s (a lapsed lease is swept, a
    /// requeued job claimed and a working runner heartbeats well within that).
    pub fn settle_quiet_ms(&self) -> u64 {
        self.settle_quiet_ms.unwrap_or((5 * self.lease_ms).max(3_000))
    }

    /// Whether work goes on besides the steps: jobs then settle at the end, as in a run.
    pub fn background(&self) -> bool {
        self.operator == OperatorMode::Automatic
            || self.steps.iter().any(|step| matches!(step.action, Action::Fault { .. }))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Link {
    Control,
    Target,
    Both,
}

impl Action {
    /// The job and attempt number the step names, if it names one (a `wait` names one when
    /// its condition gives both).
    pub fn named_attempt(&self) -> Option<(&str, u32)> {
        match self {
            Action::Wait(condition) => Some((condition.job.as_deref()?, condition.attempt?)),
            Action::Report { job, attempt, attempt_job, .. } => Some((attempt_job.as_deref().unwrap_or(job), *attempt)),
            Action::Heartbeat { job, attempt, .. }
            | Action::Capability { job, attempt, .. }
            | Action::TargetStep { job, attempt, .. }
            | Action::Reconcile { job, attempt, .. } => Some((job, *attempt)),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    Submit {
        job: String,
        key: String,
        #[serde(default = "one")]
        steps: u32,
        #[serde(default)]
        step_ms: u64,
        /// The runner that is to claim it: the other idle runners are held until it has.
        runner: Option<String>,
    },
    Wait(Box<Condition>),
    Elapse {
        ms: u64,
    },
    Cut {
        runner: String,
        link: Link,
    },
    Heal {
        runner: String,
        link: Link,
    },
    Latency {
        runner: String,
        link: Link,
        ms: u64,
    },
    Clear {
        runner: String,
        link: Link,
    },
    Pause {
        runner: String,
    },
    Resume {
        runner: String,
    },
    Kill {
        runner: String,
    },
    Restart {
        runner: String,
    },
    RestartControlPlane {},
    /// A fault exactly as the nemesis of `fencelab run` realises it, started in the
    /// background and healed after `duration_ms`.
    Fault {
        fault: Option<crate::faults::FaultKind>,
        how: String,
        runner: Option<String>,
        /// The replica a fault on replicas hits, from 1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replica: Option<u32>,
        #[serde(default)]
        duration_ms: u64,
        latency_ms: Option<u64>,
        offset_ms: Option<i64>,
    },
    Skew {
        runner: String,
        offset_ms: i64,
    },
    Reconcile {
        job: String,
        attempt: u32,
        finding: String,
        outcome: Option<String>,
    },
    Claim {
        as_runner: String,
        job: Option<String>,
    },
    Heartbeat {
        as_runner: String,
        job: String,
        attempt: u32,
        fence: Option<u64>,
        #[serde(default)]
        observed_offset_ms: i64,
    },
    Report {
        as_runner: String,
        job: String,
        attempt: u32,
        attempt_job: Option<String>,
        fence: Option<u64>,
        outcome: String,
        #[serde(default)]
        observed_offset_ms: i64,
    },
    Capability {
        as_runner: String,
        job: String,
        attempt: u32,
    },
    TargetStep {
        as_runner: String,
        job: String,
        attempt: u32,
        step: u32,
        steps: u32,
    },
}

fn one() -> u32 {
    1
}

/// A word a condition expects, or `-` for "none" (an attempt that never closed, a job
/// with no outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected<T> {
    Nothing,
    Word(T),
}

impl<T: Copy> Expected<T> {
    /// The expected word as written, `-` for nothing.
    pub fn text(self, word: impl Fn(T) -> &'static str) -> &'static str {
        match self {
            Expected::Nothing => "-",
            Expected::Word(value) => word(value),
        }
    }
}

impl<T: Serialize> Serialize for Expected<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Expected::Nothing => serializer.serialize_str("-"),
            Expected::Word(value) => value.serialize(serializer),
        }
    }
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Expected<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Expected<T>, D::Error> {
        use serde::de::IntoDeserializer;
        let word = String::deserialize(deserializer)?;
        if word == "-" {
            return Ok(Expected::Nothing);
        }
        let inner: serde::de::value::StringDeserializer<serde::de::value::Error> = word.into_deserializer();
        T::deserialize(inner).map(Expected::Word).map_err(serde::de::Error::custom)
    }
}

/// A condition on the lab: what a `wait` waits for and what an `[[expect]]` asserts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    pub job: Option<String>,
    pub state: Option<String>,
    pub outcome: Option<Expected<history::OutcomeWord>>,
    pub attempt: Option<u32>,
    pub attempts: Option<usize>,
    pub current: Option<bool>,
    pub fence: Option<u64>,
    pub closed_by: Option<Expected<history::ClosedBy>>,
    pub runner: Option<String>,
    pub ledger: Option<history::Op>,
    pub decision: Option<history::Decision>,
    pub recorded_as: Option<history::RecordedAs>,
    pub reason: Option<String>,
    pub applied_steps: Option<usize>,
    pub stale_step: Option<bool>,
    pub checker: Option<String>,
    pub verdict: Option<String>,
    pub within_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    seed: u64,
    #[serde(default = "two")]
    runners: u32,
    #[serde(default)]
    idle: Vec<String>,
    #[serde(default = "lease")]
    lease_ms: u64,
    #[serde(default = "fenced")]
    target_mode: String,
    #[serde(default)]
    bugs: Vec<String>,
    db: Option<String>,
    #[serde(default = "one_replica")]
    control_planes: u32,
    #[serde(default = "scripted")]
    operator: OperatorMode,
    heartbeat_interval_ms: Option<u64>,
    reconcile_after_ms: Option<u64>,
    #[serde(default = "settle_within")]
    settle_within_ms: u64,
    settle_quiet_ms: Option<u64>,
    #[serde(default)]
    step: Vec<toml::Table>,
    #[serde(default)]
    expect: Vec<toml::Table>,
}

fn two() -> u32 {
    2
}
fn one_replica() -> u32 {
    1
}
fn is_one(count: &u32) -> bool {
    *count == 1
}
fn lease() -> u64 {
    600
}
fn fenced() -> String {
    "fenced".into()
}
fn scripted() -> OperatorMode {
    OperatorMode::Scripted
}
fn settle_within() -> u64 {
    30_000
}

/// Lines (1-based) of every `[[name]]` header, in order.
fn header_lines(text: &str, name: &str) -> Vec<usize> {
    let header = format!("[[{name}]]");
    text.lines().enumerate().filter(|(_, line)| line.trim() == header).map(|(index, _)| index + 1).collect()
}

/// Parses and validates a scenario; the error is one message for people.
/// `checkers` are the names an `[[expect]]` may give as `checker`.
fn parse_text(text: &str, checkers: &[&str]) -> Result<Scenario, String> {
    let raw: Raw = toml::from_str(text).map_err(|error| error.to_string().trim_end().to_string())?;
    let step_lines = header_lines(text, "step");
    let expect_lines = header_lines(text, "expect");
    let mut steps = Vec::new();
    let mut last_at_ms = 0;
    for (index, mut table) in raw.step.into_iter().enumerate() {
        let line = step_lines.get(index).copied().unwrap_or(0);
        let name = table.get("action").and_then(|value| value.as_str()).unwrap_or("?").to_string();
        let place = format!("step {} (line {line}, action `{name}`)", index + 1);
        let at_ms = match table.remove("at_ms") {
            None => None,
            Some(toml::Value::Integer(ms)) if (0..=86_400_000).contains(&ms) && ms as u64 >= last_at_ms => {
                last_at_ms = ms as u64;
                Some(ms as u64)
            }
            Some(toml::Value::Integer(ms)) if (0..=86_400_000).contains(&ms) => {
                return Err(format!("{place}: at_ms = {ms} comes before an earlier step's at_ms = {last_at_ms}"))
            }
            Some(other) => return Err(format!("{place}: at_ms = {other}: must be 0..=86400000 ms")),
        };
        let if_attempt_exists = match table.remove("if_attempt_exists") {
            None => false,
            Some(toml::Value::Boolean(flag)) => flag,
            Some(other) => return Err(format!("{place}: if_attempt_exists = {other}: must be true or false")),
        };
        let action: Action = toml::Value::Table(table)
            .try_into()
            .map_err(|error: toml::de::Error| format!("{place}: {}", error.message()))?;
        if if_attempt_exists && action.named_attempt().is_none() {
            return Err(format!("{place}: if_attempt_exists needs a step that names a job's attempt"));
        }
        let step = Step { index: index + 1, line, at_ms, action, if_attempt_exists };
        check_step(&step, raw.runners).map_err(|message| format!("{place}: {message}"))?;
        steps.push(step);
    }
    let mut expects = Vec::new();
    for (index, table) in raw.expect.into_iter().enumerate() {
        let place = format!("expect {} (line {})", index + 1, expect_lines.get(index).copied().unwrap_or(0));
        let condition: Condition = toml::Value::Table(table)
            .try_into()
            .map_err(|error: toml::de::Error| format!("{place}: {}", error.message()))?;
        check_condition(&condition, false, raw.runners, checkers).map_err(|message| format!("{place}: {message}"))?;
        expects.push(condition);
    }
    let target_mode = raw
        .target_mode
        .parse::<history::TargetMode>()
        .map_err(|_| format!("target_mode = `{}`: must be fenced, idempotent or unfenced", raw.target_mode))?;
    let scenario = Scenario {
        name: raw.name,
        description: raw.description,
        seed: raw.seed,
        runners: raw.runners,
        idle: raw.idle,
        lease_ms: raw.lease_ms,
        target_mode,
        bugs: raw.bugs,
        db: raw.db,
        control_planes: raw.control_planes,
        operator: raw.operator,
        heartbeat_interval_ms: raw.heartbeat_interval_ms,
        reconcile_after_ms: raw.reconcile_after_ms,
        settle_within_ms: raw.settle_within_ms,
        settle_quiet_ms: raw.settle_quiet_ms,
        steps,
        expects,
    };
    check_header(&scenario)?;
    Ok(scenario)
}

fn check_header(scenario: &Scenario) -> Result<(), String> {
    if scenario.name.is_empty() || !scenario.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(format!("name `{}`: must be letters, digits, `-`, `_` or `.`", scenario.name));
    }
    if scenario.runners == 0 || scenario.runners > 16 {
        return Err(format!("runners = {}: must be 1..=16", scenario.runners));
    }
    if let Some(db) = scenario.db.as_deref().filter(|db| !["sqlite", "postgres"].contains(db)) {
        return Err(format!("db = `{db}`: must be sqlite or postgres"));
    }
    if !(1..=8).contains(&scenario.control_planes) {
        return Err(format!("control_planes = {}: must be 1..=8", scenario.control_planes));
    }
    for step in &scenario.steps {
        if let Action::Fault { replica: Some(replica), .. } = &step.action {
            if *replica > scenario.control_planes {
                return Err(format!(
                    "step {} (line {}): replica = {replica}: the scenario has control_planes = {}",
                    step.index, step.line, scenario.control_planes
                ));
            }
        }
    }
    if !(100..=60_000).contains(&scenario.lease_ms) {
        return Err(format!("lease_ms = {}: must be 100..=60000", scenario.lease_ms));
    }
    for runner in &scenario.idle {
        index_of_runner(runner, scenario.runners).map_err(|message| format!("idle: {message}"))?;
    }
    if let Some(ms) = scenario.heartbeat_interval_ms {
        if ms == 0 || ms >= scenario.lease_ms {
            return Err(format!("heartbeat_interval_ms = {ms}: must be above 0 and below lease_ms"));
        }
    }
    if scenario.reconcile_after_ms.is_some_and(|ms| ms > 600_000) {
        return Err("reconcile_after_ms: must be at most 600000".into());
    }
    if !(1..=3_600_000).contains(&scenario.settle_within_ms) {
        return Err(format!("settle_within_ms = {}: must be 1..=3600000", scenario.settle_within_ms));
    }
    if let Some(ms) = scenario.settle_quiet_ms {
        if !(100..=3_600_000).contains(&ms) {
            return Err(format!("settle_quiet_ms = {ms}: must be 100..=3600000"));
        }
    }
    if scenario.expects.is_empty() {
        return Err("a scenario needs at least one [[expect]]".into());
    }
    Ok(())
}

/// `rK` → K-1, when 1 <= K <= runners.
fn index_of_runner(name: &str, runners: u32) -> Result<usize, String> {
    let number = name.strip_prefix('r').and_then(|rest| rest.parse::<u32>().ok());
    match number {
        Some(number) if (1..=runners).contains(&number) => Ok(number as usize - 1),
        _ => Err(format!("runner `{name}` is not one of r1..r{runners}")),
    }
}

fn check_step(step: &Step, runners: u32) -> Result<(), String> {
    let index = |name: &str| index_of_runner(name, runners).map(drop);
    match &step.action {
        Action::Wait(condition) => check_condition(condition, true, runners, &[]),
        Action::Submit { steps, step_ms, runner, .. } => {
            if let Some(runner) = runner {
                index(runner)?;
            }
            match (*steps, *step_ms) {
                (1..=1000, 0..=600_000) => Ok(()),
                _ => Err("steps must be 1..=1000 and step_ms at most 600000".into()),
            }
        }
        Action::Elapse { ms } if *ms == 0 || *ms > WITHIN_MAX_MS => Err(format!("ms must be 1..={WITHIN_MAX_MS}")),
        Action::Cut { runner, .. }
        | Action::Heal { runner, .. }
        | Action::Clear { runner, .. }
        | Action::Pause { runner }
        | Action::Resume { runner }
        | Action::Kill { runner }
        | Action::Restart { runner }
        | Action::Skew { runner, .. } => index(runner),
        Action::Latency { runner, ms, .. } => {
            index(runner)?;
            if *ms == 0 || *ms > WITHIN_MAX_MS {
                return Err(format!("ms must be 1..={WITHIN_MAX_MS}"));
            }
            Ok(())
        }
        Action::Reconcile { finding, outcome, .. } => check_finding(finding, outcome.as_deref()),
        Action::Fault { .. } => {
            fault_of(&step.action, step.at_ms.unwrap_or(0), runners).map(drop).map_err(String::from)
        }
        Action::Report { as_runner, outcome, .. } => {
            index(as_runner)?;
            check_outcome(outcome)
        }
        Action::Claim { as_runner, .. }
        | Action::Heartbeat { as_runner, .. }
        | Action::Capability { as_runner, .. }
        | Action::TargetStep { as_runner, .. } => index(as_runner),
        _ => Ok(()),
    }
}

/// Longest window a `fault` step may hold a fault (10 minutes).
pub const FAULT_DURATION_MAX_MS: u64 = 600_000;

/// A scenario file that is not a valid scenario, or a step naming what it cannot: what is
/// wrong, with the line where there is one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadScenario(String);

impl From<String> for BadScenario {
    fn from(message: String) -> BadScenario {
        BadScenario(message)
    }
}

impl From<&str> for BadScenario {
    fn from(message: &str) -> BadScenario {
        BadScenario(message.to_string())
    }
}

/// Reads and validates a scenario file's text; `checkers` are the names an expectation may
/// use.
pub fn parse(text: &str, checkers: &[&str]) -> Result<Scenario, BadScenario> {
    parse_text(text, checkers).map_err(BadScenario)
}

/// The index of runner `name` (`r1` is 0) among `runners`.
pub fn runner_index(name: &str, runners: u32) -> Result<usize, BadScenario> {
    index_of_runner(name, runners).map_err(BadScenario)
}

/// Why a `fault` step describes no fault the nemesis can run.
#[derive(Debug, thiserror::Error)]
pub enum FaultStepError {
    #[error("not a fault step")]
    NotAFault,
    #[error("replica = 0: replicas are numbered from 1")]
    ReplicaZero,
    /// `how` and its parameters are no fault variant.
    #[error("how = `{how}`: {source}")]
    How {
        how: String,
        #[source]
        source: serde_json::Error,
    },
    /// The variant's parameters could not be written back.
    #[error("{0}")]
    Parameters(#[source] serde_json::Error),
    #[error("how = `{how}` takes no {key}")]
    TakesNo { how: String, key: &'static str },
    #[error("how = `{how}` realises `{realises}`, not `{named}`")]
    Realises { how: String, realises: &'static str, named: &'static str },
    #[error("duration_ms = {0}: must be at most {max}", max = FAULT_DURATION_MAX_MS)]
    TooLong(u64),
    /// A runner named for a fault that hits the control plane or the target.
    #[error("{how} hits the {hits}, not a runner")]
    NotOnARunner { how: String, hits: &'static str },
    #[error("how = `{how}` needs a runner")]
    NeedsARunner { how: String },
    /// The runner named is not one of the scenario's.
    #[error("{0}")]
    Runner(String),
}

/// The scenario runner's steps answer with their message.
impl From<FaultStepError> for String {
    fn from(error: FaultStepError) -> String {
        error.to_string()
    }
}

/// The nemesis fault a `fault` step describes, starting at `at_ms`.
pub fn fault_of(action: &Action, at_ms: u64, runners: u32) -> Result<crate::faults::Fault, FaultStepError> {
    let Action::Fault { fault, how, runner, replica, duration_ms, latency_ms, offset_ms } = action else {
        return Err(FaultStepError::NotAFault);
    };
    let mut fields = serde_json::json!({ "how": how });
    if let Some(ms) = latency_ms {
        fields["latency_ms"] = (*ms).into();
    }
    if let Some(ms) = offset_ms {
        fields["offset_ms"] = (*ms).into();
    }
    match replica {
        Some(0) => return Err(FaultStepError::ReplicaZero),
        Some(replica) => fields["replica"] = (replica - 1).into(),
        None => {}
    }
    let variant: crate::faults::Variant =
        serde_json::from_value(fields.clone()).map_err(|source| FaultStepError::How { how: how.clone(), source })?;
    let parameters = serde_json::to_value(&variant).map_err(FaultStepError::Parameters)?;
    for key in ["latency_ms", "offset_ms", "replica"] {
        if fields.get(key).is_some() && parameters.get(key).is_none() {
            return Err(FaultStepError::TakesNo { how: how.clone(), key });
        }
    }
    let kind = variant.kind();
    if let Some(named) = fault.filter(|named| *named != kind) {
        return Err(FaultStepError::Realises { how: how.clone(), realises: kind.name(), named: named.name() });
    }
    if *duration_ms > FAULT_DURATION_MAX_MS {
        return Err(FaultStepError::TooLong(*duration_ms));
    }
    let on_control_plane = kind == crate::faults::FaultKind::RestartControlPlane || kind.on_replicas();
    let on_target = kind == crate::faults::FaultKind::TargetClockSkew;
    let not_on_a_runner = |hits| FaultStepError::NotOnARunner { how: how.clone(), hits };
    let runner = match (runner, kind) {
        (Some(_), _) if on_control_plane => return Err(not_on_a_runner("control plane")),
        (Some(_), _) if on_target => return Err(not_on_a_runner("target")),
        (None, _) if on_target => None,
        (None, _) if on_control_plane => None,
        (None, _) if variant.hits_every_runner() => None,
        (None, _) => return Err(FaultStepError::NeedsARunner { how: how.clone() }),
        (Some(name), _) => Some(index_of_runner(name, runners).map_err(FaultStepError::Runner)? as u32),
    };
    Ok(crate::faults::Fault { at_ms, duration_ms: *duration_ms, kind, runner, variant })
}

fn check_outcome(outcome: &str) -> Result<(), String> {
    match outcome {
        "succeeded" | "failed" => Ok(()),
        other => Err(format!("outcome `{other}`: must be succeeded or failed")),
    }
}

fn check_finding(finding: &str, outcome: Option<&str>) -> Result<(), String> {
    match (finding, outcome) {
        ("completed", Some(outcome)) => check_outcome(outcome),
        ("completed", None) => Err("finding `completed` needs an outcome".into()),
        ("stopped" | "still-running", None) => Ok(()),
        ("stopped" | "still-running", Some(_)) => Err(format!("finding `{finding}` takes no outcome")),
        (other, _) => Err(format!("finding `{other}`: must be stopped, completed or still-running")),
    }
}

/// A condition names one subject: a checker, the target's stale steps, a ledger entry, an
/// attempt, or a job. Waits need a bound and cannot wait for a checker.
fn check_condition(condition: &Condition, wait: bool, runners: u32, checkers: &[&str]) -> Result<(), String> {
    match (wait, condition.within_ms) {
        (true, None) => return Err("a wait needs a bound: within_ms".into()),
        (true, Some(ms)) if ms == 0 || ms > WITHIN_MAX_MS => {
            return Err(format!("within_ms = {ms}: must be 1..={WITHIN_MAX_MS}"))
        }
        (false, Some(_)) => return Err("within_ms is for waits, not expectations".into()),
        _ => {}
    }
    if let Some(checker) = &condition.checker {
        if wait {
            return Err("a wait cannot wait for a checker's verdict".into());
        }
        if !checkers.contains(&checker.as_str()) {
            return Err(format!("unknown checker `{checker}`"));
        }
        return match condition.verdict.as_deref() {
            Some("valid" | "invalid" | "unknown") => Ok(()),
            _ => Err("checker needs verdict = valid, invalid or unknown".into()),
        };
    }
    if condition.stale_step.is_some() {
        return Ok(());
    }
    if let Some(runner) = &condition.runner {
        index_of_runner(runner, runners)?;
    }
    let Some(_) = &condition.job else {
        return Err("a condition names a job (or a checker, or stale_step)".into());
    };
    if condition.ledger.is_none() && condition.attempt.is_none() && nothing_about_job(condition) {
        return Err("a condition on a job needs state, outcome, attempts, runner or applied_steps".into());
    }
    Ok(())
}

fn nothing_about_job(condition: &Condition) -> bool {
    condition.state.is_none()
        && condition.outcome.is_none()
        && condition.attempts.is_none()
        && condition.runner.is_none()
        && condition.applied_steps.is_none()
}
