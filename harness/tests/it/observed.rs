//! What the tests of the observed systems (`buildbot.rs`, `airflow.rs`) share: the system's
//! folder, the processes a run leaves, the system file with another target, a run
//! interrupted with Ctrl-C, conform's refusal, and the recorder's own Python tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// `systems/NAME/`, the observed system's folder.
pub fn system_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../systems").join(name)
}

/// The processes of a run in `dir`: those whose command line names it or whose working
/// folder is in it. Airflow's processes rename themselves (`airflow edge worker: r1`,
/// `airflow api_server -- …`); every one of them works in its role's folder of the run.
pub fn processes_of(dir: &Path) -> Vec<String> {
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

/// Runs every scenario in the observed system `name`'s `scenarios/` folder (at least
/// `count_min` of them) against its system file, each in a store of its own; each must pass
/// and leave none of the system's processes behind.
pub async fn every_scenario_passes(name: &str, count_min: usize, wait_max: Duration) {
    let dir = system_dir(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("scenarios"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= count_min, "{files:?}");
    let system = dir.join("system.toml");
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
        let (code, text) = super::fencelab_output(&args, wait_max).await;
        let repeat = format!("fencelab scenario run {} --system {}", scenario.display(), system.display());
        assert_eq!(code, Some(0), "{text}\nrepeat with: {repeat}");
        assert!(!text.contains("FAILED"), "{text}\nrepeat with: {repeat}");
        none_left(store.path()).await;
    }
}

/// Waits (bounded) until no process of the run is left: a stopped group is reaped a moment
/// later, and a PID namespace's processes after its first.
pub async fn none_left(dir: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !processes_of(dir).is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(processes_of(dir), Vec::<String>::new(), "processes of the run are left");
}

/// The system file of `systems/NAME/` with its roles run from that folder and the target's
/// command replaced by `target`: written into `dir`.
fn system_with_target(name: &str, dir: &Path, target: &str) -> PathBuf {
    let text = std::fs::read_to_string(system_dir(name).join("system.toml")).unwrap();
    let home = system_dir(name).canonicalize().unwrap().display().to_string();
    let (head, rest) = text.split_once("[target]\n").unwrap();
    let (_, tail) = rest.split_once("[runner]\n").unwrap();
    let head = head.replace("[control_plane]\n", &format!("[control_plane]\ncwd = \"{home}\"\n"));
    let text = format!("{head}[target]\ncommand = {target}\n\n[runner]\ncwd = \"{home}\"\n{tail}");
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, text).unwrap();
    file
}

/// A run of `systems/NAME/` into `store` whose target does not start (`lab target
/// --no-such-flag`): the start fails (255) within `wait`; what the run said.
pub async fn start_with_a_failing_target(name: &str, store: &Path, wait: Duration) -> String {
    let system = system_with_target(name, store, r#"["{fencelab}", "lab", "target", "--no-such-flag"]"#);
    let args = [
        "run".as_ref(),
        "--system".as_ref(),
        system.as_os_str(),
        "--time-limit".as_ref(),
        "5".as_ref(),
        "--store".as_ref(),
        store.as_os_str(),
    ];
    let (code, text) = super::fencelab_output(&args, wait).await;
    assert_eq!(code, Some(255), "a target that does not start fails the start:\n{text}");
    text
}

/// `fencelab run --nemesis kill --time-limit SECONDS` of `system` into `store`, once it has
/// made progress (its first `[chaos]` line, within `wait`): the system is up and jobs are
/// being submitted.
pub async fn run_until_progress(system: &Path, store: &Path, seconds: &str, wait: Duration) -> tokio::process::Child {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"))
        .args(["run", "--nemesis", "kill", "--time-limit", seconds, "--system"])
        .arg(system)
        .arg("--store")
        .arg(store)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let progress = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("[chaos]") {
                return;
            }
        }
        panic!("the run ended before it made progress");
    };
    tokio::time::timeout(wait, progress).await.expect("the run makes progress in time");
    child
}

/// Ctrl-C to the run `child` in `store`: it stops within `wait` as unknown, leaves no process
/// of the run, and still writes the history.
pub async fn interrupt(mut child: tokio::process::Child, store: &Path, wait: Duration) {
    // SAFETY: kill(2) with the pid of the child started by `run_until_progress`.
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGINT) };
    let status = tokio::time::timeout(wait, child.wait()).await.expect("it stops in time").unwrap();
    assert_eq!(status.code(), Some(2), "an interrupted run is unknown");
    none_left(store).await;
    let folder = std::fs::canonicalize(store.join("latest")).unwrap();
    assert!(std::fs::metadata(folder.join("history.jsonl")).unwrap().len() > 0);
}

/// `fencelab conform` on `systems/NAME/`: it does not apply to an observed system, and
/// nothing is written.
pub async fn conform_does_not_apply(name: &str) {
    let store = tempfile::tempdir().unwrap();
    let system = system_dir(name).join("system.toml");
    let args =
        ["conform".as_ref(), "--system".as_ref(), system.as_os_str(), "--store".as_ref(), store.path().as_os_str()];
    let (code, text) = super::fencelab_output(&args, Duration::from_secs(30)).await;
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("conform does not apply to an observed system"), "{text}");
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 0, "nothing was written");
}

/// `systems/NAME/test_recorder.py`, run with the system's own virtualenv and this fencelab
/// (`FENCELAB_BIN`): every one of its `tests` passes.
pub async fn recorder_tests_pass(name: &str, tests: usize) {
    let mut command = tokio::process::Command::new(system_dir(name).join(".venv/bin/python"));
    command
        .args(["-m", "unittest", "-v", "test_recorder.py"])
        .current_dir(system_dir(name))
        .env("FENCELAB_BIN", env!("CARGO_BIN_EXE_fencelab"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let output =
        tokio::time::timeout(Duration::from_secs(120), command.output()).await.expect("it ends in time").unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("Ran {tests} tests")), "{text}");
}
