//! The `fencelab-lab` binary: a thin shell over `lab::cli`.

fn main() -> std::process::ExitCode {
    lab::cli::main()
}
