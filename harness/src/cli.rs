//! The `fencelab` command line. Every command returns its verdict as an [`Exit`] or a
//! [`CommandError`]; only [`main`] prints an error and exits. Exit codes follow Jepsen's:
//! 0 valid, 1 invalid, 2 unknown, 254 bad arguments, 255 internal error.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::error::CommandError;
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
    // A negative number is a value clap refuses by name, not an unknown flag.
    #[command(allow_negative_numbers = true)]
    Run(Box<crate::args::RunArgs>),
    /// Run a lab process (control plane, target, runner): the lab's own command line.
    #[command(disable_help_flag = true)]
    Lab {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Send one attempt's steps to the deployment target, as an observed system's job does
    /// (`fencelab step --help`; the same as `fencelab lab step`).
    #[command(disable_help_flag = true)]
    Step {
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
        /// A history longer than this many events is drawn in report.html from a sample:
        /// whole jobs (one in 2, 4, …), the nemesis's, operator's and harness's events, and
        /// every event of each job an anomaly names. The verdicts and counts stay exact.
        #[arg(long, value_name = "EVENTS", default_value_t = results::KEPT_EVENTS_MAX as u64,
              value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
        draw_events: u64,
    },
    /// Audit a live control plane's ledger (`GET /v1/ledger`, from a saved cursor) against
    /// every rule the ledger alone can prove; `--follow` keeps auditing new entries.
    Audit(crate::args::AuditArgs),
    /// Assemble a minimal evidence folder from records gathered by hand (a control plane's
    /// ledger and jobs, a target's step log, runners' logs) for `fencelab check`.
    Evidence {
        /// The ledger: entries as `GET /v1/ledger` answers them (a JSON array, or one a line).
        #[arg(long)]
        ledger: Option<std::path::PathBuf>,
        /// Every job whole, as `GET /v1/jobs/{id}` answers (an array, or one a line).
        #[arg(long)]
        jobs: Option<std::path::PathBuf>,
        /// The target's step records, as `GET /v1/steps` answers them.
        #[arg(long)]
        steps: Option<std::path::PathBuf>,
        /// A runner's log (`docs/history.md`), repeatable.
        #[arg(long = "runner-log")]
        runner_logs: Vec<std::path::PathBuf>,
        /// The lease policy the control plane ran with.
        #[arg(long)]
        lease_ms: Option<u64>,
        /// A part of the contract the system lacks, repeatable, said in the history's config
        /// as a run's config says it (`system.absent`, docs/system.md): `lease` for a system
        /// that grants none (an observed Buildbot), whose claims then carry no lease_expires_ms.
        #[arg(long, value_name = "PART", value_parser = part_of_the_contract)]
        lacks: Vec<system::Feature>,
        /// Instead of records gathered by hand, a run folder's history cut to what production
        /// keeps — its ledger and its runners' logs, written into `OUT/records/` — and assembled
        /// from those files (the lease: the run's, unless `--lease-ms` says one).
        #[arg(long, value_name = "RUN", conflicts_with_all = ["ledger", "jobs", "steps", "runner_logs", "lacks"])]
        from_run: Option<std::path::PathBuf>,
        /// The folder to write `history.jsonl` into (it must not hold one).
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Write a scenario that plays an incident's shape from its records — an evidence folder
    /// (`fencelab evidence`) or a run folder — for `fencelab scenario run` against any system.
    Import {
        /// The evidence folder or run folder (it holds `history.jsonl`).
        folder: std::path::PathBuf,
        /// The scenario file to write.
        #[arg(long)]
        out: std::path::PathBuf,
        /// An incident job to play, repeatable (default: the earliest anomalies' jobs).
        #[arg(long = "job")]
        jobs: Vec<String>,
    },
    /// For every planted bug, short runs with the faults that expose it, and the correct lab
    /// under every fault: a table of bug × detected, also written as JSON.
    Matrix(crate::args::MatrixArgs),
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
        /// Every run ends its workload and faults at the first anomaly the live records show
        /// (`fencelab run --stop-at-first`): the same verdicts, sooner.
        #[arg(long)]
        stop_at_first: bool,
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
    Conform(crate::args::ConformArgs),
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

/// The system a scenario runs against.
#[derive(Clone, Debug, Default, clap::Args)]
struct SystemArgs {
    /// The system under test: a system file (`docs/system.md`; default: the lab).
    #[arg(long)]
    system: Option<std::path::PathBuf>,
    /// A variant the system file declares (repeatable).
    #[arg(long = "variant")]
    variants: Vec<String>,
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Build the lab's image (`images/lab/Dockerfile`: this binary and the libraries it
    /// loads, FROM scratch) and its Toxiproxy image; skipped when up to date.
    Build {
        /// The lab's image (entrypoint `fencelab`).
        #[arg(long, default_value = system::image::LAB_TAG)]
        tag: String,
        /// The Toxiproxy image (entrypoint `fencelab toxiproxy`).
        #[arg(long, default_value = system::image::TOXIPROXY_TAG)]
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
        #[arg(long, default_value_os_t = runfolder::config::RunConfig::default().store)]
        store: std::path::PathBuf,
        #[command(flatten)]
        system: SystemArgs,
    },
}

/// The name a command's messages start with (`fencelab run: …`).
fn name(command: &Command) -> &'static str {
    match command {
        Command::Run(_) => "run",
        Command::Lab { .. } => "lab",
        Command::Step { .. } => "step",
        Command::Toxiproxy { .. } => "toxiproxy",
        Command::Check { .. } => "check",
        Command::Audit(_) => "audit",
        Command::Evidence { .. } => "evidence",
        Command::Import { .. } => "import",
        Command::Matrix(_) => "matrix",
        Command::Replay { .. } => "replay",
        Command::Shrink { .. } => "shrink",
        Command::Suite { .. } => "suite",
        Command::Merge { .. } => "merge",
        Command::Diff { .. } => "diff",
        Command::Bugs => "bugs",
        Command::Conform(_) => "conform",
        Command::Image { .. } => "image build",
        Command::Scenario { .. } => "scenario",
    }
}

pub fn main() -> ExitCode {
    crate::exit::install_panic_hook();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() { crate::exit::code(Exit::BadArguments) } else { ExitCode::SUCCESS };
        }
    };
    match cli.command {
        Command::Lab { args } => {
            let program = std::ffi::OsString::from("fencelab lab");
            return lab::cli::main_from(std::iter::once(program).chain(args));
        }
        Command::Step { args } => {
            let words = ["fencelab", "step"].map(std::ffi::OsString::from);
            return lab::cli::main_from(words.into_iter().chain(args));
        }
        _ => {}
    }
    let command = name(&cli.command);
    match execute(cli.command) {
        Ok(exit) => crate::exit::code(exit),
        Err(error) => {
            eprintln!("fencelab {command}: {error}");
            crate::exit::code(error.exit())
        }
    }
}

