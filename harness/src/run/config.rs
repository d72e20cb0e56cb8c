//! Flags apart from validated configuration: `RunArgs` is what the user typed, `RunConfig`
//! is what was checked (timings consistent, names known, store writable) and is what the
//! rest of a run takes.

use std::path::PathBuf;

use clap::Args;
use lab::bugs::Bug;
use lab::target::Mode;
use serde::{Deserialize, Serialize};
use workloads::faults::FaultKind;

/// The defaults of every flag, from [`RunConfig::default`]: the one place they live.
fn defaults() -> RunConfig {
    RunConfig::default()
}

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// Name of the test: the run folder is `STORE/NAME/START-TIME`.
    #[arg(long, default_value_t = defaults().test_name)]
    pub test_name: String,
    /// Seconds of workload and faults (recovery comes after).
    #[arg(long = "time-limit", default_value_t = defaults().time_limit_ms / 1_000)]
    pub time_limit_s: u64,
    /// Seed of every random choice of the run (default: taken from the clock and printed).
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long, default_value_t = defaults().runners)]
    pub runners: u32,
    /// Distinct deployment keys the jobs spread over.
    #[arg(long, default_value_t = defaults().keys)]
    pub keys: u32,
    /// Jobs submitted per second, on average.
    #[arg(long = "rate", default_value_t = defaults().rate_per_s)]
    pub rate_per_s: f64,
    /// Faults: `all`, or a comma-separated list of names (see `--help`), or `none`.
    #[arg(long, default_value = "all")]
    pub nemesis: String,
    /// Planted bugs to switch on in the lab (repeatable).
    #[arg(long = "bug")]
    pub bugs: Vec<String>,
    #[arg(long, value_enum, default_value_t = defaults().target_mode)]
    pub target_mode: Mode,
    #[arg(long, default_value_t = defaults().lease_ms)]
    pub lease_ms: u64,
    /// Default: a quarter of the lease.
    #[arg(long)]
    pub heartbeat_interval_ms: Option<u64>,
    #[arg(long, default_value_t = defaults().steps_min)]
    pub steps_min: u32,
    #[arg(long, default_value_t = defaults().steps_max)]
    pub steps_max: u32,
    #[arg(long, default_value_t = defaults().step_ms_min)]
    pub step_ms_min: u64,
    #[arg(long, default_value_t = defaults().step_ms_max)]
    pub step_ms_max: u64,
    /// How long the operator lets an attempt stay uncertain before it reconciles it
    /// (default: one lease).
    #[arg(long)]
    pub reconcile_after_ms: Option<u64>,
    /// Longest recovery phase, in seconds (faults healed, the operator reconciles, jobs settle).
    #[arg(long = "recovery-limit", default_value_t = defaults().recovery_limit_ms / 1_000)]
    pub recovery_limit_s: u64,
    /// Drive a real Toxiproxy at this URL instead of starting the embedded one.
    #[arg(long)]
    pub toxiproxy_url: Option<String>,
    /// Run a Toxiproxy server from this image (present locally) through testcontainers and
    /// drive it as with `--toxiproxy-url`.
    #[arg(long, conflicts_with = "toxiproxy_url")]
    pub toxiproxy_image: Option<String>,
    /// Where run folders go.
    #[arg(long, default_value_os_t = defaults().store)]
    pub store: PathBuf,
    /// Execute this fault schedule (a run folder's `schedule.json`) instead of generating one.
    #[arg(long)]
    pub schedule: Option<PathBuf>,
    /// The control plane's database: `sqlite` (a file in the run folder) or `postgres` (a
    /// throwaway cluster started for the run, or `--database-url`).
    #[arg(long, value_enum, default_value_t = defaults().db)]
    pub db: Db,
    /// An existing PostgreSQL server to use (with `--db postgres`); the run gets a fresh schema.
    #[arg(long)]
    pub database_url: Option<String>,
    /// The system under test: a system file (`docs/system.md`). Default: the built-in lab
    /// (`systems/lab.toml`).
    #[arg(long)]
    pub system: Option<PathBuf>,
    /// A variant the system file declares (repeatable), e.g. a build with a known bug.
    /// `--bug NAME` is the lab's shortcut for `--variant NAME`.
    #[arg(long = "variant")]
    pub variants: Vec<String>,
    /// Replicas of the control plane, on one store (each runner reaches its own first and
    /// fails over to the others).
    #[arg(long, default_value_t = defaults().control_planes)]
    pub control_planes: u32,
}

