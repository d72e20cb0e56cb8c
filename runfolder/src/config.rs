//! A run's validated configuration: `RunConfig` is what was checked (timings consistent,
//! names known) and is what the rest of a run takes; what the user typed is the command
//! line's (`harness`), which builds a `RunConfig` and has it [`RunConfig::validate`]d.

use std::path::{Path, PathBuf};

use history::TargetMode as Mode;
use lab::bugs::Bug;
use serde::{Deserialize, Serialize};
use workloads::faults::{FaultKind, EVERY_FAULT, NO_FAULT};

/// Most runners one run starts (each a process with two proxied links).
pub const RUNNERS_MAX: u32 = 512;

pub use system::Db;

/// A configuration that cannot run: what is wrong, named by the flag that sets it. Nothing
/// was started.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl From<String> for ConfigError {
    fn from(message: String) -> ConfigError {
        ConfigError(message)
    }
}

impl From<&str> for ConfigError {
    fn from(message: &str) -> ConfigError {
        ConfigError(message.to_string())
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
    /// End the chaos phase at the first anomaly the live records show (`--stop-at-first`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop_at_first: bool,
    pub version: String,
}

/// A `fencelab` command as one line: its words after `fencelab`, joined by spaces.
pub fn command_line(words: &[String]) -> String {
    format!("fencelab {}", words.join(" "))
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
            // The lease and the timings it implies are set by `with_lease` below.
            lease_ms: 0,
            heartbeat_interval_ms: 0,
            reconcile_after_ms: 0,
            renewal_margin_ms: 0,
            request_timeout_ms: 0,
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
            stop_at_first: false,
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
        .with_lease(1_000, None, None)
    }
}

/// What `config.json` holds: the run's configuration, how runner clocks were moved, how
/// long the cluster took to become healthy, and the scenario a scenario run played. Written
/// and read through `crate::folder::RunFolder`, which also reads the older, flat shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub run: RunConfig,
    pub clock_control: system::ClockControl,
    /// The system attacked, and what of the run it could not take.
    pub system: system::SystemInfo,
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

impl RunConfig {
    /// Sets the lease and the timings derived from it: heartbeats every quarter of the
    /// lease and a reconcile after one lease unless given, a renewal margin of a fifth,
    /// requests timing out after two leases (a heartbeat delayed in the network still
    /// arrives, late).
    pub fn with_lease(
        mut self,
        lease_ms: u64,
        heartbeat_interval_ms: Option<u64>,
        reconcile_after_ms: Option<u64>,
    ) -> RunConfig {
        self.lease_ms = lease_ms;
        self.heartbeat_interval_ms = heartbeat_interval_ms.unwrap_or(lease_ms / 4);
        self.reconcile_after_ms = reconcile_after_ms.unwrap_or(lease_ms);
        self.renewal_margin_ms = lease_ms / 5;
        self.request_timeout_ms = 2 * lease_ms;
        self
    }

    /// Sets the faults from the words `--nemesis` takes: `all` (every fault, with the
    /// replicas' when there are several control planes and the database's on PostgreSQL:
    /// `control_planes` and `db` are set first), `none`, or a comma-separated list.
    pub fn with_nemesis(mut self, words: &str) -> Result<RunConfig, ConfigError> {
        self.nemesis = match words.trim() {
            NO_FAULT => vec![],
            words => FaultKind::parse_list(words).map_err(|error| format!("--nemesis: {error}"))?,
        };
        if words.trim() == EVERY_FAULT {
            if self.control_planes > 1 {
                self.nemesis.extend(FaultKind::REPLICAS);
            }
            if self.db == Db::Postgres {
                self.nemesis.extend(FaultKind::DATABASE);
            }
        }
        Ok(self)
    }