fn execute(command: Command) -> Result<Exit, CommandError> {
    match command {
        Command::Run(args) => run_command(*args),
        Command::Lab { .. } | Command::Step { .. } => unreachable!("the lab's command line is answered before"),
        Command::Toxiproxy { listen, host, port, seed } => {
            let listen = SocketAddr::new(host.unwrap_or(listen.ip()), port.unwrap_or(listen.port()));
            runtime()?.block_on(proxy::serve_forever(listen, seed)).map_err(|error| internal(error.to_string()))?;
            Ok(Exit::Valid)
        }
        Command::Check { folder, draw_events } => {
            verdict::check::without_huge_pages().map_err(|error| internal(error.to_string()))?;
            let (_, run) = verdict::check::check_folder_drawing(&folder, draw_events as usize)?;
            Ok(print_verdict(&folder, &run, &run.command))
        }
        Command::Audit(args) => audit_command(&args),
        Command::Evidence { ledger, jobs, steps, runner_logs, lease_ms, lacks, from_run, out } => {
            verdict::check::without_huge_pages().map_err(|error| internal(error.to_string()))?;
            let (inputs, assembled) = match from_run {
                Some(run) => {
                    let (inputs, assembled) = verdict::evidence::assemble_run(&run, lease_ms, &out)?;
                    let mut words = vec!["fencelab evidence".to_string()];
                    words.extend(inputs.ledger.iter().map(|ledger| format!("--ledger {}", ledger.display())));
                    words.extend(inputs.steps.iter().map(|steps| format!("--steps {}", steps.display())));
                    words.extend(inputs.runner_logs.iter().map(|log| format!("--runner-log {}", log.display())));
                    words.extend(inputs.lease_ms.map(|lease| format!("--lease-ms {lease}")));
                    words.push(format!("--out {}", out.display()));
                    println!(
                        "cut to       {} (the ledger, the target's step log and the runners' logs)",
                        out.join("records").display()
                    );
                    println!("assembled as {}", words.join(" "));
                    (inputs, assembled)
                }
                None => {
                    let inputs = verdict::evidence::Inputs { ledger, jobs, steps, runner_logs, lease_ms, lacks, out };
                    let assembled = verdict::evidence::assemble(&inputs)?;
                    (inputs, assembled)
                }
            };
            let words: Vec<&str> = assembled.sources.iter().map(|source| source.as_str()).collect();
            let history = runfolder::folder::RunFolder::at(&inputs.out).history_path();
            println!("history      {} ({} events from {})", history.display(), assembled.events, words.join(", "));
            println!("check with   fencelab check {}", inputs.out.display());
            Ok(Exit::Valid)
        }
        Command::Import { folder, out, jobs } => import_command(&engine::import::Options { folder, out, jobs }),
        Command::Matrix(args) => matrix_command(&args),
        Command::Replay { folder, tries, store } => replay_command(&folder, tries, &store),
        Command::Shrink { folder, tries, checkers, out, work, confirm } => {
            let options = campaign::shrink::Options {
                out: out.unwrap_or_else(|| folder.join("shrunk.toml")),
                work: work.unwrap_or_else(|| folder.join("shrink")),
                folder,
                tries,
                checkers,
                confirm,
            };
            shrink_command(&options)
        }
        Command::Suite { file, shard, out, stop_at_first, history } => {
            let history = campaign::trends::validate(history.dir, history.limit).map_err(bad)?;
            suite_command(&file, shard.as_deref(), out, stop_at_first, history)
        }
        Command::Merge { out, shards, history } => {
            let history = campaign::trends::validate(history.dir, history.limit).map_err(bad)?;
            merge_command(&out, &shards, history)
        }
        Command::Scenario { command: ScenarioCommand::Run { file, store, system } } => {
            let system = engine::scenario::SystemChoice { system: system.system, variants: system.variants };
            scenario_command(&file, &store, &system)
        }
        Command::Diff { run_a, run_b } => {
            let a = campaign::diff::read_side(&run_a).map_err(bad)?;
            let b = campaign::diff::read_side(&run_b).map_err(bad)?;
            print!("{}", results::diff::diff_text(&a, &b));
            Ok(Exit::Valid)
        }
        Command::Conform(args) => conform_command(&args),
        Command::Image { command: ImageCommand::Build { tag, toxiproxy_tag, force } } => {
            image_command(&tag, &toxiproxy_tag, force)
        }
        Command::Bugs => {
            print!("{}", lab::bugs::listing());
            Ok(Exit::Valid)
        }
    }
}

