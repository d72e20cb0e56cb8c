//! `single-owner`: at most one attempt per job, and one job per deployment key, holds an
//! unexpired lease at any instant of the server's clock.
//!
//! From the ledger alone: an attempt's lease is the interval from its claim's
//! `received_ms` to its lease end (moved by accepted heartbeats), ended early by an
//! accepted result, an `expire` or a `reconcile`. An accepted heartbeat after the lease
//! ended opens a new interval (a resurrected lease still counts as held). Two overlapping
//! intervals of different attempts of one job, or of different jobs on one key, are an
//! anomaly. An interval closed by a ledger entry that comes earlier in the ledger does not
//! overlap a later claim, whatever the receipt times say (receipt is read before the
//! transaction, so a claim may carry an earlier time than the release it waited for).

use crate::driver::{Check, Findings, Found};
use crate::model::{FxMap, Index, Observed, Op, Source};
use std::collections::HashSet;

pub const NAME: &str = "single-owner";
pub const ABOUT: &str =
    "no two attempts of one job, and no two jobs on one deployment key, hold unexpired leases at once";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<SingleOwner>::default(), events)
}

/// The open lease interval of one attempt.
#[derive(Clone, Copy)]
struct Lease {
    start: i64,
    end: i64,
    start_event: u64,
    /// `start` on the history's clock too, to say the lease's instants with.
    since: crate::moment::Moment,
    job: u32,
    key: Option<u32>,
}

#[derive(Default)]
pub(crate) struct SingleOwner {
    open: FxMap<u32, Lease>,
    by_job: FxMap<u32, Vec<u32>>,
    by_key: FxMap<u32, Vec<u32>>,
    reported: HashSet<(u32, u32)>,
}

impl Check for SingleOwner {
    fn name(&self) -> &'static str {
        NAME
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        crate::driver::need_leases(ctx)
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        if ev.src != Source::Ledger {
            return;
        }
        let (Some(job), Some(attempt), Some(at)) = (ev.job, ev.attempt, ev.received_ms) else { return };
        match ev.op {
            Op::Claim => {
                let key = ev.key.or(ctx.job(job).key);
                let since = crate::moment::Moment::of(ev, "server", at);
                let lease = Lease { start: at, end: ev.lease_ms.unwrap_or(at), start_event: ev.index, since, job, key };
                self.start(ctx, attempt, lease, out);
            }
            Op::Heartbeat if ev.accepted() => {
                let target = ctx.heartbeat_target(job, attempt);
                let end = ev.lease_ms.unwrap_or(at);
                match self.open.get_mut(&target) {
                    Some(lease) if at < lease.end => lease.end = lease.end.max(end),
                    _ => {
                        let key = ctx.attempt(target).claim.and_then(|claim| claim.key).or(ctx.job(job).key);
                        let since = crate::moment::Moment::of(ev, "server", at);
                        let lease = Lease { start: at, end, start_event: ev.index, since, job, key };
                        self.start(ctx, target, lease, out);
                    }
                }
            }
            Op::Result if ev.accepted() => self.close(attempt),
            Op::Expire | Op::Reconcile => self.close(attempt),
            _ => {}
        }
    }
}

impl SingleOwner {
    /// Opens a lease interval, reporting every other open interval of its job or key that
    /// it overlaps.
    fn start(&mut self, ctx: &Index, attempt: u32, lease: Lease, out: &mut Findings) {
        self.close(attempt);
        let mut holders = Vec::new();
        for (list, on_key) in
            [(self.by_job.get_mut(&lease.job), false), (lease.key.and_then(|key| self.by_key.get_mut(&key)), true)]
        {
            let Some(list) = list else { continue };
            list.retain(|other| self.open.get(other).is_some_and(|other| other.end > lease.start));
            holders.extend(list.iter().map(|&other| (other, on_key)));
        }
        for (other, on_key) in holders {
            let Some(held) = self.open.get(&other).copied() else { continue };
            if other == attempt || !self.reported.insert((other.min(attempt), other.max(attempt))) {
                continue;
            }
            out.push(overlap(ctx, attempt, &lease, other, &held, on_key));
        }
        self.by_job.entry(lease.job).or_default().push(attempt);
        if let Some(key) = lease.key {
            self.by_key.entry(key).or_default().push(attempt);
        }
        self.open.insert(attempt, lease);
    }

    fn close(&mut self, attempt: u32) {
        let Some(lease) = self.open.remove(&attempt) else { return };
        if let Some(list) = self.by_job.get_mut(&lease.job) {
            list.retain(|&other| other != attempt);
        }
        if let Some(list) = lease.key.and_then(|key| self.by_key.get_mut(&key)) {
            list.retain(|&other| other != attempt);
        }
    }
}

fn overlap(ctx: &Index, attempt: u32, lease: &Lease, other: u32, held: &Lease, on_key: bool) -> crate::Anomaly {
    let scope = if on_key && held.job != lease.job {
        format!("deployment key {}", ctx.key_names.name(lease.key.unwrap_or(0)))
    } else {
        format!("job {}", ctx.jobs_names.name(lease.job))
    };
    let message = format!(
        "{} held a lease from {} while {} still held one until {} on {scope}",
        ctx.label(attempt),
        lease.since,
        ctx.label(other),
        held.since.then(held.end),
    );
    let kind = if held.job == lease.job { "two-attempts-one-job" } else { "two-jobs-one-key" };
    Found::new(NAME, kind)
        .job(ctx, Some(lease.job))
        .key(ctx, lease.key)
        .attempt(ctx, other)
        .attempt(ctx, attempt)
        .events(&[held.start_event, lease.start_event])
        .says(message)
}
