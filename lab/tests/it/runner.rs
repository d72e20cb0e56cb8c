//! The lab runner as a process: what its log holds, how its clock file is read, and what
//! it does against a scripted control plane — retrying an unanswered capability request,
//! holding one claim at a time, sending no heartbeat while it retries a result.
//!
//! Repeat with: `cargo nextest run -p lab runner::`

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use history::{Decision, Event, EventType, Op};
use lab::demo::{is_terminal, LabOptions, LocalLab};
use lab::launch;
use protocol::*;
use serde_json::{json, Value};

/// Every wait on a condition (generous: the machine may be loaded).
const WAIT_MAX: Duration = Duration::from_secs(30);

fn program() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_fencelab-lab"))
}

fn options(dir: &Path) -> LabOptions {
    LabOptions::new(program(), dir)
}

/// Starts a runner process with `args` (after `runner`), its stderr in `dir`.
fn start_runner(dir: &Path, args: &[String]) -> launch::Process {
    let mut all = vec!["runner".to_string()];
    all.extend(args.iter().cloned());
    let command = launch::command(program(), &all, Some(&dir.join("runner.stderr"))).expect("a command");
    launch::plain(command, "runner").expect("the runner starts")
}

/// Waits (bounded) for a process to exit; its exit code.
async fn exit_code(process: &mut launch::Process) -> Option<i32> {
    let status = tokio::time::timeout(WAIT_MAX, process.child.wait()).await.expect("the process exits in time");
    status.expect("the process is waited for").code()
}

/// The lines of a runner's log, each read as a history event (without `index`).
fn log_events(path: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(path).expect("the runner's log");
    text.lines()
        .map(|line| {
            assert!(!line.contains("\"index\""), "a runner's log line carries `index`: {line}");
            serde_json::from_str(line).unwrap_or_else(|error| panic!("not an event ({error}): {line}"))
        })
        .collect()
}

fn has_claim(event: &Event) -> bool {
    event.job.is_some() && event.attempt.is_some() && event.runner.is_some() && event.fence.is_some()
}

