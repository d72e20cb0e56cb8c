//! Evaluating a condition (a `wait`'s or an `[[expect]]`'s) against what the lab shows:
//! the job with its attempts and ledger, the target's step log, the checkers' verdicts.
//! A failed condition answers what was expected and what was found.

use std::collections::BTreeMap;

use checkers::{CheckerResult, Verdict};
use protocol::{AttemptView, JobView, StepRecord};

use super::format::{Condition, Expected};

/// What a condition is evaluated against.
#[derive(Default)]
pub struct View {
    pub jobs: BTreeMap<String, JobView>,
    pub steps: Vec<StepRecord>,
    pub checkers: Vec<CheckerResult>,
}

fn word<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value).ok().and_then(|value| value.as_str().map(str::to_string)).unwrap_or_default()
}

/// One line saying what the condition asks.
pub fn describe(condition: &Condition) -> String {
    let value = serde_json::json!({
        "job": condition.job, "attempt": condition.attempt, "state": condition.state, "outcome": condition.outcome,
        "attempts": condition.attempts, "current": condition.current, "fence": condition.fence,
        "closed_by": condition.closed_by, "runner": condition.runner, "ledger": condition.ledger,
        "decision": condition.decision, "recorded_as": condition.recorded_as, "reason": condition.reason,
        "applied_steps": condition.applied_steps, "stale_step": condition.stale_step,
        "checker": condition.checker, "verdict": condition.verdict,
    });
    let fields: Vec<String> = value
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, value)| !value.is_null())
        .map(|(key, value)| format!("{key} = {value}"))
        .collect();
    fields.join(", ")
}

/// Ok when the condition holds; else what was found.
pub(crate) fn evaluate(condition: &Condition, view: &View) -> Result<(), String> {
    if let Some(checker) = &condition.checker {
        return evaluate_checker(checker, condition.verdict.as_deref().unwrap_or("valid"), &view.checkers);
    }
    if let Some(expected) = condition.stale_step {
        let found = stale_steps(&view.steps, condition.job.as_deref());
        return match (expected, found.first()) {
            (true, Some(_)) | (false, None) => Ok(()),
            (true, None) => Err("no applied step had a fence lower than one already applied on its key".into()),
            (false, Some(step)) => Err(format!(
                "step {} of {} (fence {}) was applied on `{}` after fence {}",
                step.step, step.attempt, step.fence, step.deployment_key, step.highest_fence_before
            )),
        };
    }
    let name = condition.job.as_deref().unwrap_or_default();
    let Some(job) = view.jobs.get(name) else { return Err(format!("job `{name}` does not exist")) };
    if let Some(kind) = condition.ledger {
        return evaluate_ledger(kind, condition, job);
    }
    if let Some(number) = condition.attempt {
        let Some(attempt) = job.attempts.get(number as usize - 1).filter(|_| number > 0) else {
            return Err(format!("job `{name}` has {} attempts, no attempt {number}", job.attempts.len()));
        };
        return evaluate_attempt(condition, attempt);
    }
    evaluate_job(condition, job, &view.steps)
}

fn evaluate_checker(checker: &str, expected: &str, results: &[CheckerResult]) -> Result<(), String> {
    let Some(result) = results.iter().find(|result| result.checker == checker) else {
        return Err(format!("checker `{checker}` gave no verdict"));
    };
    let (found, detail) = match &result.verdict {
        Verdict::Valid => ("valid", String::new()),
        Verdict::Invalid { anomalies } => {
            ("invalid", anomalies.first().map_or(String::new(), |anomaly| format!(": {}", anomaly.message)))
        }
        Verdict::Unknown { reason } => ("unknown", format!(": {reason}")),
    };
    if found == expected {
        Ok(())
    } else {
        Err(format!("{checker} was {found}{detail}"))
    }
}

fn mismatch<T: PartialEq + std::fmt::Display>(what: &str, expected: Option<T>, found: T) -> Option<String> {
    match expected {
        Some(expected) if expected != found => Some(format!("{what} {found}")),
        _ => None,
    }
}

