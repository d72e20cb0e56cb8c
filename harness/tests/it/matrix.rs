//! The short matrix: every planted bug is caught by a real run under the faults that expose
//! it, and the correct lab under every fault is not accused. A regression in a checker, a
//! fault or the lab fails here.

use std::path::Path;

use harness::matrix::{exposing_faults, run_cell, store_args, Cell};
use lab::bugs::Bug;

/// Seconds of each run.
const TIME_LIMIT_S: u64 = 25;
/// Seeds tried per bug before it counts as missed (timing on a loaded machine varies).
const SEEDS_MAX: u64 = 3;
/// Runs at once.
const PARALLEL: usize = 5;

/// The checker each PostgreSQL bug must trip: the check written for it.
const CAUGHT_BY: &[(&str, &str)] = &[
    ("replica-clock", "clock-authority"),
    ("claim-without-lock", "single-owner"),
    ("sweeper-without-lock", "rules-model"),
    ("retry-lost-commit", "ledger-completeness"),
];

fn program() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_fencelab"))
}

/// Runs `bug` with seeds 1, 2, ... until one run detects it; returns every run made.
async fn until_detected(store: std::path::PathBuf, bug: Bug) -> Vec<Cell> {
    let mut cells = Vec::new();
    for seed in 1..=SEEDS_MAX {
        let cell = run_cell(program(), &store, Some(bug), &exposing_faults(bug), seed, TIME_LIMIT_S).await;
        let detected = cell.detected();
        cells.push(cell);
        if detected {
            break;
        }
    }
    cells
}

#[tokio::test(flavor = "multi_thread")]
async fn every_planted_bug_is_caught_and_the_correct_lab_is_not() {
    let store = tempfile::tempdir().unwrap();
    let mut running = tokio::task::JoinSet::new();
    let mut results: Vec<(Option<Bug>, Vec<Cell>)> = Vec::new();
    let mut work: Vec<Option<Bug>> = Bug::ALL.iter().copied().map(Some).collect();
    if let Some(why) = lab::pg::unavailable() {
        let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
        assert!(!require_all, "PostgreSQL is not installed (Debian: postgresql), and FENCELAB_REQUIRE_ALL=1");
        eprintln!("SKIPPED: the planted bugs that need PostgreSQL: {why}");
        work.retain(|bug| bug.is_none_or(|bug| store_args(bug).is_empty()));
    }
    work.push(None);
    for bug in work {
        if running.len() >= PARALLEL {
            results.push(running.join_next().await.unwrap().unwrap());
        }
        let store = store.path().to_path_buf();
        running.spawn(async move {
            match bug {
                Some(bug) => (Some(bug), until_detected(store, bug).await),
                None => (None, vec![run_cell(program(), &store, None, "all", 1, TIME_LIMIT_S).await]),
            }
        });
    }
    while let Some(done) = running.join_next().await {
        results.push(done.unwrap());
    }
    let mut failures = Vec::new();
    for (bug, cells) in &results {
        let last = cells.last().unwrap();
        let pinned = bug.and_then(|bug| CAUGHT_BY.iter().find(|(name, _)| *name == bug.name()));
        if let Some((name, checker)) = pinned.filter(|_| last.detected()) {
            if !last.checkers.iter().any(|found| found == checker) {
                failures
                    .push(format!("{name} was caught, but not by {checker}: {:?}; {}", last.checkers, last.command));
            }
        }
        match bug {
            Some(bug) if !last.detected() => failures.push(format!(
                "{bug} was not detected in {} runs; repeat one: {} ({})",
                cells.len(),
                last.command,
                last.verdict
            )),
            None if !last.verdict.is(results::Overall::Valid) => failures.push(format!(
                "the correct lab was judged {} by {:?}; repeat: {}; run folder {:?}",
                last.verdict, last.checkers, last.command, last.folder
            )),
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
