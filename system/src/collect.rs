//! The one collector: at the end of a run, a scenario or a conformance session, every record
//! a system keeps — the control plane's ledger and its jobs (each whole, with its attempts),
//! the target's step log — is read once and turned into history events. What cannot be read
//! is never taken as empty: it is named in [`Records::unreadable`] and becomes an
//! `unreadable` event, which makes every verdict that needs it unknown, with the reason.
//! A part the system says it lacks (no ledger, no target) is absent, not unreadable.

use std::path::{Path, PathBuf};
use std::time::Duration;

use history::{Decision, Event, EventType, Op, Process};
use protocol::client::Client;
use protocol::{JobView, LedgerEntry, StepRecord};

use crate::{Feature, RunningSystem};

/// The most ledger entries or step records read (ten million).
pub const RECORDS_MAX: usize = 10_000_000;

/// Every record a system kept, and what of them could not be read.
#[derive(Clone, Debug, Default)]
pub struct Records {
    pub ledger: Vec<LedgerEntry>,
    /// Every job, each read whole (its attempts); a job listed but not readable whole is
    /// kept as listed and named in `unreadable`.
    pub jobs: Vec<JobView>,
    pub steps: Vec<StepRecord>,
    /// One sentence per record that could not be read.
    pub unreadable: Vec<String>,
}

/// Reads every record of `system`; each request waits at most `wait`.
pub async fn collect(system: &RunningSystem, wait: Duration) -> Records {
    let absent = system.launch.file.provides.absent();
    let target = system.target_url().map(|url| Client::new(&url, None, wait));
    read(&system.operator, target.as_ref(), !absent.contains(&Feature::Ledger)).await
}

/// How long the ledger may keep growing while the jobs are read before the records are
/// named unreadable (30 s: a sweeper expiring the leases of stopped runners is done within
/// a lease), and the pause between two reads (200 ms).
pub const CONSISTENT_READ_MAX: Duration = Duration::from_secs(30);
const CONSISTENT_READ_PAUSE: Duration = Duration::from_millis(200);

/// Reads the records through the operator's client and the target's (none: the system has
/// no target); `has_ledger` is false for a system that keeps none.
///
/// The ledger and the jobs are one snapshot only if the ledger does not grow while the jobs
/// are read: a system may still decide after its runners stopped (an observed CI master
/// giving up on the builds of workers that went away, a sweeper expiring a lease), and a
/// job read after a decision that the ledger read before it lacks would be judged against a
/// ledger it is ahead of. So the ledger's tail is read again after the jobs; while it grew,
/// the jobs are read again (bounded by [`CONSISTENT_READ_MAX`]). A system that never holds
/// still is named as unreadable, never judged on a torn snapshot.
pub async fn read(operator: &Client, target: Option<&Client>, has_ledger: bool) -> Records {
    let mut records = Records::default();
    if has_ledger {
        match operator.ledger(RECORDS_MAX).await {
            Ok(ledger) => records.ledger = ledger,
            Err(error) => records.unreadable.push(format!("the control plane's ledger could not be read: {error}")),
        }
    }
    let started = tokio::time::Instant::now();
    loop {
        records.jobs.clear();
        read_jobs(operator, &mut records).await;
        if !has_ledger || !records.unreadable.is_empty() {
            break;
        }
        let last = records.ledger.last().map_or(0, |entry| entry.seq);
        match operator.ledger_page(last, 10_000).await {
            Ok(tail) if tail.is_empty() => break,
            Ok(_) if started.elapsed() >= CONSISTENT_READ_MAX => {
                records.unreadable.push(format!(
                    "the control plane's ledger kept growing while its jobs were read, for {} s: no snapshot of \
                     its jobs and its ledger agrees",
                    CONSISTENT_READ_MAX.as_secs()
                ));
                break;
            }
            Ok(tail) => {
                records.ledger.extend(tail);
                tokio::time::sleep(CONSISTENT_READ_PAUSE).await;
            }
            Err(error) => {
                records.unreadable.push(format!("the control plane's ledger could not be read: {error}"));
                break;
            }
        }
    }
    if let Some(target) = target {
        match target.steps(RECORDS_MAX).await {
            Ok(steps) => records.steps = steps,
            Err(error) => records.unreadable.push(format!("the target's step log could not be read: {error}")),
        }
    }
    records
}

/// Every job, each read whole (a job listed but not readable whole is kept as listed).
async fn read_jobs(operator: &Client, records: &mut Records) {
    match operator.jobs().await {
        Ok(listed) => {
            for job in listed {
                match operator.job(&job.id).await {
                    Ok(view) => records.jobs.push(view),
                    Err(error) => {
                        records.unreadable.push(format!("job `{}` could not be read: {error}", job.id));
                        records.jobs.push(job);
                    }
                }
            }
        }
        Err(error) => records.unreadable.push(format!("the control plane's jobs could not be read: {error}")),
    }
}

impl Records {
    /// The events that close a history: every job's final state (none when `finals` is
    /// false: an interrupted run never reached its end, and an unsettled job is not lost),
    /// then one `unreadable` event per record that could not be read.
    pub fn closing_events(&self, finals: bool) -> Vec<Event> {
        let mut events: Vec<Event> = if finals { self.jobs.iter().map(final_event).collect() } else { vec![] };
        events.extend(self.unreadable.iter().map(|why| unreadable_event(why)));
        events
    }
}

/// An `unreadable` event: evidence that exists and could not be read.
pub fn unreadable_event(why: &str) -> Event {
    let mut event = Event::new(0, Process::HARNESS, EventType::Info, Op::Unreadable);
    event.reason = Some(why.to_string());
    event
}

