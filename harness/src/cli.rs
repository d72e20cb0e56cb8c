//! The `fencelab` command line. Exit codes follow Jepsen's: 0 valid, 1 invalid, 2 unknown,
//! 254 bad arguments, 255 internal error.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::exit::Exit;

#[derive(Parser)]
#[command(name = "fencelab", version, about = "A chaos harness for CI control planes: fencing under fire")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the lab under faults and record one history (the main job).
    Run(Box<crate::run::config::RunArgs>),
    /// Run a lab process (control plane, target, runner): the lab's own command line.
    #[command(disable_help_flag = true)]
    Lab {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Serve a Toxiproxy-compatible API (the same server every run embeds).
    Toxiproxy {
        /// Where the REST API listens.
        #[arg(long, default_value = "127.0.0.1:8474")]
        listen: SocketAddr,
        /// The host to listen on, as Toxiproxy's `-host` (replaces --listen's).
        #[arg(long)]
        host: Option<std::net::IpAddr>,
        /// The port to listen on, as Toxiproxy's `-port` (replaces --listen's).
        #[arg(long)]
        port: Option<u16>,
        /// Seed of every random choice the toxics make (jitter, slicing, toxicity).
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Check a stored run again: rewrite its results.json, report.html and junit.xml.
    Check {
        /// The run folder (`store/<test>/<start-time>`, or `store/latest`).
        folder: std::path::PathBuf,
    },
    /// For every planted bug, short runs with the faults that expose it, and the correct lab
    /// under every fault: a table of bug × detected, also written as JSON.
    Matrix(crate::matrix::MatrixArgs),
    /// Run a recorded run again (its config and realised fault schedule) and say whether the
    /// same anomalies appeared.
    Replay {
        /// The run folder (`store/<test>/<start-time>`, or `store/latest`).
        folder: std::path::PathBuf,
        /// Replays to make; the answer counts how many reproduced.
        #[arg(long, default_value_t = 1)]
        tries: u32,
        /// Where the replays' run folders go.
        #[arg(long, default_value = "store/replays")]
        store: std::path::PathBuf,
    },
    /// Cut a run that found an anomaly down to the smallest scenario that still finds it:
    /// remove faults, runners and jobs while the anomaly persists, each try a real run.
    Shrink {
        /// The run folder (`store/<test>/<start-time>`, or `store/latest`).
        folder: std::path::PathBuf,
        /// Most tries (each a real scenario run), 1..=500.
        #[arg(long, default_value_t = 40)]
        tries: u32,
        /// A checker whose anomaly must persist (repeatable; default: the first to find one).
        #[arg(long = "checker")]
        checkers: Vec<String>,
        /// The scenario file to write (default: FOLDER/shrunk.toml).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// Where the tries go (default: FOLDER/shrink).
        #[arg(long)]
        work: Option<std::path::PathBuf>,
        /// Runs confirming the result, 0..=20.
        #[arg(long, default_value_t = 3)]
        confirm: u32,
    },
    /// Run a suite file (runs × faults × seeds) within its time budget: an index page, one
    /// aggregated junit.xml; exits non-zero if a run did not pass.
    Suite {
        file: std::path::PathBuf,
        /// Run only the I-th of N slices (1-based), for a CI matrix.
        #[arg(long)]
        shard: Option<String>,
        /// Where the index, junit.xml, suite.json and the runs go.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        #[command(flatten)]
        history: HistoryArgs,
    },
    /// Join the outputs of suite shards into one index, junit.xml and suite.json.
    Merge {
        #[arg(long)]
        out: std::path::PathBuf,
        /// The shards' output folders.
        #[arg(required = true)]
        shards: Vec<std::path::PathBuf>,
        #[command(flatten)]
        history: HistoryArgs,
    },
    /// Say what differs between two run folders: verdicts, anomalies by checker, fault
    /// schedule, run flags, timings and counts (exit 0 when printed).
    Diff {
        /// The first run folder (e.g. yesterday's).
        run_a: std::path::PathBuf,
        /// The second run folder.
        run_b: std::path::PathBuf,
    },
    /// List the lab's planted bugs, one a line: name, then the protection it removes.
    Bugs,
    /// Check a system against the contract before chaos: deterministic single-step cases
    /// over HTTP, one line each, conform.json and junit.xml (`docs/conform.md`).
    Conform(crate::conform::ConformArgs),
    /// The lab as container images, built locally from this binary (no registry).
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Scripted incidents against the real lab (`docs/scenarios.md`).
    Scenario {
        #[command(subcommand)]
        command: ScenarioCommand,
    },
}

/// Earlier suite outputs for the index page's trends.
#[derive(clap::Args)]
struct HistoryArgs {
    /// A folder of earlier suite outputs (one sub-folder per night, each with its suite.json,
    /// ordered by name): the index page then shows trends over them and this suite.
    #[arg(long = "history")]
    dir: Option<std::path::PathBuf>,
    /// Read at most the last N earlier nights (1..=365).
    #[arg(long = "history-limit", default_value_t = 14)]
    limit: usize,
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Build the lab's image (`images/lab/Dockerfile`: this binary and the libraries it
    /// loads, FROM scratch) and its Toxiproxy image; skipped when up to date.
    Build {
        /// The lab's image (entrypoint `fencelab`).
        #[arg(long, default_value = crate::image::LAB_TAG)]
        tag: String,
        /// The Toxiproxy image (entrypoint `fencelab toxiproxy`).
        #[arg(long, default_value = crate::image::TOXIPROXY_TAG)]
        toxiproxy_tag: String,
        /// Build even when the images are up to date.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
enum ScenarioCommand {
    /// Run a scenario file: exit 0 when every expectation held, 1 when one failed.
    Run {
        file: std::path::PathBuf,
        /// Where run folders go (`STORE/scenario-NAME/START-TIME`).
        #[arg(long, default_value = "store")]
        store: std::path::PathBuf,
        #[command(flatten)]
        system: crate::scenario::SystemChoice,
    },
}

pub fn main() -> ExitCode {
    crate::exit::install_panic_hook();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() { Exit::BadArguments.into() } else { ExitCode::SUCCESS };
        }
    };
    match cli.command {
        Command::Run(args) => run_command(*args),
        Command::Lab { args } => {
            let program = std::ffi::OsString::from("fencelab lab");
            lab::cli::main_from(std::iter::once(program).chain(args))
        }
        Command::Toxiproxy { listen, host, port, seed } => {
            let listen = SocketAddr::new(host.unwrap_or(listen.ip()), port.unwrap_or(listen.port()));
            let runtime = match runtime("toxiproxy") {
                Ok(runtime) => runtime,
                Err(code) => return code,
            };
            match runtime.block_on(proxy::serve_forever(listen, seed)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("fencelab toxiproxy: {error}");
                    Exit::Internal.into()
                }
            }
        }
        Command::Check { folder } => {
            if !folder.join("history.jsonl").is_file() {
                eprintln!("fencelab check: {} holds no history.jsonl", folder.display());
                return Exit::BadArguments.into();
            }
            let command = std::fs::read_to_string(folder.join("run.json"))
                .ok()
                .and_then(|text| serde_json::from_str::<crate::check::RunMeta>(&text).ok())
                .map_or_else(String::new, |meta| meta.command);
            verdict(&folder, &command)
        }
        Command::Matrix(args) => matrix_command(&args),
        Command::Replay { folder, tries, store } => replay_command(&folder, tries, &store),
        Command::Shrink { folder, tries, checkers, out, work, confirm } => {
            let options = crate::shrink::Options {
                out: out.unwrap_or_else(|| folder.join("shrunk.toml")),
                work: work.unwrap_or_else(|| folder.join("shrink")),
                folder,
                tries,
                checkers,
                confirm,
            };
            shrink_command(&options)
        }
        Command::Suite { file, shard, out, history } => match crate::trends::validate(history.dir, history.limit) {
            Ok(history) => suite_command(&file, shard.as_deref(), out, history),
            Err(message) => bad_arguments(&message),
        },
        Command::Merge { out, shards, history } => match crate::trends::validate(history.dir, history.limit) {
            Ok(history) => merge_command(&out, &shards, history),
            Err(message) => bad_arguments(&message),
        },
        Command::Scenario { command: ScenarioCommand::Run { file, store, system } } => {
            crate::scenario::main(&file, &store, &system)
        }
        Command::Diff { run_a, run_b } => diff_command(&run_a, &run_b),
        Command::Conform(args) => crate::conform::main(&args),
        Command::Image { command: ImageCommand::Build { tag, toxiproxy_tag, force } } => {
            crate::image::main(&tag, &toxiproxy_tag, force)
        }
        Command::Bugs => {
            print!("{}", lab::bugs::listing());
            ExitCode::SUCCESS
        }
    }
}

