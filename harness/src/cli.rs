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
