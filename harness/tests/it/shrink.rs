//! `fencelab shrink` end to end: a real run that found a planted bug is cut down, each try a
//! real scenario run, to a smaller scenario that still finds it; bad input exits 254.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use super::run::run;

/// Longest a whole shrink may take (generous: the machine may be loaded).
const SHRINK_WAIT_MAX: Duration = Duration::from_secs(600);

async fn shrink(folder: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut all: Vec<&std::ffi::OsStr> = vec!["shrink".as_ref(), folder.as_os_str()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    super::fencelab_output(&all, SHRINK_WAIT_MAX).await
}

/// `overwrite-terminal-result` under a conflicting result, with a harmless latency fault on
/// the other runner before it: the shrink starts from what the history says about the
/// anomaly (its job, the runner that held it, the conflicting result that named it), so
/// its first try is already that job alone with that fault, at most two jobs and two
/// runners; the scenario it writes still finds the overwritten outcome on its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_found_a_bug_shrinks_to_a_smaller_scenario_that_still_finds_it() {
    let dir = tempfile::tempdir().unwrap();
    let schedule = dir.path().join("schedule.json");
    let faults = json!([
        {"at_ms": 1500, "duration_ms": 500, "kind": "delayed-heartbeats", "runner": 1,
         "variant": {"how": "latency", "latency_ms": 50}},
        {"at_ms": 3500, "duration_ms": 0, "kind": "conflicting-results", "runner": 0, "variant": {"how": "conflict"}},
    ]);
    std::fs::write(&schedule, serde_json::to_vec(&faults).unwrap()).unwrap();
    let schedule = schedule.to_string_lossy().into_owned();
    let args = ["--seed", "3", "--time-limit", "7", "--runners", "2", "--rate", "3", "--lease-ms", "600"];
    let finished = run(&[&args[..], &["--bug", "overwrite-terminal-result", "--schedule", &schedule]].concat()).await;
    assert_eq!(finished.code, Some(1), "the bug is found:\n{}\n{}", finished.stdout, finished.stderr);
    let folder = finished.folder();
    let out = dir.path().join("shrunk.toml");
    let out_arg = out.to_string_lossy().into_owned();
    let (code, text) =
        shrink(&folder, &["--checker", "terminal-stability", "--tries", "8", "--confirm", "1", "--out", &out_arg])
            .await;
    let repeat = format!("repeat with: fencelab shrink {} --checker terminal-stability --tries 8", folder.display());
    assert_eq!(code, Some(0), "{text}\n{repeat}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(folder.join("shrink/shrink.json")).unwrap()).unwrap();
    let (before, after) = (&report["before"], &report["after"]);
    assert_eq!(before["faults"], 2, "{report}");
    assert_eq!(after["faults"], 1, "the harmless fault is gone: {report}\n{repeat}");
    assert!(after["jobs"].as_u64() < before["jobs"].as_u64(), "{report}\n{repeat}");
    assert!(after["steps"].as_u64() < before["steps"].as_u64(), "{report}\n{repeat}");
    assert_eq!(report["confirmed"], json!([1, 1]), "{report}\n{repeat}");
    assert!(after["jobs"].as_u64() <= Some(2) && after["runners"].as_u64() <= Some(2), "{report}\n{repeat}");
    let tries = report["tries"].as_array().unwrap();
    assert!(!tries.is_empty() && tries.len() <= 8, "{report}");
    // The first try is the anomaly's story, and it reproduced: nothing was halved to find it.
    assert_eq!((tries[0]["pass"].as_str(), tries[0]["reproduced"].as_bool()), (Some("story"), Some(true)), "{report}");
    assert!(tries[0]["size"]["jobs"].as_u64() <= Some(2), "{report}");
    assert!(text.contains("size") && text.contains("before") && text.contains("after"), "{text}");
    // The written scenario is a scenario: it parses, holds the remaining fault, and expects the anomaly.
    let scenario = std::fs::read_to_string(&out).unwrap();
    assert!(scenario.contains("how = \"conflict\"") && !scenario.contains("how = \"latency\""), "{scenario}");
    assert!(scenario.contains("checker = \"terminal-stability\"\nverdict = \"invalid\""), "{scenario}");
    assert!(scenario.contains("operator = \"automatic\"") && scenario.contains("overwrite-terminal-result"));
    // The shrunk scenario's own report, as a reader meets it in Chromium: its story's
    // faults on the runners they hit, grouped anomalies, a timeline zoomed to the incident.
    if crate::browser::available() {
        let store = dir.path().join("shrunk-store");
        let args = ["scenario".as_ref(), "run".as_ref(), out.as_os_str(), "--store".as_ref(), store.as_os_str()];
        let (code, text) = super::fencelab_output(&args, SHRINK_WAIT_MAX).await;
        let repeat = format!("fencelab scenario run {}", out.display());
        assert_eq!(code, Some(0), "the shrunk scenario passes: {text}\n{repeat}");
        let folder = text.lines().find_map(|line| line.split("run folder ").nth(1)).expect("the run folder is said");
        let folder = Path::new(folder.trim());
        let history = verdict::check::read_history(&folder.join("history.jsonl")).expect("a valid history");
        super::report::check_page(folder, &history, &repeat);
    }
    // Against the correct lab the same steps find nothing: the scenario is about the bug.
    let correct = dir.path().join("correct.toml");
    std::fs::write(&correct, scenario.replace("bugs = [\"overwrite-terminal-result\"]", "bugs = []")).unwrap();
    let store = dir.path().join("correct-store");
    let args = ["scenario".as_ref(), "run".as_ref(), correct.as_os_str(), "--store".as_ref(), store.as_os_str()];
    let (code, text) = super::fencelab_output(&args, SHRINK_WAIT_MAX).await;
    assert_eq!(code, Some(1), "the correct lab shows no overwritten outcome: {text}");
    assert!(text.contains("FAILED  expect 1: expected checker = \"terminal-stability\""), "{text}");

    // Bad input changes nothing and runs nothing: exit 254 with the reason.
    let (code, text) = shrink(&folder, &["--checker", "clock-authority", "--out", &out_arg]).await;
    assert_eq!(code, Some(254), "{text}");
    assert!(text.contains("--checker clock-authority: found no anomaly in this run"), "{text}");
    let (code, text) = shrink(&folder, &["--checker", "no-such-checker"]).await;
    assert_eq!((code, text.contains("unknown checker `no-such-checker`")), (Some(254), true), "{text}");
    let (code, text) = shrink(&folder, &["--tries", "0", "--out", &out_arg]).await;
    assert_eq!((code, text.contains("--tries must be 1..=500")), (Some(254), true), "{text}");
    let (code, text) = shrink(dir.path(), &[]).await;
    assert_eq!((code, text.contains("config.json")), (Some(254), true), "{text}");
    let try_folder = tries[0]["folder"].as_str().unwrap();
    let (code, text) = shrink(Path::new(try_folder), &[]).await;
    assert_eq!((code, text.contains("is a scenario's run folder")), (Some(254), true), "{text}");
    let written = std::fs::read_to_string(&out).unwrap();
    assert_eq!(written, scenario, "a refused shrink leaves the written scenario alone");

    // A shrink killed mid-try takes its try and the try's lab with it, at once: the first
    // try (every job up to the anomaly, then settling) would run on for seconds.
    let work = dir.path().join("killed");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    command.arg("shrink").arg(&folder).arg("--work").arg(&work).arg("--out").arg(dir.path().join("killed.toml"));
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::null()).kill_on_drop(true).spawn().unwrap();
    let lab_started = async {
        while !lab_running(&work) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(SHRINK_WAIT_MAX, lab_started).await.expect("the first try starts its lab");
    // SAFETY: kill(2) on the child we started.
    assert_eq!(unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGKILL) }, 0);
    child.wait().await.unwrap();
    let at_once = Duration::from_secs(2);
    assert_eq!(super::run::leftovers_within(&work, at_once).await, Vec::<String>::new());
}

/// Whether a runner of a try under `work` is running.
fn lab_running(work: &Path) -> bool {
    let needle = work.to_string_lossy().into_owned();
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        cmdline.contains(&needle) && cmdline.contains(" lab runner ")
    })
}
