//! `progress`: safety is not enough — a system that refuses everything is safe and useless.
//! Three cross-source checks, from the target's step log, the ledger and the final state:
//!
//! - a step the target refused as `stale_fence` must carry a fence below the highest fence
//!   the target had applied on that key (derived from the step log itself, not from what
//!   the target says it saw); an idempotent target's `duplicate` must repeat a step it
//!   applied before;
//! - an accepted `succeeded` result must be backed by its own attempt's work: at least one
//!   step of that attempt applied on the target before the result was received;
//! - a run in which jobs were acknowledged but none succeeded made no progress;
//! - a runner process that exited on its own during the run (no fault killed it) is a
//!   worker the system lost (`runner-exited`).

use crate::driver::{need_finals, Check, Findings, Found};
use crate::model::{FxMap, Index, Observed, Op, Source};
use history::{Decision, OutcomeWord, Reason};
use std::collections::HashSet;

pub const NAME: &str = "progress";
pub const ABOUT: &str = "refusals are justified by the record, accepted successes by their attempt's own applied steps, some job succeeds, and no runner exits on its own";

/// Fewest acknowledged jobs for "none succeeded" to mean the system made no progress.
const JOBS_FOR_PROGRESS_MIN: u64 = 3;

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<Progress>::default(), events)
}

#[derive(Default)]
pub(crate) struct Progress {
    /// Deployment key → the highest fence applied on it so far.
    highest: FxMap<u32, u64>,
    /// Deployment key → the revision its last step left.
    revisions: FxMap<u32, u64>,
    /// Attempts with at least one applied step.
    worked: HashSet<u32>,
    /// (job, step) pairs an idempotent target applied.
    applied_steps: HashSet<(u32, u64)>,
    acknowledged: u64,
    succeeded: u64,
    /// The first final events, the evidence of "none succeeded".
    finals: Vec<u64>,
}

/// Most final events an anomaly names.
const FINALS_NAMED_MAX: usize = 10;

impl Check for Progress {
    fn name(&self) -> &'static str {
        NAME
    }

    fn needs(&self) -> &'static [(&'static str, &'static [history::Source])] {
        &[
            ("refusal-unjustified", &[history::Source::TargetLog]),
            ("revision-not-moved-by-one", &[history::Source::TargetLog]),
            ("success-without-work", &[history::Source::TargetLog]),
            ("no-progress", &[history::Source::Client, history::Source::Finals]),
        ]
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        crate::driver::need_ledger(ctx).or_else(|| need_finals(ctx))
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        match ev.src {
            Source::Target => self.step(ev, ctx, out),
            Source::Ledger if ev.op == Op::Result && ev.accepted() => self.success(ev, ctx, out),
            Source::SubmitOk => self.acknowledged += 1,
            Source::RunnerExited => {
                let runner = ev.runner.map_or("a runner", |runner| ctx.runner_name(runner));
                let status = ev.raw.reason.as_deref().unwrap_or("unknown status");
                let message = format!(
                    "runner {runner} exited on its own during the run ({status}); no fault killed it: the system lost a worker"
                );
                let found = Found::new(NAME, "runner-exited").events(&[ev.index]);
                let found = match ev.runner {
                    Some(runner) => found.runner(ctx, runner),
                    None => found,
                };
                out.push(found.says(message));
            }
            Source::Final => {
                self.succeeded += u64::from(ev.raw.outcome_word() == Some(OutcomeWord::Succeeded));
                if self.finals.len() < FINALS_NAMED_MAX {
                    self.finals.push(ev.index);
                }
            }
            _ => {}
        }
    }

    fn finish(&mut self, _ctx: &Index, out: &mut Findings) {
        // Without final states (an interrupted run) the jobs' ends are not known.
        if self.finals.is_empty() {
            return;
        }
        if self.acknowledged >= JOBS_FOR_PROGRESS_MIN && self.succeeded == 0 {
            let message =
                format!("{} jobs were acknowledged and none succeeded: the system made no progress", self.acknowledged);
            out.push(Found::new(NAME, "no-progress").events(&self.finals).says(message));
        }
    }
}

impl Progress {
    fn step(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        let (Some(key), Some(fence)) = (ev.key, ev.fence) else { return };
        let step = ev.raw.value.as_ref().and_then(|value| value.get("step")?.as_u64());
        self.revision(ev, ctx, key, out);
        let highest = self.highest.get(&key).copied().unwrap_or(0);
        if ev.decision == Some(Decision::Accepted) {
            self.highest.insert(key, highest.max(fence));
            if let Some(attempt) = ev.attempt {
                self.worked.insert(attempt);
            }
            if let (Some(job), Some(step)) = (ev.job, step) {
                self.applied_steps.insert((job, step));
            }
            return;
        }
        let unjustified = match ev.raw.reason_code() {
            Some(Reason::StaleFence) if fence >= highest => {
                Some(format!("the highest fence applied on the key was {highest}"))
            }
            Some(Reason::Duplicate) if ev.job.zip(step).is_some_and(|pair| !self.applied_steps.contains(&pair)) => {
                Some("that step was never applied before".to_string())
            }
            _ => None,
        };
        if let Some(why) = unjustified {
            let message = format!(
                "the target refused a step of {} (fence {fence}) as `{}` but {why}",
                ev.attempt.map_or("an unknown attempt", |attempt| ctx.attempt_name(attempt)),
                ev.raw.reason.as_deref().unwrap_or("?"),
            );
            let found = Found::new(NAME, "refusal-unjustified").job(ctx, ev.job).key(ctx, Some(key)).reported(ctx, ev);
            out.push(found.events(&[ev.index]).says(message));
        }
    }

    /// An applied step moves the key's revision by one; a refused one leaves it.
    fn revision(&mut self, ev: &Observed, ctx: &Index, key: u32, out: &mut Findings) {
        let Some(revision) = ev.raw.value.as_ref().and_then(|value| value.get("revision")?.as_u64()) else { return };
        let before = self.revisions.insert(key, revision).unwrap_or(0);
        let applied = ev.decision == Some(Decision::Accepted);
        let expected = before + u64::from(applied);
        if revision != expected {
            let message = format!(
                "the target {} a step on `{}` and left its revision at {revision}, not {expected}",
                if applied { "applied" } else { "refused" },
                ctx.key_names.name(key)
            );
            let found = Found::new(NAME, "revision-not-moved-by-one").job(ctx, ev.job).key(ctx, Some(key));
            out.push(found.reported(ctx, ev).events(&[ev.index]).says(message));
        }
    }

    fn success(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        let Some(attempt) = ev.attempt else { return };
        if ev.raw.outcome_word() != Some(OutcomeWord::Succeeded) || self.worked.contains(&attempt) {
            return;
        }
        if ctx.lacks("target") {
            // No target, no step log: work cannot be seen, so its absence proves nothing.
            return;
        }
        let message = format!(
            "{}'s success was accepted but the target applied none of its steps: the ledger records work nobody did",
            ctx.label(attempt)
        );
        let found = Found::new(NAME, "success-without-work").job(ctx, ev.job).reported(ctx, ev);
        out.push(found.events(&[ev.index]).says(message));
    }
}
