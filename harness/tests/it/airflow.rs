//! Apache Airflow 3.3.2, unmodified and observed (`systems/airflow/`): its own scheduler, API
//! server and DAG processor on the run's PostgreSQL, its own edge workers as the runners,
//! each worker's HTTP link through its own fault proxy, judged on what Airflow's own records
//! say. A chaos run ends with a verdict that names what it cannot judge, and nothing of
//! Airflow is left after a run, after Ctrl-C and after a failed start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::bullmq::skip_for;

/// A run of Airflow: its database, scheduler, API server and workers start in about 30 s
/// here; the bound is for a loaded machine.
const AIRFLOW_WAIT_MAX: Duration = Duration::from_secs(300);

fn airflow_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../systems/airflow")
}

/// Skips (or, under `FENCELAB_REQUIRE_ALL=1`, fails) when the pinned virtualenv or
/// PostgreSQL's server is absent.
fn airflow_missing() -> bool {
    let airflow = airflow_dir().join(".venv/bin/airflow");
    let postgres = lab::pg::unavailable();
    skip_for(vec![
        (!airflow.exists()).then_some("systems/airflow/.venv is absent (run systems/airflow/install.sh)"),
        postgres.as_deref(),
    ])
}

/// The processes of a run in `dir`: those whose command line names it or whose working
/// folder is in it. Airflow's processes rename themselves (`airflow edge worker: r1`,
/// `airflow api_server -- …`); every one of them works in its role's folder of the run.
fn processes_of(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let words = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let cwd = std::fs::read_link(entry.path().join("cwd")).unwrap_or_default();
        if words.contains(&needle) || cwd.starts_with(dir) {
            found.push(format!("{}: {words} (in {})", entry.file_name().to_string_lossy(), cwd.display()));
        }
    }
    found
}

/// Waits (bounded) until no process of the run is left: a stopped group is reaped a moment
/// later, and a PID namespace's processes after its first.
async fn none_left(dir: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !processes_of(dir).is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(processes_of(dir), Vec::<String>::new(), "processes of the run are left");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_airflow_chaos_run_ends_with_a_verdict_naming_what_it_cannot_judge_and_leaves_nothing() {
    if airflow_missing() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let system = airflow_dir().join("system.toml");
    let args = [
        "run".as_ref(),
        "--system".as_ref(),
        system.as_os_str(),
        "--nemesis".as_ref(),
        "all".as_ref(),
        "--time-limit".as_ref(),
        "20".as_ref(),
        "--rate".as_ref(),
        "1".as_ref(),
        "--seed".as_ref(),
        "3".as_ref(),
        "--store".as_ref(),
        store.path().as_os_str(),
    ];
    let (code, text) = super::fencelab_output(&args, AIRFLOW_WAIT_MAX).await;
    assert!(matches!(code, Some(0..=2)), "a verdict, not {code:?}:\n{text}");
    // What the run could not judge is named: with no lease, the lease rules are unknown.
    assert!(text.contains("heartbeat-resurrection   unknown  the system grants no lease"), "{text}");
    assert!(text.contains("runner-contract          unknown"), "{text}");
    assert!(text.contains("not run      conflicting-results: the system lacks `runner-log`"), "{text}");
    let folder = std::fs::canonicalize(store.path().join("latest")).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap()).unwrap();
    let absent = config["system"]["absent"].to_string();
    for part in ["lease", "runner-log", "restart"] {
        assert!(absent.contains(&format!("\"{part}\"")), "config.json names {part}: {absent}");
    }
    assert_eq!(config["run"]["db"], "postgres", "Airflow's metadata database is the run's PostgreSQL");
    none_left(store.path()).await;
}

/// Airflow's system file with its roles run from `systems/airflow/` and the target's command
/// replaced by `target`: written into `dir`.
fn system_with_target(dir: &Path, target: &str) -> PathBuf {
    let text = std::fs::read_to_string(airflow_dir().join("system.toml")).unwrap();
    let home = airflow_dir().canonicalize().unwrap().display().to_string();
    let (head, rest) = text.split_once("[target]\n").unwrap();
    let (_, tail) = rest.split_once("[runner]\n").unwrap();
    let head = head.replace("[control_plane]\n", &format!("[control_plane]\ncwd = \"{home}\"\n"));
    let text = format!("{head}[target]\ncommand = {target}\n\n[runner]\ncwd = \"{home}\"\n{tail}");
    let file = dir.join("airflow.toml");
    std::fs::write(&file, text).unwrap();
    file
}