/// A part of the contract by its system-file name (`lease`, `runner-log`, …).
fn part_of_the_contract(text: &str) -> Result<system::Feature, String> {
    serde_json::from_value(serde_json::Value::String(text.to_string())).map_err(|error| error.to_string())
}

fn bad(message: impl std::fmt::Display) -> CommandError {
    CommandError::BadArguments(message.to_string())
}

fn internal(message: impl std::fmt::Display) -> CommandError {
    CommandError::Internal(message.to_string())
}

/// The one tokio runtime of a command; failing to start one is an internal error.
fn runtime() -> Result<tokio::runtime::Runtime, CommandError> {
    tokio::runtime::Runtime::new().map_err(|error| internal(format!("cannot start a tokio runtime: {error}")))
}

/// The running `fencelab` binary, which runs the children.
fn program() -> Result<std::path::PathBuf, CommandError> {
    std::env::current_exe().map_err(|error| internal(format!("cannot find this program: {error}")))
}

fn run_command(args: crate::args::RunArgs) -> Result<Exit, CommandError> {
    let clock_seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let config = args.config(clock_seed).map_err(bad)?;
    let throwaway = config.db == system::Db::Postgres && config.database_url.is_none();
    if let Some(why) = procs::pg::unavailable().filter(|_| throwaway) {
        return Err(bad(format!("--db postgres: {why} (or give --database-url)")));
    }
    let (runtime, program) = (runtime()?, program()?);
    if let Some(url) = &config.toxiproxy_url {
        let reachable = proxy::Client::new(url).map_err(|error| error.to_string());
        let version = runtime.block_on(async { reachable?.version().await.map_err(|error| error.to_string()) });
        if let Err(error) = version {
            return Err(bad(format!("--toxiproxy-url {url} is not a reachable Toxiproxy: {error}")));
        }
    }
    if let Some(warning) = config.backlog_warning() {
        eprintln!("fencelab run: warning: {warning}");
    }
    let folder = runfolder::folder::RunFolder::create(&config).map_err(bad)?;
    let command = folder.repeat_command(&config);
    let folder = folder.into_path();
    eprintln!("fencelab: seed {}; run folder {}", config.seed, folder.display());
    let driven = runtime
        .block_on(engine::run::execute(config, folder, &program, procs::termination()))
        .map_err(|error| CommandError::from(error).repeat_with(&command))?;
    summary(&driven, &command);
    Ok(print_verdict(&driven.folder, &driven.run, &command))
}

