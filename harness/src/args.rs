//! The flags of `fencelab run` and how they become a validated `RunConfig` (ripgrep's
//! `lowargs` → `hiargs`): [`RunArgs`] holds what the user typed; [`RunArgs::config`] parses
//! its words (faults, bugs, a schedule file), derives the timings a lease implies, and has
//! the result checked by `RunConfig::validate`, which the rest of fencelab takes.

use std::path::PathBuf;

use clap::Args;
use history::TargetMode as Mode;
use lab::bugs::Bug;
use runfolder::config::{Db, RunConfig};

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
    /// Runner processes, 1..=512, each with its two links through proxies of their own.
    #[arg(long, default_value_t = defaults().runners)]
    pub runners: u32,
    /// Distinct deployment keys the jobs spread over.
    #[arg(long, default_value_t = defaults().keys)]
    pub keys: u32,
    /// Jobs submitted per second, on average.
    #[arg(long = "rate", default_value_t = defaults().rate_per_s)]
    pub rate_per_s: f64,
    /// Faults: `all`, or a comma-separated list of names (see `--help`), or `none`.
    #[arg(long, default_value = workloads::faults::EVERY_FAULT)]
    pub nemesis: String,
    /// Planted bugs to switch on in the lab (repeatable).
    #[arg(long = "bug")]
    pub bugs: Vec<String>,
    /// `fenced`, `idempotent` or `unfenced`.
    #[arg(long, default_value_t = defaults().target_mode)]
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
    /// throwaway cluster started for the run, or `--database-url`). Default: the one store
    /// the system file declares, if it declares one `[db.*]` table; else `sqlite`.
    #[arg(long, value_parser = parse_db)]
    pub db: Option<Db>,
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
    /// End the workload and faults at the first anomaly the live records show (a rule
    /// broken by what the ledger, the target's steps or a runner's log already hold), then
    /// check the whole history without recovering: the verdict is the same, the run shorter.
    #[arg(long)]
    pub stop_at_first: bool,
}

/// A store's name (`sqlite`, `postgres`) as a flag's value.
pub fn parse_db(word: &str) -> Result<Db, String> {
    word.parse()
}

impl RunArgs {
    /// The configuration these flags give, validated; `seed_default` is the seed when none
    /// is given. Every error names the flag.
    pub fn config(&self, seed_default: u64) -> Result<RunConfig, String> {
        let db = system::SystemFile::store_of(self.system.as_deref(), self.db)
            .map_err(|error| format!("--system {error}"))?;
        let bugs = self
            .bugs
            .iter()
            .map(|bug| bug.parse::<Bug>().map_err(|error| format!("--bug: {error}")))
            .collect::<Result<Vec<Bug>, String>>()?;
        let schedule = match &self.schedule {
            Some(path) => Some(read_schedule(path)?),
            None => None,
        };
        RunConfig {
            test_name: self.test_name.clone(),
            seed: self.seed.unwrap_or(seed_default),
            time_limit_ms: self.time_limit_s.saturating_mul(1_000),
            recovery_limit_ms: self.recovery_limit_s.saturating_mul(1_000),
            runners: self.runners,
            keys: self.keys,
            rate_per_s: self.rate_per_s,
            bugs,
            target_mode: self.target_mode,
            steps_min: self.steps_min,
            steps_max: self.steps_max,
            step_ms_min: self.step_ms_min,
            step_ms_max: self.step_ms_max,
            toxiproxy_url: self.toxiproxy_url.clone(),
            toxiproxy_image: self.toxiproxy_image.clone(),
            store: self.store.clone(),
            schedule,
            db,
            database_url: self.database_url.clone(),
            system: self.system.clone(),
            variants: self.variants.clone(),
            control_planes: self.control_planes,
            stop_at_first: self.stop_at_first,
            ..RunConfig::default()
        }
        .with_lease(self.lease_ms, self.heartbeat_interval_ms, self.reconcile_after_ms)
        .with_nemesis(&self.nemesis)
        .and_then(RunConfig::validate)
        .map_err(|error| error.to_string())
    }
}