/// The control plane's database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Db {
    Sqlite,
    Postgres,
}

impl Db {
    pub fn name(self) -> &'static str {
        match self {
            Db::Sqlite => "sqlite",
            Db::Postgres => "postgres",
        }
    }
}

impl std::fmt::Display for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<&RunConfig> for RunArgs {
    /// The flags that give `config` back through [`validate`] (a schedule stays the
    /// config's own: it has no file here).
    fn from(config: &RunConfig) -> RunArgs {
        let nemesis: Vec<&str> = config.nemesis.iter().map(|kind| kind.name()).collect();
        RunArgs {
            test_name: config.test_name.clone(),
            time_limit_s: config.time_limit_ms / 1_000,
            seed: Some(config.seed),
            runners: config.runners,
            keys: config.keys,
            rate_per_s: config.rate_per_s,
            nemesis: if nemesis.is_empty() { "none".to_string() } else { nemesis.join(",") },
            bugs: config.bugs.iter().map(|bug| bug.name().to_string()).collect(),
            target_mode: config.target_mode,
            lease_ms: config.lease_ms,
            heartbeat_interval_ms: Some(config.heartbeat_interval_ms),
            steps_min: config.steps_min,
            steps_max: config.steps_max,
            step_ms_min: config.step_ms_min,
            step_ms_max: config.step_ms_max,
            reconcile_after_ms: Some(config.reconcile_after_ms),
            recovery_limit_s: config.recovery_limit_ms / 1_000,
            toxiproxy_url: config.toxiproxy_url.clone(),
            toxiproxy_image: config.toxiproxy_image.clone(),
            store: config.store.clone(),
            schedule: None,
            db: config.db,
            database_url: config.database_url.clone(),
            system: config.system.clone(),
            variants: config.variants.clone(),
            control_planes: config.control_planes,
        }
    }
}

/// A run's validated configuration: what `config.json` holds, read back through this type.
///
/// Defaults ([`Default`]): test name `chaos`, seed 0 (a run takes it from the clock when no
/// `--seed` is given), 30 000 ms of workload, 30 000 ms of recovery at most, 3 runners,
/// 4 deployment keys, 2 jobs/s, every fault, no bug, a fenced target, a 1 000 ms lease,
/// heartbeats every 250 ms (a quarter of the lease), reconcile after 1 000 ms (one lease),
/// a renewal margin of 200 ms (a fifth), requests timing out after 2 000 ms (two leases:
/// a heartbeat delayed in the network still arrives, late), 3 to 6 steps of 100 to 300 ms,
/// the embedded Toxiproxy, run folders under `store`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub test_name: String,
    pub seed: u64,
    pub time_limit_ms: u64,
    pub recovery_limit_ms: u64,
    pub runners: u32,
    pub keys: u32,
    pub rate_per_s: f64,
    pub nemesis: Vec<FaultKind>,
    pub bugs: Vec<Bug>,
    pub target_mode: Mode,
    pub lease_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub reconcile_after_ms: u64,
    pub renewal_margin_ms: u64,
    pub request_timeout_ms: u64,
    pub steps_min: u32,
    pub steps_max: u32,
    pub step_ms_min: u64,
    pub step_ms_max: u64,
    pub toxiproxy_url: Option<String>,
    /// A Toxiproxy image run through testcontainers (`--toxiproxy-image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toxiproxy_image: Option<String>,
    pub store: PathBuf,
    /// A given fault schedule, replacing the generated one.
    pub schedule: Option<Vec<workloads::faults::Fault>>,
    /// The control plane's database.
    #[serde(default = "sqlite")]
    pub db: Db,
    /// An existing PostgreSQL server (else a throwaway cluster is started for the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_url: Option<String>,
    /// The system file (absolute), or none for the built-in lab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<PathBuf>,
    /// The system's variants switched on (the planted bugs are in `bugs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<String>,
    /// Replicas of the control plane.
    #[serde(default = "one")]
    pub control_planes: u32,
    pub version: String,
}

