//! `heartbeat-resurrection`: a heartbeat must not bring back authority that has ended.
//!
//! An accepted ledger `heartbeat` is an anomaly when the attempt's lease had already
//! lapsed on the server's clock (its `received_ms` at or past the lease end the ledger
//! last granted, by claim or accepted heartbeat), when an `expire` entry for the attempt
//! came before it, or when the claim was no longer current (superseded by a newer claim of
//! the job, or closed by a result or a reconciliation). Rejoining after that is a
//! reconciliation flow, not a heartbeat.

use crate::driver::{Check, Findings, Found};
use crate::model::{Index, Observed, Op, Source};

pub const NAME: &str = "heartbeat-resurrection";
pub const ABOUT: &str =
    "no heartbeat is accepted after its lease lapsed on the server's clock, after an expiry, or for a claim no longer current";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<HeartbeatResurrection>::default(), events)
}

#[derive(Default)]
pub(crate) struct HeartbeatResurrection {
    /// Attempts already reported as revived or closed: one anomaly each, not one per beat.
    reported: std::collections::HashSet<u32>,
}

impl Check for HeartbeatResurrection {
    fn name(&self) -> &'static str {
        NAME
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        crate::driver::need_leases(ctx)
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        if ev.src != Source::Ledger || ev.op != Op::Heartbeat || !ev.accepted() {
            return;
        }
        let (Some(job), Some(attempt), Some(received)) = (ev.job, ev.attempt, ev.received_ms) else { return };
        let target = ctx.heartbeat_target(job, attempt);
        let facts = ctx.attempt(target);
        let name = ctx.label(target);
        let latest = ctx.job(job).latest;
        let at = crate::moment::Moment::of(ev, "server", received);
        let (kind, proof, message) = if let Some(expired) = facts.expired {
            let message = format!("heartbeat for {name} accepted at {at} after the attempt expired (event {expired})");
            ("heartbeat-after-expiry", Some(expired), message)
        } else if received >= facts.lease_end && facts.claim.is_some() {
            let message = format!(
                "heartbeat for {name} accepted at {at}, at or after its lease ended at {}",
                at.then(facts.lease_end)
            );
            ("heartbeat-after-lease-end", facts.claim.map(|claim| claim.index), message)
        } else if latest.is_some_and(|latest| latest != target) {
            let current = latest.map_or_else(String::new, |latest| ctx.label(latest));
            let message = format!("heartbeat for {name} accepted while {current} was the job's current claim");
            (
                "heartbeat-for-superseded-claim",
                latest.and_then(|latest| ctx.attempt(latest).claim).map(|c| c.index),
                message,
            )
        } else if let Some(closed) = facts.closed {
            let message = format!("heartbeat for {name} accepted after the attempt was closed (event {closed})");
            ("heartbeat-after-close", Some(closed), message)
        } else if facts.claim.is_none() {
            let message = format!("heartbeat for {name} accepted although the ledger never claimed it");
            ("heartbeat-for-unclaimed", None, message)
        } else {
            return;
        };
        let once = matches!(kind, "heartbeat-after-expiry" | "heartbeat-after-close");
        if once && !self.reported.insert(target) {
            return;
        }
        let proof: Vec<u64> = proof.into_iter().chain([ev.index]).collect();
        out.push(
            Found::new(NAME, kind)
                .job(ctx, Some(job))
                .attempt(ctx, target)
                .reported(ctx, ev)
                .attempts_of(ctx, latest.filter(|&latest| latest != target))
                .events(&proof)
                .says(message),
        );
    }
}
