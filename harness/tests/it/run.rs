//! `fencelab run` end to end: each fault of the mission really takes effect in the history,
//! the same seed gives the same schedule, bad flags exit 254 before anything starts, and an
//! interrupted or killed harness leaves no process behind and a readable history.

use history::{Op, Process};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use history::{Decision, Event, EventType};
use serde_json::json;

/// Longest a whole test run may take (generous: the machine may be loaded).
const RUN_WAIT_MAX: Duration = Duration::from_secs(180);

pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub store: tempfile::TempDir,
}

impl Finished {
    pub fn folder(&self) -> PathBuf {
        let latest = self.store.path().join("latest");
        self.store.path().join(std::fs::read_link(&latest).expect("store/latest points at the run"))
    }

    pub fn history(&self) -> Vec<Event> {
        verdict::check::read_history(&self.folder().join("history.jsonl")).expect("a valid history")
    }
}

/// A test that fails keeps its run's store: copied out of the temporary directory (which
/// is removed) to one that stays, named on stderr, so that a failure seen once in a soak
/// can be read afterwards.
impl Drop for Finished {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let kept = std::env::temp_dir().join(format!(
            "fencelab-failed-{}-{}",
            std::process::id(),
            self.store.path().file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default()
        ));
        let copied = std::process::Command::new("cp").arg("-a").arg(self.store.path()).arg(&kept).status();
        match copied {
            Ok(status) if status.success() => eprintln!("the failing run's store is kept at {}", kept.display()),
            _ => eprintln!("the failing run's store {} could not be kept", self.store.path().display()),
        }
    }
}

fn fencelab() -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    command
}

/// Runs `fencelab run` with `args` into a fresh store; the store's test name is `run`.
/// Whether PostgreSQL can be started here; if not, says the test skipped (a failure under
/// `FENCELAB_REQUIRE_ALL=1`).
pub fn postgres_or_skip() -> bool {
    let Some(why) = procs::pg::unavailable() else { return true };
    let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
    assert!(!require_all, "PostgreSQL cannot be used ({why}), and FENCELAB_REQUIRE_ALL=1");
    eprintln!("SKIPPED: {why}");
    false
}

pub async fn run(args: &[&str]) -> Finished {
    let store = tempfile::tempdir().unwrap();
    let mut command = fencelab();
    command.args(["run", "--test-name", "run", "--store"]).arg(store.path()).args(args);
    let output = tokio::time::timeout(RUN_WAIT_MAX, command.output()).await.expect("the run ends in time").unwrap();
    let finished = Finished {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        store,
    };
    assert!(finished.code != Some(255), "internal error:\n{}\n{}", finished.stdout, finished.stderr);
    finished
}

/// A run of two busy runners with exactly one fault, given as a schedule. Four jobs a
/// second keep the queue full, so the runner a fault hits is working whenever it hits.
/// Seeds tried for a run that must catch its planted bug: one run's timing decides whether
/// its faults meet the bug (`fencelab matrix` measures the rate), as in the matrix tests.
pub const BUGGY_SEEDS: [&str; 3] = ["3", "4", "5"];

/// The first run of `args` under [`BUGGY_SEEDS`] that is invalid, and the command that
/// repeats it.
pub async fn caught(args: &[&str]) -> (Finished, String) {
    let mut said = Vec::new();
    for seed in BUGGY_SEEDS {
        let finished = run(&[&["--seed", seed], args].concat()).await;
        if finished.code == Some(1) {
            return (finished, format!("fencelab run --seed {seed} {}", args.join(" ")));
        }
        said.push(format!("seed {seed}: exit {:?}\n{}", finished.code, finished.stdout));
    }
    panic!("no seed of {BUGGY_SEEDS:?} caught the bug ({}):\n{}", args.join(" "), said.join("\n"));
}

async fn one_fault(fault: serde_json::Value) -> Finished {
    one_fault_at_rate(fault, "4").await
}

/// As [`one_fault`], with `rate_per_s` jobs a second (a higher rate keeps both runners busy).
async fn one_fault_at_rate(fault: serde_json::Value, rate_per_s: &str) -> Finished {
    faults_at_rate(vec![fault], rate_per_s).await
}

/// As [`one_fault_at_rate`], with every fault of `faults` scheduled.
pub async fn faults_at_rate(faults: Vec<serde_json::Value>, rate_per_s: &str) -> Finished {
    let finished = scheduled(faults, rate_per_s, &[]).await;
    assert_eq!(finished.code, Some(0), "{}\n{}", finished.stdout, finished.stderr);
    finished
}

/// Writes `faults` as `schedule.json` in `dir` (for `--schedule`); its path.
pub fn schedule_file(dir: &std::path::Path, faults: &[serde_json::Value]) -> String {
    let schedule = dir.join("schedule.json");
    std::fs::write(&schedule, serde_json::to_vec(faults).unwrap()).unwrap();
    schedule.to_string_lossy().into_owned()
}

/// A run of two busy runners with exactly the faults of `faults`, and `extra` flags (a
/// planted bug, say), whatever its verdict: jobs of 4 to 6 steps of 150 to 250 ms.
pub async fn scheduled(faults: Vec<serde_json::Value>, rate_per_s: &str, extra: &[&str]) -> Finished {
    scheduled_jobs(faults, rate_per_s, (4, 6), (150, 250), extra).await
}

