//! `stale-side-effect`: the target must not apply a step of an older generation after a
//! newer one — fencing is only as strong as the boundary that checks it.
//!
//! From the target's step log: per deployment key, an applied step whose fence is lower
//! than a fence already applied on that key (an older attempt's step after a newer
//! attempt's, interleaving two executions). With an unfenced target (the harness's
//! `config` says `"target_mode": "unfenced"`) this is still reported, as the residual risk
//! the seed's exercise names, not hidden.
//!
//! And a runner that lost its authority does not mutate the target: an applied step
//! received after its attempt's lease ended (`step-after-lease`) — the latest lease the
//! ledger granted that attempt (claim, accepted heartbeat or capability) at or before the
//! step's receipt — is a late side effect even where no newer fence has written the key.
//! The target's receipt time and the lease's end are compared as wall-clock times, so the
//! target and the lease's clock must agree within [`CLOCK_TOLERANCE_MS`]; a history without
//! a ledger cannot be judged on this and is not.
//!
//! And a step takes effect once (`step-applied-twice`): the target applied the same step of
//! one attempt more than once — a step whose answer was lost, sent again and applied again,
//! a deployment step run twice. A correct runner never sends a step twice (a lost answer
//! leaves its outcome unknown and ends the attempt), so a second application means a re-send
//! its log shows (the anomaly says how many sends it holds) or one it does not. On an
//! idempotent target (`"target_mode": "idempotent"`), which promises each step of a job
//! once whoever sends it, the identity is the job and the step, across attempts.

use crate::driver::{Check, Findings, Found};
use crate::model::{FxMap, Index, Observed, Op, Source};
use crate::moment::Moment;
use std::collections::HashSet;

pub const NAME: &str = "stale-side-effect";
pub const ABOUT: &str = "the target never applies a step with a lower fence after a higher one on the same deployment key, nor a step after its attempt's lease ended";

/// How far the target's clock and the clock that decides leases may disagree before a step
/// applied after the lease's end is reported.
pub const CLOCK_TOLERANCE_MS: i64 = 25;

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<StaleSideEffect>::default(), events)
}

/// The highest fence applied on a key, with the attempt, runner and event that applied it.
#[derive(Clone, Copy)]
struct Highest {
    fence: u64,
    attempt: Option<u32>,
    runner: Option<u32>,
    event: u64,
}

/// A lease the ledger granted: receipt, lease end, the ledger event, the receipt as said.
type Lease = (i64, i64, u64, Moment);

/// An applied step not yet known to be within a lease: attempt, receipt, event, the
/// receipt as said.
type LateStep = (u32, i64, u64, Moment);

#[derive(Default)]
pub(crate) struct StaleSideEffect {
    highest: FxMap<u32, Highest>,
    reported: HashSet<(u32, u64)>,
    /// Leases granted per attempt.
    leases: FxMap<u32, Vec<Lease>>,
    /// Applied steps past every lease seen when they were observed: judged at the end, when
    /// every ledger entry has been seen.
    pending: Vec<LateStep>,
    /// Applied steps per identity — (attempt, step), or (job, step) on an idempotent
    /// target — with their events; an identity reported once.
    applied: FxMap<(u32, u64), Vec<u64>>,
    /// Steps the runners' logs show sent, per (attempt, step).
    sent: FxMap<(u32, u64), u32>,
}

impl StaleSideEffect {
    /// The latest lease granted to `attempt` at or before `at_ms`.
    fn lease_at(&self, attempt: u32, at_ms: i64) -> Option<Lease> {
        let granted = self.leases.get(&attempt)?.iter().filter(|lease| lease.0 <= at_ms);
        granted.max_by_key(|lease| lease.1).copied()
    }
}

