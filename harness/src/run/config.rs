//! Flags apart from validated configuration: `RunArgs` is what the user typed, `RunConfig`
//! is what was checked (timings consistent, names known, store writable) and is what the
//! rest of a run takes.

use std::path::PathBuf;

use clap::Args;
use lab::bugs::Bug;
use lab::target::Mode;
use serde::Serialize;
use workloads::faults::FaultKind;

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// Name of the test: the run folder is `STORE/NAME/START-TIME`.
    #[arg(long, default_value = "chaos")]
    pub test_name: String,
    /// Seconds of workload and faults (recovery comes after).
    #[arg(long, default_value_t = 30)]
    pub time_limit: u64,
    /// Seed of every random choice of the run (default: taken from the clock and printed).
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long, default_value_t = 3)]
    pub runners: u32,
    /// Distinct deployment keys the jobs spread over.
    #[arg(long, default_value_t = 4)]
    pub keys: u32,
    /// Jobs submitted per second, on average.
    #[arg(long, default_value_t = 2.0)]
    pub rate: f64,
    /// Faults: `all`, or a comma-separated list of names (see `--help`), or `none`.
    #[arg(long, default_value = "all")]
    pub nemesis: String,
    /// Planted bugs to switch on in the lab (repeatable).
    #[arg(long = "bug")]
    pub bugs: Vec<String>,
    #[arg(long, value_enum, default_value = "fenced")]
    pub target_mode: Mode,
    #[arg(long, default_value_t = 1_000)]
    pub lease_ms: u64,
    /// Default: a quarter of the lease.
    #[arg(long)]
    pub heartbeat_interval_ms: Option<u64>,
    #[arg(long, default_value_t = 3)]
    pub steps_min: u32,
    #[arg(long, default_value_t = 6)]
    pub steps_max: u32,
    #[arg(long, default_value_t = 100)]
    pub step_ms_min: u64,
    #[arg(long, default_value_t = 300)]
    pub step_ms_max: u64,
    /// How long the operator lets an attempt stay uncertain before it reconciles it
    /// (default: one lease).
    #[arg(long)]
    pub reconcile_after_ms: Option<u64>,
    /// Longest recovery phase, in seconds (faults healed, the operator reconciles, jobs settle).
    #[arg(long, default_value_t = 30)]
    pub recovery_limit: u64,
    /// Drive a real Toxiproxy at this URL instead of starting the embedded one.
    #[arg(long)]
    pub toxiproxy_url: Option<String>,
    /// Where run folders go.
    #[arg(long, default_value = "store")]
    pub store: PathBuf,
    /// Execute this fault schedule (a run folder's `schedule.json`) instead of generating one.
    #[arg(long)]
    pub schedule: Option<PathBuf>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunConfig {
    pub test_name: String,
    pub seed: u64,
    pub time_limit_ms: u64,
    pub recovery_limit_ms: u64,
    pub runners: u32,
    pub keys: u32,
    pub rate_per_s: f64,
    pub nemesis: Vec<FaultKind>,
    pub bugs: Vec<String>,
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
    pub store: PathBuf,
    /// A given fault schedule, replacing the generated one.
    pub schedule: Option<Vec<workloads::faults::Fault>>,
    pub version: String,
}

impl RunConfig {
    pub fn bug_values(&self) -> Vec<Bug> {
        self.bugs.iter().filter_map(|name| name.parse().ok()).collect()
    }
}

/// Checks the flags; every error names the flag.
pub fn validate(args: &RunArgs, seed_default: u64) -> Result<RunConfig, String> {
    let nemesis = if args.nemesis.trim() == "none" {
        vec![]
    } else {
        FaultKind::parse_list(&args.nemesis).map_err(|error| format!("--nemesis: {error}"))?
    };
    for bug in &args.bugs {
        bug.parse::<Bug>().map_err(|error| format!("--bug: {error}"))?;
    }
    let heartbeat_interval_ms = args.heartbeat_interval_ms.unwrap_or(args.lease_ms / 4);
    let checks = [
        (args.time_limit == 0 || args.time_limit > 86_400, "--time-limit must be 1..=86400 seconds"),
        (args.runners == 0 || args.runners > 64, "--runners must be 1..=64"),
        (args.keys == 0 || args.keys > 10_000, "--keys must be 1..=10000"),
        (!(args.rate > 0.0 && args.rate <= 1_000.0), "--rate must be above 0 and at most 1000 jobs/s"),
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
        (args.recovery_limit == 0 || args.recovery_limit > 3_600, "--recovery-limit must be 1..=3600 seconds"),
    ];
    if let Some((_, message)) = checks.iter().find(|(bad, _)| *bad) {
        return Err(message.to_string());
    }
    let schedule = match &args.schedule {
        Some(path) => Some(read_schedule(path)?),
        None => None,
    };
    if args.test_name.is_empty() || !args.test_name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err("--test-name must be letters, digits, `-`, `_` or `.`".into());
    }
    Ok(RunConfig {
        test_name: args.test_name.clone(),
        seed: args.seed.unwrap_or(seed_default),
        time_limit_ms: args.time_limit * 1_000,
        recovery_limit_ms: args.recovery_limit * 1_000,
        runners: args.runners,
        keys: args.keys,
        rate_per_s: args.rate,
        nemesis,
        bugs: args.bugs.clone(),
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
        store: args.store.clone(),
        schedule,
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
        match &self.schedule {
            Some(schedule) => schedule.clone(),
            None => workloads::faults::schedule(self.seed, &self.schedule_options()),
        }
    }

    /// The command that repeats this run.
    pub fn command(&self) -> String {
        let nemesis: Vec<&str> = self.nemesis.iter().map(|kind| kind.name()).collect();
        let nemesis = if nemesis.is_empty() { "none".to_string() } else { nemesis.join(",") };
        let mut command = format!(
            "fencelab run --test-name {} --seed {} --time-limit {} --runners {} --keys {} --rate {} --nemesis {} --target-mode {} --lease-ms {} --heartbeat-interval-ms {} --reconcile-after-ms {} --steps-min {} --steps-max {} --step-ms-min {} --step-ms-max {} --recovery-limit {}",
            self.test_name, self.seed, self.time_limit_ms / 1_000, self.runners, self.keys, self.rate_per_s, nemesis,
            serde_json::to_value(self.target_mode).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
            self.lease_ms, self.heartbeat_interval_ms, self.reconcile_after_ms, self.steps_min, self.steps_max, self.step_ms_min, self.step_ms_max,
            self.recovery_limit_ms / 1_000,
        );
        for bug in &self.bugs {
            command.push_str(&format!(" --bug {bug}"));
        }
        command
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
        }
    }
}
