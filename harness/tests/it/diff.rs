//! `fencelab diff RUN_A RUN_B` from outside: two run folders whose results.json the real
//! renderer wrote differ in verdict, anomalies, faults, flags and timings, and the binary says
//! so; the same folder twice has no differences; bad input exits 254 with a clear message.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use checkers::{Anomaly, CheckerResult, Verdict};
use workloads::faults::{Fault, FaultKind, Variant};

const BOUND: Duration = Duration::from_secs(120);

fn fault(at_ms: u64, kind: FaultKind, variant: Variant) -> Fault {
    Fault { at_ms, duration_ms: 3000, kind, runner: Some(1), variant }
}

/// A run folder holding a results.json for a run with `anomalies` stale completions.
fn run_folder(folder: &Path, command: &str, duration_ms: u64, anomalies: usize, faults: &[Fault]) {
    let anomaly = |n: usize| Anomaly {
        checker: "stale-completion".into(),
        kind: "superseded-result-accepted".into(),
        job: Some(format!("j{n}")),
        attempts: vec![format!("j{n}-a1")],
        runners: vec!["r1".into()],
        fences: vec![1],
        key: None,
        events: vec![],
        message: format!("late report for j{n}-a1 accepted"),
    };
    let verdict = if anomalies == 0 {
        Verdict::Valid
    } else {
        Verdict::Invalid { anomalies: (0..anomalies).map(anomaly).collect() }
    };
    let run = results::Run {
        test_name: "chaos".into(),
        seed: 5,
        command: command.into(),
        started_at: "2026-12-01T00:00:00Z".into(),
        duration_ms,
        config: serde_json::json!({"seed": 5}),
        schedule: serde_json::to_value(faults).unwrap(),
        checkers: vec![CheckerResult { checker: "stale-completion".into(), description: "d".into(), verdict }],
        complete: true,
    };
    std::fs::create_dir_all(folder).unwrap();
    std::fs::write(folder.join("results.json"), results::results_json(&run, &[])).unwrap();
}

fn diff(a: &Path, b: &Path) -> (Option<i32>, String) {
    let args: [&OsStr; 3] = ["diff".as_ref(), a.as_os_str(), b.as_os_str()];
    tokio::runtime::Runtime::new().unwrap().block_on(crate::fencelab_output(&args, BOUND))
}

#[test]
fn diff_names_what_changed_between_two_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("yesterday"), dir.path().join("today"));
    let reconnect = |at| fault(at, FaultKind::Reconnects, Variant::CutLinks);
    run_folder(&a, "fencelab run --seed 5 --time-limit 20 --store s", 20_000, 0, &[reconnect(2000), reconnect(6000)]);
    let today = [reconnect(2000), fault(9000, FaultKind::Kill, Variant::KillRunner)];
    run_folder(&b, "fencelab run --seed 5 --time-limit 30 --bug accept-stale-result --store s", 31_250, 2, &today);
    let (code, said) = diff(&a, &b);
    assert_eq!(code, Some(0), "{said}");
    for line in [
        "seed 5, valid, 20000 ms",
        "  overall                      valid → invalid",
        "  stale-completion             valid → invalid (2 anomalies)",
        "  stale-completion / superseded-result-accepted 0 → 2",
        "  only in A: at 6000 ms for 3000 ms: reconnects on r2 {\"how\":\"cut-links\"}",
        "  only in B: at 9000 ms for 3000 ms: kill on r2 {\"how\":\"kill-runner\"}",
        "  --bug                        (absent) → accept-stale-result",
        "  --time-limit                 20 → 30",
        "  duration_ms                  20000 → 31250  (+11250)",
        "differs in: verdicts, anomalies by checker and kind, fault schedule, run flags (from the repeat commands), timings",
    ] {
        assert!(said.contains(line), "missing {line:?} in:\n{said}");
    }
    let (code, said) = diff(&a, &a);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("no differences in verdicts, anomalies, faults, flags, timings or counts"), "{said}");
}

#[test]
fn diff_of_something_that_is_not_a_run_folder_exits_254() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    run_folder(&good, "fencelab run --seed 5", 1000, 0, &[]);
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let garbage = dir.path().join("garbage");
    std::fs::create_dir_all(&garbage).unwrap();
    std::fs::write(garbage.join("results.json"), "{\"schema\": 7").unwrap();
    let other = dir.path().join("other-schema");
    std::fs::create_dir_all(&other).unwrap();
    let text = std::fs::read_to_string(good.join("results.json")).unwrap();
    std::fs::write(other.join("results.json"), text.replace("fencelab.results/1", "fencelab.results/2")).unwrap();
    let cases = [
        (dir.path().join("missing"), "missing is not a run folder: cannot read its results.json"),
        (empty, "empty is not a run folder: cannot read its results.json"),
        (garbage, "not a results.json"),
        (other, "results.json schema `fencelab.results/2`, expected `fencelab.results/1`"),
    ];
    for (bad, message) in cases {
        for (a, b) in [(&good, &bad), (&bad, &good)] {
            let (code, said) = diff(a, b);
            assert_eq!(code, Some(254), "{said}");
            assert!(said.contains("fencelab diff: ") && said.contains(message), "{said}");
        }
    }
}