/// A suite's `[[run]]` as the configuration of its runs (seed 0: each entry sets its own):
/// its `args`, further `fencelab run` flags, read by this parser, so that they mean what
/// they mean to `fencelab run`; then its own fields. A flag its fields always set
/// (`--test-name`, `--seed`, `--time-limit`, `--nemesis`, `--store`; `--system` when it
/// names one) is refused in `args`; its bugs and variants come before those of `args`.
pub fn suite_config(run: &campaign::suite::SuiteRun) -> Result<RunConfig, String> {
    use clap::{Args, FromArgMatches};
    let command = RunArgs::augment_args(clap::Command::new("run").no_binary_name(true).allow_negative_numbers(true));
    let said = |error: clap::Error| {
        let text = error.to_string();
        format!("args: {}", text.lines().next().unwrap_or_default().trim_start_matches("error: "))
    };
    let long = |id: &str| command.get_arguments().find(|arg| arg.get_id() == id).and_then(|arg| arg.get_long());
    let owned = [
        ("test_name", "name"),
        ("seed", "seeds"),
        ("time_limit_s", "time_limit"),
        ("nemesis", "nemesis"),
        ("store", "the suite's --out"),
        ("system", "system"),
    ];
    let owned: Vec<(&str, String, &str)> = owned
        .into_iter()
        .filter(|(id, _)| *id != "system" || run.system.is_some())
        .map(|(id, field)| (id, format!("--{}", long(id).unwrap_or(id)), field))
        .collect();
    let matches = command.clone().try_get_matches_from(&run.args).map_err(said)?;
    for (id, flag, field) in owned {
        if matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
            return Err(format!("args: {flag} is set by the run's own `{field}`"));
        }
    }
    let mut flags = RunArgs::from_arg_matches(&matches).map_err(said)?;
    flags.test_name = run.name.clone();
    flags.time_limit_s = run.time_limit.unwrap_or(flags.time_limit_s);
    flags.nemesis = run.nemesis.clone().unwrap_or(flags.nemesis);
    flags.bugs = run.bugs.iter().map(|bug| bug.name().to_string()).chain(flags.bugs).collect();
    flags.system = run.system.clone().or(flags.system);
    flags.variants = run.variants.iter().cloned().chain(flags.variants).collect();
    flags.config(0)
}

fn read_schedule(path: &std::path::Path) -> Result<Vec<workloads::faults::Fault>, String> {
    runfolder::folder::read_schedule(path).map_err(|error| format!("--schedule {error}"))
}

/// The flags of `fencelab conform`.
#[derive(clap::Args, Clone, Debug)]
pub struct ConformArgs {
    /// The system file (contract `fencelab.system/1`, like `systems/lab.toml`); default: the
    /// built-in lab.
    #[arg(long)]
    pub system: Option<PathBuf>,
    /// Switch on a variant of the system file (repeatable).
    #[arg(long = "variant")]
    pub variants: Vec<String>,
    /// The lease the control plane is started with (`{lease_ms}`), 100..=10000 ms: short, so
    /// that the cases that wait for a lease to lapse are quick.
    #[arg(long, default_value_t = 1_000)]
    pub lease_ms: u64,
    /// The control plane's store: `sqlite` (a file in `--out`) or `postgres` (a throwaway
    /// cluster, or `--database-url`, with a schema of the session's own). Default: the one
    /// store the system file declares, if it declares one `[db.*]` table; else `sqlite`.
    #[arg(long, value_parser = crate::args::parse_db)]
    pub db: Option<Db>,
    /// An existing PostgreSQL server (with `--db postgres`).
    #[arg(long)]
    pub database_url: Option<String>,
    /// Where conform.json, junit.xml and the system's files go: a folder that is new or
    /// empty (default: a new folder `<store>/conform/<system>-<time>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The store folder, as every other command takes it: each session gets a new folder
    /// `conform/<system>-<time>` in it.
    #[arg(long, conflicts_with = "out", default_value_os_t = defaults().store)]
    pub store: PathBuf,
}

impl ConformArgs {
    /// The session these flags ask for; the error names the flag.
    pub fn options(&self) -> Result<conform::Options, String> {
        let db = system::SystemFile::store_of(self.system.as_deref(), self.db)
            .map_err(|error| format!("--system {error}"))?;
        Ok(conform::Options {
            system: self.system.clone(),
            variants: self.variants.clone(),
            lease_ms: self.lease_ms,
            db,
            database_url: self.database_url.clone(),
            out: self.out.clone(),
            store: Some(self.store.clone()),
        })
    }
}