fn one() -> u32 {
    1
}

fn sqlite() -> Db {
    Db::Sqlite
}

impl Default for RunConfig {
    fn default() -> RunConfig {
        RunConfig {
            test_name: "chaos".into(),
            seed: 0,
            time_limit_ms: 30_000,
            recovery_limit_ms: 30_000,
            runners: 3,
            keys: 4,
            rate_per_s: 2.0,
            nemesis: FaultKind::ALL.to_vec(),
            bugs: Vec::new(),
            target_mode: Mode::Fenced,
            lease_ms: 1_000,
            heartbeat_interval_ms: 1_000 / 4,
            reconcile_after_ms: 1_000,
            renewal_margin_ms: 1_000 / 5,
            request_timeout_ms: 2 * 1_000,
            steps_min: 3,
            steps_max: 6,
            step_ms_min: 100,
            step_ms_max: 300,
            toxiproxy_url: None,
            toxiproxy_image: None,
            store: PathBuf::from("store"),
            schedule: None,
            db: Db::Sqlite,
            database_url: None,
            system: None,
            variants: Vec::new(),
            control_planes: 1,
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// What `config.json` holds: the run's configuration, how runner clocks were moved, how
/// long the cluster took to become healthy, and the scenario a scenario run played.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(flatten)]
    pub run: RunConfig,
    pub clock_control: super::cluster::ClockControl,
    /// The system attacked, and what of the run it could not take (absent in older files).
    #[serde(default)]
    pub system: crate::system::SystemInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<ScenarioInfo>,
}

/// Which scenario a scenario run played.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioInfo {
    pub name: String,
    pub description: String,
    pub file: PathBuf,
}

impl ConfigFile {
    /// Reads a run folder's `config.json`; the error names the file.
    pub fn read(folder: &std::path::Path) -> Result<ConfigFile, String> {
        let path = folder.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|error| format!("{}: {error}", path.display()))?;
        serde_json::from_str(&text).map_err(|error| format!("{}: {error}", path.display()))
    }
}