fn run_command(args: crate::run::config::RunArgs) -> ExitCode {
    let clock_seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let config = match crate::run::config::validate(&args, clock_seed) {
        Ok(config) => config,
        Err(message) => return bad_arguments(&message),
    };
    let throwaway = config.db == crate::run::config::Db::Postgres && config.database_url.is_none();
    if let Some(why) = lab::pg::unavailable().filter(|_| throwaway) {
        return bad_arguments(&format!("--db postgres: {why} (or give --database-url)"));
    }
    let runtime = match runtime("run") {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    if let Some(url) = &config.toxiproxy_url {
        let reachable = proxy::Client::new(url).map_err(|error| error.to_string());
        let version = runtime.block_on(async { reachable?.version().await.map_err(|error| error.to_string()) });
        if let Err(error) = version {
            return bad_arguments(&format!("--toxiproxy-url {url} is not a reachable Toxiproxy: {error}"));
        }
    }
    let folder = match crate::run::create_folder(&config) {
        Ok(folder) => folder,
        Err(message) => return bad_arguments(&message),
    };
    eprintln!("fencelab: seed {}; run folder {}", config.seed, folder.display());
    let command = config.command_in(&folder);
    match runtime.block_on(crate::run::execute(config, folder, lab::web::termination())) {
        Ok(outcome) => {
            summary(&outcome, &command);
            verdict(&outcome.folder, &command)
        }
        Err(error) => {
            eprintln!("fencelab run: {error:#}");
            eprintln!("repeat with: {command}");
            start_error_exit(&error).into()
        }
    }
}

/// 254 when the system could not start because of something the user named wrongly (a
/// program that is not there), else 255.
pub fn start_error_exit(error: &anyhow::Error) -> Exit {
    match error.downcast_ref::<crate::system::StartError>() {
        Some(crate::system::StartError::Named(_)) => Exit::BadArguments,
        _ => Exit::Internal,
    }
}

fn diff_command(run_a: &std::path::Path, run_b: &std::path::Path) -> ExitCode {
    match (crate::diff::read_side(run_a), crate::diff::read_side(run_b)) {
        (Ok(a), Ok(b)) => {
            print!("{}", results::diff::diff_text(&a, &b));
            Exit::Valid.into()
        }
        (Err(message), _) | (_, Err(message)) => {
            eprintln!("fencelab diff: {message}");
            Exit::BadArguments.into()
        }
    }
}

fn bad_arguments(message: &str) -> ExitCode {
    eprintln!("fencelab run: {message}");
    Exit::BadArguments.into()
}

/// Checks a run folder, prints the verdict table, and answers the exit code.
fn verdict(folder: &std::path::Path, command: &str) -> ExitCode {
    match crate::check::check_folder(folder) {
        Ok((overall, run)) => {
            for result in &run.checkers {
                let (word, detail) = match &result.verdict {
                    checkers::Verdict::Valid => ("valid", String::new()),
                    checkers::Verdict::Invalid { anomalies } => ("INVALID", format!("{} anomalies", anomalies.len())),
                    checkers::Verdict::Unknown { reason } => ("unknown", reason.clone()),
                };
                println!("  {:<24} {:<8} {detail}", result.checker, word);
            }
            for anomaly in run
                .checkers
                .iter()
                .filter_map(|r| match &r.verdict {
                    checkers::Verdict::Invalid { anomalies } => Some(anomalies),
                    _ => None,
                })
                .flatten()
                .take(10)
            {
                println!("  ! {}: {}", anomaly.checker, anomaly.message);
            }
            println!("verdict      {} (report: {})", overall.as_str(), folder.join("report.html").display());
            if overall != results::Overall::Valid {
                println!("repeat with  {command}");
            }
            Exit::of(overall).into()
        }
        Err(error) => {
            eprintln!("fencelab: cannot check {}: {error:#}", folder.display());
            Exit::Internal.into()
        }
    }
}

/// The one-screen summary at the end of a run.
fn summary(outcome: &crate::run::RunEnd, command: &str) {
    let mut states = std::collections::BTreeMap::new();
    for job in &outcome.jobs {
        *states.entry(format!("{:?}", job.state).to_lowercase()).or_insert(0) += 1;
    }
    let attempts: usize = outcome.jobs.iter().map(|job| job.attempts.len()).sum();
    println!("run folder   {}", outcome.folder.display());
    println!("healthy in   {} ms", outcome.healthy_ms);
    println!("faults       {}", outcome.faults);
    println!("jobs         {} ({} attempts): {:?}", outcome.jobs.len(), attempts, states);
    println!("history      {} events", outcome.events);
    println!("complete     {}", if outcome.complete { "yes" } else { "no: interrupted, or jobs did not settle" });
    println!("command      {command}");
}

/// A tokio runtime for `command`; failing to start one is an internal error (255).
pub(crate) fn runtime(command: &str) -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Runtime::new().map_err(|error| {
        eprintln!("fencelab {command}: cannot start a tokio runtime: {error}");
        Exit::Internal.into()
    })
}