/// The flags of `fencelab matrix`.
#[derive(clap::Args, Clone, Debug)]
pub struct MatrixArgs {
    /// Seeds per planted bug.
    #[arg(long, default_value_t = 10)]
    pub seeds: u64,
    /// Seeds for the correct lab under every fault.
    #[arg(long, default_value_t = 20)]
    pub correct_seeds: u64,
    /// Seconds of each run.
    #[arg(long, default_value_t = 30)]
    pub time_limit: u64,
    /// The first seed; run i uses seed `first_seed + i`.
    #[arg(long, default_value_t = 1)]
    pub first_seed: u64,
    /// Runs at once.
    #[arg(long, default_value_t = 3)]
    pub parallel: usize,
    /// Run every bug under these faults (e.g. `all`, the default run's) instead of the
    /// faults chosen to expose it.
    #[arg(long)]
    pub nemesis: Option<String>,
    /// Only these bugs (repeatable; default: every bug).
    #[arg(long = "bug")]
    pub bugs: Vec<lab::bugs::Bug>,
    /// The system under test (a system file, `docs/system.md`); its variants are the rows,
    /// each run under its `nemesis` (or `--nemesis`, or every fault). Default: the lab.
    #[arg(long)]
    pub system: Option<PathBuf>,
    /// With `--system`: only these variants (repeatable; default: every variant).
    #[arg(long = "variant")]
    pub variants: Vec<String>,
    /// The control plane's store for every run; a variant that needs another store (its
    /// `db` in the system file) is left out, and the table says so. Default: the one store
    /// the system file declares, if it declares one `[db.*]` table; else `sqlite`.
    #[arg(long, value_parser = crate::args::parse_db)]
    pub db: Option<system::Db>,
    /// Replicas of the control plane in every run.
    #[arg(long, default_value_t = 1)]
    pub control_planes: u32,
    /// Where the runs and `matrix.json` go.
    #[arg(long, default_value = "store/matrix")]
    pub store: PathBuf,
    /// Every run ends its workload and faults at the first anomaly the live records show
    /// (`fencelab run --stop-at-first`): the same table, sooner.
    #[arg(long)]
    pub stop_at_first: bool,
}

impl MatrixArgs {
    /// The matrix these flags ask for; the error names the flag.
    pub fn options(&self) -> Result<campaign::matrix::Options, String> {
        let db = system::SystemFile::store_of(self.system.as_deref(), self.db)
            .map_err(|error| format!("--system {error}"))?;
        Ok(campaign::matrix::Options {
            seeds: self.seeds,
            correct_seeds: self.correct_seeds,
            time_limit: self.time_limit,
            first_seed: self.first_seed,
            parallel: self.parallel,
            nemesis: self.nemesis.clone(),
            bugs: self.bugs.clone(),
            system: self.system.clone(),
            variants: self.variants.clone(),
            db,
            control_planes: self.control_planes,
            store: self.store.clone(),
            stop_at_first: self.stop_at_first,
        })
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

    /// The flags of a `fencelab run` command's words (`run` first, in the place of the
    /// program's name).
    fn parse(words: &[String]) -> RunArgs {
        Wrapper::try_parse_from(words).expect("the command parses").run
    }

    #[test]
    fn the_default_is_what_no_flag_gives() {
        let config = parse(&["run".to_string()]).config(0).unwrap();
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
            nemesis: vec![workloads::faults::FaultKind::Kill, workloads::faults::FaultKind::ClockSkew],
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
            store: PathBuf::from("elsewhere"),
            ..RunConfig::default()
        };
        let words = config.command_words(Some(&config.store), None);
        assert_eq!(parse(&words).config(0).unwrap(), config);
        let command = runfolder::folder::RunFolder::at("unused").repeat_command(&config);
        assert_eq!(command, format!("fencelab {}", words.join(" ")), "the printed command is the words");
    }

    fn words(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| word.to_string()).collect()
    }

    #[test]
    fn a_suite_run_means_what_its_flags_mean_to_fencelab_run() {
        let text = "name = \"a\"\nseeds = [1]\nnemesis = \"all\"\nbugs = [\"accept-stale-result\"]\n\
                    args = [\"--target-mode\", \"idempotent\", \"--control-planes\", \"2\", \"--bug\", \"unscoped-fence\"]";
        let run: campaign::suite::SuiteRun = toml::from_str(text).unwrap();
        let config = suite_config(&run).unwrap();
        let expected = RunConfig {
            test_name: "a".into(),
            bugs: vec![Bug::AcceptStaleResult, Bug::UnscopedFence],
            target_mode: Mode::Idempotent,
            control_planes: 2,
            ..RunConfig::default()
        };
        assert_eq!(config, expected.with_nemesis("all").unwrap().validate().unwrap());
        assert!(config.nemesis.contains(&workloads::faults::FaultKind::KillReplica), "`all` on two replicas");
        let owned = campaign::suite::SuiteRun { args: words(&["--seed", "3"]), ..run.clone() };
        assert_eq!(suite_config(&owned).unwrap_err(), "args: --seed is set by the run's own `seeds`");
        let unknown = campaign::suite::SuiteRun { args: words(&["--colour", "red"]), ..run };
        assert!(suite_config(&unknown).unwrap_err().contains("--colour"));
    }

    #[test]
    fn every_shipped_suite_reads_and_fits_its_budget() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../suites");
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let suite = campaign::suite::read(&entry.path(), suite_config).unwrap_or_else(|error| panic!("{error}"));
            // An entry is budgeted at twice its time limit (start, recovery and checking).
            let plan = campaign::suite::plan(&suite, None);
            let planned_s: u64 = plan.iter().map(|(_, run, _)| 2 * run.config.time_limit_ms / 1_000).sum();
            let wall_s = planned_s / suite.parallel.max(1) as u64;
            assert!(
                wall_s <= suite.time_budget_s,
                "{}: {wall_s} s planned, {} s budget",
                suite.name,
                suite.time_budget_s
            );
            read += 1;
        }
        assert!(read >= 1);
    }

    #[test]
    fn a_store_is_named_as_the_flag_says() {
        assert_eq!(parse_db("postgres"), Ok(Db::Postgres));
        assert!(parse_db("mysql").unwrap_err().contains("`mysql`"));
    }
}