/// Checks one line of a correct run's log against docs/history.md ("The runner's log").
fn check_fields(event: &Event) -> Result<(), String> {
    let ledger_seq = event.value.as_ref().and_then(|value| value.get("ledger_seq")).and_then(Value::as_u64);
    let step_value = event.value.as_ref().is_some_and(|value| value["step"].is_u64() && value["steps"].is_u64());
    let fine = match (event.kind, event.f) {
        (EventType::Request, Op::Claim) => {
            event.runner.is_some() && event.observed_ms.is_some() && event.job.is_none() && event.decision.is_none()
        }
        (EventType::Response, Op::Claim) if event.decision.is_some() => {
            has_claim(event)
                && event.key.is_some()
                && event.observed_ms.is_some()
                && event.lease_expires_ms.is_some()
                && event.decision == Some(Decision::Accepted)
        }
        (EventType::Response, Op::Claim) => {
            event.reason.as_deref() == Some("none_claimable") && event.job.is_none() && event.runner.is_some()
        }
        (EventType::Request, Op::Heartbeat | Op::Capability | Op::Result) => {
            has_claim(event)
                && event.observed_ms.is_some()
                && event.decision.is_none()
                && (event.outcome.is_some() == (event.f == Op::Result))
        }
        (EventType::Response, Op::Heartbeat | Op::Capability | Op::Result) => {
            has_claim(event) && event.observed_ms.is_some() && event.decision.is_some() && ledger_seq.is_some()
        }
        (EventType::Request, Op::Step) => {
            has_claim(event) && event.key.is_some() && step_value && event.observed_ms.is_none()
        }
        (EventType::Response, Op::Step) => has_claim(event) && event.key.is_some() && event.decision.is_some(),
        _ => false,
    };
    fine.then_some(()).ok_or_else(|| format!("{event:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_runner_log_is_appended_without_index_with_the_documented_fields() {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = LocalLab::start(options(dir.path())).await.unwrap();
    let log = lab.runner_log("r1");
    let earlier = r#"{"time_ns":1,"process":"runner:r1","type":"info","f":"claim","reason":"an earlier run"}"#;
    std::fs::write(&log, format!("{earlier}\n")).unwrap();
    lab.spawn_runner("r1", &["--jobs-max=1".into()]).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    while !std::fs::read_to_string(&log).unwrap().contains("none_claimable") {
        assert!(tokio::time::Instant::now() < deadline, "the runner never logged an empty claim answer");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lab.submit("j1", "k", JobSpec { steps: 3, step_ms: 300 }).await.unwrap();
    let view = lab.wait_job("j1", WAIT_MAX, is_terminal).await.unwrap();
    assert_eq!(view.state, JobState::Succeeded);
    assert_eq!(exit_code(&mut lab.runners[0]).await, Some(0), "--jobs-max=1: the runner exits after one job");

    let events = log_events(&log);
    assert_eq!(events[0].reason.as_deref(), Some("an earlier run"), "the log was not appended to");
    let events = &events[1..];
    let wrong: Vec<String> = events.iter().filter_map(|event| check_fields(event).err()).collect();
    assert!(wrong.is_empty(), "lines without their documented fields:\n{}", wrong.join("\n"));
    for f in [Op::Claim, Op::Heartbeat, Op::Capability, Op::Step, Op::Result] {
        let answered = events.iter().any(|event| event.f == f && event.kind == EventType::Response);
        assert!(answered, "no answered {f:?} in the log");
    }
    assert!(events.windows(2).all(|pair| pair[0].time_ns <= pair[1].time_ns), "the log is not in time order");
    lab.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_answer_to_a_claim_is_logged_and_stops_the_runner() {
    let dir = tempfile::tempdir().unwrap();
    let lab = LocalLab::start(options(dir.path())).await.unwrap();
    let log = dir.path().join("runner.jsonl");
    let args = [
        "--id=r1".to_string(),
        "--token=not-a-token".into(),
        format!("--control-url={}", lab.control_url()),
        format!("--log={}", log.display()),
    ];
    let mut runner = start_runner(dir.path(), &args);
    assert_eq!(exit_code(&mut runner).await, Some(255));
    let events = log_events(&log);
    let kinds: Vec<(EventType, Op)> = events.iter().map(|event| (event.kind, event.f)).collect();
    assert_eq!(kinds, [(EventType::Request, Op::Claim), (EventType::Response, Op::Claim)]);
    let answer = &events[1];
    assert_eq!((answer.decision, answer.runner.as_deref()), (None, Some("r1")));
    let reason = answer.reason.as_deref().unwrap_or_default();
    assert!(reason.starts_with("401 unauthorized: "), "{reason}");
    lab.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_answer_is_logged_as_info_and_sigterm_stops_the_runner() {
    let dir = tempfile::tempdir().unwrap();
    // A port nobody listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let log = dir.path().join("runner.jsonl");
    let args = [
        "--id=r1".to_string(),
        "--token=t".into(),
        format!("--control-url=http://{closed}"),
        format!("--log={}", log.display()),
        "--poll-ms=20".into(),
    ];
    let mut runner = start_runner(dir.path(), &args);
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    while std::fs::read_to_string(&log).map_or(true, |text| text.lines().count() < 4) {
        assert!(tokio::time::Instant::now() < deadline, "the runner logged too little");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(runner.signal(libc::SIGTERM));
    assert_eq!(exit_code(&mut runner).await, Some(0));
    let events = log_events(&log);
    for pair in events.chunks_exact(2) {
        assert_eq!((pair[0].kind, pair[1].kind), (EventType::Request, EventType::Info), "{pair:?}");
        let reason = pair[1].reason.as_deref().unwrap_or_default();
        assert!(reason.starts_with(&format!("no answer from http://{closed}/v1/claim")), "{reason}");
    }
}

/// The skew of a job's reports: observation minus receipt time, each within 500 ms of `expected_ms`.
/// Its claim is left out: the runner polls, and the request that is answered with the job may
/// have read the clock before the job was submitted (a soak pass saw j4 claimed by a request
/// that read the previous offset).
async fn assert_skew(lab: &LocalLab, job: &str, expected_ms: i64) {
    let view = lab.wait_job(job, WAIT_MAX, is_terminal).await.unwrap();
    assert_eq!(view.state, JobState::Succeeded, "{view:?}");
    let reports: Vec<&LedgerEntry> = view
        .ledger
        .iter()
        .filter(|entry| !matches!(entry.kind, Op::Submit | Op::Claim) && entry.observed_ms.is_some())
        .collect();
    assert!(!reports.is_empty());
    for entry in reports {
        let skew_ms = entry.observed_ms.unwrap() - entry.received_ms;
        assert!(
            (skew_ms - expected_ms).abs() <= 500,
            "{job}: entry {} skew {skew_ms} ms, expected {expected_ms}",
            entry.seq
        );
    }
}

/// The clock file is re-read at every observation; its offset adds to `--clock-offset-ms`;
/// a file that cannot be read or parsed adds nothing.
#[tokio::test(flavor = "multi_thread")]
async fn the_clock_offset_file_is_reread_and_ignored_when_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = LocalLab::start(options(dir.path())).await.unwrap();
    let file: PathBuf = dir.path().join("clock-offset");
    std::fs::write(&file, " -120000\n").unwrap();
    lab.spawn_runner("r1", &["--clock-offset-ms=1000".into(), format!("--clock-offset-file={}", file.display())])
        .await
        .unwrap();
    let spec = JobSpec { steps: 2, step_ms: 10 };
    lab.submit("j1", "k", spec.clone()).await.unwrap();
    assert_skew(&lab, "j1", -119_000).await;
    std::fs::write(&file, "two minutes\n").unwrap();
    lab.submit("j2", "k", spec.clone()).await.unwrap();
    assert_skew(&lab, "j2", 1_000).await;
    std::fs::write(&file, "+30000").unwrap();
    lab.submit("j3", "k", spec.clone()).await.unwrap();
    assert_skew(&lab, "j3", 31_000).await;
    std::fs::remove_file(&file).unwrap();
    lab.submit("j4", "k", spec).await.unwrap();
    assert_skew(&lab, "j4", 1_000).await;
    lab.shutdown().await;
}

/// A control plane and target in one, answering as scripted and recording every request.
#[derive(Default)]
struct Script {
    /// Each request's path, in arrival order (`/v1/claim` as `claim-granted` or `claim-empty`).
    seen: Mutex<Vec<String>>,
    grants: AtomicU64,
    grants_max: u64,
    /// How many of the first capability (result) requests get no answer before the runner's timeout.
    capability_stalls: AtomicU32,
    result_stalls: AtomicU32,
    ledger_seq: AtomicU64,
}

/// Longer than the runner's request timeout in these tests.
const STALL: Duration = Duration::from_millis(900);
const REQUEST_TIMEOUT_MS: u64 = 300;

impl Script {
    fn see(&self, what: &str) {
        self.seen.lock().unwrap().push(what.to_string());
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    async fn stall_if(counter: &AtomicU32) {
        if counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1)).is_ok() {
            tokio::time::sleep(STALL).await;
        }
    }

    fn verdict(&self, body: &Value) -> Value {
        let seq = self.ledger_seq.fetch_add(1, Ordering::SeqCst) + 1;
        json!({"decision": "accepted", "ledger_seq": seq, "lease_expires_ms": lab::control::Now::read().ms + 60_000,
               "capability": {"deployment_key": "k", "job": body["job"], "attempt": body["attempt"],
                              "runner": body["runner"], "fence": body["fence"], "expires_ms": i64::MAX, "signature": "00"}})
    }
}

type Shared = Arc<Script>;

async fn claim(State(script): State<Shared>, Json(body): Json<Value>) -> Json<Value> {
    let n = script.grants.fetch_add(1, Ordering::SeqCst) + 1;
    if n > script.grants_max {
        script.see("claim-empty");
        return Json(json!({"grant": null}));
    }
    script.see("claim-granted");
    let claim = json!({"job": format!("j{n}"), "attempt": format!("j{n}-a1"), "runner": body["runner"], "fence": n});
    Json(json!({"grant": {"claim": claim, "project": "p", "deployment_key": "k", "spec": {"steps": 2, "step_ms": 0},
                          "lease_ms": 60_000, "lease_expires_ms": lab::control::Now::read().ms + 60_000}}))
}

async fn heartbeat(State(script): State<Shared>, Json(body): Json<Value>) -> Json<Value> {
    script.see("heartbeat");
    let mut verdict = script.verdict(&body);
    verdict.as_object_mut().unwrap().remove("capability");
    Json(verdict)
}

async fn capability(State(script): State<Shared>, Json(body): Json<Value>) -> Json<Value> {
    script.see("capability");
    Script::stall_if(&script.capability_stalls).await;
    Json(script.verdict(&body))
}

async fn result(State(script): State<Shared>, Json(body): Json<Value>) -> Json<Value> {
    script.see("result");
    Script::stall_if(&script.result_stalls).await;
    Json(json!({"decision": "accepted", "ledger_seq": script.verdict(&body)["ledger_seq"]}))
}

async fn step(State(script): State<Shared>, Json(body): Json<Value>) -> Json<Value> {
    script.see("step");
    // Long enough for heartbeats to be due while the steps run.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let capability = &body["capability"];
    Json(json!({"record": {"seq": 0, "deployment_key": "k", "job": capability["job"], "attempt": capability["attempt"],
                           "runner": capability["runner"], "fence": capability["fence"], "step": body["step"],
                           "steps": body["steps"], "applied": true, "revision": 1, "highest_fence_before": 0,
                           "received_ms": 0, "mono_ns": 0}}))
}

/// Serves `script` on loopback; its base URL.
async fn serve(script: Shared) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = Router::new()
        .route("/v1/claim", post(claim))
        .route("/v1/heartbeat", post(heartbeat))
        .route("/v1/capability", post(capability))
        .route("/v1/result", post(result))
        .route("/v1/steps", post(step))
        .with_state(script);
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// Runs a runner for `jobs` jobs against `script`; returns what the script saw.
async fn run_scripted(script: Script, jobs: u64) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let script = Arc::new(script);
    let url = serve(script.clone()).await;
    let args = [
        "--id=r1".to_string(),
        "--token=t".into(),
        format!("--control-url={url}"),
        format!("--target-url={url}"),
        format!("--jobs-max={jobs}"),
        format!("--request-timeout-ms={REQUEST_TIMEOUT_MS}"),
        "--heartbeat-interval-ms=50".into(),
        "--poll-ms=20".into(),
    ];
    let mut runner = start_runner(dir.path(), &args);
    assert_eq!(exit_code(&mut runner).await, Some(0), "the runner failed: see its stderr");
    script.seen()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unanswered_capability_request_is_retried_while_heartbeats_go_on() {
    let seen =
        run_scripted(Script { grants_max: 1, capability_stalls: AtomicU32::new(2), ..Script::default() }, 1).await;
    let first_step = seen.iter().position(|what| what == "step").expect("a step was sent");
    let before = &seen[..first_step];
    assert_eq!(before.iter().filter(|what| *what == "capability").count(), 3, "{seen:?}");
    assert!(before.iter().any(|what| what == "heartbeat"), "no heartbeat while redeeming: {seen:?}");
    assert_eq!(seen.iter().filter(|what| *what == "step").count(), 2, "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("result"), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runner_holds_one_claim_at_a_time() {
    let seen = run_scripted(Script { grants_max: 2, ..Script::default() }, 2).await;
    let mut order: Vec<&str> =
        seen.iter().map(String::as_str).filter(|what| matches!(*what, "claim-granted" | "result")).collect();
    // A result whose answer was late is sent again (a duplicate the contract allows; seen on
    // a loaded machine): one claim's results count once.
    order.dedup();
    assert_eq!(order, ["claim-granted", "result", "claim-granted", "result"], "{seen:?}");
    assert_eq!(seen.iter().filter(|what| what.starts_with("claim")).count(), 2, "a claim while one was held: {seen:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_heartbeat_is_sent_while_a_result_is_retried() {
    let seen = run_scripted(Script { grants_max: 1, result_stalls: AtomicU32::new(2), ..Script::default() }, 1).await;
    let first_result = seen.iter().position(|what| what == "result").expect("a result was sent");
    let after: Vec<&String> = seen[first_result..].iter().collect();
    assert_eq!(after, ["result", "result", "result"], "{seen:?}");
    assert!(seen[..first_result].iter().any(|what| what == "heartbeat"), "no heartbeat at all: {seen:?}");
}
