//! `clock-authority`: the runner's clock is diagnostic data, never authority for a lease.
//!
//! From the ledger: an accepted heartbeat, capability or result whose server receipt time
//! (`received_ms`) is at or past the attempt's lease end while the runner's `observed_ms`
//! is before it — a decision that holds only on the runner's clock.

use crate::driver::{Check, Findings, Found};
use crate::model::{Index, Observed, Op, Source};

pub const NAME: &str = "clock-authority";
pub const ABOUT: &str =
    "no report is accepted past the lease end on the server's clock because the runner's clock said it was still early";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<ClockAuthority>::default(), events)
}

#[derive(Default)]
pub(crate) struct ClockAuthority;

impl Check for ClockAuthority {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        if ev.src != Source::Ledger || !ev.op.is_report() || !ev.accepted() {
            return;
        }
        let (Some(job), Some(attempt), Some(received), Some(observed)) =
            (ev.job, ev.attempt, ev.received_ms, ev.observed_ms)
        else {
            return;
        };
        let target = if ev.op == Op::Heartbeat { ctx.heartbeat_target(job, attempt) } else { attempt };
        let facts = ctx.attempt(target);
        let Some(claim) = facts.claim else { return };
        let end = facts.lease_end;
        if received < end || observed >= end {
            return;
        }
        let message = format!(
            "{} for {} accepted at {received} ms on the server's clock, at or past its lease end {end} ms, because the runner's clock said {observed} ms",
            ev.raw.f,
            ctx.label(target)
        );
        out.push(
            Found::new(NAME, "runner-clock-trusted")
                .job(ctx, Some(job))
                .attempt(ctx, target)
                .reported(ctx, ev)
                .events(&[claim.index, ev.index])
                .says(message),
        );
    }
}
