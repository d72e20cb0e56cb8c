//! The operator: for every uncertain job, establish that the old execution stopped — by
//! freezing its runner (SIGSTOP) when it is still alive — inspect the target, and only then
//! reconcile with what the target shows. It lets an attempt stay uncertain for a grace
//! period first (`--reconcile-after-ms`), as an operator gathering evidence would, so that
//! late reports reach the control plane while the attempt is uncertain. A runner it froze is continued after the finding:
//! it wakes without authority and its reports arrive late.

use history::{Op, Process};
use std::time::Duration;

use history::EventType;
use protocol::{AttemptState, Finding, JobState, Outcome, ReconcileRequest};
use workloads::operator::{decide, Action, Evidence};

use super::cluster::{Cluster, RunnerSlot};
use super::Shared;

/// Between the operator's rounds.
const ROUND_MS: u64 = 100;

pub async fn run(shared: Shared) {
    loop {
        if let Err(error) = round(&shared).await {
            shared.recorder.record(Process::OPERATOR, EventType::Info, Op::Round, |event| event.reason = Some(error));
        }
        tokio::time::sleep(Duration::from_millis(ROUND_MS)).await;
    }
}

/// Whether the process that ran an attempt claimed at `claimed_ms` no longer executes, and
/// will not again before the operator says so: killed since the claim, or stopped and not
/// only by the nemesis, whose pause ends when its fault heals. A runner the nemesis paused
/// is frozen by the operator itself first (it then holds the stop, and thaws it after its
/// finding), so that no `stopped` finding is recorded for an execution that goes on.
fn execution_stopped(slot: &RunnerSlot, claimed_ms: i64) -> bool {
    if slot.killed_at_ms.is_some_and(|killed_ms| killed_ms >= claimed_ms) {
        return true;
    }
    slot.is_stopped() && (slot.frozen_by_operator || !slot.paused_by_nemesis)
}

async fn round(shared: &Shared) -> Result<(), String> {
    let operator = shared.cluster.lock().await.system.operator.clone();
    let jobs = operator.jobs().await.map_err(|error| error.to_string())?;
    for job in jobs.iter().filter(|job| job.state == JobState::Uncertain) {
        let view = operator.job(&job.id).await.map_err(|error| error.to_string())?;
        let Some(attempt) =
            view.attempts.iter().find(|attempt| attempt.current && attempt.state == AttemptState::Uncertain)
        else {
            continue;
        };
        let uncertain_for_ms = protocol::wall_ms() - attempt.lease_end_ms();
        if uncertain_for_ms < shared.config.reconcile_after_ms as i64 {
            continue;
        }
        settle(shared, &view, attempt).await?;
    }
    Ok(())
}

async fn settle(shared: &Shared, view: &protocol::JobView, attempt: &protocol::AttemptView) -> Result<(), String> {
    let mut cluster = shared.cluster.lock().await;
    let Some(index) = cluster.runners.iter().position(|slot| slot.id == attempt.runner) else {
        return Err(format!("attempt {} names an unknown runner {}", attempt.id, attempt.runner));
    };
    let steps = cluster.target_steps(Duration::from_secs(5)).await?;
    let applied = steps.iter().filter(|step| step.applied && step.attempt == attempt.id).count() as u32;
    let evidence = Evidence {
        execution_stopped: execution_stopped(&cluster.runners[index], attempt.claimed_ms),
        steps_applied: applied,
        steps: view.spec.steps,
    };
    let claim = |event: &mut history::Event| {
        *event = event.clone().with_claim(&view.id, &attempt.id, &attempt.runner, attempt.fence);
        event.key = Some(view.deployment_key.clone());
    };
    match decide(&evidence) {
        Action::StopExecution => {
            shared.recorder.record(Process::OPERATOR, EventType::Invoke, Op::Freeze, claim);
            let frozen = cluster.signal_runner(index, libc::SIGSTOP);
            cluster.runners[index].frozen_by_operator |= frozen;
            let kind = if frozen { EventType::Ok } else { EventType::Fail };
            shared.recorder.record(Process::OPERATOR, kind, Op::Freeze, claim);
            Ok(())
        }
        action => reconcile(shared, &mut cluster, index, view, attempt, action, applied, claim).await,
    }
}