/// `fencelab import`: the scenario written, and what it plays.
fn import_command(options: &engine::import::Options) -> Result<Exit, CommandError> {
    verdict::check::without_huge_pages().map_err(|error| internal(error.to_string()))?;
    let imported = engine::import::import(options)?;
    println!(
        "scenario     {} ({} job(s): {}; {} runner(s), {} fault(s), {} played report(s))",
        options.out.display(),
        imported.jobs.len(),
        imported.jobs.join(", "),
        imported.runners,
        imported.faults,
        imported.played
    );
    println!("expects      {} valid (the incident found anomalies there)", imported.checkers.join(", "));
    for unknown in &imported.unknowns {
        println!("not known    {unknown}");
    }
    println!("run with     fencelab scenario run {} [--system FILE --variant NAME]", options.out.display());
    Ok(Exit::Valid)
}

fn audit_command(args: &crate::args::AuditArgs) -> Result<Exit, CommandError> {
    let options = args.options().map_err(bad)?;
    verdict::check::without_huge_pages().map_err(|error| internal(error.to_string()))?;
    let audited = runtime()?.block_on(verdict::audit::audit(&options, procs::termination()))?;
    let cursor = &audited.cursor;
    println!("audit folder {}", options.out.display());
    println!(
        "ledger       {} entries ({} read now in {} pages), cursor after seq {}",
        cursor.entries, audited.new_entries, audited.pages, cursor.after
    );
    if options.follow.is_some() {
        println!(
            "window       {} rounds, {} entries held at most, {} now",
            cursor.rounds, cursor.window_entries_peak, cursor.window_entries
        );
    }
    match &cursor.stopped {
        Some(why) => println!("complete     no: {why}; the same command resumes from the cursor"),
        None => println!("complete     yes: read to the ledger's end"),
    }
    Ok(print_verdict(&options.out, &audited.run, &options.command))
}