impl Check for StaleSideEffect {
    fn name(&self) -> &'static str {
        NAME
    }

    fn needs(&self) -> &'static [(&'static str, &'static [history::Source])] {
        &[
            ("stale-step-applied", &[history::Source::TargetLog]),
            ("step-applied-twice", &[history::Source::TargetLog]),
            ("stale-step-applied-unfenced-target", &[history::Source::TargetLog]),
            ("step-after-lease", &[history::Source::TargetLog, history::Source::Ledger, history::Source::Leases]),
            (
                "step-after-lease-unfenced-target",
                &[history::Source::TargetLog, history::Source::Ledger, history::Source::Leases],
            ),
        ]
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        (ctx.seen.steps == 0).then(|| "the history has no target step events: no side effect to judge".to_string())
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        let grant = ev.op == Op::Claim || (ev.accepted() && matches!(ev.op, Op::Heartbeat | Op::Capability));
        if let (Source::Ledger, true, Some(attempt), Some(at), Some(end)) =
            (ev.src, grant, ev.attempt, ev.received_ms, ev.lease_ms)
        {
            self.leases.entry(attempt).or_default().push((at, end, ev.index, Moment::of(ev, "server", at)));
        }
        if (ev.src, ev.op) == (Source::RunnerRequest, Op::Step) {
            if let (Some(attempt), Some(step)) = (ev.attempt, step_of(ev)) {
                *self.sent.entry((attempt, step)).or_default() += 1;
            }
            return;
        }
        if ev.src != Source::Target || !ev.accepted() {
            return;
        }
        self.twice(ev, ctx, out);
        if let (Some(attempt), Some(at)) = (ev.attempt, ev.received_ms) {
            if self.lease_at(attempt, at).is_none_or(|lease| at > lease.1 + CLOCK_TOLERANCE_MS) {
                self.pending.push((attempt, at, ev.index, Moment::of(ev, "target", at)));
            }
        }
        let (Some(key), Some(fence)) = (ev.key, ev.fence) else { return };
        let now = Highest { fence, attempt: ev.attempt, runner: ev.runner, event: ev.index };
        let Some(high) = self.highest.get(&key).copied() else {
            self.highest.insert(key, now);
            return;
        };
        if fence >= high.fence {
            self.highest.insert(key, now);
            return;
        }
        if !self.reported.insert((key, fence)) {
            return;
        }
        out.push(stale(ev, ctx, key, fence, &high));
    }

    fn finish(&mut self, ctx: &Index, out: &mut Findings) {
        let mut reported = HashSet::new();
        for &(attempt, at, event, applied) in &self.pending {
            let Some((_, end, granted, grant)) = self.lease_at(attempt, at) else { continue };
            if at <= end + CLOCK_TOLERANCE_MS || !reported.insert(attempt) {
                continue;
            }
            let mut message = format!(
                "the target applied a step of {} at {applied}, {} ms after its lease ended at {}: a runner that lost its authority mutated the target",
                ctx.label(attempt),
                at - end,
                grant.then(end)
            );
            let kind = if ctx.target_unfenced() {
                message.push_str(" (the residual risk of an unfenced target, which cannot refuse it)");
                "step-after-lease-unfenced-target"
            } else {
                "step-after-lease"
            };
            let claim = ctx.attempt(attempt).claim;
            let found = Found::new(NAME, kind).attempt(ctx, attempt).job(ctx, claim.map(|claim| claim.job));
            let found = match claim {
                Some(claim) => found.runner(ctx, claim.runner).fence(claim.fence).key(ctx, claim.key),
                None => found,
            };
            out.push(found.events(&[granted, event]).says(message));
        }
    }
}

impl StaleSideEffect {
    /// An applied step: reported when its identity was applied before.
    fn twice(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        let Some(step) = step_of(ev) else { return };
        let idempotent = ctx.config.target_mode == Some(history::TargetMode::Idempotent);
        let identity = match idempotent {
            true => ev.job,
            false => ev.attempt,
        };
        let Some(identity) = identity else { return };
        let events = self.applied.entry((identity, step)).or_default();
        events.push(ev.index);
        if events.len() != 2 {
            return;
        }
        let events = events.clone();
        let whose = match idempotent {
            true => format!("job {}", ctx.job_name(Some(identity)).unwrap_or_default()),
            false => ctx.attempt_name(identity).to_string(),
        };
        let mut message = format!("the target applied step {step} of {whose} a second time");
        if idempotent {
            message.push_str(": an idempotent target applies each step of a job once, whoever sends it");
        } else if let (Some(attempt), Some(runner)) = (ev.attempt, ev.runner) {
            let sent = self.sent.get(&(attempt, step)).copied().unwrap_or(0);
            if !ctx.holds(history::Source::RunnerLogs) {
                message.push_str(": a step sent again, its side effect repeated");
            } else {
                let said = format!(
                    ": {} sent it {sent} time{} by its own log — a step whose answer was lost was sent again, and its side effect repeated",
                    ctx.runner_name(runner),
                    if sent == 1 { "" } else { "s" }
                );
                message.push_str(&said);
            }
        }
        let found = Found::new(NAME, "step-applied-twice").job(ctx, ev.job).key(ctx, ev.key).reported(ctx, ev);
        let found = match ev.attempt {
            Some(attempt) => found.attempt(ctx, attempt),
            None => found,
        };
        out.push(found.events(&events).says(message));
    }
}

/// The step number an event names (`value.step`).
fn step_of(ev: &Observed) -> Option<u64> {
    ev.raw.value.as_ref().and_then(|value| value.get("step")?.as_u64())
}

fn stale(ev: &Observed, ctx: &Index, key: u32, fence: u64, high: &Highest) -> crate::Anomaly {
    let who = |attempt: Option<u32>| attempt.map_or("an unnamed attempt", |attempt| ctx.attempt_name(attempt));
    let mut message = format!(
        "the target applied a step of {} (fence {fence}) on key {} after applying {} (fence {})",
        who(ev.attempt),
        ctx.key_names.name(key),
        who(high.attempt),
        high.fence
    );
    let kind = if ctx.target_unfenced() {
        message.push_str(": the residual risk of an unfenced target, which cannot refuse stale side effects");
        "stale-step-applied-unfenced-target"
    } else {
        "stale-step-applied"
    };
    let mut found = Found::new(NAME, kind).job(ctx, ev.job).key(ctx, Some(key)).reported(ctx, ev);
    if let Some(attempt) = high.attempt {
        found = found.attempt(ctx, attempt);
    }
    if let Some(runner) = high.runner {
        found = found.runner(ctx, runner);
    }
    found.fence(high.fence).events(&[high.event, ev.index]).says(message)
}
