//! The test cargo-mutants runs for the mutation benchmark (`docs/mutation.md`): one short
//! default run of the (mutated) lab under every fault. It fails — the mutant is caught —
//! when the run is not valid; it passes — the mutant survived — when fencelab found nothing.
//!
//! `cargo test -p harness --bench mutation_probe` runs it; as a benchmark target it is
//! never part of the test suite.

use std::process::Command;

/// Seconds of the probe's run: short, so a mutant costs a build and about half a minute.
/// `FENCELAB_PROBE_TIME_LIMIT_S` sets another (the second stage of `docs/mutation.md`
/// re-runs the survivors of the short probe under the default 30-second run), and
/// `FENCELAB_PROBE_ARGS` adds flags (`--control-planes 2` for the runner's failover).
const TIME_LIMIT_S: &str = "15";

fn main() {
    let store = std::env::temp_dir().join(format!("fencelab-mutation-probe-{}", std::process::id()));
    let seed = std::env::var("FENCELAB_PROBE_SEED").unwrap_or_else(|_| "1".into());
    let time_limit_s = std::env::var("FENCELAB_PROBE_TIME_LIMIT_S").unwrap_or_else(|_| TIME_LIMIT_S.into());
    // More `fencelab run` flags, split on spaces (e.g. `--control-planes 2`).
    let extra = std::env::var("FENCELAB_PROBE_ARGS").unwrap_or_default();
    let status = Command::new(env!("CARGO_BIN_EXE_fencelab"))
        .args(["run", "--nemesis", "all", "--time-limit", &time_limit_s, "--recovery-limit", "20", "--seed", &seed])
        .args(extra.split_whitespace())
        .arg("--store")
        .arg(&store)
        .status();
    let _ = std::fs::remove_dir_all(&store);
    match status.map(|status| status.code()) {
        Ok(Some(0)) => println!("mutation probe: the run is valid: nothing found"),
        Ok(code) => {
            println!("mutation probe: the run is not valid (exit {code:?}): caught");
            std::process::exit(1);
        }
        Err(error) => {
            eprintln!("mutation probe: cannot run fencelab: {error}");
            std::process::exit(1);
        }
    }
}
