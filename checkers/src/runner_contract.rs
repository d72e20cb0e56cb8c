//! `runner-contract`: a runner keeps its own rules, judged on its own log alone (one host,
//! one monotonic clock: `time_ns`), as `docs/protocol.md` ("What a runner must do") states
//! them. A runner that breaks them is masked while the control plane and a fenced target
//! refuse what it sends; against an unfenced target it is the only protection left.
//!
//! - **`acted-past-deadline`**: a capability request or a step sent after the runner's
//!   authority ended on its own clock. The authority of a claim lasts until the *send* time
//!   of its last *answered* renewal — the accepted claim, or an accepted heartbeat — plus the
//!   lease (`lease_ms` of the run's config; the runner's own renewal margin is its safety, not
//!   the contract's, so the whole lease is allowed). Answered as of the act: a renewal whose
//!   answer comes after it moved nothing for it, and once answered it counts from its send,
//!   never its answer. A heartbeat without an answer never moves it, and neither does an
//!   accepted heartbeat sent after it had ended: authority given up is not taken back. An
//!   answer is the newest heartbeat's sent for the attempt (the lenient reading for a runner
//!   with several in flight). Heartbeats themselves may be sent late — the server judges
//!   them. A runner stopped before its deadline (the nemesis's `pause`, the operator's
//!   freeze: SIGSTOP) and resumed after it may send one capability request or step before it
//!   can see the time: the first one after it resumes is excused (it may have checked just
//!   before it stopped). The anomaly names the renewal the deadline ran from. Every excuse,
//!   and why: `docs/checkers.md`, "`runner-contract`: what it excuses".
//! - **`acted-after-refusal`**: a capability request or a step sent for a claim after the
//!   runner was refused a capability (`stale_fence`, `expired`, `not_current`, …) or a step
//!   for it: a refusal ends the attempt's work (its result may still be sent).
//! - **`result-unbacked`**: a result the runner's log does not support — `succeeded` when
//!   fewer steps were applied (answered `accepted` by the target) than the job has (as the
//!   log's step requests say: `value.steps`), or `failed` from a claim the runner never
//!   worked on (no capability asked, no step sent, no refusal) while its authority still had
//!   more than the renewal margin to run. Judged only on a log that records the runner's
//!   steps and capability requests: one that shows none of them cannot show one missing.

use crate::driver::{Check, Findings, Found};
use crate::model::{FxMap, Index, Observed, Op, Source};
use history::Decision;

pub const NAME: &str = "runner-contract";
pub const ABOUT: &str = "each runner, on its own log: no capability or step after its authority ended or after a refusal, and every result backed by what it did";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<RunnerContract>::default(), events)
}

/// One claim as its runner's log shows it.
#[derive(Default)]
struct Work {
    /// The end of its authority on the runner's monotonic clock.
    deadline_ns: u64,
    /// The request of the renewal that set it — the claim or a heartbeat — and its event.
    renewed_by: Option<(&'static str, u64)>,
    /// The send time of the accepted claim.
    claimed_ns: u64,
    /// The newest heartbeat sent for it: its send time and event.
    heartbeat_sent: Option<(u64, u64)>,
    /// The first refusal of a capability or step for it: its event.
    refused: Option<u64>,
    asked: bool,
    steps_applied: u64,
    steps_total: Option<u64>,
    reported: bool,
    flagged: bool,
}

#[derive(Default)]
pub(crate) struct RunnerContract {
    lease_ns: Option<u64>,
    margin_ns: Option<u64>,
    /// Per runner: its newest claim request, its send time and event.
    claim_sent: FxMap<u32, (u64, u64)>,
    /// Per attempt.
    work: FxMap<u32, Work>,
    /// The runners whose logs show capability requests or steps.
    logs_work: std::collections::HashSet<u32>,
    /// Per runner: when it was stopped (SIGSTOP) and is not resumed yet.
    stopped_ns: FxMap<u32, u64>,
    /// Per runner: its last stop, `(stopped, resumed)`, while no capability request or step
    /// has been sent since it resumed.
    resumed: FxMap<u32, (u64, u64)>,
}

/// Whether an event stops a runner (SIGSTOP: the nemesis's `pause` starting, the operator's
/// freeze) or resumes it (the pause healed, the operator's thaw).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    Stopped,
    Resumed,
}