/// As [`scheduled`], with jobs of `steps` (least, most) steps of `step_ms` (least, most) ms.
async fn scheduled_jobs(
    faults: Vec<serde_json::Value>,
    rate_per_s: &str,
    steps: (u32, u32),
    step_ms: (u64, u64),
    extra: &[&str],
) -> Finished {
    let dir = tempfile::tempdir().unwrap();
    let schedule = schedule_file(dir.path(), &faults);
    let words = [steps.0.to_string(), steps.1.to_string(), step_ms.0.to_string(), step_ms.1.to_string()];
    let args = [
        "--seed",
        "1",
        "--time-limit",
        "8",
        "--runners",
        "2",
        "--keys",
        "2",
        "--rate",
        rate_per_s,
        "--steps-min",
        &words[0],
        "--steps-max",
        &words[1],
        "--step-ms-min",
        &words[2],
        "--step-ms-max",
        &words[3],
        "--recovery-limit",
        "60",
        "--schedule",
        &schedule,
    ];
    // A lease of 600 ms unless `extra` gives one.
    let lease: &[&str] = if extra.contains(&"--lease-ms") { &[] } else { &["--lease-ms", "600"] };
    run(&[&args[..], lease, extra].concat()).await
}

pub fn fault(
    kind: &str,
    runner: Option<u32>,
    at_ms: u64,
    duration_ms: u64,
    variant: serde_json::Value,
) -> serde_json::Value {
    json!({"at_ms": at_ms, "duration_ms": duration_ms, "kind": kind, "runner": runner, "variant": variant})
}

fn ms(event: &Event) -> u64 {
    event.time_ns / 1_000_000
}

fn ledger(events: &[Event], f: Op) -> impl Iterator<Item = &Event> + '_ {
    events.iter().filter(move |event| event.kind == EventType::Ledger && event.f == f)
}

/// The attempts of runner `runner` that expired between `from_ms` and `to_ms` (run clock).
fn expired_attempts(events: &[Event], runner: &str, from_ms: u64, to_ms: u64) -> Vec<String> {
    ledger(events, Op::Expire)
        .filter(|event| event.runner.as_deref() == Some(runner) && (from_ms..=to_ms).contains(&ms(event)))
        .filter_map(|event| event.attempt.clone())
        .collect()
}

/// A rejected report of `attempt` reached the ledger after it had expired.
fn late_report_rejected(events: &[Event], attempt: &str) -> bool {
    [Op::Heartbeat, Op::Capability, Op::Result].into_iter().any(|f| {
        ledger(events, f)
            .any(|event| event.attempt.as_deref() == Some(attempt) && event.decision == Some(Decision::Rejected))
    })
}

fn context(finished: &Finished) -> String {
    format!("run folder {}\n{}", finished.folder().display(), finished.stdout)
}

