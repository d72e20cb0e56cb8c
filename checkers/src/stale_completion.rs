//! `stale-completion`: a result accepted as the current completion of an attempt that was
//! no longer current — the seed's walk-through, where R1's late report for A1 (fence 7)
//! must not replace A2's (fence 8) state.
//!
//! Seen from outside: a runner's answer `accepted` to a result, after a newer attempt of
//! the same job had been claimed (ledger claim or a runner's granted claim). Seen from the
//! ledger: an accepted `result` whose attempt is not the job's latest claimed attempt, or
//! whose attempt had already been expired or reconciled.

use crate::driver::{Check, Findings, Found};
use crate::model::{Index, Observed, Op, Source};

pub const NAME: &str = "stale-completion";
pub const ABOUT: &str =
    "no result is accepted as the current completion of an attempt that was superseded, expired or reconciled";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<StaleCompletion>::default(), events)
}

#[derive(Default)]
pub(crate) struct StaleCompletion;

impl Check for StaleCompletion {
    fn name(&self) -> &'static str {
        NAME
    }

    fn needs(&self) -> &'static [(&'static str, &'static [history::Source])] {
        &[("late-result-acknowledged", &[history::Source::RunnerLogs])]
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        (ctx.seen.ledger == 0 && ctx.seen.responses == 0)
            .then(|| "the history has neither ledger events nor runner answers: no result to judge".to_string())
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        if ev.op != Op::Result || !ev.accepted() {
            return;
        }
        let (Some(job), Some(attempt)) = (ev.job, ev.attempt) else { return };
        match ev.src {
            Source::RunnerResponse => outside(ev, ctx, job, attempt, out),
            Source::Ledger => ledger(ev, ctx, job, attempt, out),
            _ => {}
        }
    }
}

/// A runner was told its result was accepted although a newer attempt had been claimed.
fn outside(ev: &Observed, ctx: &Index, job: u32, attempt: u32, out: &mut Findings) {
    let Some((newest, newest_fence, shown_at)) = ctx.job(job).newest_seen else { return };
    let fence = ev.fence.unwrap_or(0);
    if newest == attempt || newest_fence <= fence {
        return;
    }
    let message = format!(
        "late report for {} (fence {fence}) acknowledged to the runner as the current completion while {} (fence {newest_fence}) was current",
        ctx.attempt_name(attempt),
        ctx.attempt_name(newest),
    );
    out.push(
        Found::new(NAME, "late-result-acknowledged")
            .job(ctx, Some(job))
            .reported(ctx, ev)
            .attempt(ctx, newest)
            .events(&[shown_at, ev.index])
            .says(message),
    );
}

/// The ledger committed a result for an attempt that was not current.
fn ledger(ev: &Observed, ctx: &Index, job: u32, attempt: u32, out: &mut Findings) {
    let facts = ctx.attempt(attempt);
    let fence = ev.fence.unwrap_or(0);
    let name = ctx.attempt_name(attempt);
    let latest = ctx.job(job).latest;
    let (kind, proof, message) = match (latest, facts.expired, facts.closed) {
        (Some(latest), _, _) if latest != attempt => {
            let proof = ctx.attempt(latest).claim.map_or(ev.index, |claim| claim.index);
            let current = ctx.label(latest);
            let message = format!(
                "late report for {name} (fence {fence}) accepted as current completion while {current} was current"
            );
            ("superseded-result-accepted", proof, message)
        }
        (_, Some(expired), _) => {
            let message = format!(
                "result for {name} (fence {fence}) accepted as current completion after its lease expired (event {expired})"
            );
            ("expired-result-accepted", expired, message)
        }
        (_, _, Some(closed)) if facts.committed.is_none_or(|(at, _)| at != closed) => {
            let message = format!(
                "result for {name} (fence {fence}) accepted as current completion after the attempt was reconciled (event {closed})"
            );
            ("reconciled-result-accepted", closed, message)
        }
        (None, _, _) => {
            let message = format!("result for {name} (fence {fence}) accepted although the ledger never claimed it");
            ("unclaimed-result-accepted", ev.index, message)
        }
        _ => return,
    };
    out.push(
        Found::new(NAME, kind)
            .job(ctx, Some(job))
            .reported(ctx, ev)
            .attempts_of(ctx, latest.filter(|&latest| latest != attempt))
            .events(&[proof, ev.index])
            .says(message),
    );
}