    /// Checks a configuration built from flags or from a scenario: timings consistent,
    /// names known to the system it names; every error names the flag that sets the field.
    pub fn validate(self) -> Result<RunConfig, ConfigError> {
        if let Some(kind) =
            self.nemesis.iter().find(|kind| self.control_planes < 2 && FaultKind::REPLICAS.contains(kind))
        {
            return Err(format!("--nemesis {}: needs --control-planes 2 or more", kind.name()).into());
        }
        let (time_limit_s, recovery_limit_s) = (self.time_limit_ms / 1_000, self.recovery_limit_ms / 1_000);
        let checks = [
            (time_limit_s == 0 || time_limit_s > 86_400, "--time-limit must be 1..=86400 seconds"),
            (self.runners == 0 || self.runners > RUNNERS_MAX, "--runners must be 1..=512"),
            (self.keys == 0 || self.keys > 10_000, "--keys must be 1..=10000"),
            (!(self.rate_per_s > 0.0 && self.rate_per_s <= 1_000.0), "--rate must be above 0 and at most 1000 jobs/s"),
            (self.lease_ms < 100 || self.lease_ms > 600_000, "--lease-ms must be 100..=600000"),
            (
                self.heartbeat_interval_ms == 0 || self.heartbeat_interval_ms >= self.lease_ms,
                "--heartbeat-interval-ms must be above 0 and below --lease-ms",
            ),
            (
                self.steps_min == 0 || self.steps_min > self.steps_max || self.steps_max > 1_000,
                "--steps-min/--steps-max must satisfy 1 <= min <= max <= 1000",
            ),
            (
                self.step_ms_min > self.step_ms_max || self.step_ms_max > 600_000,
                "--step-ms-min must not exceed --step-ms-max (at most 600000)",
            ),
            (recovery_limit_s == 0 || recovery_limit_s > 3_600, "--recovery-limit must be 1..=3600 seconds"),
            (self.control_planes == 0 || self.control_planes > 9, "--control-planes must be 1..=9"),
        ];
        if let Some((_, message)) = checks.iter().find(|(bad, _)| *bad) {
            return Err((*message).into());
        }
        if let Some(image) = &self.toxiproxy_image {
            system::container::ImageName::parse(image).map_err(|why| format!("--toxiproxy-image: {why}"))?;
        }
        if self.database_url.is_some() && self.db != Db::Postgres {
            return Err("--database-url needs --db postgres".into());
        }
        let bugs: Vec<String> = self.bugs.iter().map(|bug| bug.name().to_string()).collect();
        let system = match &self.system {
            Some(path) => {
                let file = system::SystemFile::read(path).map_err(|error| format!("--system {error}"))?;
                file.check_variants(&self.variants).map_err(|error| format!("--variant: {error}"))?;
                file.db_args(self.db).map_err(|error| format!("--db: {error}"))?;
                file.check_variants_db(&self.variants, self.db).map_err(|error| format!("--variant: {error}"))?;
                if !bugs.is_empty() && file.name != "lab" {
                    file.check_variants(&bugs).map_err(|error| format!("--bug: {error}"))?;
                }
                file.check_variants_db(&bugs, self.db).map_err(|error| format!("--bug: {error}"))?;
                Some(file.path)
            }
            None => {
                let lab = system::SystemFile::lab();
                lab.check_variants(&self.variants).map_err(|error| format!("--variant: {error}"))?;
                lab.check_variants_db(&self.variants, self.db).map_err(|error| format!("--variant: {error}"))?;
                lab.check_variants_db(&bugs, self.db).map_err(|error| format!("--bug: {error}"))?;
                None
            }
        };
        let name_ok = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if self.test_name.is_empty() || !self.test_name.chars().all(name_ok) {
            return Err("--test-name must be letters, digits, `-`, `_` or `.`".into());
        }
        Ok(RunConfig { system, ..self })
    }
    /// The fault schedule of this run: the given one, or the one the seed generates.
    pub fn fault_schedule(&self) -> Vec<workloads::faults::Fault> {
        self.fault_schedule_without(&[])
    }

    /// The fault schedule without the faults of `not_run` (kinds the system cannot take,
    /// or single variants of a kind, named).
    pub fn fault_schedule_without(&self, not_run: &[system::NotRun]) -> Vec<workloads::faults::Fault> {
        let kind_out = |kind: &FaultKind| not_run.iter().any(|not| not.fault == *kind && not.variant.is_none());
        let variants_out: Vec<String> = not_run.iter().filter_map(|not| not.variant.clone()).collect();
        match &self.schedule {
            Some(schedule) => schedule
                .iter()
                .filter(|fault| !kind_out(&fault.kind) && !variants_out.iter().any(|name| name == fault.variant.name()))
                .cloned()
                .collect(),
            None => {
                let mut options = self.schedule_options();
                options.kinds.retain(|kind| !kind_out(kind));
                options.without = variants_out;
                workloads::faults::schedule(self.seed, &options)
            }
        }
    }

