//! Throughput of the checkers on realistic correct histories of 10^4 … 10^7 events.
//!
//! Histories are generated (seeded, deterministic) in chunks and fed to a
//! [`checkers::Stream`], so 10^7 events never sit in memory together; only the checking is
//! timed. Up to 10^6 events the whole history is also held and checked with
//! [`checkers::check_all`] (which first restores ledger order). Every verdict must be
//! Valid: a checker accusing a generated correct history is a failure. Run with
//! `cargo bench -p checkers --bench check` (add a size, e.g. `-- 100000`, to run one).
//! With `FENCELAB_BENCH_SMOKE=1` (CI: `cargo test --benches`) it runs 10^4 events only.

#[path = "support/gen.rs"]
mod gen;

use checkers::Verdict;
use std::time::{Duration, Instant};

const CHUNK: usize = 100_000;

/// Peak resident memory of this process so far (VmHWM), in MiB.
fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find(|line| line.starts_with("VmHWM:")).unwrap_or("VmHWM: 0 kB");
    let kb: f64 = line.split_whitespace().nth(1).and_then(|kb| kb.parse().ok()).unwrap_or(0.0);
    kb / 1024.0
}

fn assert_valid(results: &[checkers::CheckerResult], size: usize) {
    for result in results {
        assert_eq!(result.verdict, Verdict::Valid, "{} on {size} events", result.checker);
    }
}

/// Streams `size` events (plus the finals) through the checkers; returns events, time, tracked.
fn streamed(size: usize) -> (usize, Duration, usize) {
    let mut generator = gen::Gen::new(0x5eed ^ size as u64);
    let mut stream = checkers::Stream::new();
    let (mut events, mut spent) = (0usize, Duration::ZERO);
    while events < size {
        let chunk = generator.chunk(CHUNK.min(size - events));
        events += chunk.len();
        let started = Instant::now();
        chunk.iter().for_each(|event| stream.push(event));
        spent += started.elapsed();
    }
    let finals = generator.finals();
    let started = Instant::now();
    let finals_len = finals.len();
    finals.iter().for_each(|event| stream.push(event));
    let tracked = stream.tracked();
    let results = stream.finish().expect("a generated ledger is in seq order");
    spent += started.elapsed();
    assert_valid(&results, size);
    (events + finals_len, spent, tracked)
}

/// Holds the whole history and runs `check_all`; returns events and time.
fn held(size: usize) -> (usize, Duration) {
    let mut generator = gen::Gen::new(0x5eed ^ size as u64);
    let mut events = generator.chunk(size);
    events.extend(generator.finals());
    let started = Instant::now();
    let results = checkers::check_all(&events);
    let spent = started.elapsed();
    assert_valid(&results, size);
    (events.len(), spent)
}

fn row(mode: &str, events: usize, spent: Duration, tracked: &str) {
    let seconds = spent.as_secs_f64();
    let rate = events as f64 / seconds.max(1e-9);
    println!("{mode:<9} {events:>11} {seconds:>9.3} {rate:>13.0} {tracked:>9} {:>10.0}", peak_mib());
}

fn main() {
    let only: Option<usize> = std::env::args().skip(1).find_map(|arg| arg.parse().ok());
    let sizes: Vec<usize> = match only {
        Some(size) => vec![size],
        None if std::env::var_os("FENCELAB_BENCH_SMOKE").is_some() => vec![10_000],
        None => vec![10_000, 100_000, 1_000_000, 10_000_000],
    };
    println!("{:<9} {:>11} {:>9} {:>13} {:>9} {:>10}", "mode", "events", "seconds", "events/s", "tracked", "VmHWM MiB");
    for size in sizes {
        let (events, spent, tracked) = streamed(size);
        row("stream", events, spent, &tracked.to_string());
        if size <= 1_000_000 {
            let (events, spent) = held(size);
            row("check_all", events, spent, "-");
        }
    }
}
