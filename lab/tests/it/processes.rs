//! The lab as real processes over loopback HTTP: the seed's stale completion, runners that
//! fence themselves, durability across a control-plane kill, and the process-level bugs.

use std::path::Path;
use std::time::Duration;

use history::{Decision, Op};
use lab::bugs::Bug;
use lab::demo::{is_terminal, LabOptions, LocalLab, CAPABILITY_SECRET};
use protocol::client::Client;
use protocol::*;

/// Every wait on a condition in these tests (generous: the machine may be loaded).
const WAIT_MAX: Duration = Duration::from_secs(30);

fn options(dir: &Path, lease_ms: u64, bugs: &[Bug]) -> LabOptions {
    let mut options = LabOptions::new(Path::new(env!("CARGO_BIN_EXE_fencelab-lab")), dir);
    options.lease_ms = lease_ms;
    options.bugs = bugs.to_vec();
    options
}

fn now_ms() -> i64 {
    lab::control::Now::read().ms
}

/// Claims, redeems, applies one step and reports success, as a runner would: used to spend fences.
async fn run_directly(lab: &LocalLab, runner: &Client, runner_id: &str) -> ClaimRef {
    let grant = runner
        .claim(&ClaimRequest { runner: runner_id.into(), observed_ms: now_ms() })
        .await
        .unwrap()
        .grant
        .expect("a claimable job");
    let result =
        ResultRequest { claim: grant.claim.clone(), outcome: Outcome::Succeeded, observed_ms: now_ms(), detail: None };
    assert_eq!(runner.result(&result).await.unwrap().decision, Decision::Accepted);
    let _ = lab;
    grant.claim
}

async fn uncertain(lab: &LocalLab, job: &str) -> JobView {
    lab.wait_job(job, WAIT_MAX, |view| view.state == JobState::Uncertain).await.unwrap()
}

