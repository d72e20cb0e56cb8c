//! `lost-work`: what was acknowledged must survive to the end, across control-plane
//! restarts, and every job must end settled or explicitly uncertain.
//!
//! From the client, the runners and the final state: an acknowledged submit (client `ok`)
//! whose job has no `final` event; an acknowledged result (a runner's answer `accepted`)
//! whose job's `final` outcome is another; a job whose `final` state is `running` or
//! `queued` (neither terminal nor explicitly uncertain after recovery).

use crate::driver::{Check, Findings, Found};
use crate::model::{FxMap, Index, Observed, Op, Source};

pub const NAME: &str = "lost-work";
pub const ABOUT: &str =
    "every acknowledged job and result survives to the final state, and every job ends terminal or explicitly uncertain";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<LostWork>::default(), events)
}

/// What was acknowledged about a job and how it ended.
#[derive(Default)]
struct JobEnd {
    submitted: Option<u64>,
    /// Acknowledged results: event, attempt, outcome.
    acked: Vec<(u64, Option<u32>, u32)>,
    /// The last `final` event: event and state.
    last: Option<(u64, Option<u32>)>,
}

#[derive(Default)]
pub(crate) struct LostWork {
    jobs: FxMap<u32, JobEnd>,
}

impl Check for LostWork {
    fn name(&self) -> &'static str {
        NAME
    }

    fn needs(&self) -> &'static [(&'static str, &'static [history::Source])] {
        &[
            ("acknowledged-job-missing", &[history::Source::Client, history::Source::Finals]),
            ("acknowledged-result-lost", &[history::Source::RunnerLogs, history::Source::Finals]),
            ("not-settled", &[history::Source::Finals]),
        ]
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        crate::driver::need_finals(ctx).or_else(|| {
            let why = ctx.unsettled.as_deref()?;
            Some(format!("the run did not complete ({why}): a job left unsettled is not judged lost"))
        })
    }

    fn observe(&mut self, ev: &Observed, _ctx: &Index, _out: &mut Findings) {
        let Some(job) = ev.job else { return };
        match ev.src {
            Source::SubmitOk => {
                let end = self.jobs.entry(job).or_default();
                end.submitted = end.submitted.or(Some(ev.index));
            }
            Source::RunnerResponse if ev.op == Op::Result && ev.accepted() => {
                if let Some(outcome) = ev.outcome {
                    self.jobs.entry(job).or_default().acked.push((ev.index, ev.attempt, outcome));
                }
            }
            Source::Final => self.jobs.entry(job).or_default().last = Some((ev.index, ev.outcome)),
            _ => {}
        }
    }

    fn finish(&mut self, ctx: &Index, out: &mut Findings) {
        if ctx.seen.finals == 0 {
            return;
        }
        let mut jobs: Vec<(&u32, &JobEnd)> = self.jobs.iter().collect();
        jobs.sort_unstable_by_key(|(job, _)| **job);
        for (&job, end) in jobs {
            judge(ctx, job, end, out);
        }
    }
}

fn judge(ctx: &Index, job: u32, end: &JobEnd, out: &mut Findings) {
    let name = ctx.jobs_names.name(job);
    let found = |kind: &str| Found::new(NAME, kind).job(ctx, Some(job)).key(ctx, ctx.job(job).key);
    let Some((final_at, state)) = end.last else {
        if let Some(at) = end.submitted {
            let message = format!("job {name} was acknowledged to the client but is missing from the final state");
            out.push(found("acknowledged-job-missing").events(&[at]).says(message));
        }
        return;
    };
    let state_name = state.map_or("nothing", |state| ctx.outcome_name(state));
    for &(at, attempt, outcome) in &end.acked {
        if state == Some(outcome) {
            continue;
        }
        let who = attempt.map_or_else(|| "an attempt".to_string(), |attempt| ctx.label(attempt));
        let message = format!(
            "the result `{}` of {who} was acknowledged to the runner but job {name} ended `{state_name}`",
            ctx.outcome_name(outcome)
        );
        let found = found("acknowledged-result-lost").attempts_of(ctx, attempt);
        out.push(found.events(&[at, final_at]).says(message));
    }
    if matches!(state_name, "running" | "queued") && ctx.unsettled.is_none() {
        let message =
            format!("job {name} ended `{state_name}`: neither terminal nor explicitly uncertain after recovery");
        let attempt = ctx.job(job).latest;
        out.push(found("not-settled").attempts_of(ctx, attempt).events(&[final_at]).says(message));
    }
}
