//! Buildbot 4.3.0, unmodified and observed (`systems/buildbot/`): its own master and workers,
//! each worker's PB link through its own fault proxy, judged on what Buildbot's own database
//! records. A worker lost mid-build is requeued silently (the scenario), a chaos run ends
//! with a verdict that names what it cannot judge and leaves no Buildbot process behind, and
//! conform says it does not apply.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::bullmq::skip_for;

/// A run or scenario of Buildbot: its master and workers start in a few seconds; the bound
/// is for a loaded machine.
const BUILDBOT_WAIT_MAX: Duration = Duration::from_secs(240);

fn buildbot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../systems/buildbot")
}

/// Skips (or, under `FENCELAB_REQUIRE_ALL=1`, fails) when the pinned virtualenv is absent.
fn buildbot_missing() -> bool {
    let python = buildbot_dir().join(".venv/bin/python");
    skip_for(vec![(!python.exists()).then_some("systems/buildbot/.venv is absent (run systems/buildbot/install.sh)")])
}

/// The processes whose command line names `dir`: every process a run in `dir` started does.
fn processes_naming(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let words = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if words.contains(&needle) {
            found.push(format!("{}: {words}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

/// Waits (bounded) until no process names `dir`: a stopped group is reaped a moment later.
async fn none_left(dir: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !processes_naming(dir).is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(processes_naming(dir), Vec::<String>::new(), "processes of the run are left");
}

/// Every scenario in `systems/buildbot/scenarios/` passes against Buildbot: a worker killed
/// mid-build (requeued, found as a silent requeue), and the master's side of a worker's
/// connection reset mid-build (requeued to the other worker while the first still deploys:
/// a stale step on the unfenced target). The second also holds the heal of a system whose
/// runner clocks cannot be moved (it failed with "this system's runner clocks cannot be
/// moved" while the heal reset clocks it did not have).
#[tokio::test(flavor = "multi_thread")]
async fn every_buildbot_scenario_passes_and_leaves_nothing() {
    if buildbot_missing() {
        return;
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(buildbot_dir().join("scenarios"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    let system = buildbot_dir().join("system.toml");
    for scenario in files {
        let store = tempfile::tempdir().unwrap();
        let args = [
            "scenario".as_ref(),
            "run".as_ref(),
            scenario.as_os_str(),
            "--system".as_ref(),
            system.as_os_str(),
            "--store".as_ref(),
            store.path().as_os_str(),
        ];
        let (code, text) = super::fencelab_output(&args, BUILDBOT_WAIT_MAX).await;
        let repeat = format!("fencelab scenario run {} --system {}", scenario.display(), system.display());
        assert_eq!(code, Some(0), "{text}\nrepeat with: {repeat}");
        assert!(!text.contains("FAILED"), "{text}\nrepeat with: {repeat}");
        none_left(store.path()).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_buildbot_chaos_run_ends_with_a_verdict_naming_what_it_cannot_judge_and_leaves_nothing() {
    if buildbot_missing() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let system = buildbot_dir().join("system.toml");
    let args = [
        "run".as_ref(),
        "--system".as_ref(),
        system.as_os_str(),
        "--nemesis".as_ref(),
        "all".as_ref(),
        "--time-limit".as_ref(),
        "12".as_ref(),
        "--seed".as_ref(),
        "3".as_ref(),
        "--store".as_ref(),
        store.path().as_os_str(),
    ];
    let (code, text) = super::fencelab_output(&args, BUILDBOT_WAIT_MAX).await;
    assert!(matches!(code, Some(1) | Some(2)), "a verdict, not {code:?}:\n{text}");
    // What the run could not judge is named: with no lease, the lease rules are unknown
    // (their sentence is the literal histories' in checkers/tests/it/observed.rs).
    assert!(text.contains("single-owner             unknown"), "{text}");
    assert!(text.contains("heartbeat-resurrection   unknown"), "{text}");
    assert!(text.contains("not run      conflicting-results: the system lacks `runner-log`"), "{text}");
    assert!(text.contains("not run      duplicate-results (replay)"), "{text}");
    let folder = std::fs::canonicalize(store.path().join("latest")).unwrap();
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("results.json")).unwrap()).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap()).unwrap();
    let absent = config["system"]["absent"].to_string();
    assert!(absent.contains("\"lease\"") && absent.contains("\"runner-log\""), "config.json names them: {absent}");
    let sources = results["sources"].to_string();
    assert!(!sources.contains("runner-logs"), "an observed system's history holds no runner logs: {sources}");
    none_left(store.path()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conform_says_it_does_not_apply_to_buildbot_and_starts_nothing() {
    let store = tempfile::tempdir().unwrap();
    let system = buildbot_dir().join("system.toml");
    let args =
        ["conform".as_ref(), "--system".as_ref(), system.as_os_str(), "--store".as_ref(), store.path().as_os_str()];
    let (code, text) = super::fencelab_output(&args, Duration::from_secs(30)).await;
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("conform does not apply to an observed system"), "{text}");
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 0, "nothing was written");
}

/// Buildbot's system file with its roles run from `systems/buildbot/` and the target's
/// command replaced by `target`: written into `dir`.
fn system_with_target(dir: &Path, target: &str) -> PathBuf {
    let text = std::fs::read_to_string(buildbot_dir().join("system.toml")).unwrap();
    let home = buildbot_dir().canonicalize().unwrap().display().to_string();
    let (head, rest) = text.split_once("[target]\n").unwrap();
    let (_, tail) = rest.split_once("[runner]\n").unwrap();
    let head = head.replace("[control_plane]\n", &format!("[control_plane]\ncwd = \"{home}\"\n"));
    let text = format!("{head}[target]\ncommand = {target}\n\n[runner]\ncwd = \"{home}\"\n{tail}");
    let file = dir.join("buildbot.toml");
    std::fs::write(&file, text).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_start_leaves_no_buildbot_process() {
    if buildbot_missing() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let system = system_with_target(store.path(), r#"["{fencelab}", "lab", "target", "--no-such-flag"]"#);
    let args = [
        "run".as_ref(),
        "--system".as_ref(),
        system.as_os_str(),
        "--time-limit".as_ref(),
        "5".as_ref(),
        "--store".as_ref(),
        store.path().as_os_str(),
    ];
    let (code, text) = super::fencelab_output(&args, BUILDBOT_WAIT_MAX).await;
    assert_eq!(code, Some(255), "a target that does not start fails the start:\n{text}");
    assert!(text.contains("role `target`"), "{text}");
    none_left(store.path()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_during_a_buildbot_run_stops_every_buildbot_process_and_still_writes_the_history() {
    use tokio::io::AsyncBufReadExt;
    if buildbot_missing() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let system = buildbot_dir().join("system.toml");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"))
        .args(["run", "--nemesis", "kill", "--time-limit", "60", "--system"])
        .arg(&system)
        .arg("--store")
        .arg(store.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    // The first progress line comes once the system is up and jobs are being submitted.
    let progress = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("[chaos]") {
                return;
            }
        }
        panic!("the run ended before it made progress");
    };
    tokio::time::timeout(BUILDBOT_WAIT_MAX, progress).await.expect("the run makes progress in time");
    assert!(!processes_naming(store.path()).is_empty(), "Buildbot runs under the run's folder");
    // SAFETY: kill(2) with the pid of the child started above.
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGINT) };
    let status = tokio::time::timeout(BUILDBOT_WAIT_MAX, child.wait()).await.expect("it stops in time").unwrap();
    assert_eq!(status.code(), Some(2), "an interrupted run is unknown");
    none_left(store.path()).await;
    let folder = std::fs::canonicalize(store.path().join("latest")).unwrap();
    assert!(std::fs::metadata(folder.join("history.jsonl")).unwrap().len() > 0);
}

/// The recorder decides nothing: `systems/buildbot/test_recorder.py` writes one job's records
/// into Buildbot's own schema (a worker lost mid-build, and a build run once), reads them with
/// the recorder's own code into exact ledger entries, and has this fencelab judge each ledger
/// (`evidence --lacks lease`, `check`): the requeue is found, the build run once is clean.
#[tokio::test(flavor = "multi_thread")]
async fn buildbots_recorder_maps_only_what_buildbot_recorded_and_fencelab_judges_it() {
    if buildbot_missing() {
        return;
    }
    let mut command = tokio::process::Command::new(buildbot_dir().join(".venv/bin/python"));
    command
        .args(["-m", "unittest", "-v", "test_recorder.py"])
        .current_dir(buildbot_dir())
        .env("FENCELAB_BIN", env!("CARGO_BIN_EXE_fencelab"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let output =
        tokio::time::timeout(Duration::from_secs(120), command.output()).await.expect("it ends in time").unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("Ran 5 tests"), "{text}");
}