/// Prints the verdict table of a checked run; answers its exit.
fn print_verdict(folder: &std::path::Path, run: &results::Run, command: &str) -> Exit {
    // A reason every checker shares (a history that cannot be read) is said once.
    let mut said: Option<&str> = None;
    for result in &run.checkers {
        let (word, detail) = match &result.verdict {
            checkers::Verdict::Valid => ("valid", String::new()),
            checkers::Verdict::Invalid { anomalies } => ("INVALID", format!("{} anomalies", anomalies.len())),
            checkers::Verdict::Unknown { reason } if said == Some(reason.as_str()) => ("unknown", "(as above)".into()),
            checkers::Verdict::Unknown { reason } => {
                said = Some(reason);
                ("unknown", reason.clone())
            }
        };
        println!("  {:<24} {:<8} {detail}", result.checker, word);
    }
    let anomalies = run.checkers.iter().filter_map(|r| match &r.verdict {
        checkers::Verdict::Invalid { anomalies } => Some(anomalies),
        _ => None,
    });
    for anomaly in anomalies.flatten().take(10) {
        println!("  ! {}: {}", anomaly.checker, anomaly.message);
    }
    let overall = run.overall();
    println!(
        "verdict      {} (report: {})",
        overall.as_str(),
        runfolder::folder::RunFolder::at(folder).report_path().display()
    );
    if overall != results::Overall::Valid {
        println!("repeat with  {command}");
    }
    overall.exit()
}

/// The one-screen summary at the end of a run.
fn summary(driven: &engine::run::driver::Driven, command: &str) {
    let jobs = &driven.records.jobs;
    let mut states = std::collections::BTreeMap::new();
    for job in jobs {
        *states.entry(format!("{:?}", job.state).to_lowercase()).or_insert(0) += 1;
    }
    let attempts: usize = jobs.iter().map(|job| job.attempts.len()).sum();
    println!("run folder   {}", driven.folder.display());
    println!("healthy in   {} ms", driven.healthy_ms);
    println!("faults       {}", driven.faults);
    println!("jobs         {} ({} attempts): {:?}", jobs.len(), attempts, states);
    println!("history      {} events", driven.events);
    println!("complete     {}", driven.incomplete.as_ref().map_or("yes".to_string(), |why| format!("no: {why}")));
    for not in &driven.system.faults_not_run {
        let why = if not.why.is_empty() { format!("needs `{}`", not.needs.name()) } else { not.why.clone() };
        let variant = not.variant.as_ref().map_or(String::new(), |variant| format!(" ({variant})"));
        println!("not run      {}{variant}: {why}", not.fault.name());
    }
    println!("command      {command}");
}

fn scenario_command(
    file: &std::path::Path,
    store: &std::path::Path,
    system: &engine::scenario::SystemChoice,
) -> Result<Exit, CommandError> {
    let program = program()?;
    engine::scenario::load(file)?;
    let runtime = runtime()?;
    let report = runtime.block_on(engine::scenario::run_file(file, store, &program, system, procs::termination()))?;
    for line in &report.lines {
        println!("{line}");
    }
    let word = match report.outcome {
        Exit::Valid => "passed",
        Exit::Invalid => "FAILED",
        _ => "unknown",
    };
    println!(
        "scenario     {word} (report: {})",
        runfolder::folder::RunFolder::at(&report.folder).report_path().display()
    );
    if report.outcome != Exit::Valid {
        println!("repeat with  fencelab scenario run {}{}", file.display(), system.words());
    }
    Ok(report.outcome)
}