fn evaluate_attempt(condition: &Condition, attempt: &AttemptView) -> Result<(), String> {
    held(
        attempt.id.clone(),
        [
            mismatch("state", condition.state.clone(), word(&attempt.state)),
            mismatch("fence", condition.fence, attempt.fence),
            mismatch("current", condition.current, attempt.current),
            mismatch(
                "closed_by",
                condition.closed_by.map(|expected| expected.text(history::ClosedBy::as_str)),
                attempt.closed_by.map_or("-", history::ClosedBy::as_str),
            ),
            mismatch("runner", condition.runner.clone(), attempt.runner.clone()),
        ],
    )
}

fn evaluate_job(condition: &Condition, job: &JobView, steps: &[StepRecord]) -> Result<(), String> {
    let outcome = job.outcome.map_or("-", |outcome| history::OutcomeWord::from(outcome).as_str());
    let applied = steps.iter().filter(|step| step.applied && step.job == job.id).count();
    let claimed = condition.runner.as_ref().filter(|runner| !job.attempts.iter().any(|a| &&a.runner == runner));
    held(
        format!("job `{}`", job.id),
        [
            mismatch("state", condition.state.clone(), word(&job.state)),
            mismatch("outcome", condition.outcome.map(|expected| expected.text(history::OutcomeWord::as_str)), outcome),
            mismatch("attempts", condition.attempts, job.attempts.len()),
            condition.applied_steps.filter(|wanted| applied < *wanted).map(|_| format!("{applied} applied steps")),
            claimed.map(|runner| format!("no attempt by {runner}")),
        ],
    )
}

fn evaluate_ledger(kind: history::Op, condition: &Condition, job: &JobView) -> Result<(), String> {
    let attempt = condition.attempt.map(|number| format!("{}-a{number}", job.id));
    let entries: Vec<_> = job
        .ledger
        .iter()
        .filter(|entry| entry.kind == kind && (attempt.is_none() || entry.attempt == attempt))
        .collect();
    let matches = |entry: &&protocol::LedgerEntry| {
        condition.decision.is_none_or(|wanted| entry.decision == Some(wanted))
            && condition.recorded_as.is_none_or(|wanted| entry.recorded_as == Some(wanted))
            && condition.reason.as_ref().is_none_or(|wanted| entry.reason.as_ref() == Some(wanted))
            && condition.outcome.is_none_or(|wanted| match wanted {
                Expected::Nothing => entry.outcome.is_none(),
                Expected::Word(word) => entry.outcome == Some(word),
            })
            && condition.runner.as_ref().is_none_or(|wanted| entry.runner.as_ref() == Some(wanted))
    };
    if entries.iter().any(matches) {
        return Ok(());
    }
    let seen: Vec<String> = entries
        .iter()
        .map(|entry| {
            format!(
                "#{} {} {} decision={} recorded_as={} reason={} outcome={}",
                entry.seq,
                entry.attempt.as_deref().unwrap_or("-"),
                entry.runner.as_deref().unwrap_or("-"),
                entry.decision.as_ref().map_or("-".into(), word),
                entry.recorded_as.map_or("-", history::RecordedAs::as_str),
                entry.reason.as_deref().unwrap_or("-"),
                entry.outcome.map_or("-", history::OutcomeWord::as_str),
            )
        })
        .collect();
    if seen.is_empty() {
        Err(format!("no `{kind}` entry for {}", attempt.unwrap_or_else(|| job.id.clone())))
    } else {
        Err(format!("the `{kind}` entries were: {}", seen.join("; ")))
    }
}

/// Applied steps whose fence is lower than one already applied on their key.
pub fn stale_steps<'a>(steps: &'a [StepRecord], job: Option<&str>) -> Vec<&'a StepRecord> {
    let mut highest: BTreeMap<&str, u64> = BTreeMap::new();
    let mut stale = Vec::new();
    for step in steps.iter().filter(|step| step.applied) {
        let top = highest.entry(&step.deployment_key).or_insert(0);
        if step.fence < *top && job.is_none_or(|job| job == step.job) {
            stale.push(step);
        }
        *top = (*top).max(step.fence);
    }
    stale
}

/// `Ok` when no mismatch was found, else one sentence naming the subject and every mismatch.
fn held<const N: usize>(subject: String, mismatches: [Option<String>; N]) -> Result<(), String> {
    let found: Vec<String> = mismatches.into_iter().flatten().collect();
    if found.is_empty() {
        Ok(())
    } else {
        Err(format!("{subject} has {}", found.join(", ")))
    }
}
