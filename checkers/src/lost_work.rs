//! `lost-work`: what was acknowledged must survive to the end, across control-plane
//! restarts, and every job must end settled or explicitly uncertain; and a job the system
//! itself left with no way to settle is a finding, not missing evidence.
//!
//! From the client, the runners and the final state: an acknowledged submit (client `ok`)
//! whose job has no `final` event; an acknowledged result (a runner's answer `accepted`)
//! whose job's `final` outcome is another; a job whose `final` state is `running` or
//! `queued` (neither terminal nor explicitly uncertain after recovery).
//!
//! A run whose recovery did not settle every job does not judge a job left unsettled as
//! lost: a backlog still moving at the recovery limit is not a fault. But a job whose final
//! state has no attempt that could still move it is **wedged** (`job-wedged`), complete run
//! or not, proven from the ledger and the final state alone: a `running` job whose current
//! attempt the ledger ended — expired (uncertain or requeued), closed by its result or a
//! reconcile — and not revived by an accepted heartbeat since; or an `uncertain` job whose
//! current attempt the ledger closed. Nothing the contract has can settle it: only an
//! uncertain attempt of an uncertain job is reconciled, only a queued job is claimed, and
//! the closed attempt reports nothing more. Its deployment key stays held, so the jobs
//! queued behind it on that key are named with it. An attempt the ledger leaves open may
//! still be working — without leases (an observed system) nothing in the ledger says it is
//! not — so its job stays unjudged.

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
    /// The current attempt and deployment key the last `final` event names.
    current: Option<u32>,
    key: Option<u32>,
}

/// How the ledger ended an attempt, last: the entry, and whether it closed it for good
/// (a result or a reconcile) or expired it (which an accepted heartbeat may undo).
#[derive(Clone, Copy)]
struct Ended {
    at: u64,
    closed: bool,
    when: Option<crate::moment::Moment>,
}

#[derive(Default)]
pub(crate) struct LostWork {
    jobs: FxMap<u32, JobEnd>,
    /// Attempts the ledger ended, by attempt.
    ended: FxMap<u32, Ended>,
    /// Signs of life of each claimed attempt: when the ledger granted it and when the
    /// target last received a step of it (history clock, ns).
    life: FxMap<u32, Life>,
}

#[derive(Clone, Copy, Default)]
struct Life {
    claimed_ns: u64,
    last_step_ns: Option<u64>,
}

/// The most open attempts an unknown verdict's reason names.
const OPEN_NAMED_MAX: usize = 10;

impl Check for LostWork {
    fn name(&self) -> &'static str {
        NAME
    }

    fn needs(&self) -> &'static [(&'static str, &'static [history::Source])] {
        &[
            ("acknowledged-job-missing", &[history::Source::Client, history::Source::Finals]),
            ("acknowledged-result-lost", &[history::Source::RunnerLogs, history::Source::Finals]),
            ("not-settled", &[history::Source::Finals]),
            ("job-wedged", &[history::Source::Finals, history::Source::Ledger]),
        ]
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        crate::driver::need_finals(ctx).or_else(|| {
            let why = ctx.unsettled.as_deref()?;
            Some(format!(
                "the run did not complete ({why}): a job left unsettled whose records do not show it wedged is not \
                 judged lost{}",
                self.open_at_the_end(ctx)
            ))
        })
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, _out: &mut Findings) {
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
            Source::Final => {
                let end = self.jobs.entry(job).or_default();
                end.last = Some((ev.index, ev.outcome));
                (end.current, end.key) = (ev.attempt, ev.key);
            }
            Source::Ledger => self.ledger(ev, ctx),
            Source::Target => {
                if let Some(attempt) = ev.attempt {
                    self.life.entry(attempt).or_default().last_step_ns = Some(ev.raw.time_ns);
                }
            }
            _ => {}
        }
    }

    fn finish(&mut self, ctx: &Index, out: &mut Findings) {
        if ctx.seen.finals == 0 {
            return;
        }
        let mut jobs: Vec<(&u32, &JobEnd)> = self.jobs.iter().collect();
        jobs.sort_unstable_by_key(|(job, _)| **job);
        for &(&job, end) in &jobs {
            judge(ctx, job, end, out);
        }
        for &(&job, end) in &jobs {
            if let Some(anomaly) = self.wedged(ctx, job, end, &jobs) {
                out.push(anomaly);
            }
        }
    }
}

impl LostWork {
    /// Follows how the ledger ends attempts: an expiry, an accepted result, a reconcile
    /// that closes (`stopped`, `completed`); an accepted heartbeat after an expiry revives
    /// the attempt, as the rules model follows the ledger.
    fn ledger(&mut self, ev: &Observed, ctx: &Index) {
        let Some(attempt) = ev.attempt else { return };
        let finding = ev.outcome.map(|outcome| ctx.outcome_name(outcome));
        let when = ev.received_ms.map(|ms| crate::moment::Moment::of(ev, "server", ms));
        match ev.op {
            Op::Claim => self.life.entry(attempt).or_default().claimed_ns = ev.raw.time_ns,
            Op::Expire => {
                self.ended.entry(attempt).or_insert(Ended { at: ev.index, closed: false, when });
            }
            Op::Result if ev.accepted() => {
                self.ended.insert(attempt, Ended { at: ev.index, closed: true, when });
            }
            Op::Reconcile if matches!(finding, Some("stopped" | "completed")) => {
                self.ended.insert(attempt, Ended { at: ev.index, closed: true, when });
            }
            Op::Heartbeat if ev.accepted() => {
                let target = ctx.heartbeat_target(ev.job.unwrap_or(0), attempt);
                if self.ended.get(&target).is_some_and(|ended| !ended.closed) {
                    self.ended.remove(&target);
                }
            }
            _ => {}
        }
    }