fn conform_command(args: &crate::args::ConformArgs) -> Result<Exit, CommandError> {
    let options = args.options().map_err(bad)?;
    if let Some(why) = conform::inapplicable(&options)? {
        println!("conform      unknown: {why}");
        return Ok(Exit::Unknown);
    }
    let prepared = conform::prepare(&options, &program()?)?;
    let (out, command) = (prepared.out.clone(), prepared.command.clone());
    let doc = runtime()?
        .block_on(conform::run(prepared, &options))
        .map_err(|error| CommandError::from(error).repeat_with(&command))?;
    for case in &doc.cases {
        println!("{}", conform::report::line(case));
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
    Ok(doc.overall.exit())
}

fn image_command(tag: &str, toxiproxy_tag: &str, force: bool) -> Result<Exit, CommandError> {
    let (runtime, binary) = (runtime()?, program()?);
    let said = runtime.block_on(system::image::build(&binary, tag, toxiproxy_tag, force)).map_err(|error| {
        // A tag that is no image name is the user's input; the rest, what building met.
        let bad_input = matches!(error, system::image::ImageError::Tag { .. });
        let message = format!("{error}\nrepeat with: fencelab image build --tag {tag} --toxiproxy-tag {toxiproxy_tag}");
        if bad_input {
            bad(message)
        } else {
            internal(message)
        }
    })?;
    for line in said {
        println!("{line}");
    }
    Ok(Exit::Valid)
}

fn matrix_command(args: &crate::args::MatrixArgs) -> Result<Exit, CommandError> {
    let (runtime, program) = (runtime()?, program()?);
    let matrix = runtime.block_on(campaign::matrix::run(&args.options().map_err(bad)?, &program)).map_err(internal)?;
    print!("{}", campaign::matrix::table(&matrix));
    println!("matrix.json in {}", args.store.display());
    Ok(Exit::passed(matrix.rows.iter().all(campaign::matrix::Row::holds)))
}

fn replay_command(folder: &std::path::Path, tries: u32, store: &std::path::Path) -> Result<Exit, CommandError> {
    let Some(original) = campaign::replay::invalid_checkers(folder) else {
        return Err(bad(format!("{} holds no results.json", folder.display())));
    };
    let (runtime, program) = (runtime()?, program()?);
    let listed = |checkers: &std::collections::BTreeSet<String>| match checkers.is_empty() {
        true => "no checker".to_string(),
        false => checkers.iter().map(String::as_str).collect::<Vec<_>>().join(", "),
    };
    println!("original     anomalies in {}", listed(&original));
    let mut reproduced = 0;
    for index in 1..=tries.max(1) {
        let store = store.join(format!("replay-{}-{index}", std::process::id()));
        let replayed = runtime.block_on(campaign::replay::replay(&program, folder, store)).map_err(bad)?;
        reproduced += u32::from(replayed.reproduced);
        let word = if replayed.reproduced { "reproduced" } else { "NOT reproduced" };
        let folder =
            replayed.cell.folder.as_ref().map_or("no run folder".to_string(), |folder| folder.display().to_string());
        println!(
            "replay {index}     {word}: {}, anomalies in {} ({folder})",
            replayed.cell.verdict,
            listed(&replayed.checkers)
        );
    }
    println!("{reproduced} of {} replays reproduced the anomalies", tries.max(1));
    Ok(Exit::passed(reproduced == tries.max(1)))
}

fn shrink_command(options: &campaign::shrink::Options) -> Result<Exit, CommandError> {
    if !(1..=campaign::shrink::TRIES_MAX).contains(&options.tries) {
        return Err(bad(format!("--tries must be 1..={}", campaign::shrink::TRIES_MAX)));
    }
    if options.confirm > campaign::shrink::CONFIRM_MAX {
        return Err(bad(format!("--confirm must be 0..={}", campaign::shrink::CONFIRM_MAX)));
    }
    let folder = std::fs::canonicalize(&options.folder).unwrap_or_else(|_| options.folder.clone());
    let options = campaign::shrink::Options { folder, ..options.clone() };
    for checker in &options.checkers {
        if !checkers::names().iter().any(|(name, _)| name == checker) {
            return Err(bad(format!("--checker: unknown checker `{checker}`")));
        }
    }
    campaign::shrink::read_original(&options.folder, &options.checkers).map_err(bad)?;
    let (runtime, program) = (runtime()?, program()?);
    let shrunk = runtime.block_on(campaign::shrink::shrink(&program, &options)).map_err(internal)?;
    print!("{}", campaign::shrink::table(&shrunk));
    println!("tries      {} (details: {})", shrunk.tries.len(), options.work.join("shrink.json").display());
    match &shrunk.command {
        Some(command) => {
            println!("confirmed  {} of {} runs reproduced", shrunk.confirmed.0, shrunk.confirmed.1);
            println!("scenario   {}", options.out.display());
            println!("repeat with  {command}");
            Ok(Exit::Valid)
        }
        None => {
            println!("the anomaly did not reproduce as a scenario: nothing written");
            Ok(Exit::Invalid)
        }
    }
}

fn suite_command(
    file: &std::path::Path,
    shard: Option<&str>,
    out: Option<std::path::PathBuf>,
    stop_at_first: bool,
    history: Option<campaign::trends::History>,
) -> Result<Exit, CommandError> {
    let mut suite = campaign::suite::read(file, crate::args::suite_config).map_err(bad)?;
    for run in &mut suite.runs {
        run.config.stop_at_first |= stop_at_first;
    }
    let shard = shard.map(campaign::suite::parse_shard).transpose().map_err(bad)?;
    let default_out = match shard {
        Some((i, n)) => format!("store/suite-{}-shard-{i}-of-{n}", suite.name),
        None => format!("store/suite-{}", suite.name),
    };
    let out = out.unwrap_or_else(|| default_out.into());
    std::fs::create_dir_all(&out).map_err(|error| bad(format!("--out {}: {error}", out.display())))?;
    let earlier = history.map(|history| campaign::trends::read_nights(&history, &out)).transpose().map_err(bad)?;
    let (runtime, program) = (runtime()?, program()?);
    let result = runtime.block_on(campaign::suite::execute(&suite, shard, &program, &out));
    finish_suite(&result, &out, earlier)
}

fn finish_suite(
    result: &campaign::suite::SuiteResult,
    out: &std::path::Path,
    earlier: Option<Vec<results::trends::Night>>,
) -> Result<Exit, CommandError> {
    let nights = earlier.as_ref().map_or(0, Vec::len);
    let trends = campaign::trends::section(earlier, result, out);
    campaign::suite::write_with_trends(result, out, &trends)
        .map_err(|error| internal(format!("cannot write the suite's outputs into {}: {error}", out.display())))?;
    for entry in &result.entries {
        let word = if entry.passed { "pass" } else { "FAIL" };
        println!("{word}  {:<32} seed {:<6} {}", entry.name, entry.seed, entry.verdict);
    }
    if !trends.is_empty() {
        println!("trends: over {nights} earlier nights and this one");
    }
    println!("index: {}", out.join("index.html").display());
    Ok(campaign::suite::exit(result))
}

fn merge_command(
    out: &std::path::Path,
    shards: &[std::path::PathBuf],
    history: Option<campaign::trends::History>,
) -> Result<Exit, CommandError> {
    let mut results = Vec::new();
    for shard in shards {
        results.push((shard.clone(), campaign::suite::read_result(shard).map_err(bad)?));
    }
    std::fs::create_dir_all(out).map_err(|error| bad(format!("--out {}: {error}", out.display())))?;
    let earlier = history.map(|history| campaign::trends::read_nights(&history, out)).transpose().map_err(bad)?;
    let merged = campaign::suite::merge(results, out).map_err(bad)?;
    finish_suite(&merged, out, earlier)
}
