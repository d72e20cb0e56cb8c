//! `clock-authority`: the runner's clock is diagnostic data, never authority for a lease.
//!
//! From the ledger: an accepted heartbeat, capability or result whose server receipt time
//! (`received_ms`) is at or past the attempt's lease end while the runner's `observed_ms`
//! is before it — a decision that holds only on the runner's clock. The ledger cannot tell
//! whether that clock was the cause (a report that waited in the network before a lapsed
//! lease was judged carries the same times), so the anomaly says what holds, not why.
//!
//! And one authority: in sequence order, no ledger entry's `received_ms` is more than a
//! lease before an earlier entry's. The control plane's decisions are serialised, so their
//! instants on one clock only move forward (give or take the wait between receipt and
//! decision); an entry a lease or more in the past was judged on another clock — a replica
//! whose clock is off — and leases judged on it end at other instants than on the others.

use crate::driver::{Check, Findings, Found};
use crate::model::{Index, Observed, Op, Source};
use crate::moment::Moment;

pub const NAME: &str = "clock-authority";
pub const ABOUT: &str =
    "no report is accepted past the lease end on the server's clock where only the runner's clock puts it inside the lease";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<ClockAuthority>::default(), events)
}

#[derive(Default)]
pub(crate) struct ClockAuthority {
    /// Every ledger entry with a receipt time: (seq, received_ms, history index, op, and
    /// the receipt on the history's clock too).
    entries: Vec<(u64, i64, u64, history::Op, Moment)>,
    /// The shortest lease a claim granted (its lease end less its receipt).
    lease_ms: Option<i64>,
}

/// Most `split-clock` anomalies one run reports (each is the first entry of a stretch).
const SPLIT_REPORTS_MAX: usize = 10;

/// The tolerance when no claim told the lease.
const DEFAULT_LEASE_MS: i64 = 2_000;

impl Check for ClockAuthority {
    fn name(&self) -> &'static str {
        NAME
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        crate::driver::need_leases(ctx)
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        if ev.src == Source::Ledger {
            if let (Some(seq), Some(received)) = (ev.seq, ev.received_ms) {
                self.entries.push((seq, received, ev.index, ev.raw.f, Moment::of(ev, "server", received)));
                if let (Op::Claim, Some(end)) = (ev.op, ev.lease_ms) {
                    let lease = end - received;
                    if lease > 0 {
                        self.lease_ms = Some(self.lease_ms.map_or(lease, |shortest| shortest.min(lease)));
                    }
                }
            }
        }
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
        let at = Moment::of(ev, "server", received);
        let message = format!(
            "{} for {} accepted at {at}, at or past its lease end {}: only the runner's clock, which said {observed} ms, puts it inside the lease",
            ev.raw.f,
            ctx.label(target),
            at.then(end)
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

    fn finish(&mut self, _ctx: &Index, out: &mut Findings) {
        let lease = self.lease_ms.unwrap_or(DEFAULT_LEASE_MS);
        self.entries.sort_unstable_by_key(|entry| entry.0);
        let mut latest: Option<(u64, i64, u64, history::Op, Moment)> = None;
        let (mut reported, mut in_stretch) = (0, false);
        for &(seq, received, index, op, at) in &self.entries {
            let Some(before) = latest else {
                latest = Some((seq, received, index, op, at));
                continue;
            };
            let behind = before.1 - received;
            if behind < lease {
                in_stretch = false;
            } else if !in_stretch && reported < SPLIT_REPORTS_MAX {
                in_stretch = true;
                reported += 1;
                let message = format!(
                    "ledger entry {seq} ({op}) was decided at {at}, {behind} ms before entry {} ({}) that precedes it at {}: the control plane judged leases on clocks at least a lease ({lease} ms) apart",
                    before.0, before.3, before.4
                );
                out.push(Found::new(NAME, "split-clock").events(&[before.2, index]).says(message));
            }
            if received > before.1 {
                latest = Some((seq, received, index, op, at));
            }
        }
    }
}
