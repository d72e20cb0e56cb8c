//! Evidence from anywhere: a history cut down to some of its sources — what a production
//! incident leaves, a ledger and some logs — is judged on what it holds. A rule whose
//! source is absent answers unknown, never an anomaly: the correct lab's history cut to
//! any subset of its sources is never invalid, a planted bug's history cut to the ledger
//! alone is still caught, and a correct ledger with one result edited into a stale
//! completion is invalid, naming the job.

use std::collections::BTreeSet;
use std::path::Path;

use checkers::Verdict;
use history::{Decision, Event, EventType, Op, Source};

use crate::run::run;

/// Every subset of the sources a history can be cut to, as sets (the leases are derived
/// from the ledger and the config, never cut on their own).
fn subsets() -> Vec<BTreeSet<Source>> {
    let all: Vec<Source> = Source::ALL.iter().copied().filter(|source| *source != Source::Leases).collect();
    (0..1u32 << all.len())
        .map(|mask| all.iter().enumerate().filter(|(bit, _)| mask & (1 << bit) != 0).map(|(_, s)| *s).collect())
        .collect()
}

fn invalid(events: &[Event]) -> Vec<String> {
    checkers::check_all(events)
        .into_iter()
        .filter_map(|result| match result.verdict {
            Verdict::Invalid { anomalies } => {
                let kinds: BTreeSet<String> = anomalies.iter().map(|anomaly| anomaly.kind.clone()).collect();
                Some(format!("{}: {kinds:?}", result.checker))
            }
            _ => None,
        })
        .collect()
}