/// The flags of `fencelab audit`.
#[derive(clap::Args, Clone, Debug)]
pub struct AuditArgs {
    /// The control plane to audit (`http://host:port`), read directly, not through a proxy.
    #[arg(long)]
    pub url: String,
    /// The operator's bearer token.
    #[arg(long, env = "FENCELAB_OPERATOR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A system file (`docs/system.md`) to take the operator token from, and to refuse a
    /// system that keeps no ledger.
    #[arg(long)]
    pub system: Option<PathBuf>,
    /// The audit's folder: created, or resumed from its `cursor.json`.
    #[arg(long)]
    pub out: PathBuf,
    /// The control plane's lease policy, for the rules that judge a granted lease against it.
    #[arg(long)]
    pub lease_ms: Option<u64>,
    /// Entries asked for per page (1..=10000).
    #[arg(long, default_value_t = 1_000)]
    pub page_entries: u64,
    /// Most pages this audit reads; past it the audit is incomplete (unknown) and resumable.
    #[arg(long, default_value_t = 100_000)]
    pub pages_max: u64,
    /// Seconds the whole audit may take, `--follow` included.
    #[arg(long = "time-limit", default_value_t = 600)]
    pub time_limit_s: u64,
    /// Keep auditing new entries, in rounds, until interrupted or the time limit.
    #[arg(long)]
    pub follow: bool,
    /// With `--follow`: the wait between rounds once the ledger's end is reached.
    #[arg(long, default_value_t = 1_000)]
    pub interval_ms: u64,
    /// With `--follow`: check a round at least every N new entries, also while catching up.
    #[arg(long, default_value_t = 20_000)]
    pub round_entries: usize,
    /// The longest wait for one answer of the control plane.
    #[arg(long, default_value_t = 10_000)]
    pub request_timeout_ms: u64,
}

impl AuditArgs {
    /// The audit's options: the token from `--token` (or its variable), else from `--system`.
    pub fn options(&self) -> Result<verdict::audit::Options, String> {
        let file =
            self.system.as_deref().map(system::SystemFile::read).transpose().map_err(|error| error.to_string())?;
        if let Some(file) = &file {
            if file.provides.absent().contains(&system::Feature::Ledger) {
                return Err(format!(
                    "--system {}: the system keeps no ledger: there is nothing to audit",
                    file.path.display()
                ));
            }
        }
        let token = match (&self.token, &file) {
            (Some(token), _) => token.clone(),
            (None, Some(file)) => file.operator_token.clone(),
            (None, None) => return Err("give the operator token: --token, FENCELAB_OPERATOR_TOKEN or --system".into()),
        };
        if self.request_timeout_ms == 0 {
            return Err("--request-timeout-ms 0: a request needs time to be answered".into());
        }
        let mut command = format!("fencelab audit --url {} --out {}", self.url, self.out.display());
        if let Some(system) = &self.system {
            command.push_str(&format!(" --system {}", system.display()));
        }
        if let Some(lease_ms) = self.lease_ms {
            command.push_str(&format!(" --lease-ms {lease_ms}"));
        }
        if self.follow {
            command.push_str(&format!(" --follow --interval-ms {}", self.interval_ms));
        }
        Ok(verdict::audit::Options {
            url: self.url.trim_end_matches('/').to_string(),
            token,
            out: self.out.clone(),
            lease_ms: self.lease_ms,
            page_entries: self.page_entries,
            pages_max: self.pages_max,
            time_limit: std::time::Duration::from_secs(self.time_limit_s),
            follow: self.follow.then(|| std::time::Duration::from_millis(self.interval_ms)),
            round_entries: self.round_entries,
            request_timeout: std::time::Duration::from_millis(self.request_timeout_ms),
            command,
        })
    }
}
