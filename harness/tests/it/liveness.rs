//! Liveness through the binary: a run whose jobs stop moving because of the control plane
//! exits 1 naming the wedged jobs, each finding true of the records; a run whose backlog
//! simply outlasts the recovery limit on the correct lab stays unknown (exit 2).

use history::{Decision, Event, EventType, Op};

use crate::run::{caught, run, Finished};

/// The verdict `results.json` gives one checker, and its anomalies.
fn checker(finished: &Finished, name: &str) -> results::CheckerDoc {
    let text = std::fs::read_to_string(finished.folder().join("results.json")).expect("results.json");
    let doc = results::read_results(&text).expect("a results.json");
    doc.checkers.into_iter().find(|checker| checker.checker == name).expect("the checker's verdict")
}

/// Whether the ledger left `attempt` expired: an `expire` entry and, after it, no accepted
/// heartbeat or result and no reconcile of it.
fn left_expired(history: &[Event], attempt: &str) -> bool {
    let ledger = || history.iter().filter(move |event| event.kind == EventType::Ledger);
    let of = |event: &&Event| event.attempt.as_deref() == Some(attempt);
    let Some(expired) = ledger().filter(of).position(|event| event.f == Op::Expire) else { return false };
    !ledger().filter(of).skip(expired + 1).any(|event| {
        event.f == Op::Reconcile
            || (matches!(event.f, Op::Heartbeat | Op::Result) && event.decision == Some(Decision::Accepted))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_jobs_the_control_plane_wedges_exits_1_naming_them() {
    let args = ["--bug", "expiry-leaves-job-running", "--nemesis", "reconnects", "--time-limit", "10"];
    let (finished, repeat) = caught(&[&args[..], &["--recovery-limit", "5"]].concat()).await;
    let lost = checker(&finished, "lost-work");
    let wedged: Vec<_> = lost.anomalies.iter().filter(|anomaly| anomaly.kind == "job-wedged").collect();
    assert!(!wedged.is_empty(), "{repeat}: lost-work names the wedged jobs: {lost:#?}");
    let history = finished.history();
    for anomaly in wedged {
        let job = anomaly.job.as_deref().expect("a wedged job is named");
        assert!(finished.stdout.contains(&format!("job {job} is wedged")), "{repeat}: said on stdout: {job}");
        let last = history.iter().rev().find(|event| event.f == Op::Final && event.job.as_deref() == Some(job));
        let last = last.expect("the wedged job has a final state");
        assert_eq!(last.outcome.as_deref(), Some("running"), "{repeat}: {job} ended running");
        let attempt = anomaly.attempts.first().expect("its attempt is named");
        assert_eq!(last.attempt.as_ref(), Some(attempt), "{repeat}: its current attempt");
        assert!(left_expired(&history, attempt), "{repeat}: the ledger left {attempt} expired");
    }
    let model = checker(&finished, "rules-model");
    assert!(
        model.anomalies.iter().any(|anomaly| anomaly.kind == "final-not-the-ledgers"),
        "{repeat}: the final state is not the ledger's: {model:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backlog_that_outlasts_the_recovery_limit_stays_unknown() {
    // About four times what three runners serve, 3.2-s attempts and a 3-s recovery: the
    // correct lab is still working its queue, with attempts expired under reconnects.
    let args = [
        "--seed",
        "1",
        "--nemesis",
        "reconnects",
        "--rate",
        "4",
        "--keys",
        "4",
        "--steps-min",
        "8",
        "--steps-max",
        "8",
        "--step-ms-min",
        "400",
        "--step-ms-max",
        "400",
        "--time-limit",
        "10",
        "--recovery-limit",
        "3",
    ];
    let finished = run(&args).await;
    assert_eq!(finished.code, Some(2), "{}\n{}", finished.stdout, finished.stderr);
    let lost = checker(&finished, "lost-work");
    assert_eq!(lost.verdict, "unknown", "{lost:#?}");
    assert!(lost.reason.as_deref().is_some_and(|why| why.contains("recovery limit")), "{lost:#?}");
    let history = finished.history();
    // The backlog is still there at the limit. Which of its jobs is running at that instant
    // (none, when the ones on the free keys sit between a claim and the next) is timing.
    let unsettled = ["queued", "running", "uncertain"];
    let left = history.iter().filter(|event| {
        event.f == Op::Final && event.outcome.as_deref().is_some_and(|state| unsettled.contains(&state))
    });
    assert!(left.count() > 0, "jobs were left unsettled at the limit:\n{}", finished.stdout);
    assert!(!finished.stdout.contains("INVALID"), "{}", finished.stdout);
}
