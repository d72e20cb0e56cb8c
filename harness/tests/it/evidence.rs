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

/// Every subset of the sources, as sets.
fn subsets() -> Vec<BTreeSet<Source>> {
    let all = Source::ALL;
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
    let args = ["--seed", "3", "--time-limit", "12", "--bug", "accept-stale-result", "--nemesis", "reconnects"];
    let finished = run(&args).await;
    assert_eq!(finished.code, Some(1), "{}\n{}", finished.stdout, finished.stderr);
    let events = finished.history();
    for keep in [BTreeSet::from([Source::Ledger]), BTreeSet::from([Source::Ledger, Source::RunnerLogs])] {
        let found = invalid(&history::cut(&events, &keep));
        assert!(
            found.iter().any(|line| line.starts_with("stale-completion")),
            "cut to {}: {found:?} (fencelab run --seed 3 --bug accept-stale-result --nemesis reconnects)",
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
    let events = engine::check::read_history(&folder.join("history.jsonl")).unwrap();
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