    /// The current attempts of the jobs left `running` that the ledger leaves open, each
    /// with its claim and its last step on the target: what an unknown verdict cannot
    /// judge, named (a build a system without leases never ends looks the same as one
    /// still working).
    fn open_at_the_end(&self, ctx: &Index) -> String {
        let mut open: Vec<(u32, u32)> = self
            .jobs
            .iter()
            .filter(|(_, end)| {
                end.last.and_then(|(_, state)| state).map(|state| ctx.outcome_name(state)) == Some("running")
            })
            .filter_map(|(&job, end)| Some((job, end.current.or(ctx.job(job).latest)?)))
            .filter(|(_, attempt)| !self.ended.contains_key(attempt) && self.life.contains_key(attempt))
            .collect();
        if open.is_empty() {
            return String::new();
        }
        open.sort_unstable();
        let seconds = |ns: u64| format!("{}.{:03} s", ns / 1_000_000_000, ns / 1_000_000 % 1_000);
        let steps = ctx.holds(history::Source::TargetLog);
        let named: Vec<String> = open
            .iter()
            .take(OPEN_NAMED_MAX)
            .map(|&(_, attempt)| {
                let life = self.life[&attempt];
                let step = match (steps, life.last_step_ns) {
                    (false, _) => String::new(),
                    (true, None) => ", no step on the target".to_string(),
                    (true, Some(ns)) => format!(", its last step at {}", seconds(ns)),
                };
                format!("{} claimed at {}{step}", ctx.label(attempt), seconds(life.claimed_ns))
            })
            .collect();
        let more = open.len().saturating_sub(OPEN_NAMED_MAX);
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        let lease = if ctx.holds(history::Source::Leases) {
            "no expiry of it is recorded"
        } else {
            "the system grants no lease, and nothing in its records ends it"
        };
        format!(
            "; the ledger leaves open the current attempts of the jobs left running — {}{more} — and whether each \
             still runs the records do not say ({lease})",
            named.join("; ")
        )
    }

    /// A job whose final state no attempt can move any more (see the module's comment).
    fn wedged(&self, ctx: &Index, job: u32, end: &JobEnd, jobs: &[(&u32, &JobEnd)]) -> Option<crate::Anomaly> {
        let (final_at, state) = end.last?;
        let state_name = ctx.outcome_name(state?);
        let attempt = end.current.or(ctx.job(job).latest)?;
        let claim = ctx.attempt(attempt).claim.filter(|claim| claim.job == job)?;
        if ctx.job(job).latest != Some(attempt) {
            return None;
        }
        let ended = self.ended.get(&attempt)?;
        let how = match (state_name, ended.closed) {
            ("running", false) => "expired",
            ("running" | "uncertain", true) => "closed",
            _ => return None,
        };
        let label = ctx.label(attempt);
        let name = ctx.jobs_names.name(job);
        let after = match &ctx.unsettled {
            Some(_) => "after recovery",
            None => "at the end",
        };
        let why = match state_name {
            "running" => "a running job is neither claimed again nor reconciled, and its attempt reports nothing more",
            _ => "only an uncertain attempt is reconciled, and this one was closed",
        };
        let key = end.key.or(claim.key);
        let behind: Vec<(u32, u64)> = jobs
            .iter()
            .filter(|(other, other_end)| {
                **other != job
                    && key.is_some()
                    && other_end.key.or(ctx.job(**other).key) == key
                    && other_end.last.and_then(|(_, state)| state).map(|state| ctx.outcome_name(state))
                        == Some("queued")
            })
            .filter_map(|(other, other_end)| Some((**other, other_end.last?.0)))
            .collect();
        let when = ended.when.map_or_else(String::new, |when| format!(" at {when}"));
        let mut message = format!(
            "job {name} is wedged: it ended `{state_name}` {after}, but the ledger {how} its current attempt \
             {label}{when} and no attempt of it was live since: {why}"
        );
        if !behind.is_empty() {
            let names: Vec<&str> = behind.iter().map(|(other, _)| ctx.jobs_names.name(*other)).collect();
            let key = key.map_or("?", |key| ctx.key_names.name(key));
            message.push_str(&format!(
                "; its deployment key {key} stays held, and {} stayed queued behind it",
                names.join(", ")
            ));
        }
        let mut events = vec![claim.index, ended.at, final_at];
        events.extend(behind.iter().map(|(_, at)| *at));
        let found = Found::new(NAME, "job-wedged").job(ctx, Some(job)).key(ctx, key).attempt(ctx, attempt);
        Some(found.events(&events).says(message))
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
