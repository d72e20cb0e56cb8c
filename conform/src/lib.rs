//! `fencelab conform`: a black-box conformance suite that any implementation of the
//! contract can run before chaos (`docs/conform.md`). It starts the system from its system
//! file — no proxies, no faults, runners played by the suite itself — and runs
//! deterministic single-step cases against the control plane and the target over HTTP:
//! every endpoint and its documented answers, the seed's rules, a table of bad input, races
//! of claims and of results, and a kill -9 after an acknowledgement; then it replays the
//! whole ledger through the rules model. Cases that need a part the system says it lacks
//! are skipped with the reason, which makes the answer unknown, never a pass.
//!
//! Phases: the bad-input table runs alone first (it compares every read before and after
//! each row); then every other case side by side, each in a project of its own; then the
//! restart, alone; then the replay.

pub mod case;
mod endpoints;
mod inputs;
mod model;
pub mod outcome;
mod races;
pub mod report;
mod restart;
mod rules;
pub mod session;
mod targets;
mod windows;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use case::{CaseResult, Def, Finding, Status};
use report::ConformDoc;
use session::Session;

use system::Db;
use system::{Launch, Role, RunningSystem, Server, StartError};

/// The shortest and longest lease conform accepts (100 ms, 10 s).
pub const LEASE_MS_MIN: u64 = 100;
pub const LEASE_MS_MAX: u64 = 10_000;
/// The timings a system's own runners would be given (`{heartbeat_interval_ms}`,
/// `{renewal_margin_ms}`, `{request_timeout_ms}`): conform plays the runners itself, so
/// these are the run's defaults for its default 1 000 ms lease, whatever `--lease-ms`.
const HEARTBEAT_INTERVAL_MS: u64 = 250;
const RENEWAL_MARGIN_MS: u64 = 200;
const REQUEST_TIMEOUT_MS: u64 = 2_000;
/// The most one case may take, its waits included (30 s).
const CASE_MAX: Duration = Duration::from_secs(30);

/// What a conformance session is asked to do (the command line's flags, checked by
/// [`prepare`]).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The system file; none: the built-in lab.
    pub system: Option<PathBuf>,
    pub variants: Vec<String>,
    /// The lease the control plane is started with, [`LEASE_MS_MIN`]..=[`LEASE_MS_MAX`].
    pub lease_ms: u64,
    pub db: Db,
    pub database_url: Option<String>,
    /// Where conform.json, junit.xml and the system's files go (none: a new folder
    /// `<store>/conform/<system>-<time>`).
    pub out: Option<PathBuf>,
    /// The store the new folder goes in when `out` is none (none: `store`), as every other
    /// command takes it.
    pub store: Option<PathBuf>,
}

impl Options {
    /// The system these arguments name.
    pub fn choice(&self) -> system::SystemChoice {
        system::SystemChoice {
            system: self.system.clone(),
            variants: self.variants.clone(),
            db: self.db,
            database_url: self.database_url.clone(),
        }
    }

    /// The command that repeats this.
    pub fn command(&self, out: &Path) -> String {
        let mut words = vec!["fencelab".to_string(), "conform".to_string()];
        if let Some(system) = &self.system {
            words.extend(["--system".to_string(), system.display().to_string()]);
        }
        for variant in &self.variants {
            words.extend(["--variant".to_string(), variant.clone()]);
        }
        if self.db != Db::Sqlite {
            words.extend(["--db".to_string(), self.db.name().to_string()]);
        }
        if let Some(url) = &self.database_url {
            words.extend(["--database-url".to_string(), url.clone()]);
        }
        words.extend([
            "--lease-ms".to_string(),
            self.lease_ms.to_string(),
            "--out".to_string(),
            out.display().to_string(),
        ]);
        words.join(" ")
    }
}

/// Every case but the bad-input table and the replay, in the order they are reported.
fn defs() -> Vec<Def> {
    let mut all = endpoints::defs();
    all.extend(rules::defs());
    all.extend(windows::defs());
    all.extend(races::defs());
    all.extend(targets::defs());
    all.extend(restart::defs());
    all
}

/// How many cases a session runs when nothing stops it early: the bad-input table's rows,
/// every other case, and the replay through the rules model. The documents state it.
pub fn case_count() -> usize {
    inputs::row_count() + defs().len() + 1
}

/// How many of them are the bad-input table's rows.
pub fn input_count() -> usize {
    inputs::row_count()
}

/// Cases that must run alone (they stop the control plane).
fn alone(def: &Def) -> bool {
    def.name.starts_with("restart/")
}