/// The seed's TestStaleCompletion: A1 (fence 7) expires, is reconciled as stopped, A2
/// (fence 8) runs on a real runner process, and A1's late success is kept, not taken.
#[tokio::test(flavor = "multi_thread")]
async fn seed_stale_completion_with_real_processes() {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = LocalLab::start(options(dir.path(), 800, &[])).await.unwrap();
    let r1 = lab.register("R1").await.unwrap();
    for index in 1..=6 {
        lab.submit(&format!("warm{index}"), "warm", JobSpec { steps: 1, step_ms: 1 }).await.unwrap();
        run_directly(&lab, &r1, "R1").await;
    }
    lab.submit("J", "prod", JobSpec { steps: 50, step_ms: 1_000 }).await.unwrap();
    let a1 = r1.claim(&ClaimRequest { runner: "R1".into(), observed_ms: now_ms() }).await.unwrap().grant.unwrap().claim;
    assert_eq!(a1.fence, 7);
    // R1 loses its network: it sends nothing more. The lease expires on the server's clock.
    uncertain(&lab, "J").await;
    let reconcile = ReconcileRequest {
        job: "J".into(),
        attempt: a1.attempt.clone(),
        finding: Finding::Stopped,
        outcome: None,
        evidence: Some("R1's execution observed stopped".into()),
    };
    lab.operator.reconcile(&reconcile).await.unwrap();
    lab.spawn_runner("R2", &[]).await.unwrap();
    let view =
        lab.wait_job("J", WAIT_MAX, |view| view.attempts.len() == 2 && view.state == JobState::Running).await.unwrap();
    assert_eq!(view.attempts[1].fence, 8);
    // R1 reconnects and reports success for A1.
    let late = ResultRequest { claim: a1.clone(), outcome: Outcome::Succeeded, observed_ms: now_ms(), detail: None };
    let verdict = r1.result(&late).await.unwrap();
    assert_eq!((verdict.decision, verdict.reason.map(|word| word.as_str())), (Decision::Rejected, Some("superseded")));
    let view = lab.operator.job("J").await.unwrap();
    let picture: Vec<_> =
        view.attempts.iter().map(|a| (a.fence, a.state, a.current, a.closed_by, a.runner.clone())).collect();
    assert_eq!(
        picture,
        vec![
            (7, AttemptState::Failed, false, Some(history::ClosedBy::ObservedStopped), "R1".to_string()),
            (8, AttemptState::Running, true, None, "R2".to_string()),
        ]
    );
    assert_eq!((view.state, view.outcome), (JobState::Running, None));
    let kept = view.ledger.iter().find(|entry| entry.seq == verdict.ledger_seq).unwrap();
    assert_eq!(
        (kept.attempt.as_deref(), kept.recorded_as.map(|word| word.as_str())),
        (Some(a1.attempt.as_str()), Some("late_observation"))
    );
    lab.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn real_runners_run_jobs_to_success() {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = LocalLab::start(options(dir.path(), 2_000, &[])).await.unwrap();
    lab.spawn_runner("r1", &[]).await.unwrap();
    lab.spawn_runner("r2", &[]).await.unwrap();
    for index in 0..8 {
        lab.submit(&format!("j{index}"), &format!("k{}", index % 3), JobSpec { steps: 3, step_ms: 10 }).await.unwrap();
    }
    for index in 0..8 {
        let view = lab.wait_job(&format!("j{index}"), WAIT_MAX, is_terminal).await.unwrap();
        assert_eq!(view.state, JobState::Succeeded, "{view:?}");
        assert_eq!(view.attempts.len(), 1);
    }
    let steps = Client::new(&lab.target_url(), None, Duration::from_secs(5)).steps(100_000).await.unwrap();
    assert_eq!(steps.iter().filter(|step| step.applied).count(), 24, "3 steps for each of 8 jobs");
    lab.shutdown().await;
}

/// A runner paused (SIGSTOP) past its lease wakes up, finds its renewal deadline passed and
/// stops at once: no target step after the lease expired, its late result kept as such.
#[tokio::test(flavor = "multi_thread")]
async fn paused_runner_fences_itself_when_it_wakes() {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = LocalLab::start(options(dir.path(), 1_000, &[])).await.unwrap();
    lab.spawn_runner("r1", &[]).await.unwrap();
    lab.submit("j", "prod", JobSpec { steps: 40, step_ms: 100 }).await.unwrap();
    let target = Client::new(&lab.target_url(), None, Duration::from_secs(5));
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    while target.steps(10).await.unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the runner never reached the target");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(lab.runners[0].signal(libc::SIGSTOP));
    let view = uncertain(&lab, "j").await;
    let lease_expires_ms = view.attempts[0].lease_end_ms();
    assert!(lab.runners[0].signal(libc::SIGCONT));
    let view =
        lab.wait_job("j", WAIT_MAX, |view| view.ledger.iter().any(|entry| entry.kind == Op::Result)).await.unwrap();
    let result = view.ledger.iter().find(|entry| entry.kind == Op::Result).unwrap();
    assert_eq!((result.decision, result.reason.as_deref()), (Some(Decision::Rejected), Some("expired")));
    assert_eq!(result.outcome.map(|word| word.as_str()), Some("failed"), "the runner reports that it stopped");
    let steps = target.steps(100_000).await.unwrap();
    let late: Vec<_> = steps.iter().filter(|step| step.received_ms > lease_expires_ms).collect();
    assert!(late.is_empty(), "steps sent after the lease expired: {late:?}");
    assert_eq!(view.state, JobState::Uncertain, "the job waits for reconciliation");
    lab.shutdown().await;
}

/// A runner whose clock runs two minutes behind still completes its job; the ledger keeps
/// its observation times apart from the server's receipt times.
#[tokio::test(flavor = "multi_thread")]
async fn skewed_runner_clock_is_recorded_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = LocalLab::start(options(dir.path(), 2_000, &[])).await.unwrap();
    lab.spawn_runner("r1", &["--clock-offset-ms=-120000".to_string()]).await.unwrap();
    lab.submit("j", "k", JobSpec { steps: 3, step_ms: 50 }).await.unwrap();
    let view = lab.wait_job("j", WAIT_MAX, is_terminal).await.unwrap();
    assert_eq!(view.state, JobState::Succeeded);
    for entry in view.ledger.iter().filter(|entry| entry.observed_ms.is_some() && entry.kind != Op::Submit) {
        let skew_ms = entry.observed_ms.unwrap() - entry.received_ms;
        assert!((-121_000..=-119_000).contains(&skew_ms), "entry {} skew {skew_ms} ms", entry.seq);
    }
    lab.shutdown().await;
}

/// What a client was told "accepted" must still be there after the control plane is killed.
async fn acknowledged_result_survives_a_kill(bugs: &[Bug]) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = LocalLab::start(options(dir.path(), 5_000, bugs)).await.unwrap();
    let runner = lab.register("r1").await.unwrap();
    lab.submit("j", "k", JobSpec { steps: 1, step_ms: 1 }).await.unwrap();
    run_directly(&lab, &runner, "r1").await;
    lab.restart_control().await.unwrap();
    let view = lab.operator.job("j").await.unwrap();
    lab.shutdown().await;
    view.state == JobState::Succeeded
}

#[tokio::test(flavor = "multi_thread")]
async fn ack_before_commit_loses_an_acknowledged_result_across_a_kill() {
    assert!(acknowledged_result_survives_a_kill(&[]).await, "the correct lab lost an acknowledged result");
    assert!(!acknowledged_result_survives_a_kill(&[Bug::AckBeforeCommit]).await, "ack-before-commit did not lose it");
}

/// The seed's exercise at the target boundary: fence 11 applied, then a step carrying fence 10.
async fn stale_step_refused(mode: lab::target::Mode, bugs: &[Bug]) -> bool {
    let (first, second) = two_steps(mode, bugs, (11, "j-a2"), (10, "j-a1")).await;
    assert!(first, "the first step, with the highest fence, was refused");
    !second
}

