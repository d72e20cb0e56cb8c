//! The one table of exit codes every `fencelab` command answers with (Jepsen's), and the
//! panic hook that makes a panic an internal error (255) instead of Rust's 101.

use std::process::ExitCode;

/// What a command's exit code says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Valid: every checker passed (or the command did what it was asked).
    Valid,
    /// Invalid: anomalies were found (or an expectation, a replay, a suite row failed).
    Invalid,
    /// Unknown: the run was incomplete or its evidence could not be read or decided.
    Unknown,
    /// Bad arguments or input: nothing was started and nothing was changed.
    BadArguments,
    /// An internal error (including a panic).
    Internal,
}

impl Exit {
    pub const fn code(self) -> u8 {
        match self {
            Exit::Valid => 0,
            Exit::Invalid => 1,
            Exit::Unknown => 2,
            Exit::BadArguments => 254,
            Exit::Internal => 255,
        }
    }

    /// The exit of a checked verdict.
    pub fn of(overall: results::Overall) -> Exit {
        match overall {
            results::Overall::Valid => Exit::Valid,
            results::Overall::Invalid => Exit::Invalid,
            results::Overall::Unknown => Exit::Unknown,
        }
    }

    /// Valid when `passed`, else invalid: for commands whose answer is a yes or no.
    pub fn passed(passed: bool) -> Exit {
        if passed {
            Exit::Valid
        } else {
            Exit::Invalid
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

/// Makes any panic print its message and location, remove this process's containers (by
/// label, bounded), and exit 255.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("fencelab: internal error: {info}");
        let removed = crate::system::container::remove_own_blocking();
        if removed > 0 {
            eprintln!("fencelab: removed this run's {removed} container(s)");
        }
        std::process::exit(i32::from(Exit::Internal.code()));
    }));
}
