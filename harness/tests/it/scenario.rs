//! `fencelab scenario run`: every shipped scenario in `workloads/scenarios/` passes against
//! the real lab, and a bad scenario file exits 254 naming the step, before anything starts.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Longest one scenario may take (generous: the machine may be loaded).
const SCENARIO_WAIT_MAX: Duration = Duration::from_secs(180);
/// Scenarios run at once.
const PARALLEL: usize = 4;

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/scenarios")
}

/// Runs `fencelab scenario run FILE` into `store`: exit code and output.
async fn run(file: &Path, store: &Path) -> (Option<i32>, String) {
    let args = ["scenario".as_ref(), "run".as_ref(), file.as_os_str(), "--store".as_ref(), store.as_os_str()];
    super::fencelab_output(&args, SCENARIO_WAIT_MAX).await
}

#[tokio::test(flavor = "multi_thread")]
async fn every_shipped_scenario_passes() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(scenarios_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 9, "{files:?}");
    let store = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for chunk in files.chunks(PARALLEL) {
        let mut set = tokio::task::JoinSet::new();
        for file in chunk {
            let (file, store) = (file.clone(), store.path().to_path_buf());
            set.spawn(async move {
                let (code, text) = run(&file, &store).await;
                (file, code, text)
            });
        }
        while let Some(joined) = set.join_next().await {
            let (file, code, text) = joined.unwrap();
            if code != Some(0) {
                let name = file.file_name().unwrap().to_string_lossy().into_owned();
                failures.push(format!(
                    "{name} exited {code:?}\n{text}\nrepeat with: fencelab scenario run workloads/scenarios/{name}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Writes `text` as a scenario file, runs it, and expects 254 with `needle` in the message.
async fn bad(text: &str, needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, text).unwrap();
    let (code, output) = run(&file, &dir.path().join("store")).await;
    assert_eq!(code, Some(254), "{output}");
    assert!(output.contains(needle), "expected `{needle}` in:\n{output}");
    assert!(!dir.path().join("store").exists(), "nothing is started for a bad file");
}

const HEAD: &str = "name = \"bad\"\nrunners = 1\n\n[[step]]\naction = \"submit\"\njob = \"j\"\nkey = \"k\"\n\n";
const TAIL: &str = "\n[[expect]]\njob = \"j\"\nstate = \"succeeded\"\n";

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_action_is_named_with_its_step_and_line() {
    bad(&format!("{HEAD}[[step]]\naction = \"cutt\"\nrunner = \"r1\"\n{TAIL}"), "step 2 (line 9, action `cutt`)").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_field_is_named() {
    bad(&format!("{HEAD}[[step]]\naction = \"cut\"\nrunner = \"r1\"\n{TAIL}"), "missing field `link`").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wait_without_a_good_bound_is_refused() {
    let unbounded = format!("{HEAD}[[step]]\naction = \"wait\"\njob = \"j\"\nstate = \"running\"\n{TAIL}");
    bad(&unbounded, "step 2 (line 9, action `wait`): a wait needs a bound").await;
    let zero = format!("{HEAD}[[step]]\naction = \"wait\"\njob = \"j\"\nstate = \"running\"\nwithin_ms = 0\n{TAIL}");
    bad(&zero, "within_ms = 0").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_runner_is_refused() {
    bad(&format!("{HEAD}[[step]]\naction = \"pause\"\nrunner = \"r7\"\n{TAIL}"), "runner `r7` is not one of r1..r1")
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_fault_step_is_refused() {
    let step = |fields: &str| format!("{HEAD}[[step]]\naction = \"fault\"\n{fields}\n{TAIL}");
    bad(&step("how = \"cut-wires\"\nrunner = \"r1\""), "step 2 (line 9, action `fault`): how = `cut-wires`").await;
    bad(&step("how = \"cut-links\""), "how = `cut-links` needs a runner").await;
    bad(&step("how = \"cut-links\"\nrunner = \"r1\"\nlatency_ms = 5"), "takes no latency_ms").await;
    bad(&step("how = \"latency\"\nrunner = \"r1\""), "missing field `latency_ms`").await;
    bad(&step("fault = \"kill\"\nhow = \"pause\"\nrunner = \"r1\""), "realises `delayed-heartbeats`, not `kill`").await;
    bad(&step("how = \"restart-control\"\nrunner = \"r1\""), "hits the control plane, not a runner").await;
    bad(&step("how = \"pause\"\nrunner = \"r1\"\nduration_ms = 600001"), "duration_ms = 600001").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn steps_out_of_time_order_and_a_bad_operator_are_refused() {
    let late_then_early = format!(
        "{HEAD}[[step]]\nat_ms = 900\naction = \"elapse\"\nms = 1\n\n[[step]]\nat_ms = 100\naction = \"elapse\"\nms = 1\n{TAIL}"
    );
    bad(&late_then_early, "step 3 (line 14, action `elapse`): at_ms = 100 comes before").await;
    bad(&format!("{HEAD}[[step]]\nat_ms = -1\naction = \"elapse\"\nms = 1\n{TAIL}"), "at_ms = -1").await;
    bad(&format!("operator = \"robot\"\n{HEAD}{TAIL}"), "operator").await;
    bad(&format!("heartbeat_interval_ms = 600\n{HEAD}{TAIL}"), "heartbeat_interval_ms = 600").await;
    bad(&format!("settle_quiet_ms = 5\n{HEAD}{TAIL}"), "settle_quiet_ms = 5: must be 100..=3600000").await;
}

/// Settling ends once nothing moves: a job claimed by a runner the scenario plays and
/// then left to lapse stays uncertain (no operator reconciles it), so with an hour to
/// settle in, the scenario still ends after its quiet window (five 400-ms leases, at least
/// 3 s), says which job it left open, and judges its expectations. Without the quiet
/// window it would wait the hour, past this test's bound.
#[tokio::test(flavor = "multi_thread")]
async fn settling_ends_when_no_job_has_moved_for_the_quiet_window() {
    let text = "name = \"quiet\"\nrunners = 1\nidle = [\"r1\"]\nlease_ms = 400\nsettle_within_ms = 3600000\n\n\
                [[step]]\naction = \"submit\"\njob = \"j\"\nkey = \"k\"\n\n\
                [[step]]\naction = \"claim\"\nas_runner = \"r1\"\njob = \"j\"\n\n\
                [[step]]\naction = \"fault\"\nhow = \"latency\"\nrunner = \"r1\"\nlatency_ms = 10\nduration_ms = 100\n\n\
                [[expect]]\njob = \"j\"\nstate = \"uncertain\"\n";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("quiet.toml");
    std::fs::write(&file, text).unwrap();
    let (code, output) = run(&file, &dir.path().join("store")).await;
    assert_eq!(code, Some(0), "{output}");
    assert!(output.contains("none changed for 3000 ms: j uncertain"), "{output}");
}

/// A submit with `runner` is claimed by that runner, however many others are idle: three
/// pinned jobs in a row, each to the runner named. Unpinned, the runner that polls first
/// takes each job (r1, in practice), and this test fails.
#[tokio::test(flavor = "multi_thread")]
async fn a_pinned_submit_is_claimed_by_the_runner_it_names() {
    let mut text = String::from("name = \"pinned\"\nrunners = 3\nlease_ms = 1000\n");
    for (job, runner) in [("j1", "r3"), ("j2", "r2"), ("j3", "r3")] {
        text += &format!("\n[[step]]\naction = \"submit\"\njob = \"{job}\"\nkey = \"{job}\"\nrunner = \"{runner}\"\n");
        text += &format!("\n[[step]]\naction = \"wait\"\njob = \"{job}\"\nstate = \"succeeded\"\nwithin_ms = 20000\n");
        text += &format!("\n[[expect]]\njob = \"{job}\"\nattempt = 1\nrunner = \"{runner}\"\n");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pinned.toml");
    std::fs::write(&file, text).unwrap();
    let (code, output) = run(&file, &dir.path().join("store")).await;
    assert_eq!(code, Some(0), "{output}");
    assert_eq!(output.matches("  ok      expect").count(), 3, "{output}");
}

/// A scenario whose step fails stops there: the job it left running was never waited for,
/// so the run is incomplete and nothing judges that job unsettled — the failed step is the
/// finding, not the system. Before, the run read as recovered, and the correct lab was
/// accused (`lost-work`'s `not-settled`).
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_step_leaves_its_jobs_unjudged_not_unsettled() {
    let text = "name = \"stops\"\nrunners = 1\nlease_ms = 1000\n\n\
                [[step]]\naction = \"fault\"\nhow = \"latency\"\nrunner = \"r1\"\nlatency_ms = 10\nduration_ms = 100\n\n\
                [[step]]\naction = \"submit\"\njob = \"j\"\nkey = \"k\"\nsteps = 30\nstep_ms = 200\nrunner = \"r1\"\n\n\
                [[step]]\naction = \"wait\"\njob = \"j\"\nstate = \"failed\"\nwithin_ms = 1500\n\n\
                [[expect]]\nchecker = \"lost-work\"\nverdict = \"valid\"\n";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stops.toml");
    std::fs::write(&file, text).unwrap();
    let store = dir.path().join("store");
    let (code, output) = run(&file, &store).await;
    assert_eq!(code, Some(1), "{output}");
    assert!(output.contains("FAILED step 3"), "{output}");
    let results = glob_one(&store, "results.json");
    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(results).unwrap()).unwrap();
    let lost_work = results["checkers"].as_array().unwrap().iter().find(|c| c["checker"] == "lost-work").unwrap();
    let kinds: Vec<&str> =
        lost_work["anomalies"].as_array().into_iter().flatten().filter_map(|a| a["kind"].as_str()).collect();
    assert!(!kinds.contains(&"not-settled"), "{lost_work}");
    let history = std::fs::read_to_string(glob_one(&store, "history.jsonl")).unwrap();
    assert!(history.contains("when the scenario stopped at a step that failed"), "the recovery event says why");
}

/// A step marked `if_attempt_exists` that names an attempt the system never made (a job
/// that succeeded at once has no attempt 2) is skipped, and says so in the history: its
/// `wait` ends when the job has settled, not at its bound, and the report after it is not
/// sent. Without the mark the same wait fails the scenario.
#[tokio::test(flavor = "multi_thread")]
async fn a_step_on_an_attempt_the_system_never_made_is_skipped_when_marked() {
    let steps = |marked: bool| {
        let mark = if marked { "if_attempt_exists = true\n" } else { "" };
        format!(
            "name = \"retried\"\nrunners = 1\nlease_ms = 1000\n\n\
             [[step]]\naction = \"submit\"\njob = \"j\"\nkey = \"k\"\nsteps = 1\nrunner = \"r1\"\n\n\
             [[step]]\n{mark}action = \"wait\"\njob = \"j\"\nattempt = 2\nledger = \"result\"\nwithin_ms = 20000\n\n\
             [[step]]\n{mark}action = \"report\"\nas_runner = \"r1\"\njob = \"j\"\nattempt = 2\noutcome = \"failed\"\n\n\
             [[expect]]\njob = \"j\"\nstate = \"succeeded\"\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let marked = dir.path().join("marked.toml");
    std::fs::write(&marked, steps(true)).unwrap();
    let store = dir.path().join("marked");
    let (code, output) = run(&marked, &store).await;
    assert_eq!(code, Some(0), "{output}");
    let history = std::fs::read_to_string(glob_one(&store, "history.jsonl")).unwrap();
    assert_eq!(history.matches("skipped: job j has 1 attempt(s), no attempt 2").count(), 2, "{history}");
    // The wait's invoke and its skip, on the history's clock: well inside its 20 s bound.
    let step_2 = step_times(&history, "step 2 ");
    assert_eq!(step_2.len(), 2, "{history}");
    assert!(step_2[1] - step_2[0] < 19_000_000_000, "the wait ended when the job settled, not at its bound");
    let unmarked = dir.path().join("unmarked.toml");
    let text = steps(false).replace("within_ms = 20000", "within_ms = 3000");
    std::fs::write(&unmarked, text).unwrap();
    let (code, output) = run(&unmarked, &dir.path().join("unmarked")).await;
    assert_eq!(code, Some(1), "{output}");
    assert!(output.contains("FAILED step 2"), "{output}");
    // Marked, on an attempt the system made, with a condition that never holds: it fails
    // as any wait does, at its one bound (not a bound to look for the attempt, then another).
    let made = dir.path().join("made.toml");
    let text = steps(true).replace(
        "attempt = 2\nledger = \"result\"\nwithin_ms = 20000",
        "attempt = 1\nledger = \"expire\"\nwithin_ms = 2000",
    );
    std::fs::write(&made, text).unwrap();
    let store = dir.path().join("made");
    let (code, output) = run(&made, &store).await;
    assert_eq!(code, Some(1), "{output}");
    assert!(output.contains("FAILED step 2") && output.contains("not within 2000 ms"), "{output}");
    let history = std::fs::read_to_string(glob_one(&store, "history.jsonl")).unwrap();
    let step_2 = step_times(&history, "step 2 ");
    assert_eq!(step_2.len(), 2, "{history}");
    assert!(
        step_2[1] - step_2[0] < 3_900_000_000,
        "waited {} ns: more than its bound, nearly twice",
        step_2[1] - step_2[0]
    );
}

/// The times (history clock, ns) of the scenario's events whose reason starts with `label`.
fn step_times(history: &str, label: &str) -> Vec<u64> {
    history
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|event| {
            event["process"] == "scenario" && event["reason"].as_str().is_some_and(|r| r.starts_with(label))
        })
        .filter_map(|event| event["time_ns"].as_u64())
        .collect()
}

/// A `capability` step the system refuses (here: the attempt's lease has ended) is an
/// answer, recorded as the runner's, not a failure; it keeps no capability, so a
/// `target_step` after it fails for want of one. (An imported lease-end-inclusive incident
/// plays its probes at the lease's end as capability steps: the correct lab refuses them,
/// and 4 of 10 runs failed where they should have passed.)
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_capability_is_recorded_not_failed() {
    let text = |then: &str| {
        format!(
            "name = \"refused\"\nrunners = 1\nidle = [\"r1\"]\nlease_ms = 500\n\n\
             [[step]]\naction = \"submit\"\njob = \"j\"\nkey = \"k\"\nsteps = 1\n\n\
             [[step]]\naction = \"claim\"\nas_runner = \"r1\"\njob = \"j\"\n\n\
             [[step]]\naction = \"wait\"\njob = \"j\"\nattempt = 1\nstate = \"uncertain\"\nwithin_ms = 20000\n\n\
             [[step]]\naction = \"capability\"\nas_runner = \"r1\"\njob = \"j\"\nattempt = 1\n\n{then}\
             [[expect]]\njob = \"j\"\nattempt = 1\nledger = \"capability\"\ndecision = \"rejected\"\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let refused = dir.path().join("refused.toml");
    std::fs::write(&refused, text("")).unwrap();
    let (code, output) = run(&refused, &dir.path().join("refused")).await;
    assert_eq!(code, Some(0), "{output}");
    let step =
        "[[step]]\naction = \"target_step\"\nas_runner = \"r1\"\njob = \"j\"\nattempt = 1\nstep = 0\nsteps = 1\n\n";
    let stepped = dir.path().join("stepped.toml");
    std::fs::write(&stepped, text(step)).unwrap();
    let (code, output) = run(&stepped, &dir.path().join("stepped")).await;
    assert_eq!(code, Some(1), "{output}");
    assert!(output.contains("FAILED step 5") && output.contains("one refused keeps none"), "{output}");
}

/// The one file named `name` under `dir`, however deep (symbolic links not followed).
fn glob_one(dir: &Path, name: &str) -> PathBuf {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(next) = todo.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_symlink() {
                continue; // `latest` names a run folder found anyway
            }
            if path.is_dir() {
                todo.push(path);
            } else if path.file_name().is_some_and(|file| file == name) {
                found.push(path);
            }
        }
    }
    assert_eq!(found.len(), 1, "one {name} under {}: {found:?}", dir.display());
    found.pop().unwrap()
}

#[test]
fn every_shipped_scenario_round_trips_through_its_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/scenarios");
    let checkers = engine::scenario::checker_names();
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|entry| entry.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 18, "{} scenarios in {}", files.len(), dir.display());
    for file in files {
        let scenario = workloads::scenario::parse(&std::fs::read_to_string(&file).unwrap(), &checkers).unwrap();
        let written = scenario.to_toml();
        let again = workloads::scenario::parse(&written, &checkers).unwrap_or_else(|error| {
            panic!("{}: the written scenario does not parse: {error}\n{written}", file.display())
        });
        assert_eq!(again.to_toml(), written, "{}: writing is not a fixpoint", file.display());
        assert_eq!(again.steps.len(), scenario.steps.len());
        assert_eq!(again.expects.len(), scenario.expects.len());
    }
}

/// `if_attempt_exists` is written back as read, and refused with a reason on a value that
/// is not a boolean or on a step that names no attempt.
#[test]
fn if_attempt_exists_round_trips_and_bad_uses_are_refused() {
    let checkers = engine::scenario::checker_names();
    let head = "name = \"x\"\nrunners = 1\n\n[[step]]\naction = \"submit\"\njob = \"j\"\nkey = \"k\"\n\n";
    let marked = format!(
        "{head}[[step]]\nif_attempt_exists = true\naction = \"wait\"\njob = \"j\"\nattempt = 2\nwithin_ms = 10\n\n[[expect]]\njob = \"j\"\nstate = \"succeeded\"\n"
    );
    let scenario = workloads::scenario::parse(&marked, &checkers).unwrap();
    assert!(scenario.steps[1].if_attempt_exists && !scenario.steps[0].if_attempt_exists);
    let again = workloads::scenario::parse(&scenario.to_toml(), &checkers).unwrap();
    assert!(again.steps[1].if_attempt_exists && !again.steps[0].if_attempt_exists);
    let not_a_flag = marked.replace("if_attempt_exists = true", "if_attempt_exists = 1");
    let error = workloads::scenario::parse(&not_a_flag, &checkers).err().unwrap().to_string();
    assert!(error.contains("must be true or false"), "{error}");
    let no_attempt = format!("{head}[[step]]\nif_attempt_exists = true\naction = \"elapse\"\nms = 10\n\n[[expect]]\njob = \"j\"\nstate = \"succeeded\"\n");
    let error = workloads::scenario::parse(&no_attempt, &checkers).err().unwrap().to_string();
    assert!(error.contains("names a job's attempt"), "{error}");
}

/// A scenario whose control plane is gone before its records are collected is unknown
/// (exit 2) and says what could not be read: the ledger and the jobs are not read as empty.
/// The system is the lab with its control plane under `timeout -s KILL`, so that it dies
/// a few seconds after it started, while the scenario's last step waits.
#[tokio::test(flavor = "multi_thread")]
async fn a_scenario_whose_control_plane_died_before_collection_is_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let system = super::dying_lab(dir.path(), "control-plane", 8);
    let text = "name = \"dying\"\nrunners = 1\n\n[[step]]\naction = \"submit\"\njob = \"j\"\nkey = \"k\"\n\n\
                [[step]]\naction = \"elapse\"\nms = 12000\n\n[[expect]]\njob = \"j\"\nstate = \"succeeded\"\n";
    let file = dir.path().join("dying.toml.scenario");
    std::fs::write(&file, text).unwrap();
    let store = dir.path().join("store");
    let args = [
        "scenario".as_ref(),
        "run".as_ref(),
        file.as_os_str(),
        "--store".as_ref(),
        store.as_os_str(),
        "--system".as_ref(),
        system.as_os_str(),
    ];
    let (code, output) = super::fencelab_output(&args, SCENARIO_WAIT_MAX).await;
    assert_eq!(code, Some(2), "{output}");
    assert!(output.contains("ledger could not be read"), "the reason is said: {output}");
    assert!(output.contains("scenario     unknown"), "{output}");
}

/// On a host without libfaketime (here: `FENCELAB_LIBFAKETIME=none`, which makes fencelab
/// find none), the seed's target-fence scenario cannot move the target's clock: it is
/// unknown (exit 2), each expectation that did not hold says `unknown` and why, none says
/// FAILED.
#[tokio::test(flavor = "multi_thread")]
async fn a_scenario_whose_clock_fault_cannot_act_here_is_unknown_and_says_why() {
    let store = tempfile::tempdir().unwrap();
    let file = scenarios_dir().join("bug-target-ignores-fence.toml");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    command.args(["scenario", "run"]).arg(&file).arg("--store").arg(store.path());
    command.env(system::launch::LIBFAKETIME_VARIABLE, "none").kill_on_drop(true);
    let output = tokio::time::timeout(SCENARIO_WAIT_MAX, command.output()).await.unwrap().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let repeat = "FENCELAB_LIBFAKETIME=none fencelab scenario run workloads/scenarios/bug-target-ignores-fence.toml";
    assert_eq!(output.status.code(), Some(2), "{repeat}\n{said}");
    assert!(!said.contains("FAILED"), "an expectation the fault could not serve is not FAILED ({repeat}):\n{said}");
    assert!(said.contains("unknown expect"), "{said}");
    assert!(said.contains("target-clock-skew did not take effect"), "{said}");
    assert!(said.contains("libfaketime, which is not installed here"), "{said}");
}