/// Two steps on one key through a real target: whether each was applied.
async fn two_steps(mode: lab::target::Mode, bugs: &[Bug], first: (u64, &str), second: (u64, &str)) -> (bool, bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut options = options(dir.path(), 2_000, bugs);
    options.mode = mode;
    let lab = LocalLab::start(options).await.unwrap();
    let target = Client::new(&lab.target_url(), None, Duration::from_secs(5));
    let step = |fence: u64, attempt: &str| {
        let unsigned = Capability {
            deployment_key: "prod".into(),
            job: "j".into(),
            attempt: attempt.into(),
            runner: "r".into(),
            fence,
            expires_ms: now_ms() + 60_000,
            signature: String::new(),
        };
        StepRequest {
            capability: lab::capability::sign(CAPABILITY_SECRET.as_bytes(), unsigned),
            step: 0,
            steps: 2,
            duration_ms: 0,
        }
    };
    let first = target.step(&step(first.0, first.1)).await.unwrap().record.applied;
    let second = target.step(&step(second.0, second.1)).await.unwrap().record.applied;
    lab.shutdown().await;
    (first, second)
}

#[tokio::test(flavor = "multi_thread")]
async fn target_refuses_current_fence_refuses_the_second_step_of_the_current_attempt() {
    use lab::target::Mode;
    let current = (11, "j-a2");
    assert_eq!(
        two_steps(Mode::Fenced, &[], current, current).await,
        (true, true),
        "the fenced target refused fence 11 twice"
    );
    let buggy = two_steps(Mode::Fenced, &[Bug::TargetRefusesCurrentFence], current, current).await;
    assert_eq!(buggy, (true, false), "target-refuses-current-fence applied the current fence's second step");
}

#[tokio::test(flavor = "multi_thread")]
async fn fenced_target_refuses_a_stale_step_and_target_ignores_fence_applies_it() {
    use lab::target::Mode;
    assert!(stale_step_refused(Mode::Fenced, &[]).await, "the fenced target applied fence 10 after 11");
    assert!(
        !stale_step_refused(Mode::Fenced, &[Bug::TargetIgnoresFence]).await,
        "target-ignores-fence still refused it"
    );
    assert!(!stale_step_refused(Mode::Unfenced, &[]).await, "an unfenced target applies everything: the residual risk");
}

#[tokio::test(flavor = "multi_thread")]
async fn target_refuses_a_forged_capability() {
    let dir = tempfile::tempdir().unwrap();
    let lab = LocalLab::start(options(dir.path(), 2_000, &[])).await.unwrap();
    let target = Client::new(&lab.target_url(), None, Duration::from_secs(5));
    let forged = Capability {
        deployment_key: "prod".into(),
        job: "j".into(),
        attempt: "j-a1".into(),
        runner: "r".into(),
        fence: 99,
        expires_ms: now_ms() + 60_000,
        signature: "00".repeat(32),
    };
    let record =
        target.step(&StepRequest { capability: forged, step: 0, steps: 1, duration_ms: 0 }).await.unwrap().record;
    assert_eq!((record.applied, record.reason.map(|word| word.as_str())), (false, Some("bad_signature")));
    lab.shutdown().await;
}

/// The answers a runner sees over HTTP: 200 for accepted and duplicate (which carries only
/// its decision and ledger entry), 409 with the reason for a refusal or a conflict, and
/// nothing renewed by either.
#[tokio::test(flavor = "multi_thread")]
async fn verdicts_over_http_carry_status_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let lab = LocalLab::start(options(dir.path(), 2_000, &[])).await.unwrap();
    let runner = lab.register("r1").await.unwrap();
    lab.submit("j", "k", JobSpec { steps: 1, step_ms: 1 }).await.unwrap();
    let claim = run_directly(&lab, &runner, "r1").await;
    let post = |path: &'static str, body: serde_json::Value| {
        let runner = runner.clone();
        async move { runner.raw(reqwest::Method::POST, path, Some(&body)).await.unwrap() }
    };
    let result = |outcome: &str| serde_json::json!({"job": claim.job, "attempt": claim.attempt, "runner": "r1", "fence": claim.fence, "outcome": outcome, "observed_ms": 0});
    let (status, duplicate) = post("/v1/result", result("succeeded")).await;
    assert_eq!((status, duplicate["decision"].as_str()), (200, Some("duplicate")));
    let fields: Vec<&String> = duplicate.as_object().unwrap().keys().collect();
    assert_eq!(fields, ["decision", "ledger_seq"], "a duplicate carries no reason and renews no lease: {duplicate}");
    let (status, conflict) = post("/v1/result", result("failed")).await;
    assert_eq!(
        (status, conflict["decision"].as_str(), conflict["reason"].as_str()),
        (409, Some("conflict"), Some("conflict"))
    );
    let heartbeat = serde_json::json!({"job": claim.job, "attempt": claim.attempt, "runner": "r1", "fence": claim.fence, "observed_ms": 0});
    let (status, refused) = post("/v1/heartbeat", heartbeat).await;
    assert_eq!(
        (status, refused["decision"].as_str(), refused["reason"].as_str()),
        (409, Some("rejected"), Some("not_current"))
    );
    let view = lab.operator.job("j").await.unwrap();
    assert_eq!((view.state, view.outcome), (JobState::Succeeded, Some(Outcome::Succeeded)));
    lab.shutdown().await;
}
