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
mod races;
pub mod report;
mod restart;
mod rules;
pub mod session;
mod targets;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use case::{CaseResult, Def, Finding, Status};
use report::ConformDoc;
use session::Session;

use crate::exit::Exit;
use crate::run::config::{Db, RunConfig};
use crate::system::{Launch, Role, RunningSystem, Server, StartError};

/// The shortest and longest lease conform accepts (100 ms, 10 s).
pub const LEASE_MS_MIN: u64 = 100;
pub const LEASE_MS_MAX: u64 = 10_000;
/// The most one case may take, its waits included (30 s).
const CASE_MAX: Duration = Duration::from_secs(30);

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
    /// cluster, or `--database-url`, with a schema of the session's own).
    #[arg(long, value_enum, default_value_t = Db::Sqlite)]
    pub db: Db,
    /// An existing PostgreSQL server (with `--db postgres`).
    #[arg(long)]
    pub database_url: Option<String>,
    /// Where conform.json, junit.xml and the system's files go (default: a new folder
    /// `store/conform/<system>-<time>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl ConformArgs {
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
    all.extend(races::defs());
    all.extend(targets::defs());
    all.extend(restart::defs());
    all
}

/// Cases that must run alone (they stop the control plane).
fn alone(def: &Def) -> bool {
    def.name.starts_with("restart/")
}

pub fn main(args: &ConformArgs) -> ExitCode {
    let bad = |message: String| {
        eprintln!("fencelab conform: {message}");
        ExitCode::from(Exit::BadArguments)
    };
    if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&args.lease_ms) {
        return bad(format!("--lease-ms must be {LEASE_MS_MIN}..={LEASE_MS_MAX}"));
    }
    let program = match crate::cli::program("conform") {
        Ok(program) => program,
        Err(code) => return code,
    };
    if args.database_url.is_some() && args.db != Db::Postgres {
        return bad("--database-url needs --db postgres".into());
    }
    let config = RunConfig {
        system: args.system.clone(),
        variants: args.variants.clone(),
        lease_ms: args.lease_ms,
        db: args.db,
        database_url: args.database_url.clone(),
        ..RunConfig::default()
    };
    let mut launch = match crate::run::cluster::launch_of(&config, Path::new("."), &program) {
        Ok(launch) => launch,
        Err(error) => return bad(error.to_string()),
    };
    let out = match output_folder(args, &launch.file.name) {
        Ok(out) => out,
        Err(message) => return bad(message),
    };
    launch.dir = out.join("system");
    launch.secret = format!("conform-secret-{:x}", protocol::monotonic_ns());
    let runtime = match crate::cli::runtime("conform") {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let command = args.command(&out);
    // A throwaway cluster lives until the session ends (dropped after it).
    let _database = match runtime.block_on(crate::run::cluster::start_database(&config, &mut launch)) {
        Ok(database) => database,
        Err(error) => {
            eprintln!("fencelab conform: the database: {error:#}");
            eprintln!("repeat with: {command}");
            return Exit::Internal.into();
        }
    };
    match runtime.block_on(execute(launch, &out, &command)) {
        Ok(doc) => finish(&doc, &out),
        Err(error) => {
            eprintln!("fencelab conform: {error}");
            eprintln!("repeat with: {command}");
            match error {
                StartError::Named(_) => Exit::BadArguments.into(),
                StartError::Failed(_) => Exit::Internal.into(),
            }
        }
    }
}

fn output_folder(args: &ConformArgs, name: &str) -> Result<PathBuf, String> {
    let out = match &args.out {
        Some(out) => out.clone(),
        None => {
            let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
            PathBuf::from("store").join("conform").join(format!("{name}-{stamp}"))
        }
    };
    let used = std::fs::read_dir(&out).map(|mut entries| entries.next().is_some()).unwrap_or(false);
    if used {
        return Err(format!("--out {} is not empty: conform starts its system on a fresh store there", out.display()));
    }
    std::fs::create_dir_all(&out).map_err(|error| format!("--out {}: {error}", out.display()))?;
    Ok(std::path::absolute(&out).unwrap_or(out))
}

fn finish(doc: &ConformDoc, out: &Path) -> ExitCode {
    for case in &doc.cases {
        println!("{}", report::line(case));
    }
    if let Err(error) = report::write(doc, out) {
        eprintln!("fencelab conform: cannot write into {}: {error}", out.display());
        return Exit::Internal.into();
    }
    let counts = doc.counts;
    println!(
        "conform      {}: {} passed, {} failed, {} skipped in {} ms ({} cases)",
        doc.overall,
        counts.pass,
        counts.fail,
        counts.skip,
        doc.duration_ms,
        doc.cases.len()
    );
    println!("output       {} (conform.json, junit.xml)", out.display());
    if doc.overall != results::Overall::Valid {
        println!("repeat with  {}", doc.command);
    }
    ExitCode::from(doc.exit_code)
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
    for mode in ["idempotent", "unfenced"] {
        let mut other = launch.clone();
        other.target_mode = mode.to_string();
        other.dir = out.join(format!("target-{mode}"));
        std::fs::create_dir_all(&other.dir)
            .map_err(|error| StartError::Failed(format!("{}: {error}", other.dir.display())))?;
        targets.insert(mode, other.start_server(Role::Target, 0, 0).await?);
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
        exit_code: Exit::of(overall).code(),
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
    needs: &'static [crate::system::Feature],
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