/// A conformance session ready to start: the system's launch, the output folder, the
/// command that repeats it.
pub struct Prepared {
    pub launch: Launch,
    pub out: PathBuf,
    pub command: String,
}

/// Why conformance does not apply to the system `args` names, if it does not: an observed
/// system (`docs/system.md`, "Observed systems") speaks its own protocol, not the
/// contract's, so there is no contract to check it against.
pub fn inapplicable(args: &Options) -> Result<Option<String>, StartError> {
    let file = system::SystemFile::of_choice(args.choice().system.as_deref())?;
    let absent = file.provides.absent();
    let mut why: Vec<String> = Vec::new();
    if file.runner_link == system::RunnerLink::Tcp {
        why.push("its runners speak its own protocol (`runner_link = \"tcp\"`)".into());
    }
    for feature in [system::Feature::RunnerLog, system::Feature::Lease].into_iter().filter(|f| absent.contains(f)) {
        why.push(format!("it lacks {}", feature.name()));
    }
    if why.is_empty() {
        return Ok(None);
    }
    Ok(Some(format!(
        "{}: conform does not apply to an observed system: {}; \
         `fencelab run --system` attacks it and judges what its records hold",
        file.path.display(),
        why.join(" and ")
    )))
}

/// Checks the arguments and makes the output folder; `program` is the `fencelab` binary.
/// Every error is the user's to fix ([`StartError::Named`]): nothing was started.
pub fn prepare(args: &Options, program: &Path) -> Result<Prepared, StartError> {
    if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&args.lease_ms) {
        return Err(StartError::Named(format!("--lease-ms must be {LEASE_MS_MIN}..={LEASE_MS_MAX}")));
    }
    if args.database_url.is_some() && args.db != Db::Postgres {
        return Err(StartError::Named("--database-url needs --db postgres".into()));
    }
    let choice = args.choice();
    let timings = system::Timings {
        lease_ms: args.lease_ms,
        heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS,
        renewal_margin_ms: RENEWAL_MARGIN_MS,
        request_timeout_ms: REQUEST_TIMEOUT_MS,
        target_mode: history::TargetMode::Fenced,
        replicas: 1,
        secret: format!("conform-secret-{:x}", protocol::monotonic_ns()),
        poll_ms: system::launch::poll_ms_for(1),
    };
    let mut launch = Launch::new(&choice, &timings, Path::new("."), program)?;
    let out = output_folder(args, &launch.file.name).map_err(StartError::Named)?;
    launch.dir = out.join("system");
    let command = args.command(&out);
    Ok(Prepared { launch, out, command })
}

/// Runs a prepared session — its database first, when it has one — and writes
/// `conform.json` and `junit.xml` into its folder.
pub async fn run(prepared: Prepared, args: &Options) -> Result<ConformDoc, StartError> {
    let Prepared { mut launch, out, command } = prepared;
    // A throwaway cluster lives until the session ends (dropped after it).
    let _database = system::start_database(&args.choice(), &mut launch).await?;
    let doc = execute(launch, &out, &command).await?;
    report::write(&doc, &out)
        .map_err(|error| StartError::Failed(format!("cannot write into {}: {error}", out.display())))?;
    Ok(doc)
}

fn output_folder(args: &Options, name: &str) -> Result<PathBuf, String> {
    let out = match &args.out {
        Some(out) => out.clone(),
        None => {
            let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
            let store = args.store.clone().unwrap_or_else(|| PathBuf::from("store"));
            store.join("conform").join(format!("{name}-{stamp}"))
        }
    };
    let used = std::fs::read_dir(&out).map(|mut entries| entries.next().is_some()).unwrap_or(false);
    if used {
        return Err(format!("--out {} is not empty: conform starts its system on a fresh store there", out.display()));
    }
    std::fs::create_dir_all(&out).map_err(|error| format!("--out {}: {error}", out.display()))?;
    Ok(std::path::absolute(&out).unwrap_or(out))
}

/// Whether the target's mode can be chosen: `{target_mode}` in its command or environment.
fn mode_choosable(launch: &Launch) -> bool {
    let Some(spec) = launch.file.roles.get(&Role::Target) else { return false };
    let variants = launch.variants.iter().filter_map(|name| launch.file.variants.get(name));
    let extra = variants.flat_map(|variant| variant.target.args.iter().chain(variant.target.env.values()));
    spec.command.get_ref().iter().chain(spec.env.values()).chain(extra).any(|word| word.contains("{target_mode}"))
}

