//! Apache Airflow 3.3.2, unmodified and observed (`systems/airflow/`): its own scheduler, API
//! server and DAG processor on the run's PostgreSQL, its own edge workers as the runners,
//! each worker's HTTP link through its own fault proxy, judged on what Airflow's own records
//! say. Its scenarios pass (a worker killed mid-try, two runs for one key), a chaos run ends
//! with a verdict that names what it cannot judge, and nothing of Airflow is left after a
//! run, after Ctrl-C and after a failed start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::bullmq::skip_for;
use super::observed::{
    every_scenario_passes, interrupt, none_left, processes_of, run_until_progress, start_with_a_failing_target,
    system_dir,
};

/// A run of Airflow: its database, scheduler, API server and workers start in about 30 s
/// here; the bound is for a loaded machine.
const AIRFLOW_WAIT_MAX: Duration = Duration::from_secs(300);

fn airflow_dir() -> PathBuf {
    system_dir("airflow")
}

/// Skips (or, under `FENCELAB_REQUIRE_ALL=1`, fails) when the pinned virtualenv or
/// PostgreSQL's server is absent.
fn airflow_missing() -> bool {
    let airflow = airflow_dir().join(".venv/bin/airflow");
    let postgres = procs::pg::unavailable();
    skip_for(vec![
        (!airflow.exists()).then_some("systems/airflow/.venv is absent (run systems/airflow/install.sh)"),
        postgres.as_deref(),
    ])
}

/// Every scenario in `systems/airflow/scenarios/` passes against Airflow: the only edge
/// worker killed mid-try (the try failed on its stopped heartbeats and the task tried again,
/// never uncertain), and two DAG runs for one deployment key (both tries deploy it at once:
/// `claim-key-held`, and their steps interleave on the unfenced target).
#[tokio::test(flavor = "multi_thread")]
async fn every_airflow_scenario_passes_and_leaves_nothing() {
    if airflow_missing() {
        return;
    }
    every_scenario_passes("airflow", 2, AIRFLOW_WAIT_MAX).await;
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

/// A target that does not start fails the start once the control plane, started beside it,
/// is up (Airflow's schema made, its API server, scheduler and DAG processor running), and
/// the harness's stop of the control plane's group leaves no process of Airflow behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_start_leaves_no_airflow_process() {
    if airflow_missing() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let text = start_with_a_failing_target("airflow", store.path(), AIRFLOW_WAIT_MAX).await;
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
    if airflow_missing() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let system = airflow_dir().join("system.toml");
    // A time limit the start (30 s here, minutes on a loaded machine) cannot use up, so that
    // the run is in its chaos phase when it is interrupted.
    let child = run_until_progress(&system, store.path(), "400", AIRFLOW_WAIT_MAX).await;
    let running = processes_of(store.path());
    assert!(running.iter().any(|process| process.contains("edge worker")), "edge workers run: {running:#?}");
    assert!(running.iter().any(|process| process.contains("scheduler")), "the scheduler runs: {running:#?}");
    interrupt(child, store.path(), AIRFLOW_WAIT_MAX).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conform_says_it_does_not_apply_to_airflow_and_starts_nothing() {
    super::observed::conform_does_not_apply("airflow").await;
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
    super::observed::recorder_tests_pass("airflow", 6).await;
}