/// A target that does not start fails the start once the control plane, started beside it,
/// is up (Airflow's schema made, its API server, scheduler and DAG processor running), and
/// the harness's stop of the control plane's group leaves no process of Airflow behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_start_leaves_no_airflow_process() {
    if airflow_missing() {
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
    let (code, text) = super::fencelab_output(&args, AIRFLOW_WAIT_MAX).await;
    assert_eq!(code, Some(255), "a target that does not start fails the start:\n{text}");
    // The target's failure, or on a machine loaded enough to keep Airflow from answering within
    // its `ready_ms`, the control plane's: a failed start either way.
    assert!(text.contains("role `target`") || text.contains("role `control_plane`"), "{text}");
    let control_log = std::fs::read_dir(store.path())
        .unwrap()
        .flatten()
        .filter(|entry| entry.path().is_dir())
        .flat_map(|entry| walk(&entry.path()))
        .find(|path| path.ends_with("lab/control.log"))
        .map(|path| std::fs::read_to_string(path).unwrap())
        .unwrap_or_default();
    assert!(control_log.contains("serving on"), "the recorder started Airflow:\n{control_log}");
    none_left(store.path()).await;
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_during_an_airflow_run_stops_every_airflow_process_and_still_writes_the_history() {
    use tokio::io::AsyncBufReadExt;
    if airflow_missing() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let system = airflow_dir().join("system.toml");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"))
        // A time limit the start (30 s here, minutes on a loaded machine) cannot use up, so
        // that the run is in its chaos phase when it is interrupted.
        .args(["run", "--nemesis", "kill", "--time-limit", "400", "--system"])
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
    tokio::time::timeout(AIRFLOW_WAIT_MAX, progress).await.expect("the run makes progress in time");
    let running = processes_of(store.path());
    assert!(running.iter().any(|process| process.contains("edge worker")), "edge workers run: {running:#?}");
    assert!(running.iter().any(|process| process.contains("scheduler")), "the scheduler runs: {running:#?}");
    // SAFETY: kill(2) with the pid of the child started above.
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGINT) };
    let status = tokio::time::timeout(AIRFLOW_WAIT_MAX, child.wait()).await.expect("it stops in time").unwrap();
    assert_eq!(status.code(), Some(2), "an interrupted run is unknown");
    none_left(store.path()).await;
    let folder = std::fs::canonicalize(store.path().join("latest")).unwrap();
    assert!(std::fs::metadata(folder.join("history.jsonl")).unwrap().len() > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn conform_says_it_does_not_apply_to_airflow_and_starts_nothing() {
    let store = tempfile::tempdir().unwrap();
    let system = airflow_dir().join("system.toml");
    let args =
        ["conform".as_ref(), "--system".as_ref(), system.as_os_str(), "--store".as_ref(), store.path().as_os_str()];
    let (code, text) = super::fencelab_output(&args, Duration::from_secs(30)).await;
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("conform does not apply to an observed system"), "{text}");
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 0, "nothing was written");
}

/// The recorder decides nothing: `systems/airflow/test_recorder.py` gives the recorder's own
/// code what Airflow recorded about one job (a try failed by the heartbeat timeout and
/// retried; a try that reported its own end), checks the exact ledger entries and job views,
/// and has this fencelab judge each ledger (`evidence --lacks lease`, `check`): the retry is
/// found, the try run once is clean.
#[tokio::test(flavor = "multi_thread")]
async fn airflows_recorder_maps_only_what_airflow_recorded_and_fencelab_judges_it() {
    if airflow_missing() {
        return;
    }
    let mut command = tokio::process::Command::new(airflow_dir().join(".venv/bin/python"));
    command
        .args(["-m", "unittest", "-v", "test_recorder.py"])
        .current_dir(airflow_dir())
        .env("FENCELAB_BIN", env!("CARGO_BIN_EXE_fencelab"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let output =
        tokio::time::timeout(Duration::from_secs(120), command.output()).await.expect("it ends in time").unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("Ran 6 tests"), "{text}");
}