/// Checks the flags; every error names the flag.
pub fn validate(args: &RunArgs, seed_default: u64) -> Result<RunConfig, String> {
    let mut nemesis = if args.nemesis.trim() == "none" {
        vec![]
    } else {
        FaultKind::parse_list(&args.nemesis).map_err(|error| format!("--nemesis: {error}"))?
    };
    if args.control_planes > 1 && args.nemesis.trim() == "all" {
        nemesis.extend(FaultKind::REPLICAS);
    }
    if args.db == Db::Postgres && args.nemesis.trim() == "all" {
        nemesis.extend(FaultKind::DATABASE);
    }
    if let Some(kind) = nemesis.iter().find(|kind| args.control_planes < 2 && FaultKind::REPLICAS.contains(kind)) {
        return Err(format!("--nemesis {}: needs --control-planes 2 or more", kind.name()));
    }
    let bugs = args
        .bugs
        .iter()
        .map(|bug| bug.parse::<Bug>().map_err(|error| format!("--bug: {error}")))
        .collect::<Result<Vec<Bug>, String>>()?;
    let heartbeat_interval_ms = args.heartbeat_interval_ms.unwrap_or(args.lease_ms / 4);
    let checks = [
        (args.time_limit_s == 0 || args.time_limit_s > 86_400, "--time-limit must be 1..=86400 seconds"),
        (args.runners == 0 || args.runners > 64, "--runners must be 1..=64"),
        (args.keys == 0 || args.keys > 10_000, "--keys must be 1..=10000"),
        (!(args.rate_per_s > 0.0 && args.rate_per_s <= 1_000.0), "--rate must be above 0 and at most 1000 jobs/s"),
        (args.lease_ms < 100 || args.lease_ms > 600_000, "--lease-ms must be 100..=600000"),
        (
            heartbeat_interval_ms == 0 || heartbeat_interval_ms >= args.lease_ms,
            "--heartbeat-interval-ms must be above 0 and below --lease-ms",
        ),
        (
            args.steps_min == 0 || args.steps_min > args.steps_max || args.steps_max > 1_000,
            "--steps-min/--steps-max must satisfy 1 <= min <= max <= 1000",
        ),
        (
            args.step_ms_min > args.step_ms_max || args.step_ms_max > 600_000,
            "--step-ms-min must not exceed --step-ms-max (at most 600000)",
        ),
        (args.recovery_limit_s == 0 || args.recovery_limit_s > 3_600, "--recovery-limit must be 1..=3600 seconds"),
        (args.control_planes == 0 || args.control_planes > 9, "--control-planes must be 1..=9"),
    ];
    if let Some((_, message)) = checks.iter().find(|(bad, _)| *bad) {
        return Err(message.to_string());
    }
    let schedule = match &args.schedule {
        Some(path) => Some(read_schedule(path)?),
        None => None,
    };
    if let Some(image) = &args.toxiproxy_image {
        crate::system::container::ImageName::parse(image).map_err(|why| format!("--toxiproxy-image: {why}"))?;
    }
    if args.database_url.is_some() && args.db != Db::Postgres {
        return Err("--database-url needs --db postgres".into());
    }
    let system = match &args.system {
        Some(path) => {
            let file = crate::system::SystemFile::read(path).map_err(|error| format!("--system {error}"))?;
            file.check_variants(&args.variants).map_err(|error| format!("--variant: {error}"))?;
            file.db_args(args.db).map_err(|error| format!("--db: {error}"))?;
            file.check_variants_db(&args.variants, args.db).map_err(|error| format!("--variant: {error}"))?;
            if !bugs.is_empty() && file.name != "lab" {
                file.check_variants(&args.bugs).map_err(|error| format!("--bug: {error}"))?;
            }
            file.check_variants_db(&args.bugs, args.db).map_err(|error| format!("--bug: {error}"))?;
            Some(file.path)
        }
        None => {
            let lab = crate::system::SystemFile::lab();
            lab.check_variants(&args.variants).map_err(|error| format!("--variant: {error}"))?;
            lab.check_variants_db(&args.variants, args.db).map_err(|error| format!("--variant: {error}"))?;
            lab.check_variants_db(&args.bugs, args.db).map_err(|error| format!("--bug: {error}"))?;
            None
        }
    };
    if args.test_name.is_empty() || !args.test_name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err("--test-name must be letters, digits, `-`, `_` or `.`".into());
    }
    Ok(RunConfig {
        test_name: args.test_name.clone(),
        seed: args.seed.unwrap_or(seed_default),
        time_limit_ms: args.time_limit_s * 1_000,
        recovery_limit_ms: args.recovery_limit_s * 1_000,
        runners: args.runners,
        keys: args.keys,
        rate_per_s: args.rate_per_s,
        nemesis,
        bugs,
        target_mode: args.target_mode,
        lease_ms: args.lease_ms,
        heartbeat_interval_ms,
        reconcile_after_ms: args.reconcile_after_ms.unwrap_or(args.lease_ms),
        renewal_margin_ms: args.lease_ms / 5,
        // Longer than the lease: a heartbeat delayed in the network still arrives, late.
        request_timeout_ms: 2 * args.lease_ms,
        steps_min: args.steps_min,
        steps_max: args.steps_max,
        step_ms_min: args.step_ms_min,
        step_ms_max: args.step_ms_max,
        toxiproxy_url: args.toxiproxy_url.clone(),
        toxiproxy_image: args.toxiproxy_image.clone(),
        store: args.store.clone(),
        schedule,
        db: args.db,
        database_url: args.database_url.clone(),
        system,
        variants: args.variants.clone(),
        control_planes: args.control_planes,
        version: env!("CARGO_PKG_VERSION").to_string(),
    })
}

