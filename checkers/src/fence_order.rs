//! `fence-order`: fences identify generations of permission, so they must be unique and
//! grow, and a report must carry exactly the fence, job and runner of its attempt's claim.
//!
//! From the ledger: per job, claim fences strictly increase in claim order; no fence is
//! claimed by two attempts anywhere (fences come from one global counter); no attempt is
//! claimed twice; and every accepted or duplicate-acknowledged heartbeat, capability or
//! result names the fence, job and runner its attempt was claimed with (a report matched
//! by a bare fence number is the planted `unscoped-fence`).

use crate::driver::{Check, Findings, Found};
use crate::model::{FxMap, Index, Observed, Op, Source};
use history::Decision;

pub const NAME: &str = "fence-order";
pub const ABOUT: &str =
    "fences strictly increase per job, are never reused, and every accepted report carries its own claim's fence, job and runner";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<FenceOrder>::default(), events)
}

#[derive(Default)]
pub(crate) struct FenceOrder {
    /// Per job: the last claim's fence, attempt and event.
    last: FxMap<u32, (u64, u32, u64)>,
    /// Per fence: the attempt that claimed it and the event.
    owners: FxMap<u64, (u32, u64)>,
}

impl Check for FenceOrder {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        if ev.src != Source::Ledger {
            return;
        }
        let (Some(job), Some(attempt), Some(fence)) = (ev.job, ev.attempt, ev.fence) else { return };
        let acknowledged = matches!(ev.decision, Some(Decision::Accepted | Decision::Duplicate));
        match ev.op {
            Op::Claim => self.claim(ev, ctx, job, attempt, fence, out),
            op if op.is_report() && acknowledged => report(ev, ctx, job, attempt, fence, out),
            _ => {}
        }
    }
}

impl FenceOrder {
    fn claim(&mut self, ev: &Observed, ctx: &Index, job: u32, attempt: u32, fence: u64, out: &mut Findings) {
        let found = || Found::new(NAME, "").job(ctx, Some(job)).reported(ctx, ev);
        let name = ctx.attempt_name(attempt);
        if let Some(before) = ctx.attempt(attempt).claim {
            let message = format!("{name} was claimed twice, with fence {} and then fence {fence}", before.fence);
            out.push(kind(found(), "attempt-claimed-twice").events(&[before.index, ev.index]).says(message));
        }
        if let Some(&(owner, at)) = self.owners.get(&fence).filter(|(owner, _)| *owner != attempt) {
            let message =
                format!("fence {fence} was claimed by {name} after {} had already claimed it", ctx.attempt_name(owner));
            out.push(kind(found(), "fence-reused").attempt(ctx, owner).events(&[at, ev.index]).says(message));
        }
        if let Some(&(last, previous, at)) = self.last.get(&job).filter(|(last, _, _)| *last >= fence) {
            let message = format!(
                "{name} was claimed with fence {fence}, not above the job's previous claim {} (fence {last})",
                ctx.attempt_name(previous)
            );
            out.push(
                kind(found(), "fence-not-increasing").attempt(ctx, previous).events(&[at, ev.index]).says(message),
            );
        }
        self.owners.entry(fence).or_insert((attempt, ev.index));
        self.last.insert(job, (fence, attempt, ev.index));
    }
}

fn kind(found: Found, kind: &str) -> Found {
    found.kind(kind)
}

/// An acknowledged report must carry its attempt's claim exactly.
fn report(ev: &Observed, ctx: &Index, job: u32, attempt: u32, fence: u64, out: &mut Findings) {
    let what = ev.raw.f.as_str();
    let name = ctx.attempt_name(attempt);
    let Some(claim) = ctx.attempt(attempt).claim else {
        let message =
            format!("{what} for {name} (fence {fence}) acknowledged although the ledger never claimed {name}");
        out.push(
            Found::new(NAME, "report-for-unclaimed-attempt")
                .job(ctx, Some(job))
                .reported(ctx, ev)
                .events(&[ev.index])
                .says(message),
        );
        return;
    };
    let mut wrong = Vec::new();
    if claim.fence != fence {
        wrong.push(format!("fence {fence} instead of {}", claim.fence));
    }
    if claim.job != job {
        wrong.push(format!("job {} instead of {}", ctx.jobs_names.name(job), ctx.jobs_names.name(claim.job)));
    }
    if ev.runner.is_some_and(|runner| runner != claim.runner) {
        let runner = ev.runner.map_or("?", |runner| ctx.runner_name(runner));
        wrong.push(format!("runner {runner} instead of {}", ctx.runner_name(claim.runner)));
    }
    if wrong.is_empty() {
        return;
    }
    let message = format!("{what} for {name} acknowledged with {}", wrong.join(", "));
    out.push(
        Found::new(NAME, "report-claim-mismatch")
            .job(ctx, Some(job))
            .attempt(ctx, attempt)
            .reported(ctx, ev)
            .events(&[claim.index, ev.index])
            .says(message),
    );
}
