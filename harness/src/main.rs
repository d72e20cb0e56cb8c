//! The `fencelab` binary: a thin shell over `harness::cli`.
//!
//! Its allocator is mimalloc: `fencelab check` parses a history on one thread and checks it
//! on another, and glibc's allocator spent more time on its locks and on zeroing pages
//! than the checkers spent checking (`cargo bench -p verdict --bench check_file`).

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    harness::cli::main()
}