fn words(sources: &BTreeSet<Source>) -> String {
    let words: Vec<&str> = sources.iter().map(|source| source.as_str()).collect();
    format!("[{}]", words.join(", "))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_correct_labs_history_cut_to_any_of_its_sources_is_never_invalid() {
    let args = ["--seed", "11", "--time-limit", "12", "--nemesis", "all"];
    let finished = run(&args).await;
    assert_eq!(finished.code, Some(0), "the whole history is valid first:\n{}\n{}", finished.stdout, finished.stderr);
    let events = finished.history();
    let mut false_alarms = Vec::new();
    for keep in subsets() {
        let found = invalid(&history::cut(&events, &keep));
        if !found.is_empty() {
            false_alarms.push(format!("cut to {}: {}", words(&keep), found.join("; ")));
        }
    }
    let repeat = "fencelab run --seed 11 --time-limit 12 --nemesis all";
    assert!(false_alarms.is_empty(), "false alarms ({repeat}):\n{}", false_alarms.join("\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_planted_bugs_history_cut_to_its_ledger_is_still_caught() {
    let args = ["--time-limit", "12", "--bug", "accept-stale-result", "--nemesis", "reconnects"];
    let (finished, repeat) = super::run::caught(&args).await;
    let events = finished.history();
    for keep in [BTreeSet::from([Source::Ledger]), BTreeSet::from([Source::Ledger, Source::RunnerLogs])] {
        let found = invalid(&history::cut(&events, &keep));
        assert!(
            found.iter().any(|line| line.starts_with("stale-completion")),
            "cut to {}: {found:?} ({repeat})",
            words(&keep)
        );
    }
}

/// The seed's walk-through, run as the shipped scenario, then its ledger and runner logs
/// alone: valid or unknown; with A1's rejected late success edited into an accepted one,
/// invalid, and the anomaly names the job.
#[tokio::test(flavor = "multi_thread")]
async fn a_ledger_with_one_result_edited_into_a_stale_completion_is_invalid_naming_the_job() {
    let store = tempfile::tempdir().unwrap();
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/scenarios/seed-walkthrough.toml");
    let args = ["scenario".as_ref(), "run".as_ref(), file.as_os_str(), "--store".as_ref(), store.path().as_os_str()];
    let (code, output) = super::fencelab_output(&args, std::time::Duration::from_secs(180)).await;
    assert_eq!(code, Some(0), "{output}");
    let latest = store.path().join("scenario-seed-walkthrough").join("latest");
    let latest = store.path().join(std::fs::read_link(&latest).unwrap_or(latest));
    let folder = std::fs::read_dir(store.path().join("scenario-seed-walkthrough"))
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .find(|path| path.join("history.jsonl").is_file())
        .unwrap_or(latest);
    let events = verdict::check::read_history(&folder.join("history.jsonl")).unwrap();
    let production = BTreeSet::from([Source::Ledger, Source::RunnerLogs]);
    let mut cut = history::cut(&events, &production);
    assert!(invalid(&cut).is_empty(), "the correct records alone are never invalid: {:?}", invalid(&cut));
    let late = cut
        .iter_mut()
        .find(|event| {
            event.kind == EventType::Ledger && event.f == Op::Result && event.decision == Some(Decision::Rejected)
        })
        .expect("the walk-through's late success is in the ledger, rejected");
    late.decision = Some(Decision::Accepted);
    late.reason = None;
    let job = late.job.clone().unwrap();
    let anomalies = checkers::check_one("stale-completion", &cut).unwrap();
    let Verdict::Invalid { anomalies } = anomalies.verdict else { panic!("{anomalies:?}") };
    assert!(anomalies.iter().any(|anomaly| anomaly.job.as_deref() == Some(job.as_str())), "{anomalies:#?}");
}

/// Runs `fencelab` with `args`: exit code and output.
async fn fencelab(args: &[&str]) -> (Option<i32>, String) {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    super::fencelab_output(&args, std::time::Duration::from_secs(60)).await
}

fn write_lines<T: serde::Serialize>(path: &Path, records: &[T]) {
    let lines: Vec<String> = records.iter().map(|record| serde_json::to_string(record).unwrap()).collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// From the outside, as a user after an incident would: a real lab runs three jobs; its
/// ledger, jobs, step log and runner log are fetched over HTTP and written as files;
/// `fencelab evidence` assembles them and `fencelab check` judges them — valid or unknown,
/// never invalid, for the whole set and for the ledger alone; and a ledger whose heartbeat
/// grant was edited past the lease policy is invalid.
#[tokio::test(flavor = "multi_thread")]
async fn records_gathered_by_hand_are_assembled_and_judged_on_what_they_hold() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = lab::demo::LabOptions::new(Path::new(&super::lab_binary()), &dir.path().join("lab"));
    options.lease_ms = 1_000;
    let mut lab = lab::demo::LocalLab::start(options).await.unwrap();
    lab.spawn_runner("r1", &[]).await.unwrap();
    for job in ["j1", "j2", "j3"] {
        lab.submit(job, job, protocol::JobSpec { steps: 3, step_ms: 100 }).await.unwrap();
    }
    let mut views = Vec::new();
    for job in ["j1", "j2", "j3"] {
        let wait = std::time::Duration::from_secs(30);
        views.push(lab.wait_job(job, wait, |view| view.state == protocol::JobState::Succeeded).await.unwrap());
    }
    let ledger = lab.operator.ledger(100_000).await.unwrap();
    let target = protocol::Client::new(&lab.target_url(), None, std::time::Duration::from_secs(5));
    let steps = target.steps(100_000).await.unwrap();
    let log = lab.runner_log("r1");
    lab.shutdown().await;
    let records = dir.path().join("records");
    std::fs::create_dir_all(&records).unwrap();
    std::fs::write(records.join("ledger.json"), serde_json::to_vec(&ledger).unwrap()).unwrap();
    write_lines(&records.join("jobs.jsonl"), &views);
    write_lines(&records.join("steps.jsonl"), &steps);
    let path = |name: &str| records.join(name).display().to_string();
    let (whole, ledger_only, edited) =
        (dir.path().join("whole"), dir.path().join("ledger-only"), dir.path().join("edited"));
    let log = log.display().to_string();
    let whole_s = whole.display().to_string();
    let (ledger_file, jobs_file, steps_file) = (path("ledger.json"), path("jobs.jsonl"), path("steps.jsonl"));
    let assembled = fencelab(&[
        "evidence",
        "--ledger",
        &ledger_file,
        "--jobs",
        &jobs_file,
        "--steps",
        &steps_file,
        "--runner-log",
        &log,
        "--lease-ms",
        "1000",
        "--out",
        &whole_s,
    ])
    .await;
    assert_eq!(assembled.0, Some(0), "{}", assembled.1);
    let (code, output) = fencelab(&["check", &whole_s]).await;
    assert!(matches!(code, Some(0) | Some(2)), "the correct lab's records are never invalid: {output}");
    let ledger_s = ledger_only.display().to_string();
    assert_eq!(fencelab(&["evidence", "--ledger", &ledger_file, "--out", &ledger_s]).await.0, Some(0));
    let (code, output) = fencelab(&["check", &ledger_s]).await;
    assert!(matches!(code, Some(0) | Some(2)), "the ledger alone is never invalid: {output}");
    assert!(output.contains("unknown"), "what the ledger alone cannot show is said unknown: {output}");

    let mut bent = ledger.clone();
    let grant = bent.iter_mut().find(|entry| entry.kind == history::Op::Heartbeat && entry.lease_expires_ms.is_some());
    let grant = grant.expect("a heartbeat was granted");
    grant.lease_expires_ms = grant.lease_expires_ms.map(|end| end + 60_000);
    std::fs::write(records.join("bent.json"), serde_json::to_vec(&bent).unwrap()).unwrap();
    let (bent_file, edited_s) = (path("bent.json"), edited.display().to_string());
    let assembled = fencelab(&["evidence", "--ledger", &bent_file, "--lease-ms", "1000", "--out", &edited_s]).await;
    assert_eq!(assembled.0, Some(0), "{}", assembled.1);
    let (code, output) = fencelab(&["check", &edited_s]).await;
    assert_eq!(code, Some(1), "a lease granted past the policy is caught from the ledger alone: {output}");
    assert!(output.contains("rules-model"), "{output}");

    let (code, output) = fencelab(&["evidence", "--ledger", &path("nothing.json"), "--out", &edited_s]).await;
    assert_eq!(code, Some(254), "a missing input is bad input: {output}");
    std::fs::write(records.join("broken.jsonl"), "{\"seq\": 1}\nnot json\n").unwrap();
    let broken = path("broken.jsonl");
    let fresh = dir.path().join("fresh").display().to_string();
    let (code, output) = fencelab(&["evidence", "--ledger", &broken, "--out", &fresh]).await;
    assert_eq!(code, Some(254), "{output}");
    assert!(output.contains("broken.jsonl: line 1"), "the file and line are named: {output}");
    assert!(!dir.path().join("fresh").exists(), "bad input changes nothing");
}

/// A folder holding only `history.jsonl` is checked (every other file has its default); a
/// `config.json` that is not JSON is bad input naming the file, never an internal error.
#[tokio::test(flavor = "multi_thread")]
async fn a_folder_with_only_a_history_is_checked_and_a_broken_config_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let mut events = vec![Event::new(0, history::Process::CLIENT, EventType::Invoke, Op::Submit).with_job("j1")];
    events[0].index = 0;
    let mut writer = history::Writer::new(Vec::new());
    for event in events {
        writer.append(event).unwrap();
    }
    std::fs::write(dir.path().join("history.jsonl"), writer.into_inner()).unwrap();
    let folder = dir.path().display().to_string();
    let (code, output) = fencelab(&["check", &folder]).await;
    assert_eq!(code, Some(2), "a history with almost nothing in it is unknown: {output}");
    assert!(dir.path().join("results.json").is_file() && dir.path().join("junit.xml").is_file(), "{output}");
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    let (code, output) = fencelab(&["check", &folder]).await;
    assert_eq!(code, Some(254), "{output}");
    assert!(output.contains("config.json"), "{output}");
}