/// Sends a reconcile as the operator, recorded as the operator's `reconcile` operation
/// (invoke, then ok, fail or info) with the claim `claim` fills in: a reconcile is always
/// an operator's decision, whether the automatic operator or a scenario's step took it.
pub(crate) async fn send_reconcile(
    recorder: &super::recorder::Recorder,
    operator: &protocol::client::Client,
    request: &ReconcileRequest,
    claim: impl Fn(&mut history::Event),
) -> Result<protocol::JobView, protocol::client::ClientError> {
    let finding = history::OutcomeWord::from(request.finding);
    let fill = |event: &mut history::Event| {
        claim(event);
        event.outcome = Some(finding.as_str().to_string());
        event.value = Some(serde_json::json!({
            "outcome": request.outcome.map(Outcome::as_str),
            "evidence": request.evidence,
        }));
    };
    recorder.record(Process::OPERATOR, EventType::Invoke, Op::Reconcile, fill);
    let answer = operator.reconcile(request).await;
    let kind = match &answer {
        Ok(_) => EventType::Ok,
        Err(error) if error.outcome_unknown() => EventType::Info,
        Err(_) => EventType::Fail,
    };
    recorder.record(Process::OPERATOR, kind, Op::Reconcile, |event| {
        fill(event);
        event.reason = answer.as_ref().err().map(|error| error.to_string());
        // The entry that records the finding: the view's last reconcile of this attempt.
        let recorded = answer.as_ref().ok().and_then(|view| {
            view.ledger
                .iter()
                .rev()
                .find(|entry| entry.kind == Op::Reconcile && entry.attempt.as_deref() == Some(request.attempt.as_str()))
        });
        if let (Some(entry), Some(value)) = (recorded, event.value.as_mut()) {
            value["ledger_seq"] = serde_json::Value::from(entry.seq);
        }
    });
    answer
}

#[allow(clippy::too_many_arguments)]
async fn reconcile(
    shared: &Shared,
    cluster: &mut Cluster,
    index: usize,
    view: &protocol::JobView,
    attempt: &protocol::AttemptView,
    action: Action,
    applied: u32,
    claim: impl Fn(&mut history::Event),
) -> Result<(), String> {
    let (finding, outcome) = match action {
        Action::ReconcileCompleted => (Finding::Completed, Some(Outcome::Succeeded)),
        _ => (Finding::Stopped, None),
    };
    let evidence = format!("execution stopped; target applied {applied} of {} steps", view.spec.steps);
    let request = ReconcileRequest {
        job: view.id.clone(),
        attempt: attempt.id.clone(),
        finding,
        outcome,
        evidence: Some(evidence.clone()),
    };
    // The answer, whatever it is, is in the history; the next round sees the job as it is.
    let _answer = send_reconcile(&shared.recorder, &cluster.system.operator, &request, &claim).await;
    if cluster.runners[index].frozen_by_operator {
        // A runner the nemesis still pauses is continued by the nemesis when its fault heals.
        if !cluster.runners[index].paused_by_nemesis {
            cluster.signal_runner(index, libc::SIGCONT);
        }
        cluster.runners[index].frozen_by_operator = false;
        shared.recorder.record(Process::OPERATOR, EventType::Ok, Op::Thaw, claim);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(paused_by_nemesis: bool, frozen_by_operator: bool, killed_at_ms: Option<i64>) -> RunnerSlot {
        RunnerSlot {
            id: "r1".into(),
            token: "t".into(),
            process: None,
            clock_file: "clock-r1".into(),
            killed_at_ms,
            frozen_by_operator,
            paused_by_nemesis,
        }
    }

    #[test]
    fn a_runner_only_the_nemesis_paused_is_not_evidence_that_its_execution_stopped() {
        assert!(!execution_stopped(&slot(true, false, None), 1_000), "the nemesis continues it when its fault heals");
        assert!(execution_stopped(&slot(true, true, None), 1_000), "the operator holds the stop itself");
        assert!(execution_stopped(&slot(false, false, None), 1_000), "a process that is gone executes nothing");
        assert!(execution_stopped(&slot(true, false, Some(1_500)), 1_000), "killed since the claim");
    }
}