fn stop_of(ev: &Observed) -> Option<Stop> {
    let raw = ev.raw;
    if ev.src != Source::RunnerStop {
        return None;
    }
    if raw.process == history::Process::OPERATOR {
        return Some(if raw.f == Op::Freeze { Stop::Stopped } else { Stop::Resumed });
    }
    let value = raw.value.as_ref()?;
    match value.get("phase")?.as_str()? {
        "start" if value.get("effective")? == true => Some(Stop::Stopped),
        "heal" => Some(Stop::Resumed),
        _ => None,
    }
}

impl RunnerContract {
    fn stopped(&mut self, runner: u32, stop: Stop, at: u64) {
        match stop {
            Stop::Stopped => {
                self.stopped_ns.entry(runner).or_insert(at);
            }
            Stop::Resumed => {
                if let Some(stopped) = self.stopped_ns.remove(&runner) {
                    self.resumed.insert(runner, (stopped, at));
                }
            }
        }
    }
}

impl Check for RunnerContract {
    fn name(&self) -> &'static str {
        NAME
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        (ctx.seen.responses == 0).then(|| "the history has no runner answers: no runner's log to judge".to_string())
    }

    fn needs(&self) -> &'static [(&'static str, &'static [history::Source])] {
        &[
            ("acted-past-deadline", &[history::Source::RunnerLogs, history::Source::Config]),
            ("acted-after-refusal", &[history::Source::RunnerLogs]),
            ("result-unbacked", &[history::Source::RunnerLogs, history::Source::Config]),
        ]
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        if ev.src == Source::Config {
            self.lease_ns = ctx.config.lease_ms.map(|ms| ms * 1_000_000);
            self.margin_ns = ctx.config.renewal_margin_ms.map(|ms| ms * 1_000_000);
            return;
        }
        if let Some(stop) = stop_of(ev) {
            if let Some(runner) = ev.runner {
                self.stopped(runner, stop, ev.raw.time_ns);
            }
            return;
        }
        if !ev.raw.process.is_runner() {
            return;
        }
        let (Some(runner), at) = (ev.runner, ev.raw.time_ns) else { return };
        let lease_ns = self.lease_ns.unwrap_or(u64::MAX / 4);
        match (ev.src, ev.op) {
            (Source::RunnerRequest, Op::Claim) => {
                self.claim_sent.insert(runner, (at, ev.index));
            }
            (Source::RunnerResponse, Op::Claim) if ev.accepted() => {
                let Some(attempt) = ev.attempt else { return };
                let claim = self.claim_sent.get(&runner).copied();
                let (sent, request) = claim.map_or((at, None), |(sent, index)| (sent, Some(("claim", index))));
                let deadline_ns = sent.saturating_add(lease_ns);
                let work = Work { deadline_ns, renewed_by: request, claimed_ns: sent, ..Work::default() };
                self.work.insert(attempt, work);
            }
            (Source::ReportSent, Op::Heartbeat) => {
                if let Some(work) = ev.attempt.and_then(|attempt| self.work.get_mut(&attempt)) {
                    work.heartbeat_sent = Some((at, ev.index));
                }
            }
            (Source::RunnerResponse, Op::Heartbeat) if ev.accepted() => {
                if let Some(work) = ev.attempt.and_then(|attempt| self.work.get_mut(&attempt)) {
                    // Only a heartbeat sent while authority lasted moves it; an answer is the
                    // newest heartbeat's (a runner with several in flight gets the latest send).
                    if let Some((sent, request)) = work.heartbeat_sent.filter(|(sent, _)| *sent <= work.deadline_ns) {
                        if sent.saturating_add(lease_ns) > work.deadline_ns {
                            work.deadline_ns = sent.saturating_add(lease_ns);
                            work.renewed_by = Some(("heartbeat", request));
                        }
                    }
                }
            }
            (Source::RunnerResponse, Op::Capability | Op::Step) if ev.decision == Some(Decision::Rejected) => {
                if let Some(work) = ev.attempt.and_then(|attempt| self.work.get_mut(&attempt)) {
                    work.refused.get_or_insert(ev.index);
                }
            }
            (Source::RunnerResponse, Op::Step) if ev.accepted() => {
                if let Some(work) = ev.attempt.and_then(|attempt| self.work.get_mut(&attempt)) {
                    work.steps_applied += 1;
                }
            }
            (Source::ReportSent, Op::Capability) | (Source::RunnerRequest, Op::Step) => {
                let Some(attempt) = ev.attempt else { return };
                self.logs_work.insert(runner);
                let stop = self.resumed.remove(&runner);
                let Some(work) = self.work.get_mut(&attempt) else { return };
                work.asked = true;
                if ev.op == Op::Step {
                    let total = ev.raw.value.as_ref().and_then(|value| value.get("steps")?.as_u64());
                    work.steps_total = total.or(work.steps_total);
                }
                let what = if ev.op == Op::Step { "a step" } else { "a capability request" };
                let name = ctx.label(attempt);
                let (kind, message, proof) = if let Some(refused) = work.refused {
                    let said = format!(
                        "{} sent {what} for {name} after it was refused (event {refused})",
                        ctx.runner_name(runner)
                    );
                    ("acted-after-refusal", said, Some(refused))
                } else if stop.is_some_and(|(stopped, resumed)| stopped <= work.deadline_ns && resumed <= at) {
                    return; // stopped before its deadline: its first act after it is excused
                } else if self.lease_ns.is_some() && at > work.deadline_ns {
                    let late_ms = (at - work.deadline_ns) as f64 / 1e6;
                    let renewal = match work.renewed_by {
                        Some((what, index)) => format!("the {what} of event {index}"),
                        None => "its claim".to_string(),
                    };
                    let said = format!(
                        "{} sent {what} for {name} {late_ms:.1} ms after its authority ended on its own clock: the send of its last answered renewal ({renewal}, accepted) plus the {} ms lease",
                        ctx.runner_name(runner),
                        lease_ns / 1_000_000
                    );
                    ("acted-past-deadline", said, work.renewed_by.map(|(_, index)| index))
                } else {
                    return;
                };
                if std::mem::replace(&mut work.flagged, true) {
                    return;
                }
                let events: Vec<u64> = proof.into_iter().chain([ev.index]).collect();
                let found =
                    Found::new(NAME, kind).job(ctx, ev.job).attempt(ctx, attempt).reported(ctx, ev).events(&events);
                out.push(found.says(message));
            }
            (Source::ReportSent, Op::Result) => {
                let Some(attempt) = ev.attempt else { return };
                let Some(work) = self.work.get_mut(&attempt) else { return };
                if std::mem::replace(&mut work.reported, true) {
                    return;
                }
                let succeeded = ev.outcome.is_some_and(|outcome| ctx.outcome_name(outcome) == "succeeded");
                let name = ctx.label(attempt);
                let message = if succeeded {
                    // A log that shows no step of the claim says nothing of its steps.
                    let Some(total) = work.steps_total.filter(|total| work.steps_applied < *total) else { return };
                    format!(
                        "{} reported {name} succeeded after {} of {total} steps were applied",
                        ctx.runner_name(runner),
                        work.steps_applied
                    )
                } else {
                    let (Some(margin), Some(lease)) = (self.margin_ns, self.lease_ns) else { return };
                    if !self.logs_work.contains(&runner) {
                        return; // a log that shows none of the runner's work cannot show it missing
                    }
                    let still = work.deadline_ns.saturating_sub(margin.min(lease));
                    if work.asked || work.refused.is_some() || at >= still || at < work.claimed_ns {
                        return;
                    }
                    format!(
                        "{} reported {name} failed without asking for a capability or sending a step, {:.1} ms into a claim whose authority had {:.1} ms to run",
                        ctx.runner_name(runner),
                        (at - work.claimed_ns) as f64 / 1e6,
                        (work.deadline_ns - at) as f64 / 1e6
                    )
                };
                let found =
                    Found::new(NAME, "result-unbacked").job(ctx, ev.job).attempt(ctx, attempt).reported(ctx, ev);
                out.push(found.events(&[ev.index]).says(message));
            }
            _ => {}
        }
    }
}