/// A job's final state as the harness read it at the end.
pub fn final_event(job: &JobView) -> Event {
    let state = serde_json::to_value(job.state).ok().and_then(|value| value.as_str().map(str::to_string));
    let mut event = Event::new(0, Process::HARNESS, EventType::Ok, Op::Final);
    event.job = Some(job.id.clone());
    event.key = Some(job.deployment_key.clone());
    event.attempt = job.current_attempt.clone();
    event.outcome = state;
    let attempts: Vec<serde_json::Value> = job
        .attempts
        .iter()
        .map(|a| serde_json::json!({"attempt": a.id, "runner": a.runner, "fence": a.fence, "state": a.state, "closed_by": a.closed_by}))
        .collect();
    event.value = Some(serde_json::json!({ "attempts": attempts }));
    event
}

/// A ledger entry as a history event at `time_ns`.
pub fn ledger_event(entry: &LedgerEntry, time_ns: u64) -> Event {
    let mut event = Event::new(time_ns, Process::CONTROL_PLANE, EventType::Ledger, entry.kind);
    event.project = Some(entry.project.clone());
    event.job = Some(entry.job.clone());
    event.attempt = entry.attempt.clone();
    event.runner = entry.runner.clone();
    event.fence = entry.fence;
    event.key = Some(entry.deployment_key.clone());
    event.received_ms = Some(entry.received_ms);
    event.observed_ms = entry.observed_ms;
    event.lease_expires_ms = entry.lease_expires_ms;
    event.decision = entry.decision;
    event.reason = entry.reason.clone();
    event.outcome = entry.outcome.map(|word| word.as_str().to_string());
    event.value = Some(serde_json::json!({"seq": entry.seq, "recorded_as": entry.recorded_as}));
    event
}

/// A target step record as a history event at `time_ns`.
pub fn step_event(record: &StepRecord, time_ns: u64) -> Event {
    let mut event = Event::new(time_ns, Process::TARGET, EventType::Step, Op::Step).with_claim(
        &record.job,
        &record.attempt,
        &record.runner,
        record.fence,
    );
    event.key = Some(record.deployment_key.clone());
    event.received_ms = Some(record.received_ms);
    let decision = if record.applied { Decision::Accepted } else { Decision::Rejected };
    event = event.with_decision(decision, record.reason);
    event.value = Some(serde_json::json!({
        "seq": record.seq, "step": record.step, "steps": record.steps,
        "revision": record.revision, "highest_fence_before": record.highest_fence_before,
    }));
    event
}

/// Every source of a history before it is merged.
pub struct Sources<'a> {
    /// Events already on the history's clock (the harness's own).
    pub own: Vec<Event>,
    pub runner_logs: &'a [PathBuf],
    pub ledger: &'a [LedgerEntry],
    pub steps: &'a [StepRecord],
    /// Events that close the history, placed at its end (final states, unreadable records,
    /// the declaration of sources).
    pub closing: Vec<Event>,
}

/// The one merge: every source onto one clock (`mono_ns` − `start_ns`), in time order, the
/// closing events at the end (`now_ns` at the latest), numbered.
pub fn merge(start_ns: u64, now_ns: u64, sources: Sources<'_>) -> Vec<Event> {
    let rebase = |mono_ns: u64| mono_ns.saturating_sub(start_ns);
    let mut all: Vec<Event> = sources.own;
    for path in sources.runner_logs {
        all.extend(read_runner_log(path, start_ns, now_ns));
    }
    all.extend(sources.ledger.iter().map(|entry| ledger_event(entry, rebase(entry.mono_ns))));
    all.extend(sources.steps.iter().map(|record| step_event(record, rebase(record.mono_ns))));
    all.sort_by_key(|event| event.time_ns);
    let end_ns = all.last().map_or(0, |event| event.time_ns).max(now_ns);
    all.extend(sources.closing.into_iter().map(|mut event| {
        event.time_ns = end_ns;
        event
    }));
    for (index, event) in all.iter_mut().enumerate() {
        event.index = index as u64;
    }
    all
}

/// A runner's log, rebased. A torn last line (a killed runner) is skipped; any other line
/// that is not an event of the vocabulary, or a log that cannot be read, becomes an
/// `unreadable` event naming the file and line, so the verdict is unknown rather than blind.
pub fn read_runner_log(path: &Path, start_ns: u64, now_ns: u64) -> Vec<Event> {
    let unreadable = |time_ns: u64, why: String| {
        let mut event = Event::new(time_ns, Process::HARNESS, EventType::Info, Op::Unreadable);
        event.reason = Some(format!("{}: {why}", path.display()));
        event
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return vec![],
        Err(error) => return vec![unreadable(now_ns, error.to_string())],
    };
    let torn = !text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut events = Vec::with_capacity(lines.len());
    let mut last_ns = 0;
    for (number, line) in lines.iter().enumerate() {
        let parsed = serde_json::from_str::<Event>(line)
            .map_err(|error| error.to_string())
            .and_then(|event| event.check_vocabulary().map(|()| event).map_err(|why| why.to_string()));
        match parsed {
            Ok(mut event) => {
                event.time_ns = event.time_ns.saturating_sub(start_ns);
                last_ns = event.time_ns;
                events.push(event);
            }
            Err(_) if torn && number + 1 == lines.len() => {}
            Err(why) => events.push(unreadable(last_ns, format!("line {}: {why}", number + 1))),
        }
    }
    events
}
