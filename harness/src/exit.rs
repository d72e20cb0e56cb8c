//! The process side of the one exit table (`history::Exit`): a verdict or an error as the
//! process's exit code, and the panic hook that makes a panic an internal error (255)
//! instead of Rust's 101.

use std::process::ExitCode;

pub use history::Exit;

/// The process exit code of `exit`.
pub fn code(exit: Exit) -> ExitCode {
    ExitCode::from(exit.code())
}

/// Makes any panic print its message and location, remove this process's containers (by
/// label, bounded) and packet rules (by comment), and exit 255.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("fencelab: internal error: {info}");
        let removed = system::container::remove_own_blocking();
        if removed > 0 {
            eprintln!("fencelab: removed this run's {removed} container(s)");
        }
        let rules = system::packets::remove_own();
        if rules > 0 {
            eprintln!("fencelab: removed this run's {rules} packet rule(s) on lo");
        }
        std::process::exit(i32::from(Exit::Internal.code()));
    }));
}
