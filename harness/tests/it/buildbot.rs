//! Buildbot 4.3.0, unmodified and observed (`systems/buildbot/`): its own master and workers,
//! each worker's PB link through its own fault proxy, judged on what Buildbot's own database
//! records. A worker lost mid-build is requeued silently (the scenario), a chaos run ends
//! with a verdict that names what it cannot judge and leaves no Buildbot process behind, and
//! conform says it does not apply.

use std::path::PathBuf;
use std::time::Duration;

use super::bullmq::skip_for;
use super::observed::{
    every_scenario_passes, interrupt, none_left, processes_of, run_until_progress, start_with_a_failing_target,
    system_dir,
};

/// A run or scenario of Buildbot: its master and workers start in a few seconds; the bound
/// is for a loaded machine.
const BUILDBOT_WAIT_MAX: Duration = Duration::from_secs(240);

fn buildbot_dir() -> PathBuf {
    system_dir("buildbot")
}

/// Skips (or, under `FENCELAB_REQUIRE_ALL=1`, fails) when the pinned virtualenv is absent.
fn buildbot_missing() -> bool {
    let python = buildbot_dir().join(".venv/bin/python");
    skip_for(vec![(!python.exists()).then_some("systems/buildbot/.venv is absent (run systems/buildbot/install.sh)")])
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
    every_scenario_passes("buildbot", 2, BUILDBOT_WAIT_MAX).await;
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
    super::observed::conform_does_not_apply("buildbot").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_start_leaves_no_buildbot_process() {
    if buildbot_missing() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let text = start_with_a_failing_target("buildbot", store.path(), BUILDBOT_WAIT_MAX).await;
    assert!(text.contains("role `target`"), "{text}");
    none_left(store.path()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_during_a_buildbot_run_stops_every_buildbot_process_and_still_writes_the_history() {
    if buildbot_missing() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let system = buildbot_dir().join("system.toml");
    let child = run_until_progress(&system, store.path(), "60", BUILDBOT_WAIT_MAX).await;
    assert!(!processes_of(store.path()).is_empty(), "Buildbot runs under the run's folder");
    interrupt(child, store.path(), BUILDBOT_WAIT_MAX).await;
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
    super::observed::recorder_tests_pass("buildbot", 5).await;
}
