//! `stale-side-effect`: the target must not apply a step of an older generation after a
//! newer one — fencing is only as strong as the boundary that checks it.
//!
//! From the target's step log: per deployment key, an applied step whose fence is lower
//! than a fence already applied on that key (an older attempt's step after a newer
//! attempt's, interleaving two executions). With an unfenced target (the harness's
//! `config` says `"target_mode": "unfenced"`) this is still reported, as the residual risk
//! the seed's exercise names, not hidden.

use crate::driver::{Check, Findings, Found};
use crate::model::{FxMap, Index, Observed, Source};
use std::collections::HashSet;

pub const NAME: &str = "stale-side-effect";
pub const ABOUT: &str =
    "the target never applies a step with a lower fence after a higher one on the same deployment key";

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

#[derive(Default)]
pub(crate) struct StaleSideEffect {
    highest: FxMap<u32, Highest>,
    reported: HashSet<(u32, u64)>,
}

impl Check for StaleSideEffect {
    fn name(&self) -> &'static str {
        NAME
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        (ctx.seen.steps == 0).then(|| "the history has no target step events: no side effect to judge".to_string())
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        if ev.src != Source::Target || !ev.accepted() {
            return;
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
