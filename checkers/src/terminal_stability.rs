//! `terminal-stability`: once a job's outcome is committed it never changes, and repeats
//! of a committed result are answered for what they are.
//!
//! From the ledger and the final state: a second accepted result for a job (or a
//! reconcile `completed` after a commit) replaces or re-commits the outcome; the `final`
//! outcome differs from the committed one; a result for the committed attempt with the
//! same claim but another outcome is not recorded as `conflict`; an identical one is not
//! acknowledged as `duplicate`.

use crate::driver::{Check, Findings, Found};
use crate::model::{FxMap, Index, Observed, Op, Source};
use history::{Decision, RecordedAs};

pub const NAME: &str = "terminal-stability";
pub const ABOUT: &str =
    "a committed outcome is never replaced, conflicting results are recorded as conflicts and identical retries as duplicates";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<TerminalStability>::default(), events)
}

/// A job's committed outcome: the event, the outcome, the attempt.
#[derive(Clone, Copy)]
struct Commit {
    event: u64,
    outcome: u32,
    attempt: u32,
}

#[derive(Default)]
pub(crate) struct TerminalStability {
    committed: FxMap<u32, Commit>,
}

impl Check for TerminalStability {
    fn name(&self) -> &'static str {
        NAME
    }

    fn needs(&self) -> &'static [(&'static str, &'static [history::Source])] {
        &[("final-differs-from-commit", &[history::Source::Finals])]
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        crate::driver::need_ledger(ctx).or_else(|| crate::driver::need_finals(ctx))
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        let Some(job) = ev.job else { return };
        match (ev.src, ev.op) {
            (Source::Ledger, Op::Result) => self.result(ev, ctx, job, out),
            (Source::Ledger, Op::Reconcile) if ev.recorded.is_some() && ev.attempt.is_some() => {
                let (Some(outcome), Some(attempt)) = (ev.recorded, ev.attempt) else { return };
                self.commit(ev, ctx, job, Commit { event: ev.index, outcome, attempt }, out);
            }
            (Source::Final, _) => self.final_state(ev, ctx, job, out),
            _ => {}
        }
    }
}

impl TerminalStability {
    fn result(&mut self, ev: &Observed, ctx: &Index, job: u32, out: &mut Findings) {
        let (Some(attempt), Some(outcome)) = (ev.attempt, ev.outcome) else { return };
        if ev.accepted() {
            self.commit(ev, ctx, job, Commit { event: ev.index, outcome, attempt }, out);
            return;
        }
        let facts = ctx.attempt(attempt);
        let (Some((at, committed)), Some(claim)) = (facts.committed, facts.claim) else { return };
        let same_claim = claim.job == job && Some(claim.fence) == ev.fence && Some(claim.runner) == ev.runner;
        if !same_claim {
            return;
        }
        let name = ctx.label(attempt);
        let (said, wanted) = (ctx.outcome_name(outcome), ctx.outcome_name(committed));
        let decision = ev.decision.map_or("none", decision_name);
        let (kind, message) = if outcome != committed {
            if ev.decision == Some(Decision::Conflict) && ev.recorded_as == Some(RecordedAs::Conflict) {
                return;
            }
            let message = format!(
                "conflicting result `{said}` for {name}, which had committed `{wanted}`, was answered `{decision}` (recorded as {}) instead of being recorded as a conflict",
                ev.recorded_as.map_or("nothing", RecordedAs::as_str)
            );
            ("conflict-not-recorded", message)
        } else {
            if ev.decision == Some(Decision::Duplicate) {
                return;
            }
            let message = format!(
                "identical retry of {name}'s committed result `{said}` was answered `{decision}` instead of being acknowledged as a duplicate"
            );
            ("duplicate-not-acknowledged", message)
        };
        out.push(
            Found::new(NAME, kind).job(ctx, Some(job)).attempt(ctx, attempt).events(&[at, ev.index]).says(message),
        );
    }

    /// A commit: the first for its job, or an anomaly replacing (or repeating) the first.
    fn commit(&mut self, ev: &Observed, ctx: &Index, job: u32, commit: Commit, out: &mut Findings) {
        let Some(first) = self.committed.get(&job).copied() else {
            self.committed.insert(job, commit);
            return;
        };
        let how = if ev.op == Op::Reconcile { "a reconciliation" } else { "an accepted result" };
        let (kind, message) = if first.outcome != commit.outcome {
            let message = format!(
                "job {}'s committed outcome `{}` (by {}) was replaced by `{}` from {how} for {}",
                ctx.jobs_names.name(job),
                ctx.outcome_name(first.outcome),
                ctx.label(first.attempt),
                ctx.outcome_name(commit.outcome),
                ctx.label(commit.attempt),
            );
            ("committed-outcome-replaced", message)
        } else {
            let message = format!(
                "job {}'s outcome `{}`, committed by {}, was committed again by {how} for {}",
                ctx.jobs_names.name(job),
                ctx.outcome_name(first.outcome),
                ctx.label(first.attempt),
                ctx.label(commit.attempt),
            );
            ("outcome-committed-twice", message)
        };
        out.push(
            Found::new(NAME, kind)
                .job(ctx, Some(job))
                .attempt(ctx, first.attempt)
                .attempt(ctx, commit.attempt)
                .events(&[first.event, ev.index])
                .says(message),
        );
    }

    fn final_state(&mut self, ev: &Observed, ctx: &Index, job: u32, out: &mut Findings) {
        let Some(commit) = self.committed.get(&job).copied() else { return };
        if ev.outcome == Some(commit.outcome) {
            return;
        }
        let state = ev.outcome.map_or("nothing", |outcome| ctx.outcome_name(outcome));
        let message = format!(
            "job {} ended `{state}` although {} had committed `{}`",
            ctx.jobs_names.name(job),
            ctx.label(commit.attempt),
            ctx.outcome_name(commit.outcome)
        );
        out.push(
            Found::new(NAME, "final-differs-from-commit")
                .job(ctx, Some(job))
                .attempt(ctx, commit.attempt)
                .events(&[commit.event, ev.index])
                .says(message),
        );
    }
}

pub(crate) fn decision_name(decision: Decision) -> &'static str {
    match decision {
        Decision::Accepted => "accepted",
        Decision::Rejected => "rejected",
        Decision::Duplicate => "duplicate",
        Decision::Conflict => "conflict",
    }
}
