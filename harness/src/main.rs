//! The `fencelab` binary: a thin shell over `harness::cli`.

fn main() -> std::process::ExitCode {
    harness::cli::main()
}
