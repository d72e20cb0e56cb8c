//! The runner held to its own rules, through the binary: each planted bug of the runner
//! (`Home::Runner`, passed to the runner processes as `--bug`) is caught by `runner-contract`
//! under the one fault that gives it the chance, scheduled alone on runner r1, and the
//! correct lab under the same schedule is valid — the fault having taken effect: renewals
//! answered late (`slow-answers`). The rates under the default run's every fault, and of the
//! bugs that a clock moved back (`backward-jump`) gives its chance, are `fencelab matrix`'s.

use history::{Event, EventType, Op, Process};
use serde_json::{json, Value};

use crate::run::{fault, scheduled, Finished};

/// The lease of a scheduled run (`run::scheduled`), ms.
const LEASE_MS: u64 = 600;

/// When the fault starts, ms into the run: both runners are busy by then.
const AT_MS: u64 = 2_000;

/// The control plane's answers to r1 0.6 lease late for 5 leases. Named on r1, the fault
/// waits (bounded) for r1 to hold a claim: on a loaded machine the lab may not be working
/// yet at `AT_MS` (a default run's slow answers, on every runner, wait for none).
fn slow_answers() -> Value {
    let latency_ms = LATENCY_MS;
    let variant = json!({"how": "slow-answers", "latency_ms": latency_ms});
    fault("delayed-heartbeats", Some(0), AT_MS, 5 * LEASE_MS, variant)
}

/// The slow answers' latency, ms.
const LATENCY_MS: u64 = LEASE_MS * 3 / 5;

/// `runner-contract`'s verdict in the run's `results.json`.
fn runner_contract(finished: &Finished) -> results::CheckerDoc {
    let text = std::fs::read_to_string(finished.folder().join("results.json")).expect("results.json");
    let doc = results::read_results(&text).expect("a results.json");
    doc.checkers.into_iter().find(|checker| checker.checker == "runner-contract").expect("its verdict")
}

/// The nemesis's start of the fault realised as `how`, and its heal's time (ns): it must
/// have taken effect, else the run tested nothing.
fn window(history: &[Event], how: &str) -> (Event, u64) {
    let of = |phase: &str| {
        history.iter().find(|event| {
            let value = event.value.as_ref();
            event.process == Process::NEMESIS
                && event.kind == EventType::Ok
                && value.is_some_and(|value| value["variant"]["how"] == how && value["phase"] == phase)
        })
    };
    let start = of("start").unwrap_or_else(|| panic!("no effective start of {how}"));
    assert_eq!(start.value.as_ref().unwrap()["effective"], true, "{start:?}");
    let heal = of("heal").unwrap_or_else(|| panic!("no heal of {how}"));
    (start.clone(), heal.time_ns)
}

/// r1's requests of `f` inside `[from_ns, to_ns)` and the time each waited for its answer
/// (ms), in its own log's order.
fn answered_after(history: &[Event], f: Op, from_ns: u64, to_ns: u64) -> Vec<u64> {
    let r1 = Process::runner("r1");
    let log: Vec<&Event> = history.iter().filter(|event| event.process == r1 && event.f == f).collect();
    let pairs = log.windows(2).filter(|pair| pair[0].kind == EventType::Request && pair[1].kind == EventType::Response);
    let inside = pairs.filter(|pair| from_ns <= pair[0].time_ns && pair[0].time_ns < to_ns);
    inside.map(|pair| (pair[1].time_ns - pair[0].time_ns) / 1_000_000).collect()
}

/// Runs the schedule of `fault` with `bug` switched on and without it, at once: the buggy
/// run is invalid with `runner-contract`'s `acted-past-deadline`, the correct run valid. Answers both runs (the correct one second).
async fn judged(bug: &str, fault: Value) -> (Finished, Finished) {
    let flags = ["--bug", bug];
    let (buggy, correct) = tokio::join!(scheduled(vec![fault.clone()], "4", &flags), scheduled(vec![fault], "4", &[]));
    let repeat = format!("the buggy run's folder {}", buggy.folder().display());
    assert_eq!(buggy.code, Some(1), "{bug} is caught ({repeat}):\n{}\n{}", buggy.stdout, buggy.stderr);
    let verdict = runner_contract(&buggy);
    // On r1 mostly; a loaded machine's slow answers give r2 its chance too (seen: r2's
    // first claim answered late, before the fault, with r1 not caught in what was left of
    // the 8-s run after the fault had waited for it to hold a claim).
    let found: Vec<_> = verdict.anomalies.iter().filter(|anomaly| anomaly.kind == "acted-past-deadline").collect();
    assert!(!found.is_empty(), "{bug}: a runner acted past its deadline ({repeat}): {verdict:#?}");
    assert!(found[0].message.contains("its last answered renewal"), "{:?}", found[0]);
    assert_eq!(correct.code, Some(0), "the correct lab:\n{}\n{}", correct.stdout, correct.stderr);
    (buggy, correct)
}

/// The correct run shows the slow answers: r1's requests to the control plane inside the
/// window were answered at least the toxic's latency late.
fn answers_came_late(correct: &Finished) {
    let history = correct.history();
    let (start, heal_ns) = window(&history, "slow-answers");
    let latency_ms = LATENCY_MS;
    // A request sent within the latency of the heal may be answered as the toxic goes.
    // Whatever r1 was doing then — claiming, renewing, asking for a capability (a correct
    // runner whose claim and capability together outlast its deadline self-fences and
    // claims again, and may send no heartbeat in the window).
    let to_ns = heal_ns - latency_ms * 1_000_000;
    let waits: Vec<(Op, u64)> = [Op::Claim, Op::Heartbeat, Op::Capability]
        .into_iter()
        .flat_map(|f| answered_after(&history, f, start.time_ns, to_ns).into_iter().map(move |ms| (f, ms)))
        .collect();
    let window_ms = (start.time_ns / 1_000_000, heal_ns / 1_000_000);
    assert!(
        !waits.is_empty() && waits.iter().all(|(_, ms)| *ms >= latency_ms),
        "r1's requests inside the window {window_ms:?} ms and their waits (ms): {waits:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runner_counting_its_authority_from_a_renewals_answer_is_caught_under_slow_answers() {
    let (_, correct) = judged("deadline-from-answer", slow_answers()).await;
    answers_came_late(&correct);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runner_sending_the_step_of_a_capability_answered_too_late_is_caught_under_slow_answers() {
    let (_, correct) = judged("step-with-held-capability", slow_answers()).await;
    answers_came_late(&correct);
}
