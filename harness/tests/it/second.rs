//! The second implementation (`examples/python/`: standard-library Python written from the
//! contract documents alone) under fencelab: it conforms, it is valid under every fault
//! kind, and each of its planted-bug variants is caught — by conform and by chaos runs; a
//! replay of its run runs it again, not the built-in lab.

use std::path::{Path, PathBuf};
use std::time::Duration;

use runfolder::folder::RunFolder;

use super::run::run;

pub fn python_system() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/python/system.toml")
}

/// Skips (or, under `FENCELAB_REQUIRE_ALL=1`, fails) when `python3` is not on the PATH.
pub fn python_missing() -> bool {
    let found = std::process::Command::new("python3").arg("--version").output().is_ok_and(|out| out.status.success());
    if !found {
        eprintln!("SKIPPED: python3 is not installed");
        let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
        assert!(!require_all, "python3 is missing and FENCELAB_REQUIRE_ALL=1");
    }
    !found
}

fn words(args: &[&str]) -> Vec<std::ffi::OsString> {
    args.iter().map(std::ffi::OsString::from).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_implementation_is_valid_under_every_fault_kind() {
    if python_missing() {
        return;
    }
    let system = python_system();
    let system = system.to_str().unwrap();
    // A seed whose 30-second schedule deals every fault kind (a 30-second run deals 21.6 of
    // the 23 variants on average; seed 3 stopped dealing `reconnects` when `late-step` came
    // to be dealt early).
    let finished = run(&["--system", system, "--seed", "4", "--time-limit", "30", "--nemesis", "all"]).await;
    assert_eq!(finished.code, Some(0), "{}\n{}", finished.stdout, finished.stderr);
    let schedule = std::fs::read_to_string(finished.folder().join("schedule.json")).unwrap();
    let config = std::fs::read_to_string(finished.folder().join("config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    let not_run = config["system"]["faults_not_run"].as_array().cloned().unwrap_or_default();
    // A fault this host cannot do (a partition without iptables as root) says why instead.
    let runs = |kind: &workloads::faults::FaultKind| !not_run.iter().any(|not| not["fault"] == kind.name());
    for kind in workloads::faults::FaultKind::ALL.iter().filter(|kind| runs(kind)) {
        assert!(schedule.contains(&format!("\"{}\"", kind.name())), "{} was scheduled: {schedule}", kind.name());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_implementation_conforms_and_its_bug_fails_conform() {
    if python_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let system = python_system();
    let conform = |out: &str, variant: Option<&str>| {
        let mut args = vec!["conform", "--system", system.to_str().unwrap(), "--lease-ms", "1500"];
        args.extend(variant.map(|variant| ["--variant", variant]).into_iter().flatten());
        let out = dir.path().join(out);
        let mut args = words(&args);
        args.extend([std::ffi::OsString::from("--out"), out.into_os_string()]);
        async move {
            let refs: Vec<&std::ffi::OsStr> = args.iter().map(|arg| arg.as_os_str()).collect();
            super::fencelab_output(&refs, Duration::from_secs(180)).await
        }
    };
    let ((correct, said), (buggy, buggy_said)) =
        tokio::join!(conform("correct", None), conform("buggy", Some("accept-stale-result")));
    assert_eq!(correct, Some(0), "{said}");
    assert_eq!(buggy, Some(1), "{buggy_said}");
    let failed: Vec<&str> = buggy_said.lines().filter(|line| line.starts_with("FAIL")).collect();
    assert!(failed.iter().any(|line| line.contains("rule/stale-completion")), "{failed:?}");
}

/// Seeds tried per variant before it counts as missed, as the lab's matrix test does: one
/// run's timing on a loaded machine decides whether its faults meet the bug (the matrix
/// benchmark measures the rate, `fencelab matrix --system examples/python/system.toml`).
const SEEDS_MAX: u64 = 3;
/// Variants run at once.
const PARALLEL: usize = 3;

/// Runs `variant` of the Python system under its declared faults with seeds 1, 2, ...
/// until a run detects it; returns every run made.
async fn until_detected(store: PathBuf, variant: String) -> (String, Vec<campaign::matrix::Cell>) {
    let program = Path::new(env!("CARGO_BIN_EXE_fencelab"));
    let mut cells = Vec::new();
    for seed in 1..=SEEDS_MAX {
        let cell = campaign::matrix::run_variant_cell(program, &store, &python_system(), &variant, seed, 25).await;
        let cell = cell.unwrap_or_else(|error| panic!("{variant}: {error:#}"));
        let detected = cell.detected();
        cells.push(cell);
        if detected {
            break;
        }
    }
    (variant, cells)
}

/// Every variant the Python system file declares (read from the file, so a variant added or
/// a contract change that leaves its `nemesis` stale fails here) is caught under its own
/// faults; the runner's own bug only by `runner-contract`.
#[tokio::test(flavor = "multi_thread")]
async fn each_python_bug_variant_is_caught_under_its_faults() {
    if python_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = system::SystemFile::read(&python_system()).unwrap();
    let mut running = tokio::task::JoinSet::new();
    let mut done = Vec::new();
    for variant in file.variants.keys().cloned() {
        if running.len() >= PARALLEL {
            done.push(running.join_next().await.unwrap().unwrap());
        }
        running.spawn(until_detected(dir.path().join("matrix"), variant));
    }
    while let Some(finished) = running.join_next().await {
        done.push(finished.unwrap());
    }
    let mut failures = Vec::new();
    let mut caught = std::collections::BTreeMap::new();
    for (variant, cells) in done {
        match cells.iter().find(|cell| cell.detected()) {
            Some(cell) => drop(caught.insert(variant, cell.checkers.clone())),
            None => {
                let tried: Vec<String> =
                    cells.iter().map(|cell| format!("{} ({})", cell.command, cell.verdict)).collect();
                failures.push(format!("{variant} was not detected in {} runs: {tried:#?}", cells.len()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let shipped = [
        "accept-stale-result",
        "trust-runner-clock",
        "target-ignores-fence",
        "runner-ignores-deadline",
        "runner-reports-unfinished-success",
        "runner-resends-lost-step",
    ];
    for variant in shipped {
        assert!(caught.contains_key(variant), "the file declares {variant}: {caught:?}");
    }
    // The runner's own bugs are masked by the control plane and the fenced target: only the
    // runner's contract, read on its log, sees them.
    assert_eq!(caught["runner-ignores-deadline"], ["runner-contract"], "{caught:?}");
    assert_eq!(caught["runner-reports-unfinished-success"], ["runner-contract"], "{caught:?}");
    // A re-sent step breaks no rule of the runner's log; its harm is on the target's.
    assert_eq!(caught["runner-resends-lost-step"], ["stale-side-effect"], "{caught:?}");
}

/// The Python implementation's runners under libfaketime (its system file with
/// `runner_clock = ["libfaketime"]`), with clock skew: its multithreaded runner starts,
/// survives every clock the nemesis sets, and the run is valid. A clock file libfaketime
/// cannot parse (a bare `0`) made every runner exit at once, and the correct
/// implementation invalid (`runner-exited`, `not-settled`).
#[tokio::test(flavor = "multi_thread")]
async fn the_python_implementation_is_valid_under_libfaketime_clock_skew() {
    if python_missing() {
        return;
    }
    if engine::run::cluster::libfaketime().is_none() {
        eprintln!("SKIPPED: libfaketime is not installed");
        let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
        assert!(!require_all, "libfaketime is missing and FENCELAB_REQUIRE_ALL=1");
        return;
    }
    let original = std::fs::read_to_string(python_system()).unwrap();
    let here = python_system().parent().unwrap().canonicalize().unwrap();
    let mut text = original.replace("runner_clock = [\"offset-file\"]", "runner_clock = [\"libfaketime\"]");
    for role in ["[control_plane]", "[target]", "[runner]"] {
        text = text.replacen(role, &format!("{role}\ncwd = \"{}\"", here.display()), 1);
    }
    assert!(text.contains("runner_clock = [\"libfaketime\"]"), "the clock method was found in the file");
    let dir = tempfile::tempdir().unwrap();
    let system = dir.path().join("python-libfaketime.toml");
    std::fs::write(&system, text).unwrap();
    let system = system.display().to_string();
    let args = ["--system", &system, "--seed", "6", "--time-limit", "15", "--nemesis", "clock-skew,kill"];
    let finished = run(&args).await;
    assert_eq!(finished.code, Some(0), "{}\n{}", finished.stdout, finished.stderr);
    let config = std::fs::read_to_string(finished.folder().join("config.json")).unwrap();
    assert!(config.contains("\"libfaketime\""), "the runners' clocks were libfaketime's: {config}");
    let skewed = finished.history().iter().any(|event| event.f == history::Op::ClockSkew);
    assert!(skewed, "a clock skew was scheduled and recorded");
}

/// The Python runner's authority, from the outside: a heartbeat sent while it held moves
/// the deadline; one sent after the deadline passed does not, even when accepted (an
/// earlier heartbeat whose answer was lost had moved the server's lease), so the runner
/// stays stopped — the rule `runner-contract` judges (`docs/protocol.md`).
#[test]
fn the_python_runner_never_revives_authority_with_a_late_heartbeat() {
    if python_missing() {
        return;
    }
    let folder = python_system().parent().unwrap().to_path_buf();
    let script = "import sys; sys.path.insert(0, sys.argv[1])\n\
                  from runner import Authority\n\
                  a = Authority(1_000)\n\
                  a.extend(600, 1_000); print(a.deadline_ns)\n\
                  a.extend(1_700, 1_000); print(a.deadline_ns)\n\
                  a.extend(100, 1_000); print(a.deadline_ns)\n";
    let out = std::process::Command::new("python3").arg("-c").arg(script).arg(&folder).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert_eq!(said.lines().collect::<Vec<_>>(), ["1600", "1600", "1600"], "in time, late, older: {said}");
}

/// Bounds a replay of a 5-second run (a start, the run, recovery, the check).
const REPLAY_WAIT_MAX: Duration = Duration::from_secs(180);

/// The run folder a replay wrote in `store` (`store/replay-<pid>-1/latest`).
fn replayed_folder(store: &Path) -> PathBuf {
    let tries: Vec<PathBuf> = std::fs::read_dir(store).unwrap().map(|entry| entry.unwrap().path()).collect();
    assert_eq!(tries.len(), 1, "one try, one store: {tries:?}");
    std::fs::canonicalize(tries[0].join("latest")).expect("the replay wrote a run folder")
}

/// Issue 37: a run of the Python example, replayed, ran the built-in lab (the system file
/// was lost reading `config.json` back).
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_runs_the_recorded_runs_own_system_file_and_variants() {
    if python_missing() {
        return;
    }
    let system = python_system();
    let system = system.to_str().unwrap();
    let args = ["--system", system, "--variant", "trust-runner-clock", "--seed", "3", "--time-limit", "5"];
    let finished = run(&[&args[..], &["--nemesis", "reconnects", "--runners", "2"]].concat()).await;
    assert!(matches!(finished.code, Some(0 | 1)), "{}\n{}", finished.stdout, finished.stderr);
    let original = RunFolder::at(finished.folder()).run_config().unwrap();
    let replays = tempfile::tempdir().unwrap();
    let folder = finished.folder().into_os_string();
    let replay_args = ["replay".as_ref(), folder.as_os_str(), "--tries".as_ref(), "1".as_ref()];
    let store = ["--store".as_ref(), replays.path().as_os_str()];
    let (code, text) = super::fencelab_output(&[&replay_args[..], &store[..]].concat(), REPLAY_WAIT_MAX).await;
    assert!(matches!(code, Some(0 | 1)), "the replay ran: {text}");
    let replayed = RunFolder::at(replayed_folder(replays.path())).run_config().unwrap();
    assert_eq!(replayed.system.name, "python-lab", "the replay ran the Python system: {text}");
    assert_eq!(replayed.run.system, original.run.system, "{text}");
    assert_eq!(replayed.run.variants, ["trust-runner-clock"], "{text}");
    assert_eq!(replayed.run.seed, 3);
}