/// A target of the system in each other mode, in a folder of its own.
async fn mode_targets(launch: &Launch, out: &Path) -> Result<BTreeMap<&'static str, Server>, StartError> {
    let mut targets = BTreeMap::new();
    if !mode_choosable(launch) {
        return Ok(targets);
    }
    for mode in [history::TargetMode::Idempotent, history::TargetMode::Unfenced] {
        let mut other = launch.clone();
        other.target_mode = mode;
        other.dir = out.join(format!("target-{mode}"));
        std::fs::create_dir_all(&other.dir)
            .map_err(|error| StartError::Failed(format!("{}: {error}", other.dir.display())))?;
        targets.insert(mode.as_str(), other.start_server(Role::Target, 0, 0).await?);
    }
    Ok(targets)
}

/// Starts the system, runs every case, stops it.
pub async fn execute(launch: Launch, out: &Path, command: &str) -> Result<ConformDoc, StartError> {
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339();
    let (system_path, name, variants, lease_ms) =
        (launch.file.path.display().to_string(), launch.file.name.clone(), launch.variants.clone(), launch.lease_ms);
    let targets = mode_targets(&launch, out).await?;
    let system = RunningSystem::start(launch).await?;
    let session = Arc::new(Session::new(system, targets, lease_ms));
    let cases = run_all(&session).await;
    session.stop().await;
    let counts = report::counts(&cases);
    let overall = report::overall(counts);
    Ok(ConformDoc {
        schema: report::SCHEMA.to_string(),
        system: system_path,
        name,
        variants,
        lease_ms,
        started_at,
        duration_ms: started.elapsed().as_millis() as u64,
        overall,
        exit_code: overall.exit().code(),
        counts,
        command: command.to_string(),
        cases,
    })
}

/// The phases: the bad-input table alone, every case side by side, the restart alone, the
/// replay of the ledger.
async fn run_all(session: &Arc<Session>) -> Vec<CaseResult> {
    let mut results = inputs::run(session).await;
    let defs = defs();
    let first = results.len();
    let mut tags = BTreeMap::new();
    let mut running = tokio::task::JoinSet::new();
    for (index, def) in defs.iter().enumerate() {
        let slot = first + index;
        let tag = case::tag(index);
        tags.insert(tag.clone(), slot);
        results.push(CaseResult {
            name: def.name.to_string(),
            status: Status::Skip,
            evidence: "not run".into(),
            duration_ms: 0,
        });
        if alone(def) {
            continue;
        }
        let (session, run, needs, name) = (session.clone(), def.run, def.needs, def.name);
        running.spawn(async move { (slot, one(&session, name, needs, run, tag).await) });
    }
    while let Some(joined) = running.join_next().await {
        match joined {
            Ok((slot, result)) => results[slot] = result,
            Err(error) => eprintln!("fencelab conform: a case task failed: {error}"),
        }
    }
    for (index, def) in defs.iter().enumerate().filter(|(_, def)| alone(def)) {
        results[first + index] = one(session, def.name, def.needs, def.run, case::tag(index)).await;
    }
    let replayed = if session.provides.ledger {
        model::judge(session, &mut results, &tags).await
    } else {
        let evidence = "the system file says `provides.ledger = false`: there is no ledger to replay".to_string();
        CaseResult { name: model::NAME.to_string(), status: Status::Skip, evidence, duration_ms: 0 }
    };
    results.push(replayed);
    results
}

/// Runs one case, bounded by [`CASE_MAX`]; skipped when the system lacks a part it needs.
async fn one(
    session: &Session,
    name: &'static str,
    needs: &'static [system::Feature],
    run: for<'a> fn(&'a Session, case::Case) -> case::CaseFuture<'a>,
    tag: String,
) -> CaseResult {
    let started = Instant::now();
    let missing: Vec<&str> =
        needs.iter().filter(|feature| !session.provides.has(**feature)).map(|feature| feature.name()).collect();
    let (status, evidence) = if !missing.is_empty() {
        let said: Vec<String> = missing.iter().map(|name| format!("`provides.{name} = false`")).collect();
        (Status::Skip, format!("the system file says {}", said.join(" and ")))
    } else {
        match tokio::time::timeout(CASE_MAX, run(session, case::Case { name, tag })).await {
            Ok(Ok(evidence)) => (Status::Pass, evidence),
            Ok(Err(Finding::Fail(why))) => (Status::Fail, why),
            Ok(Err(Finding::Skip(why))) => (Status::Skip, why),
            Err(_) => (Status::Fail, format!("the case did not finish within {} s", CASE_MAX.as_secs())),
        }
    };
    CaseResult { name: name.to_string(), status, evidence, duration_ms: started.elapsed().as_millis() as u64 }
}
