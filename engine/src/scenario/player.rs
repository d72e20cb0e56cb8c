//! Steps played as a runner with its token (`as_runner`): claims, heartbeats, results,
//! capabilities and target steps sent straight to the control plane and the target, so a
//! scenario can send a late, duplicate, conflicting or stale report at a precise moment.

use history::{Op, Process};
use std::time::Duration;

use history::EventType;
use protocol::*;

use super::format::Action;
use super::steps::Driver;

fn claim_ref(attempt: &AttemptView, job: &str, runner: &str, fence: Option<u64>) -> ClaimRef {
    ClaimRef {
        job: job.to_string(),
        attempt: attempt.id.clone(),
        runner: runner.to_string(),
        fence: fence.unwrap_or(attempt.fence),
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Driver {
    pub(super) async fn runner_action(&mut self, action: &Action) -> Result<(), String> {
        match action {
            Action::Claim { as_runner, job } => self.claim(as_runner, job.as_deref()).await,
            Action::Heartbeat { as_runner, job, attempt, fence, observed_offset_ms } => {
                let (client, runner) = self.as_runner(as_runner).await?;
                let found = self.attempt(job, *attempt).await?;
                let request = HeartbeatRequest {
                    claim: claim_ref(&found, job, &runner, *fence),
                    observed_ms: now_ms() + observed_offset_ms,
                };
                let verdict = client.heartbeat(&request).await.map_err(|error| error.to_string())?;
                self.note(Op::Heartbeat, &request.claim, request.observed_ms, None, &verdict);
                Ok(())
            }
            Action::Report { as_runner, job, attempt, attempt_job, fence, outcome, observed_offset_ms } => {
                let (client, runner) = self.as_runner(as_runner).await?;
                let found = self.attempt(attempt_job.as_deref().unwrap_or(job), *attempt).await?;
                let request = ResultRequest {
                    claim: claim_ref(&found, job, &runner, *fence),
                    outcome: serde_json::from_value(outcome.as_str().into()).map_err(|error| error.to_string())?,
                    observed_ms: now_ms() + observed_offset_ms,
                    detail: Some("scenario".into()),
                };
                let verdict = client.result(&request).await.map_err(|error| error.to_string())?;
                self.note(Op::Result, &request.claim, request.observed_ms, Some(request.outcome), &verdict);
                Ok(())
            }
            Action::Capability { as_runner, job, attempt } => {
                let (client, runner) = self.as_runner(as_runner).await?;
                let found = self.attempt(job, *attempt).await?;
                let request = CapabilityRequest { claim: claim_ref(&found, job, &runner, None), observed_ms: now_ms() };
                let verdict = client.capability(&request).await.map_err(|error| error.to_string())?;
                self.note(Op::Capability, &request.claim, request.observed_ms, None, &verdict);
                // A refusal is an answer, recorded as the others are; nothing is kept, and a
                // `target_step` that needs this capability then fails for want of one.
                if let Some(capability) = verdict.capability {
                    self.capabilities.insert(found.id, capability);
                }
                Ok(())
            }
            Action::TargetStep { job, attempt, step, steps, .. } => {
                self.target_step(job, *attempt, *step, *steps).await
            }
            other => Err(format!("not a step: {other:?}")),
        }
    }

    async fn claim(&self, as_runner: &str, job: Option<&str>) -> Result<(), String> {
        let (client, runner) = self.as_runner(as_runner).await?;
        let request = ClaimRequest { runner, observed_ms: now_ms() };
        let answer = client.claim(&request).await.map_err(|error| error.to_string())?;
        let Some(grant) = answer.grant else { return Err("nothing was claimable".into()) };
        self.shared.recorder.record(Process::SCENARIO, EventType::Ok, Op::Claim, |event| {
            event.job = Some(grant.claim.job.clone());
            event.attempt = Some(grant.claim.attempt.clone());
            event.fence = Some(grant.claim.fence);
        });
        match job {
            Some(job) if job != grant.claim.job => Err(format!("claimed job `{}`, not `{job}`", grant.claim.job)),
            _ => Ok(()),
        }
    }

    async fn target_step(&self, job: &str, number: u32, step: u32, steps: u32) -> Result<(), String> {
        let attempt = self.attempt(job, number).await?;
        let capability = self.capabilities.get(&attempt.id).cloned().ok_or_else(|| {
            format!("no capability for {}: add a `capability` step first (one refused keeps none)", attempt.id)
        })?;
        let target = self.cluster().await.target_client(Duration::from_secs(10)).ok_or("the system has no target")?;
        let request = StepRequest { capability, step, steps, duration_ms: 0 };
        // A refused step (409) is an answer, recorded in the step log: the step itself succeeded.
        match target.step(&request).await {
            Ok(_) => Ok(()),
            Err(error) if !error.is_transport() => Ok(()),
            Err(error) => Err(error.to_string()),
        }
    }

    /// Records a played report's answer in the history as the runner's own answer (a
    /// `runner:ID` `response` event, as its log would hold it, with the `ledger_seq` the
    /// answer names): the played runner was told this, so the checkers that read what
    /// runners were told (`lost-work`, `ledger-completeness`, `stale-completion`) see it.
    fn note(&self, f: Op, claim: &ClaimRef, observed_ms: i64, outcome: Option<Outcome>, ruling: &Ruling) {
        self.shared.recorder.record(Process::runner(&claim.runner), EventType::Response, f, |event| {
            event.job = Some(claim.job.clone());
            event.attempt = Some(claim.attempt.clone());
            event.runner = Some(claim.runner.clone());
            event.fence = Some(claim.fence);
            event.observed_ms = Some(observed_ms);
            event.outcome = outcome.map(|outcome| outcome.as_str().to_string());
            event.decision = Some(ruling.decision);
            event.reason = ruling.reason.map(|reason| reason.as_str().to_string());
            event.lease_expires_ms = ruling.lease_expires_ms;
            event.value = Some(serde_json::json!({"ledger_seq": ruling.ledger_seq, "played": true}));
        });
    }
}