/// The running `fencelab` binary, which runs the children; an error exits 255.
pub(crate) fn program(command: &str) -> Result<std::path::PathBuf, ExitCode> {
    std::env::current_exe().map_err(|error| {
        eprintln!("fencelab {command}: {error}");
        Exit::Internal.into()
    })
}

fn matrix_command(args: &crate::matrix::MatrixArgs) -> ExitCode {
    let runtime = match runtime("matrix") {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let program = match program("matrix") {
        Ok(program) => program,
        Err(code) => return code,
    };
    match runtime.block_on(crate::matrix::run(args, &program)) {
        Ok(matrix) => {
            print!("{}", crate::matrix::table(&matrix));
            println!("matrix.json in {}", args.store.display());
            Exit::passed(matrix.rows.iter().all(crate::matrix::Row::holds)).into()
        }
        Err(error) => {
            eprintln!("fencelab matrix: {error:#}");
            Exit::Internal.into()
        }
    }
}

fn replay_command(folder: &std::path::Path, tries: u32, store: &std::path::Path) -> ExitCode {
    let Some(original) = crate::replay::invalid_checkers(folder) else {
        eprintln!("fencelab replay: {} holds no results.json", folder.display());
        return Exit::BadArguments.into();
    };
    let (runtime, program) = match runtime("replay").and_then(|runtime| Ok((runtime, program("replay")?))) {
        Ok(both) => both,
        Err(code) => return code,
    };
    println!("original anomalies in: {:?}", original);
    let mut reproduced = 0;
    for index in 1..=tries.max(1) {
        let store = store.join(format!("replay-{}-{index}", std::process::id()));
        match runtime.block_on(crate::replay::replay(&program, folder, store)) {
            Ok(replayed) => {
                reproduced += u32::from(replayed.reproduced);
                let word = if replayed.reproduced { "reproduced" } else { "NOT reproduced" };
                println!(
                    "replay {index}: {word}: {} in {:?} ({:?})",
                    replayed.cell.verdict, replayed.checkers, replayed.cell.folder
                );
            }
            Err(error) => {
                eprintln!("fencelab replay: {error}");
                return Exit::BadArguments.into();
            }
        }
    }
    println!("{reproduced} of {} replays reproduced the anomalies", tries.max(1));
    Exit::passed(reproduced == tries.max(1)).into()
}

fn shrink_command(options: &crate::shrink::Options) -> ExitCode {
    if !(1..=crate::shrink::TRIES_MAX).contains(&options.tries) {
        return bad_arguments(&format!("--tries must be 1..={}", crate::shrink::TRIES_MAX));
    }
    if options.confirm > crate::shrink::CONFIRM_MAX {
        return bad_arguments(&format!("--confirm must be 0..={}", crate::shrink::CONFIRM_MAX));
    }
    let folder = std::fs::canonicalize(&options.folder).unwrap_or_else(|_| options.folder.clone());
    let options = crate::shrink::Options { folder, ..options.clone() };
    for checker in &options.checkers {
        if !checkers::names().iter().any(|(name, _)| name == checker) {
            return bad_arguments(&format!("--checker: unknown checker `{checker}`"));
        }
    }
    if let Err(message) = crate::shrink::read_original(&options.folder, &options.checkers) {
        return bad_arguments(&message);
    }
    let runtime = match runtime("shrink") {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let program = match program("shrink") {
        Ok(program) => program,
        Err(code) => return code,
    };
    match runtime.block_on(crate::shrink::shrink(&program, &options)) {
        Ok(shrunk) => {
            print!("{}", crate::shrink::table(&shrunk));
            println!("tries      {} (details: {})", shrunk.tries.len(), options.work.join("shrink.json").display());
            match &shrunk.command {
                Some(command) => {
                    println!("confirmed  {} of {} runs reproduced", shrunk.confirmed.0, shrunk.confirmed.1);
                    println!("scenario   {}", options.out.display());
                    println!("repeat with  {command}");
                    ExitCode::SUCCESS
                }
                None => {
                    println!("the anomaly did not reproduce as a scenario: nothing written");
                    Exit::Invalid.into()
                }
            }
        }
        Err(message) => {
            eprintln!("fencelab shrink: {message}");
            Exit::Internal.into()
        }
    }
}

fn suite_command(
    file: &std::path::Path,
    shard: Option<&str>,
    out: Option<std::path::PathBuf>,
    history: Option<crate::trends::History>,
) -> ExitCode {
    let suite = match crate::suite::read(file) {
        Ok(suite) => suite,
        Err(message) => return bad_arguments(&message),
    };
    let shard = match shard.map(crate::suite::parse_shard).transpose() {
        Ok(shard) => shard,
        Err(message) => return bad_arguments(&message),
    };
    let default_out = match shard {
        Some((i, n)) => format!("store/suite-{}-shard-{i}-of-{n}", suite.name),
        None => format!("store/suite-{}", suite.name),
    };
    let out = out.unwrap_or_else(|| default_out.into());
    if let Err(error) = std::fs::create_dir_all(&out) {
        return bad_arguments(&format!("--out {}: {error}", out.display()));
    }
    let earlier = match history.map(|history| crate::trends::read_nights(&history, &out)).transpose() {
        Ok(earlier) => earlier,
        Err(message) => return bad_arguments(&message),
    };
    let (runtime, program) = match runtime("suite").and_then(|runtime| Ok((runtime, program("suite")?))) {
        Ok(both) => both,
        Err(code) => return code,
    };
    let result = runtime.block_on(crate::suite::execute(&suite, shard, &program, &out));
    finish_suite(&result, &out, earlier)
}

fn finish_suite(
    result: &crate::suite::SuiteResult,
    out: &std::path::Path,
    earlier: Option<Vec<results::trends::Night>>,
) -> ExitCode {
    let nights = earlier.as_ref().map_or(0, Vec::len);
    let trends = crate::trends::section(earlier, result, out);
    if let Err(error) = crate::suite::write_with_trends(result, out, &trends) {
        eprintln!("fencelab: cannot write the suite's outputs into {}: {error}", out.display());
        return Exit::Internal.into();
    }
    for entry in &result.entries {
        let word = if entry.passed { "pass" } else { "FAIL" };
        println!("{word}  {:<32} seed {:<6} {}", entry.name, entry.seed, entry.verdict);
    }
    if !trends.is_empty() {
        println!("trends: over {nights} earlier nights and this one");
    }
    println!("index: {}", out.join("index.html").display());
    crate::suite::exit(result).into()
}

fn merge_command(
    out: &std::path::Path,
    shards: &[std::path::PathBuf],
    history: Option<crate::trends::History>,
) -> ExitCode {
    let mut results = Vec::new();
    for shard in shards {
        match crate::suite::read_result(shard) {
            Ok(result) => results.push((shard.clone(), result)),
            Err(message) => return bad_arguments(&message),
        }
    }
    if let Err(error) = std::fs::create_dir_all(out) {
        return bad_arguments(&format!("--out {}: {error}", out.display()));
    }
    let earlier = match history.map(|history| crate::trends::read_nights(&history, out)).transpose() {
        Ok(earlier) => earlier,
        Err(message) => return bad_arguments(&message),
    };
    match crate::suite::merge(results, out) {
        Ok(merged) => finish_suite(&merged, out, earlier),
        Err(message) => bad_arguments(&message),
    }
}