#[tokio::test(flavor = "multi_thread")]
async fn paused_runner_outlives_its_lease_and_its_late_reports_are_refused() {
    let finished = one_fault(fault("delayed-heartbeats", Some(0), 2_000, 2_000, json!({"how": "pause"}))).await;
    let events = finished.history();
    let expired = expired_attempts(&events, "r1", nemesis_window(&events).0, nemesis_window(&events).1 + 500);
    assert!(!expired.is_empty(), "no attempt of r1 expired while it was paused; {}", context(&finished));
    assert!(expired.iter().any(|attempt| late_report_rejected(&events, attempt)), "{}", context(&finished));
    // As soon as the control plane held r1's claim as ended (its lease is 0.6 s of the 2-s
    // pause), the nemesis sent the heartbeat and capability request r1 would have: refused.
    for report in ["heartbeat", "capability"] {
        let answer = events.iter().find(|event| {
            event.process == Process::NEMESIS
                && event.kind == EventType::Ok
                && event.value.as_ref().is_some_and(|value| {
                    value["report"] == report && value["stale"] == true && value.get("aimed_ms").is_none()
                })
        });
        let Some(answer) = answer else { panic!("no stale {report} was sent in r1's name; {}", context(&finished)) };
        assert_eq!(answer.decision, Some(Decision::Rejected), "{report}: {}", context(&finished));
        assert!(late_report_rejected(&events, answer.attempt.as_deref().unwrap()), "{}", context(&finished));
    }
    // Before that, capability requests in r1's name aimed around the millisecond its lease
    // ended, the end the ledger granted it: each one the control plane received before it was
    // granted, and each one received in that millisecond or after refused (expired).
    let aimed: Vec<&Event> = events
        .iter()
        .filter(|event| {
            event.process == Process::NEMESIS
                && event.kind == EventType::Ok
                && event.value.as_ref().is_some_and(|value| value.get("aimed_ms").is_some())
        })
        .collect();
    assert!(!aimed.is_empty(), "no request was aimed at r1's lease end; {}", context(&finished));
    for probe in aimed {
        let value = probe.value.as_ref().unwrap();
        assert_eq!(value["report"], "capability", "{value}");
        let aimed_ms = value["aimed_ms"].as_i64().unwrap();
        let granted = events.iter().filter(|event| event.kind == EventType::Ledger && event.attempt == probe.attempt);
        assert!(
            granted.clone().any(|event| event.lease_expires_ms == Some(aimed_ms)),
            "aimed at {aimed_ms}, a lease end the ledger never granted {:?}; {}",
            probe.attempt,
            context(&finished)
        );
        let seq = &value["ledger_seq"];
        let entry =
            ledger(&events, Op::Capability).find(|event| event.value.as_ref().is_some_and(|v| &v["seq"] == seq));
        let Some(entry) = entry else {
            panic!("the aimed request {value} is not in the ledger; {}", context(&finished))
        };
        let inside = entry.received_ms < Some(aimed_ms);
        let decided = if inside { Decision::Accepted } else { Decision::Rejected };
        assert_eq!(
            probe.decision,
            Some(decided),
            "received at {:?}, the lease ending at {aimed_ms}",
            entry.received_ms
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn heartbeats_delayed_beyond_the_lease_expire_it() {
    let finished =
        one_fault(fault("delayed-heartbeats", Some(0), 2_000, 2_000, json!({"how": "latency", "latency_ms": 900})))
            .await;
    let events = finished.history();
    assert!(
        !expired_attempts(&events, "r1", nemesis_window(&events).0, nemesis_window(&events).1 + 1_000).is_empty(),
        "{}",
        context(&finished)
    );
}

/// A replay sends the runner's last accepted result again, then a heartbeat and a capability
/// request for that closed claim: the result is a duplicate, and the stale requests are
/// refused and recorded as refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_result_is_acknowledged_as_a_duplicate_and_its_stale_requests_refused() {
    let finished = one_fault(fault("duplicate-results", Some(0), 4_000, 0, json!({"how": "replay"}))).await;
    let events = finished.history();
    let answers: Vec<&Event> =
        events.iter().filter(|event| event.process == Process::NEMESIS && event.kind == EventType::Ok).collect();
    let sent = |report: &str| {
        answers.iter().find(|event| event.value.as_ref().is_some_and(|value| value["report"] == report)).copied()
    };
    let result = sent("result").expect("replayed");
    assert_eq!(result.decision, Some(Decision::Duplicate), "{}", context(&finished));
    assert!(ledger(&events, Op::Result).any(|event| event.decision == Some(Decision::Duplicate)));
    for (report, f) in [("heartbeat", Op::Heartbeat), ("capability", Op::Capability)] {
        let stale = sent(report).unwrap_or_else(|| panic!("no stale {report} was sent; {}", context(&finished)));
        assert_eq!(stale.attempt, result.attempt, "{}", context(&finished));
        assert_eq!(stale.decision, Some(Decision::Rejected), "{report}: {}", context(&finished));
        let recorded = ledger(&events, f)
            .any(|event| event.attempt == result.attempt && event.decision == Some(Decision::Rejected));
        assert!(recorded, "the refused {report} is in the ledger; {}", context(&finished));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_response_makes_the_runner_retry_into_a_duplicate() {
    // Jobs of one 4-s step (the first two submitted at 1.1 s and 1.5 s with this seed and
    // rate), so that the window opens (at 2 s) while r1 is inside its first job's only step,
    // its capability already redeemed: whatever a loaded machine delays, its success is sent
    // inside the window, before its deadline (a 6-s lease), and one of its 8 tries (4.5 s of
    // back-off) lands after the heal (at 7 s).
    let lost = fault("duplicate-results", Some(0), 2_000, 5_000, json!({"how": "lost-response"}));
    let finished = scheduled_jobs(vec![lost], "2", (1, 1), (4_000, 4_000), &["--lease-ms", "6000"]).await;
    assert_eq!(finished.code, Some(0), "{}", context(&finished));
    let events = finished.history();
    let duplicates: Vec<&Event> = ledger(&events, Op::Result)
        .filter(|event| event.runner.as_deref() == Some("r1") && event.decision == Some(Decision::Duplicate))
        .collect();
    assert!(!duplicates.is_empty(), "r1 never retried a committed result; {}", context(&finished));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conflicting_result_is_recorded_and_the_outcome_stays() {
    // The conflict resends r1's last accepted result, so r1 must have had one accepted by 4 s:
    // on a 600-ms lease a loaded machine's r1 self-fenced job after job and had none (a soak
    // pass); a 2-s lease it meets.
    let conflict = fault("conflicting-results", Some(0), 4_000, 0, json!({"how": "conflict"}));
    let finished = scheduled(vec![conflict], "4", &["--lease-ms", "2000"]).await;
    assert_eq!(finished.code, Some(0), "{}", context(&finished));
    let events = finished.history();
    let nemesis = events.iter().find(|event| event.process == Process::NEMESIS && event.kind == EventType::Ok);
    let Some(nemesis) = nemesis else { panic!("the conflict was never sent; {}", context(&finished)) };
    assert_eq!(nemesis.decision, Some(Decision::Conflict), "{}", context(&finished));
    let job = nemesis.job.clone().unwrap();
    let committed = ledger(&events, Op::Result)
        .find(|event| event.job.as_ref() == Some(&job) && event.decision == Some(Decision::Accepted))
        .and_then(|event| event.outcome.clone());
    let last = events.iter().rev().find(|event| event.f == Op::Final && event.job.as_ref() == Some(&job)).unwrap();
    assert_eq!(last.outcome, committed, "the committed outcome was replaced");
}

/// A result for another runner's claim, sent with r1's token: the correct control plane
/// refuses it (`runner_mismatch`) and records nothing; one that takes the body's runner at
/// its word (the planted `trust-named-runner`) applies it, and `ledger-completeness` says so.
#[tokio::test(flavor = "multi_thread")]
async fn a_report_for_another_runners_claim_is_refused_and_applying_it_is_caught() {
    let impersonate = || fault("conflicting-results", Some(0), 3_000, 0, json!({"how": "impersonate"}));
    let finished = one_fault(impersonate()).await;
    let events = finished.history();
    let sent = |event: &&Event| event.process == Process::NEMESIS && event.f == Op::ConflictingResults;
    let invoke = events.iter().filter(sent).find(|event| event.kind == EventType::Invoke).expect("sent");
    let value = invoke.value.as_ref().unwrap();
    assert_eq!((value["token_of"].as_str(), value["effective"].as_bool()), (Some("r1"), Some(true)), "{value}");
    assert_eq!(invoke.runner.as_deref(), Some("r2"), "r2's claim, reported with r1's token; {}", context(&finished));
    let answer = events.iter().filter(sent).find(|event| event.kind != EventType::Invoke).unwrap();
    assert_eq!(answer.kind, EventType::Fail, "{answer:?}");
    assert!(answer.reason.as_deref().unwrap_or_default().contains("runner_mismatch"), "{answer:?}");
    let attempt = invoke.attempt.clone();
    let failed_result = |event: &&Event| event.attempt == attempt && event.outcome.as_deref() == Some("failed");
    let failed = ledger(&events, Op::Result).filter(failed_result).count();
    // r2 may fail that job itself (a job fails now and then): each of its own failed reports
    // may have an entry; the refused one has none.
    let own = events
        .iter()
        .filter(|event| event.process == Process::runner("r2") && event.kind == EventType::Request)
        .filter(|event| event.f == Op::Result)
        .filter(failed_result)
        .count();
    assert!(failed <= own, "nothing recorded for the refused report (r2 sent {own} failed result(s) itself, the ledger holds {failed}); {}", context(&finished));

    caught_under_bug(impersonate(), "trust-named-runner", "foreign-report-applied").await;
}

/// The run of `fault` with planted `bug` on is invalid, and its results name anomaly `kind`.
async fn caught_under_bug(fault: serde_json::Value, bug: &str, kind: &str) {
    let finished = scheduled(vec![fault], "4", &["--bug", bug]).await;
    assert_eq!(finished.code, Some(1), "{bug} is found; {}", context(&finished));
    let results = std::fs::read_to_string(finished.folder().join("results.json")).unwrap();
    assert!(results.contains(&format!("\"{kind}\"")), "{bug} shows {kind}; {}", context(&finished));
}

#[tokio::test(flavor = "multi_thread")]
async fn reconnect_after_reconciliation_gives_the_seeds_stale_completion() {
    let finished = one_fault(fault("reconnects", Some(0), 2_000, 2_400, json!({"how": "cut-links"}))).await;
    let events = finished.history();
    let expired = expired_attempts(&events, "r1", nemesis_window(&events).0, nemesis_window(&events).1);
    let Some(attempt) = expired.first() else { panic!("r1's lease never expired; {}", context(&finished)) };
    let reconciled = events.iter().any(|event| {
        event.process == Process::OPERATOR
            && event.f == Op::Reconcile
            && event.kind == EventType::Ok
            && event.attempt.as_ref() == Some(attempt)
    });
    assert!(reconciled, "the operator never reconciled {attempt}; {}", context(&finished));
    let late = ledger(&events, Op::Result).find(|event| {
        event.attempt.as_ref() == Some(attempt)
            && event.value.as_ref().is_some_and(|v| v["recorded_as"] == "late_observation")
    });
    assert!(late.is_some(), "the old runner's report was not kept as a late observation; {}", context(&finished));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_skewed_runner_clock_shows_in_observation_times_only() {
    let skew = fault("clock-skew", Some(0), 2_000, 2_400, json!({"how": "static-skew", "offset_ms": 90_000}));
    // Four jobs a second keep the queue full, so the skewed runner reports all through the window.
    let finished = one_fault_at_rate(skew, "4").await;
    let events = finished.history();
    let window = nemesis_window(&events);
    let skews: Vec<i64> = events
        .iter()
        .filter(|event| {
            event.kind == EventType::Ledger && event.runner.as_deref() == Some("r1") && event.f != Op::Expire
        })
        .filter(|event| (window.0 + 100..=window.1.saturating_sub(100)).contains(&ms(event)))
        .filter_map(|event| Some(event.observed_ms? - event.received_ms?))
        .collect();
    assert!(!skews.is_empty(), "r1 reported nothing during the skew; {}", context(&finished));
    assert!(skews.iter().all(|skew| (89_000..=91_000).contains(skew)), "skews {skews:?}; {}", context(&finished));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(finished.folder().join("config.json")).unwrap()).unwrap();
    // With libfaketime the runner's whole process clock was moved; without it, its own offset.
    let faked = config["clock_control"].get("libfaketime").is_some();
    assert!(faked || config["clock_control"] == "runner-offset", "the run records how clocks were moved: {config}");
    if !faked {
        let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
        assert!(!require_all, "libfaketime is not installed (Debian: faketime), and FENCELAB_REQUIRE_ALL=1");
        eprintln!("SKIPPED: libfaketime is not installed; the runner's own clock offset was used instead");
    }
}

/// When the (only) fault of a run started and was healed, from the nemesis's records (ms).
fn nemesis_window(events: &[Event]) -> (u64, u64) {
    let phase = |wanted: &str| {
        events.iter().find(|event| {
            event.process == Process::NEMESIS
                && event.kind == EventType::Ok
                && event.value.as_ref().is_some_and(|value| value["phase"] == wanted)
        })
    };
    (phase("start").map_or(0, ms), phase("heal").map_or(u64::MAX, ms))
}

#[tokio::test(flavor = "multi_thread")]
async fn control_link_cut_between_steps_expires_the_lease() {
    let finished =
        one_fault(fault("disconnect-during-mutation", Some(0), 2_000, 1_500, json!({"how": "control-link"}))).await;
    let events = finished.history();
    assert!(
        !expired_attempts(&events, "r1", nemesis_window(&events).0, nemesis_window(&events).1 + 500).is_empty(),
        "{}",
        context(&finished)
    );
}

/// A step held in the network past its attempt's lease (`late-step`): the target refuses
/// it as expired, since a capability dies with its lease; a control plane whose
/// capabilities outlive the lease (`capability-outlives-lease`) lets it land, and
/// `stale-side-effect` says so (`step-after-lease`).
#[tokio::test(flavor = "multi_thread")]
async fn a_step_held_past_its_lease_is_refused_and_applying_it_is_caught() {
    let late =
        || fault("disconnect-during-mutation", Some(0), 2_000, 2_400, json!({"how": "late-step", "latency_ms": 1_200}));
    let finished = one_fault(late()).await;
    let events = finished.history();
    let refused = events.iter().any(|event| {
        event.kind == EventType::Step
            && event.runner.as_deref() == Some("r1")
            && event.reason.as_deref() == Some("expired")
            && ms(event) >= nemesis_window(&events).0
    });
    assert!(refused, "no step of r1 was refused as expired; {}", context(&finished));

    caught_under_bug(late(), "capability-outlives-lease", "step-after-lease").await;
}

/// The target's clock moved behind (`target-skew`): its step log's receipt times fall
/// behind the control plane's by the offset, and the correct lab stays valid.
#[tokio::test(flavor = "multi_thread")]
async fn a_target_clock_moved_behind_shows_in_its_step_log() {
    if engine::run::cluster::libfaketime().is_none() {
        let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
        assert!(!require_all, "libfaketime is not installed (Debian: faketime), and FENCELAB_REQUIRE_ALL=1");
        eprintln!("SKIPPED: libfaketime is not installed: the target's clock cannot be moved");
        return;
    }
    let skew = fault("target-clock-skew", None, 1_500, 3_000, json!({"how": "target-skew", "offset_ms": -60_000}));
    let finished = one_fault(skew).await;
    let events = finished.history();
    let window = nemesis_window(&events);
    let inside = |event: &&Event| (window.0 + 100..=window.1.saturating_sub(100)).contains(&ms(event));
    let server: Vec<(u64, i64)> = events
        .iter()
        .filter(|event| event.kind == EventType::Ledger)
        .filter(inside)
        .filter_map(|event| Some((event.time_ns, event.received_ms?)))
        .collect();
    let skews: Vec<i64> = events
        .iter()
        .filter(|event| event.kind == EventType::Step)
        .filter(inside)
        .filter_map(|step| {
            let near = server.iter().min_by_key(|(time_ns, _)| time_ns.abs_diff(step.time_ns))?;
            Some(step.received_ms? - near.1)
        })
        .collect();
    assert!(!skews.is_empty(), "the target judged no step during the skew; {}", context(&finished));
    assert!(skews.iter().all(|skew| (-61_000..=-59_000).contains(skew)), "skews {skews:?}; {}", context(&finished));
}

#[tokio::test(flavor = "multi_thread")]
async fn target_link_cut_mid_step_leaves_a_step_without_an_answer() {
    let finished =
        one_fault(fault("disconnect-during-mutation", Some(0), 2_000, 1_000, json!({"how": "target-link-mid-step"})))
            .await;
    let events = finished.history();
    let unanswered = events.iter().any(|event| {
        event.process == Process::runner("r1")
            && event.f == Op::Step
            && event.kind == EventType::Info
            && (nemesis_window(&events).0..=nemesis_window(&events).1 + 500).contains(&ms(event))
    });
    assert!(unanswered, "no step of r1 lost its answer; {}", context(&finished));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_runner_loses_its_lease_and_claims_again_after_restart() {
    let finished = one_fault(fault("kill", Some(0), 2_000, 1_200, json!({"how": "kill-runner"}))).await;
    let events = finished.history();
    assert!(
        !expired_attempts(&events, "r1", nemesis_window(&events).0, nemesis_window(&events).1 + 300).is_empty(),
        "{}",
        context(&finished)
    );
    let claimed_again = ledger(&events, Op::Claim)
        .any(|event| event.runner.as_deref() == Some("r1") && ms(event) > nemesis_window(&events).1);
    assert!(claimed_again, "the restarted runner never claimed; {}", context(&finished));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_control_plane_restart_keeps_every_acknowledged_job() {
    // A lease that outlasts the restart even on a loaded machine: a restart longer than the
    // lease makes the runners self-fence and fail their jobs, as they must.
    let restart = fault("restart-control-plane", None, 3_000, 300, json!({"how": "restart-control"}));
    let finished = scheduled(vec![restart], "4", &["--lease-ms", "3000"]).await;
    assert_eq!(finished.code, Some(0), "{}\n{}", finished.stdout, finished.stderr);
    let events = finished.history();
    let acknowledged: Vec<&String> = events
        .iter()
        .filter(|event| event.process == Process::CLIENT && event.kind == EventType::Ok)
        .filter_map(|event| event.job.as_ref())
        .collect();
    assert!(acknowledged.len() >= 10, "{}", context(&finished));
    for job in acknowledged {
        let last = events.iter().find(|event| event.f == Op::Final && event.job.as_ref() == Some(job));
        assert_eq!(
            last.and_then(|event| event.outcome.as_deref()),
            Some("succeeded"),
            "job {job}; {}",
            context(&finished)
        );
    }
    let restarted = events.iter().any(|event| event.process == Process::NEMESIS && event.f == Op::RestartControlPlane);
    assert!(restarted);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_seed_gives_the_same_fault_schedule() {
    let schedule = |finished: &Finished| std::fs::read(finished.folder().join("schedule.json")).unwrap();
    let args = |seed: &'static str| {
        ["--seed", seed, "--time-limit", "40", "--nemesis", "all", "--rate", "0.01", "--recovery-limit", "1"]
    };
    // A run stops early on SIGINT; the schedule is written before anything starts.
    let (five, six) = (args("5"), args("6"));
    let (first, second, other) = tokio::join!(interrupted(&five), interrupted(&five), interrupted(&six));
    assert_eq!(schedule(&first), schedule(&second));
    assert_ne!(schedule(&first), schedule(&other));
    let faults: Vec<serde_json::Value> = serde_json::from_slice(&schedule(&first)).unwrap();
    assert!(faults.len() >= 8, "40 s hold every kind of fault: {faults:?}");
}

/// Starts a run, lets it get going, interrupts it with SIGINT and waits for it to end.
async fn interrupted(args: &[&str]) -> Finished {
    stopped(args, libc::SIGINT).await
}

async fn stopped(args: &[&str], signal: i32) -> Finished {
    let store = tempfile::tempdir().unwrap();
    let mut command = fencelab();
    command.args(["run", "--test-name", "run", "--store"]).arg(store.path()).args(args);
    let mut child = command.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stderr));
    let mut said = String::new();
    let started = async {
        while let Ok(Some(line)) = lines.next_line().await {
            said.push_str(&line);
            said.push('\n');
            if line.starts_with("[chaos]") {
                return;
            }
        }
    };
    tokio::time::timeout(RUN_WAIT_MAX, started).await.expect("the run gets going");
    // SAFETY: kill(2) on the child we started.
    assert_eq!(unsafe { libc::kill(child.id().unwrap() as i32, signal) }, 0);
    let status = tokio::time::timeout(RUN_WAIT_MAX, child.wait()).await.expect("the harness ends").unwrap();
    Finished { code: status.code(), stdout: String::new(), stderr: said, store }
}

/// Processes whose command line mentions `path` (the run's own store).
fn processes_under(path: &Path) -> Vec<String> {
    let needle = path.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            found.push(format!("{}: {cmdline}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

/// Waits (bounded) until no process of the run remains; returns those that do.
async fn leftovers(path: &Path) -> Vec<String> {
    leftovers_within(path, Duration::from_secs(10)).await
}

/// Waits up to `bound` until no process mentioning `path` remains; returns those that do.
pub async fn leftovers_within(path: &Path, bound: Duration) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let found = processes_under(path);
        if found.is_empty() || tokio::time::Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const LONG_RUN: [&str; 6] = ["--seed", "3", "--time-limit", "60", "--nemesis", "all"];

#[tokio::test(flavor = "multi_thread")]
async fn sigint_stops_every_child_and_leaves_a_history() {
    let finished = interrupted(&LONG_RUN).await;
    assert_eq!(finished.code, Some(2), "an interrupted run is incomplete: {}", finished.stderr);
    assert_eq!(leftovers(finished.store.path()).await, Vec::<String>::new());
    let events = finished.history();
    assert!(events.iter().any(|event| event.process == Process::HARNESS && event.f == Op::Config));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_the_harness_takes_every_child_with_it() {
    let finished = stopped(&LONG_RUN, libc::SIGKILL).await;
    assert_eq!(finished.code, None, "killed by a signal");
    assert_eq!(leftovers(finished.store.path()).await, Vec::<String>::new());
    let folder = std::fs::read_dir(finished.store.path().join("run")).unwrap().flatten().next().unwrap().path();
    let text = std::fs::read_to_string(folder.join("history.jsonl")).unwrap();
    let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
    let events = history::read(complete.as_bytes()).expect("the written prefix is a valid history");
    assert!(events.iter().any(|event| event.process == Process::HARNESS && event.f == Op::Config));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_flags_exit_254_before_anything_starts() {
    let cases: [&[&str]; 8] = [
        &["--nemesis", "kill,earthquake"],
        &["--nemesis", "kill,,reconnects"],
        &["--time-limit", "-1"],
        &["--bug", "no-such-bug"],
        &["--lease-ms", "1000", "--heartbeat-interval-ms", "1000"],
        &["--toxiproxy-url", "http://127.0.0.1:9"],
        &["--runners", "0"],
        &["--steps-min", "5", "--steps-max", "2"],
    ];
    for args in cases {
        let finished = run(args).await;
        assert_eq!(finished.code, Some(254), "{args:?}: {}", finished.stderr);
        assert!(finished.stderr.contains(args[0]), "{args:?}: the error names the flag: {}", finished.stderr);
        assert!(!finished.store.path().join("run").exists(), "{args:?} started something");
    }
    // The value itself is named too: an empty name in a list, a negative number.
    for (args, named) in [(["--nemesis", "kill,,reconnects"], "empty fault"), (["--time-limit", "-1"], "'-1'")] {
        let finished = run(&args).await;
        assert!(finished.stderr.contains(named) && finished.stderr.contains(args[1]), "{args:?}: {}", finished.stderr);
    }
    let mut command = fencelab();
    command.args(["run", "--store", "/proc/no-such-place"]);
    let output = command.output().await.unwrap();
    assert_eq!(output.status.code(), Some(254), "{}", String::from_utf8_lossy(&output.stderr));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_on_postgresql_is_valid_and_leaves_no_cluster_behind() {
    if !postgres_or_skip() {
        return;
    }
    let finished =
        run(&["--db", "postgres", "--seed", "2", "--time-limit", "8", "--nemesis", "kill,restart-control-plane"]).await;
    assert_eq!(finished.code, Some(0), "{}\n{}", finished.stdout, finished.stderr);
    let config = std::fs::read_to_string(finished.folder().join("config.json")).unwrap();
    assert!(config.contains("\"db\": \"postgres\""), "config.json says which database: {config}");
    let sqlite = finished.folder().join("lab").join("control_plane").join("control.sqlite");
    assert!(!sqlite.exists(), "no SQLite store was used");
    let events = finished.history();
    let succeeded =
        events.iter().filter(|event| event.f == Op::Final && event.outcome.as_deref() == Some("succeeded")).count();
    // What this shows is that jobs went through PostgreSQL, not a throughput: an 8-s run of
    // runner kills and control-plane restarts on a loaded machine finishes few jobs (2 in a
    // full suite beside two busy loops).
    assert!(succeeded >= 1, "jobs went through the PostgreSQL control plane: {succeeded} succeeded");
    // A cluster folder is named after its owner's pid; the run's owner is gone by now, so a
    // folder whose owner is gone is one the run left behind.
    let orphaned: Vec<String> = std::fs::read_dir(procs::pg::default_parent())
        .map(|dir| {
            dir.filter_map(|entry| entry.ok())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect::<Vec<String>>()
        })
        .unwrap_or_default()
        .into_iter()
        .filter(|name: &String| {
            let owner = name.strip_prefix("cluster-").and_then(|rest| rest.split('-').next());
            owner.is_some_and(|pid| !Path::new("/proc").join(pid).exists())
        })
        .collect();
    assert!(orphaned.is_empty(), "clusters whose owner is gone are left: {orphaned:?}");
}

/// The database dies mid-run: the control plane answers 503, nothing settles, and the run
/// is unknown (exit 2) naming what it could not read — never valid, never an internal error.
#[tokio::test(flavor = "multi_thread")]
async fn a_database_that_dies_mid_run_makes_the_run_unknown_and_says_why() {
    if !postgres_or_skip() {
        return;
    }
    let cluster = tokio::task::spawn_blocking(procs::pg::TempCluster::start).await.unwrap().unwrap();
    let url = cluster.url();
    let args = ["--db", "postgres", "--database-url", &url, "--time-limit", "8", "--recovery-limit", "5"];
    let args = [&args[..], &["--seed", "3", "--nemesis", "none"]].concat();
    let killer = async {
        tokio::time::sleep(std::time::Duration::from_secs(4)).await;
        tokio::task::spawn_blocking(move || drop(cluster)).await.unwrap();
    };
    let (finished, ()) = tokio::join!(run(&args), killer);
    assert_eq!(finished.code, Some(2), "{}\n{}", finished.stdout, finished.stderr);
    let results = std::fs::read_to_string(finished.folder().join("results.json")).unwrap();
    assert!(results.contains("the control plane's ledger could not be read"), "{results}");
    assert!(results.contains("503"), "the control plane said the database was unavailable: {results}");
}

/// A run whose target is gone before its step log is collected is unknown (exit 2), the
/// reason in results.json and its exit code 2 too: the step log is not read as empty (with
/// no steps a run can look valid). The system is the lab with its target under
/// `timeout -s KILL`, so that it dies during the run.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_target_died_before_collection_is_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let system = super::dying_lab(dir.path(), "target", 6).display().to_string();
    let args = ["--system", &system, "--time-limit", "8", "--recovery-limit", "5", "--seed", "4", "--nemesis", "none"];
    let finished = run(&args).await;
    assert_eq!(finished.code, Some(2), "{}\n{}", finished.stdout, finished.stderr);
    let results = std::fs::read_to_string(finished.folder().join("results.json")).unwrap();
    assert!(results.contains("the target's step log could not be read"), "{results}");
    // The summary says why the run is incomplete, not a guess between two causes.
    assert!(finished.stdout.contains("complete     no: "), "{}", finished.stdout);
    assert!(!finished.stdout.contains("interrupted, or jobs did not settle"), "{}", finished.stdout);
    assert!(finished.stdout.contains("records could not be read"), "{}", finished.stdout);
    // The command that repeats it writes where this one did.
    let store = format!("--store {}", finished.store.path().display());
    let repeat = finished.stdout.lines().find(|line| line.starts_with("command ")).unwrap_or_default();
    assert!(repeat.ends_with(&store), "{repeat}");
    let doc = results::read_results(&results).unwrap();
    assert_eq!((doc.overall, doc.exit_code), (results::Overall::Unknown, 2), "results.json is the process's verdict");
}

/// `--stop-at-first`: a planted bug whose anomaly the live records show ends the workload
/// and faults there — recorded as a `stop-at-first` event well before the 30-s limit, the
/// history then collected (no recovery) and checked whole, to the same verdict — and the
/// repeat command keeps the flag. A bug only the target's step log shows, and one only a
/// runner's answer against the ledger shows, stop too. The correct lab under every fault
/// runs to its limit.
#[tokio::test(flavor = "multi_thread")]
async fn stop_at_first_ends_the_workload_at_the_first_ledger_anomaly_with_the_same_verdict() {
    let args = ["--bug", "accept-stale-result", "--nemesis", "all", "--time-limit", "30", "--stop-at-first"];
    let (finished, repeat) = caught(&args).await;
    let history = finished.history();
    let stop = stopped_at(&history, &repeat, &finished.stdout);
    assert!(stop.reason.as_deref().is_some_and(|why| why.contains('/')), "names the rule: {stop:?}");
    assert!(finished.stdout.contains("stopped      at the first anomaly"), "{}", finished.stdout);
    let after = history.iter().filter(|event| event.process == Process::CLIENT && event.time_ns > stop.time_ns);
    assert_eq!(after.filter(|event| event.kind == EventType::Invoke).count(), 0, "no submit after the stop");
    assert!(history.iter().any(|event| event.f == Op::Final), "collected whole ({repeat})");
    let recovery = history.iter().find(|event| event.f == Op::Recovery).expect("a recovery event");
    assert!(
        recovery.reason.as_deref().is_none_or(|why| why.contains("--stop-at-first")),
        "an unsettled job is said to be the stop's: {recovery:?}"
    );
    assert!(finished.stdout.contains("--stop-at-first"), "the repeat command keeps the flag");
    for (bug, nemesis, kind) in [
        ("target-ignores-fence", "target-clock-skew,disconnect-during-mutation", "stale-side-effect/"),
        ("unrecorded-late-result", "reconnects", "ledger-completeness/"),
    ] {
        let (finished, repeat) =
            caught(&["--bug", bug, "--nemesis", nemesis, "--time-limit", "30", "--stop-at-first"]).await;
        let history = finished.history();
        let stop = stopped_at(&history, &repeat, &finished.stdout);
        assert!(stop.reason.as_deref().is_some_and(|why| why.starts_with(kind)), "{bug} stops on {kind}: {stop:?}");
    }
    let correct = run(&["--seed", "3", "--nemesis", "all", "--time-limit", "8", "--stop-at-first"]).await;
    assert_eq!(correct.code, Some(0), "{}\n{}", correct.stdout, correct.stderr);
    assert!(!correct.history().iter().any(|event| event.f == Op::StopAtFirst), "nothing to stop at");
}

/// The `stop-at-first` event of a history, before the 30-s time limit.
fn stopped_at<'a>(history: &'a [history::Event], repeat: &str, stdout: &str) -> &'a history::Event {
    let stop = history.iter().find(|event| event.f == Op::StopAtFirst);
    let stop = stop.unwrap_or_else(|| panic!("the watch found the anomaly ({repeat})\n{stdout}"));
    assert!(stop.time_ns < 30_000_000_000, "before the time limit: {stop:?} ({repeat})");
    stop
}

/// Issue 38: a system file that declares one store (`[db.*]` table) makes it the run's store
/// when `--db` is left out; `config.json` and the repeat command name it, and a `--db` the
/// file lacks is still refused by name.
#[tokio::test(flavor = "multi_thread")]
async fn a_system_file_with_one_store_runs_on_it_without_db() {
    if !postgres_or_skip() {
        return;
    }
    let lab = include_str!("../../../systems/lab.toml");
    let sqlite_table = "[db.sqlite]\ncontrol_plane_args = [\"--db={data_dir}/control.sqlite\"]\n";
    assert!(lab.contains(sqlite_table), "systems/lab.toml's `[db.sqlite]` table is as this test cuts it");
    let folder = tempfile::tempdir().unwrap();
    let file = folder.path().join("postgres-only.toml");
    std::fs::write(&file, lab.replace(sqlite_table, "")).unwrap();
    let file = file.display().to_string();
    let args = ["--system", &file, "--nemesis", "none", "--time-limit", "3", "--runners", "1", "--seed", "1"];
    let finished = run(&args).await;
    assert_eq!(finished.code, Some(0), "{}\n{}", finished.stdout, finished.stderr);
    let config = runfolder::folder::RunFolder::at(finished.folder()).run_config().unwrap();
    assert_eq!(config.run.db, system::Db::Postgres, "config.json records the file's one store");
    let repeat = finished.stdout.lines().find(|line| line.contains("fencelab run ")).unwrap_or_default();
    assert!(repeat.contains(&format!("--db postgres --system {file}")), "the repeat command names the store: {repeat}");
    let wrong = run(&[&args[..], &["--db", "sqlite"]].concat()).await;
    assert_eq!(wrong.code, Some(254), "{}", wrong.stderr);
    assert!(wrong.stderr.contains("`--db sqlite`: the system file has no `[db.sqlite]` table"), "{}", wrong.stderr);
}

/// A start that takes longer than the plan's first times leaves none of them overdue: the
/// jobs are submitted, and the faults fired, at their times from when the workload began
/// (the `config` event), not all at once when the system came up. (A PostgreSQL start that
/// took 7.9 s of an 8-s run once fired four control-plane restarts within 0.7 s, and every
/// submit into the first.) The lab's control plane is started here 3 s late.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_start_leaves_no_submit_or_fault_overdue() {
    let lab = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../systems/lab.toml");
    let text = std::fs::read_to_string(lab).unwrap();
    let slow = text.replacen(
        "command = [\n  \"{fencelab}\", \"lab\", \"control-plane\",",
        "command = [\n  \"sh\", \"-c\", \"sleep 3 && exec \\\"$0\\\" \\\"$@\\\"\", \"{fencelab}\", \"lab\", \"control-plane\",",
        1,
    );
    assert_ne!(slow, text, "the lab's control-plane command is where this test expects it");
    let dir = tempfile::tempdir().unwrap();
    let system = dir.path().join("slow-lab.toml");
    std::fs::write(&system, slow).unwrap();
    let replay = fault("duplicate-results", Some(0), 1_000, 0, json!({"how": "replay"}));
    let finished = scheduled(vec![replay], "4", &["--system", system.to_str().unwrap()]).await;
    assert_eq!(finished.code, Some(0), "{}", context(&finished));
    let events = finished.history();
    let began_ms = events.iter().find(|event| event.f == Op::Config).expect("the config event").time_ns / 1_000_000;
    assert!(began_ms >= 3_000, "the control plane came up {began_ms} ms in, after its 3-s sleep");
    let jobs: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(finished.folder().join("jobs.json")).unwrap()).unwrap();
    let mut checked = 0;
    for job in &jobs {
        let (id, at_ms) = (job["id"].as_str().unwrap(), job["at_ms"].as_u64().unwrap());
        let submitted = events.iter().find(|event| {
            event.process == Process::CLIENT && event.kind == EventType::Invoke && event.job.as_deref() == Some(id)
        });
        let Some(submitted) = submitted else { continue };
        let submitted_ms = submitted.time_ns / 1_000_000;
        assert!(
            submitted_ms >= began_ms + at_ms,
            "{id}, planned {at_ms} ms into the workload, was submitted {} ms into it; {}",
            submitted_ms as i64 - began_ms as i64,
            context(&finished)
        );
        checked += 1;
    }
    assert!(checked >= 4, "the plan's jobs were submitted ({checked}); {}", context(&finished));
    let fired = events.iter().find(|event| event.process == Process::NEMESIS).expect("the replay was tried");
    let fired_ms = fired.time_ns / 1_000_000;
    assert!(
        fired_ms >= began_ms + 1_000,
        "the replay planned at 1000 ms fired {} ms into the workload",
        fired_ms as i64 - began_ms as i64
    );
}
