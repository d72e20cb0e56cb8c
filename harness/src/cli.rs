//! The `fencelab` command line. Exit codes follow Jepsen's: 0 valid, 1 invalid, 2 unknown,
//! 254 bad arguments, 255 internal error.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Bad arguments: nothing was started.
pub const EXIT_BAD_ARGUMENTS: u8 = 254;
/// An internal error.
pub const EXIT_INTERNAL: u8 = 255;

#[derive(Parser)]
#[command(name = "fencelab", version, about = "A chaos harness for CI control planes: fencing under fire")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the lab under faults and record one history (the main job).
    Run(crate::run::config::RunArgs),
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
        /// Seed of every random choice the toxics make (jitter, slicing, toxicity).
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// List the lab's planted bugs, one a line: name, then the protection it removes.
    Bugs,
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() { ExitCode::from(EXIT_BAD_ARGUMENTS) } else { ExitCode::SUCCESS };
        }
    };
    match cli.command {
        Command::Run(args) => run_command(args),
        Command::Lab { args } => {
            let program = std::ffi::OsString::from("fencelab lab");
            lab::cli::main_from(std::iter::once(program).chain(args))
        }
        Command::Toxiproxy { listen, seed } => {
            let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime starts");
            match runtime.block_on(proxy::serve_forever(listen, seed)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("fencelab toxiproxy: {error}");
                    ExitCode::from(EXIT_INTERNAL)
                }
            }
        }
        Command::Bugs => {
            print!("{}", lab::bugs::listing());
            ExitCode::SUCCESS
        }
    }
}

/// Exit code of a complete run until its history is checked.
pub const EXIT_VALID: u8 = 0;
/// Exit code of an incomplete run (interrupted, or jobs that did not settle).
pub const EXIT_UNKNOWN: u8 = 2;

fn run_command(args: crate::run::config::RunArgs) -> ExitCode {
    let clock_seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let config = match crate::run::config::validate(&args, clock_seed) {
        Ok(config) => config,
        Err(message) => return bad_arguments(&message),
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime starts");
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
    let mut command = config.command();
    if config.schedule.is_some() {
        command.push_str(&format!(" --schedule {}", folder.join("schedule.json").display()));
    }
    match runtime.block_on(crate::run::execute(config, folder, lab::web::termination())) {
        Ok(outcome) => summary(&outcome, &command),
        Err(error) => {
            eprintln!("fencelab run: {error:#}");
            eprintln!("repeat with: {command}");
            ExitCode::from(EXIT_INTERNAL)
        }
    }
}

fn bad_arguments(message: &str) -> ExitCode {
    eprintln!("fencelab run: {message}");
    ExitCode::from(EXIT_BAD_ARGUMENTS)
}

/// The one-screen summary at the end of a run.
fn summary(outcome: &crate::run::Outcome, command: &str) -> ExitCode {
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
    println!("repeat with  {command}");
    ExitCode::from(if outcome.complete { EXIT_VALID } else { EXIT_UNKNOWN })
}
