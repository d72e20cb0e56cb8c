//! `explicit-uncertainty`: a lapsed lease is not a stopped process, so the ledger must say
//! "uncertain" and wait for a reconciliation before the job runs again.
//!
//! From the ledger: every `expire` entry must record the attempt as `uncertain` (not, say,
//! `requeued`); and a job's new claim must come after a reconciliation that found the
//! previous attempt `stopped` — the only way a correct control plane returns a claimed job
//! to the queue.

use crate::driver::{Check, Findings, Found};
use crate::model::{Index, Observed, Op, Source};
use history::RecordedAs;

pub const NAME: &str = "explicit-uncertainty";
pub const ABOUT: &str =
    "an expired lease makes its attempt uncertain, and a job is claimed again only after its previous attempt was reconciled as stopped";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<ExplicitUncertainty>::default(), events)
}

#[derive(Default)]
pub(crate) struct ExplicitUncertainty;

impl Check for ExplicitUncertainty {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        if ev.src != Source::Ledger {
            return;
        }
        let (Some(job), Some(attempt)) = (ev.job, ev.attempt) else { return };
        match ev.op {
            Op::Expire if ev.recorded_as != Some(RecordedAs::Uncertain) => {
                // A system that grants no lease ends an attempt it lost on its own word.
                let how = if ctx.lacks("lease") { " was given up by the system" } else { "'s lease expired" };
                let message = format!(
                    "{}{how} without a result and was recorded as `{}`, not as uncertain",
                    ctx.label(attempt),
                    ev.recorded_as.map_or("nothing", RecordedAs::as_str)
                );
                let found = Found::new(NAME, "expiry-not-uncertain").job(ctx, Some(job)).attempt(ctx, attempt);
                out.push(found.events(&[ev.index]).says(message));
            }
            Op::Claim => reclaim(ev, ctx, job, attempt, out),
            _ => {}
        }
    }
}

/// A new claim of a job whose previous attempt was not found stopped.
fn reclaim(ev: &Observed, ctx: &Index, job: u32, attempt: u32, out: &mut Findings) {
    let Some(previous) = ctx.job(job).latest.filter(|&previous| previous != attempt) else { return };
    let facts = ctx.attempt(previous);
    if facts.stopped.is_some() {
        return;
    }
    let (history, proof) = match (facts.expired, facts.committed, facts.closed) {
        (Some(expired), _, _) => (format!("it expired at event {expired} and was never reconciled"), Some(expired)),
        (_, Some((at, outcome)), _) => {
            (format!("it had committed `{}` at event {at}", ctx.outcome_name(outcome)), Some(at))
        }
        (_, _, Some(closed)) => (format!("it was closed at event {closed}"), Some(closed)),
        _ => ("its lease was never expired or reconciled".to_string(), None),
    };
    let fence = ev.fence.unwrap_or(0);
    let message = format!(
        "{} (fence {fence}) was claimed without a reconciliation finding {} stopped: {history}",
        ctx.attempt_name(attempt),
        ctx.label(previous),
    );
    let claimed = facts.claim.map(|claim| claim.index);
    let events: Vec<u64> = claimed.into_iter().chain(proof).chain([ev.index]).collect();
    out.push(
        Found::new(NAME, "reclaimed-without-reconcile")
            .job(ctx, Some(job))
            .attempt(ctx, previous)
            .reported(ctx, ev)
            .events(&events)
            .says(message),
    );
}