fn read_schedule(path: &std::path::Path) -> Result<Vec<workloads::faults::Fault>, String> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("--schedule {}: {error}", path.display()))?;
    serde_json::from_str(&text).map_err(|error| format!("--schedule {}: {error}", path.display()))
}

impl RunConfig {
    /// The fault schedule of this run: the given one, or the one the seed generates.
    pub fn fault_schedule(&self) -> Vec<workloads::faults::Fault> {
        self.fault_schedule_without(&[])
    }

    /// The fault schedule without the faults of `not_run` (kinds the system cannot take).
    pub fn fault_schedule_without(&self, not_run: &[FaultKind]) -> Vec<workloads::faults::Fault> {
        match &self.schedule {
            Some(schedule) => schedule.iter().filter(|fault| !not_run.contains(&fault.kind)).cloned().collect(),
            None => {
                let mut options = self.schedule_options();
                options.kinds.retain(|kind| !not_run.contains(kind));
                workloads::faults::schedule(self.seed, &options)
            }
        }
    }

    /// The `fencelab run` arguments (after `run`) that give this configuration back, built
    /// from the fields: `--store` and `--schedule` are the caller's to add.
    pub fn args(&self) -> Vec<String> {
        let nemesis: Vec<&str> = self.nemesis.iter().map(|kind| kind.name()).collect();
        let nemesis = if nemesis.is_empty() { "none".to_string() } else { nemesis.join(",") };
        let mut args: Vec<String> = [
            ("--test-name", self.test_name.clone()),
            ("--seed", self.seed.to_string()),
            ("--time-limit", (self.time_limit_ms / 1_000).to_string()),
            ("--runners", self.runners.to_string()),
            ("--keys", self.keys.to_string()),
            ("--rate", self.rate_per_s.to_string()),
            ("--nemesis", nemesis),
            ("--target-mode", self.target_mode.name().to_string()),
            ("--lease-ms", self.lease_ms.to_string()),
            ("--heartbeat-interval-ms", self.heartbeat_interval_ms.to_string()),
            ("--reconcile-after-ms", self.reconcile_after_ms.to_string()),
            ("--steps-min", self.steps_min.to_string()),
            ("--steps-max", self.steps_max.to_string()),
            ("--step-ms-min", self.step_ms_min.to_string()),
            ("--step-ms-max", self.step_ms_max.to_string()),
            ("--recovery-limit", (self.recovery_limit_ms / 1_000).to_string()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect();
        for bug in &self.bugs {
            args.extend(["--bug".to_string(), bug.name().to_string()]);
        }
        if let Some(url) = &self.toxiproxy_url {
            args.extend(["--toxiproxy-url".to_string(), url.clone()]);
        }
        if let Some(image) = &self.toxiproxy_image {
            args.extend(["--toxiproxy-image".to_string(), image.clone()]);
        }
        if self.db != Db::Sqlite {
            args.extend(["--db".to_string(), self.db.name().to_string()]);
        }
        if let Some(url) = &self.database_url {
            args.extend(["--database-url".to_string(), url.clone()]);
        }
        if let Some(path) = &self.system {
            args.extend(["--system".to_string(), path.display().to_string()]);
        }
        for variant in &self.variants {
            args.extend(["--variant".to_string(), variant.clone()]);
        }
        if self.control_planes != 1 {
            args.extend(["--control-planes".to_string(), self.control_planes.to_string()]);
        }
        args
    }

    /// The command that repeats this run.
    pub fn command(&self) -> String {
        format!("fencelab run {}", self.args().join(" "))
    }

    /// The command that repeats this run, whose folder is `folder`.
    pub fn command_in(&self, folder: &std::path::Path) -> String {
        let mut command = self.command();
        if self.schedule.is_some() {
            command.push_str(&format!(" --schedule {}", folder.join("schedule.json").display()));
        }
        command
    }

    pub fn job_options(&self) -> workloads::jobs::JobOptions {
        workloads::jobs::JobOptions {
            time_limit_ms: self.time_limit_ms,
            rate_per_s: self.rate_per_s,
            keys: self.keys,
            steps_min: self.steps_min,
            steps_max: self.steps_max,
            step_ms_min: self.step_ms_min,
            step_ms_max: self.step_ms_max,
            jobs_max: 100_000,
        }
    }

    pub fn schedule_options(&self) -> workloads::faults::ScheduleOptions {
        workloads::faults::ScheduleOptions {
            kinds: self.nemesis.clone(),
            time_limit_ms: self.time_limit_ms,
            runners: self.runners,
            lease_ms: self.lease_ms,
            replicas: self.control_planes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[String]) -> RunArgs {
        let words = std::iter::once("run".to_string()).chain(args.iter().cloned());
        Wrapper::try_parse_from(words).expect("the command parses").run
    }

    #[test]
    fn the_default_is_what_no_flag_gives() {
        let config = validate(&parse(&[]), 0).unwrap();
        assert_eq!(config, RunConfig::default());
    }

    #[test]
    fn a_config_round_trips_through_its_command() {
        let config = RunConfig {
            test_name: "round-trip".into(),
            seed: 77,
            time_limit_ms: 12_000,
            recovery_limit_ms: 9_000,
            runners: 5,
            keys: 7,
            rate_per_s: 3.5,
            nemesis: vec![FaultKind::Kill, FaultKind::ClockSkew],
            bugs: vec![Bug::AcceptStaleResult, Bug::RequeueOnExpiry],
            target_mode: Mode::Unfenced,
            lease_ms: 800,
            heartbeat_interval_ms: 150,
            reconcile_after_ms: 900,
            renewal_margin_ms: 160,
            request_timeout_ms: 1_600,
            steps_min: 2,
            steps_max: 9,
            step_ms_min: 10,
            step_ms_max: 20,
            toxiproxy_url: Some("http://127.0.0.1:8474".into()),
            db: Db::Postgres,
            database_url: Some("postgres://postgres@127.0.0.1:5432/postgres".into()),
            variants: vec!["accept-stale-result".into()],
            control_planes: 3,
            ..RunConfig::default()
        };
        assert_eq!(validate(&parse(&config.args()), 0).unwrap(), config);
        assert_eq!(validate(&RunArgs::from(&config), 0).unwrap(), config);
        let command = config.command();
        let words: Vec<String> = command.split(' ').skip(2).map(str::to_string).collect();
        assert_eq!(words, config.args(), "the printed command is the arguments");
    }

    #[test]
    fn config_json_is_read_back_through_its_type() {
        let file = ConfigFile {
            run: RunConfig::default(),
            clock_control: crate::system::ClockControl::RunnerOffset,
            system: crate::system::SystemInfo { name: "lab".into(), ..Default::default() },
            healthy_ms: Some(12),
            scenario: None,
        };
        let text = serde_json::to_string(&file).unwrap();
        assert_eq!(serde_json::from_str::<ConfigFile>(&text).unwrap(), file);
        let unknown = text.replacen('{', "{\"seeed\":1,", 1);
        assert!(serde_json::from_str::<ConfigFile>(&unknown).is_err(), "an unknown field is refused");
        let missing = text.replacen("\"seed\"", "\"seeed\"", 1);
        assert!(serde_json::from_str::<ConfigFile>(&missing).is_err(), "a missing field is refused");
    }
}