    /// The words of the `fencelab run` command that gives this configuration back, after
    /// `fencelab` (`run` first): **the one writer of that command line**, built from the
    /// fields, for the command a run prints and for every child a campaign starts. Where
    /// the run's folder goes and the file its fault schedule is read from are the caller's:
    /// `--store` is written when `store` is given, `--schedule` when `schedule` is.
    pub fn command_words(&self, store: Option<&Path>, schedule: Option<&Path>) -> Vec<String> {
        let mut words = vec!["run".to_string()];
        words.extend(self.flags());
        if let Some(store) = store {
            words.extend(["--store".to_string(), store.display().to_string()]);
        }
        if let Some(schedule) = schedule {
            words.extend(["--schedule".to_string(), schedule.display().to_string()]);
        }
        words
    }

    /// The faults as `--nemesis` names them: `none`, or the list.
    pub fn nemesis_words(&self) -> String {
        let nemesis: Vec<&str> = self.nemesis.iter().map(|kind| kind.name()).collect();
        if nemesis.is_empty() {
            NO_FAULT.to_string()
        } else {
            nemesis.join(",")
        }
    }

    /// The flags of every field but the store and the schedule, in the order the printed
    /// command has always had.
    fn flags(&self) -> Vec<String> {
        let nemesis = self.nemesis_words();
        let mut args: Vec<String> = [
            ("--test-name", self.test_name.clone()),
            ("--seed", self.seed.to_string()),
            ("--time-limit", (self.time_limit_ms / 1_000).to_string()),
            ("--runners", self.runners.to_string()),
            ("--keys", self.keys.to_string()),
            ("--rate", self.rate_per_s.to_string()),
            ("--nemesis", nemesis),
            ("--target-mode", self.target_mode.to_string()),
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
        // With a system file the store is always named: without `--db` it is the file's
        // one store, and the file may have changed by the time the command is repeated.
        if self.db != Db::Sqlite || self.system.is_some() {
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
        if self.stop_at_first {
            args.push("--stop-at-first".to_string());
        }
        args
    }

    /// The command that repeats this run: with its store when it is not the default, and
    /// `schedule` (the run folder's copy, [`crate::folder::RunFolder::repeat_command`]) when it
    /// was given one.
    pub fn command_with(&self, schedule: &Path) -> String {
        let store = (self.store != RunConfig::default().store).then_some(self.store.as_path());
        command_line(&self.command_words(store, self.schedule.is_some().then_some(schedule)))
    }

    /// Whether the planned jobs can drain: each deployment key runs one attempt at a time
    /// and each runner one, so at most `min(keys, runners)` attempts of the mean length run
    /// at once. When the rate asks for more, a warning that names the numbers and how long
    /// recovery would need to drain the backlog.
    pub fn backlog_warning(&self) -> Option<String> {
        let steps = f64::from(self.steps_min + self.steps_max) / 2.0;
        let attempt_s = steps * (self.step_ms_min + self.step_ms_max) as f64 / 2.0 / 1_000.0;
        let lanes = self.keys.min(self.runners) as f64;
        let servable_per_s = lanes / attempt_s.max(0.001);
        if self.rate_per_s <= servable_per_s {
            return None;
        }
        let time_limit_s = self.time_limit_ms as f64 / 1_000.0;
        let backlog = (self.rate_per_s - servable_per_s) * time_limit_s;
        let drain_s = backlog / servable_per_s;
        Some(format!(
            "backlog: {} jobs/s over {} keys and {} runners exceeds what they can serve (about {servable_per_s:.1} jobs/s \
             for attempts of about {attempt_s:.1} s); about {backlog:.0} jobs will wait at the time limit, and draining \
             them needs about {drain_s:.0} s of recovery (--recovery-limit is {} s): expect an incomplete, unknown run",
            self.rate_per_s,
            self.keys,
            self.runners,
            self.recovery_limit_ms / 1_000
        ))
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
            without: vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_to_512_runners_are_taken_and_more_refused_by_name() {
        let many = RunConfig { runners: RUNNERS_MAX, keys: 512, ..RunConfig::default() };
        assert!(many.validate().is_ok());
        let too_many = RunConfig { runners: RUNNERS_MAX + 1, ..RunConfig::default() };
        assert_eq!(too_many.validate().unwrap_err().to_string(), "--runners must be 1..=512");
    }

    #[test]
    fn a_plan_that_cannot_drain_is_warned_about_and_one_that_can_is_not() {
        assert_eq!(RunConfig::default().backlog_warning(), None, "the default run drains");
        let crowded = RunConfig { runners: 64, keys: 32, rate_per_s: 50.0, ..RunConfig::default() };
        let warning = crowded.backlog_warning().expect("50 jobs/s over 32 keys cannot drain");
        assert!(warning.contains("50 jobs/s over 32 keys") && warning.contains("recovery"), "{warning}");
    }
}
