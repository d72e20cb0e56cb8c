//! What the reports say of a whole history, gathered one event at a time: the counts, the
//! attempts' durations, the span and the sources of `results.json`, exact over every event
//! however long the history. And the [`Sampler`]: the events a report draws from when the
//! history is too long to draw whole — every event of a sampled share of the jobs (the
//! same share of the runners' events that name no job), and every event of the nemesis,
//! the operator and the harness that names no job.

use crate::json::{AttemptTimes, Counter, Counts, Steps};
use crate::vocab::name_of;
use checkers::FxMap as HashMap;
use history::{Decision, Event, EventType, Op, Process, Source};
use std::collections::{BTreeMap, BTreeSet};

/// The whole history's figures, exact: fed every event once, in the history's order.
#[derive(Clone, Debug, Default)]
pub struct Digest {
    events: u64,
    /// Per process, per event type (as [`type_slot`] numbers them).
    by_process_and_type: HashMap<Process, [u64; TYPES.len()]>,
    reports: HashMap<(Op, Decision), u64>,
    steps_applied: u64,
    steps_refused: Counter,
    /// Every job, with where its events lie.
    jobs: HashMap<String, Span>,
    finals: HashMap<String, String>,
    /// Open attempts by id, with their claim's time.
    open: HashMap<String, u64>,
    /// Attempts claimed again under an id still open: never closed.
    abandoned: usize,
    attempts: u64,
    closed_ms: Vec<u64>,
    first_ns: Option<u64>,
    last_ns: Option<u64>,
    declared: Option<BTreeSet<Source>>,
    seen: BTreeSet<Source>,
}

impl Digest {
    pub fn new() -> Digest {
        Digest::default()
    }

    /// The digest of a history held whole.
    pub fn of(events: &[Event]) -> Digest {
        let mut digest = Digest::new();
        events.iter().for_each(|event| digest.push(event));
        digest
    }

    /// Counts one event, the next of the history; its position is its index.
    pub fn push(&mut self, e: &Event) {
        self.push_at(e, e.index);
    }

    /// Counts one event, the next of the history, found at `at` (a position of the
    /// caller's: an index, a byte offset) — what [`Digest::span`] answers with.
    pub fn push_at(&mut self, e: &Event, at: u64) {
        self.events += 1;
        self.first_ns = Some(self.first_ns.map_or(e.time_ns, |first| first.min(e.time_ns)));
        self.last_ns = Some(self.last_ns.map_or(e.time_ns, |last| last.max(e.time_ns)));
        let slot = type_slot(e.kind);
        match self.by_process_and_type.get_mut(&e.process) {
            Some(counts) => counts[slot] += 1,
            None => {
                let mut counts = [0; TYPES.len()];
                counts[slot] = 1;
                self.by_process_and_type.insert(e.process.clone(), counts);
            }
        }
        if let Some(job) = &e.job {
            let last = e.process == Process::HARNESS && e.f == Op::Final;
            match self.jobs.get_mut(job.as_str()) {
                Some(span) if last => span.final_at = Some(at),
                Some(span) => span.last = at,
                None => {
                    let span = if last {
                        Span { first: at, last: at, final_at: Some(at) }
                    } else {
                        Span { first: at, last: at, final_at: None }
                    };
                    self.jobs.insert(job.clone(), span);
                }
            }
        }
        match (e.kind, e.decision) {
            (EventType::Ledger, Some(decision)) => *self.reports.entry((e.f, decision)).or_default() += 1,
            (EventType::Step, Some(Decision::Accepted)) => self.steps_applied += 1,
            (EventType::Step, Some(_)) => {
                let reason = e.reason.as_deref().unwrap_or("unspecified");
                match self.steps_refused.get_mut(reason) {
                    Some(count) => *count += 1,
                    None => {
                        self.steps_refused.insert(reason.to_string(), 1);
                    }
                }
            }
            _ => {}
        }
        if e.process == Process::HARNESS && e.f == Op::Final {
            if let Some(job) = &e.job {
                if !self.finals.contains_key(job.as_str()) {
                    let outcome = e.outcome.clone().unwrap_or_else(|| "unspecified".to_string());
                    self.finals.insert(job.clone(), outcome);
                }
            }
        }
        if e.kind == EventType::Ledger {
            self.attempt(e);
        }
        if e.f == Op::Sources && self.declared.is_none() {
            self.declared = history::declared(e);
        }
        if let Some(source) = Source::of(e) {
            self.seen.insert(source);
        }
    }

    /// An attempt opens at its ledger claim and closes at the first accepted result, expiry
    /// or reconciliation (as [`crate::model::attempts`] reads them).
    fn attempt(&mut self, e: &Event) {
        let Some(id) = e.attempt.as_deref() else { return };
        if e.f == Op::Claim {
            self.attempts += 1;
            if self.open.insert(id.to_string(), e.time_ns).is_some() {
                self.abandoned += 1;
            }
            return;
        }
        let closes =
            (e.f == Op::Result && e.decision == Some(Decision::Accepted)) || e.f == Op::Expire || e.f == Op::Reconcile;
        if closes {
            if let Some(start_ns) = self.open.remove(id) {
                self.closed_ms.push(e.time_ns.saturating_sub(start_ns) / 1_000_000);
            }
        }
    }

    /// Where a job's events lie: from its first to its last event before the harness's
    /// final record of it, and that record's position.
    pub fn span(&self, job: &str) -> Option<Span> {
        self.jobs.get(job).copied()
    }

    /// How many events the history holds.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The first and last event's time on the run's clock.
    pub fn span_ns(&self) -> (Option<u64>, Option<u64>) {
        (self.first_ns, self.last_ns)
    }

    /// The sources the history holds: those its `sources` event declares, else those its
    /// events come from (as [`history::sources_of`] says).
    pub fn sources(&self) -> BTreeSet<Source> {
        self.declared.clone().unwrap_or_else(|| self.seen.clone())
    }

    pub(crate) fn counts(&self) -> Counts {
        let mut by_process = Counter::new();
        let mut by_type = Counter::new();
        let mut by_both: BTreeMap<String, Counter> = BTreeMap::new();
        let counted = self.by_process_and_type.iter().flat_map(|(process, counts)| {
            TYPES.iter().zip(counts).filter(|(_, count)| **count > 0).map(move |(kind, count)| (process, kind, count))
        });
        for (process, kind, count) in counted {
            let (process, kind) = (process.to_string(), name_of(kind));
            *by_process.entry(process.clone()).or_default() += count;
            *by_type.entry(kind.clone()).or_default() += count;
            *by_both.entry(process).or_default().entry(kind).or_default() += count;
        }
        let mut reports: BTreeMap<String, Counter> = BTreeMap::new();
        for ((f, decision), count) in &self.reports {
            *reports.entry(f.to_string()).or_default().entry(name_of(decision)).or_default() += count;
        }
        let mut finals = Counter::new();
        for outcome in self.finals.values() {
            *finals.entry(outcome.clone()).or_default() += 1;
        }
        let unrecorded = self.jobs.keys().filter(|job| !self.finals.contains_key(job.as_str())).count() as u64;
        if unrecorded > 0 {
            finals.insert("no_final_event".to_string(), unrecorded);
        }
        let final_only = self.finals.keys().filter(|job| !self.jobs.contains_key(job.as_str())).count() as u64;
        Counts {
            events: self.events,
            events_by_process: by_process,
            events_by_type: by_type,
            events_by_process_and_type: by_both,
            jobs: self.jobs.len() as u64 + final_only,
            jobs_by_final_state: finals,
            attempts: self.attempts,
            reports_by_decision: reports,
            steps: Steps {
                applied: self.steps_applied,
                refused: self.steps_refused.values().sum(),
                refused_by_reason: self.steps_refused.clone(),
            },
        }
    }

    pub(crate) fn attempt_times(&self) -> AttemptTimes {
        let mut closed = self.closed_ms.clone();
        closed.sort_unstable();
        let pick = |q: f64| closed.get(((closed.len() as f64 - 1.0) * q).round() as usize).copied();
        AttemptTimes {
            closed: closed.len(),
            open: self.open.len() + self.abandoned,
            min: closed.first().copied(),
            median: pick(0.5),
            p99: pick(0.99),
            max: closed.last().copied(),
        }
    }
}

/// Where one job's events lie in a history, in the positions [`Digest::push_at`] was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Its first event.
    pub first: u64,
    /// Its last event before the harness's final record (the first, if it has no other).
    pub last: u64,
    /// The harness's final record of it.
    pub final_at: Option<u64>,
}

/// Every event type, in the order of [`type_slot`].
const TYPES: [EventType; 8] = [
    EventType::Invoke,
    EventType::Ok,
    EventType::Fail,
    EventType::Info,
    EventType::Request,
    EventType::Response,
    EventType::Ledger,
    EventType::Step,
];

fn type_slot(kind: EventType) -> usize {
    match kind {
        EventType::Invoke => 0,
        EventType::Ok => 1,
        EventType::Fail => 2,
        EventType::Info => 3,
        EventType::Request => 4,
        EventType::Response => 5,
        EventType::Ledger => 6,
        EventType::Step => 7,
    }
}

/// At most this many events are kept for drawing (besides the anomalies' own, added after).
pub const KEPT_EVENTS_MAX: usize = 20_000;

/// Chooses the events a report draws from, one event at a time, in bounded memory: every
/// event while they fit in its bound; past it, the events of one job in 2, then in 4, …
/// (chosen by the job's name, so a job is kept whole or not at all), the runners' events
/// that name no job in the same share (by position), and every other event that names no
/// job (the nemesis's, the operator's, the harness's), unless those alone outgrow half
/// the bound.
#[derive(Debug)]
pub struct Sampler {
    cap: usize,
    /// The share kept is one in `2^level` (jobs and the runners' unnamed events).
    level: u32,
    /// The same for the other unnamed events.
    other_level: u32,
    kept: Vec<Event>,
    others: usize,
}

impl Sampler {
    /// A sampler keeping at most about `cap` events.
    pub fn new(cap: usize) -> Sampler {
        Sampler { cap: cap.max(2), level: 0, other_level: 0, kept: Vec::new(), others: 0 }
    }

    /// Offers the next event of the history; a copy is kept if it is chosen.
    pub fn offer(&mut self, e: &Event) {
        if !sampled(e, self.level, self.other_level) {
            return;
        }
        if is_other(e) {
            self.others += 1;
        }
        self.kept.push(e.clone());
        while self.kept.len() > self.cap && self.level < 63 {
            if self.others > self.cap / 2 {
                self.other_level += 1;
            } else {
                self.level += 1;
            }
            let (level, other_level) = (self.level, self.other_level);
            let mut kept = std::mem::take(&mut self.kept);
            kept.retain(|e| sampled(e, level, other_level));
            self.others = kept.iter().filter(|e| is_other(e)).count();
            self.kept = kept;
        }
    }

    /// The events chosen, in the history's order.
    pub fn finish(self) -> Sample {
        Sample { events: self.kept, level: self.level, other_level: self.other_level }
    }
}

/// An event that names no job and is not a runner's.
fn is_other(e: &Event) -> bool {
    e.job.is_none() && !matches!(e.process, Process::Runner(_))
}

fn sampled(e: &Event, level: u32, other_level: u32) -> bool {
    match (&e.job, is_other(e)) {
        (Some(job), _) => chosen(hash(job.as_bytes()), level),
        (None, true) => chosen(mix(e.index), other_level),
        (None, false) => chosen(mix(e.index), level),
    }
}

fn chosen(hash: u64, level: u32) -> bool {
    level == 0 || hash & ((1u64 << level.min(63)) - 1) == 0
}

/// FNV-1a, then mixed: stable across runs and platforms, so the same history draws the
/// same jobs.
fn hash(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(hash)
}

/// splitmix64's finaliser.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The events a report draws from, and which share of the history they are.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// In the history's order.
    pub events: Vec<Event>,
    level: u32,
    other_level: u32,
}

impl Sample {
    /// Whether every event was kept.
    pub fn whole(&self) -> bool {
        self.level == 0 && self.other_level == 0
    }

    /// The share of jobs kept: one in this many.
    pub fn one_in(&self) -> u64 {
        1u64 << self.level.min(63)
    }

    /// Whether every event of this job is in the sample.
    pub fn holds_job(&self, job: &str) -> bool {
        chosen(hash(job.as_bytes()), self.level)
    }

    /// Whether the event at this position with this job is in the sample.
    pub fn holds(&self, e: &Event) -> bool {
        sampled(e, self.level, self.other_level)
    }

    /// Adds events read again (an anomaly's, a job's): the sample stays in the history's
    /// order, each event once.
    pub fn add(&mut self, more: Vec<Event>) {
        if more.is_empty() {
            return;
        }
        self.events.extend(more);
        self.events.sort_by_key(|e| e.index);
        self.events.dedup_by_key(|e| e.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `jobs` jobs of `per_job` runner events each, and a nemesis event every ten.
    fn history(jobs: usize, per_job: usize) -> Vec<Event> {
        let mut events = Vec::new();
        for n in 0..jobs * per_job {
            let job = format!("j{}", n % jobs);
            let e = Event::new(n as u64, Process::runner("r1"), EventType::Request, Op::Heartbeat).with_job(&job);
            events.push(e);
            if n % 10 == 0 {
                events.push(Event::new(n as u64, Process::NEMESIS, EventType::Ok, Op::Config));
            }
        }
        for (index, event) in events.iter_mut().enumerate() {
            event.index = index as u64;
        }
        events
    }

    fn sample(events: &[Event], cap: usize) -> Sample {
        let mut sampler = Sampler::new(cap);
        events.iter().for_each(|event| sampler.offer(event));
        sampler.finish()
    }

    #[test]
    fn a_history_within_the_bound_is_kept_whole() {
        let events = history(20, 5);
        let kept = sample(&events, events.len());
        assert!(kept.whole());
        assert_eq!(kept.events, events);
    }

    #[test]
    fn past_the_bound_whole_jobs_are_kept_and_every_nemesis_event() {
        let events = history(400, 10);
        let kept = sample(&events, 1_000);
        assert!(!kept.whole() && kept.one_in() >= 4, "one in {}", kept.one_in());
        assert!(kept.events.len() <= 1_000, "{} kept", kept.events.len());
        let nemesis = |list: &[Event]| list.iter().filter(|e| e.process == Process::NEMESIS).count();
        assert_eq!(nemesis(&kept.events), nemesis(&events));
        let jobs: BTreeSet<&str> = kept.events.iter().filter_map(|e| e.job.as_deref()).collect();
        assert!(!jobs.is_empty());
        for job in (0..400).map(|n| format!("j{n}")) {
            let all = events.iter().filter(|e| e.job.as_deref() == Some(job.as_str())).count();
            let held = kept.events.iter().filter(|e| e.job.as_deref() == Some(job.as_str())).count();
            assert_eq!(held, if kept.holds_job(&job) { all } else { 0 }, "{job}: a job is kept whole or not at all");
        }
        assert!(kept.events.windows(2).all(|pair| pair[0].index < pair[1].index), "in the history's order");
    }

    #[test]
    fn events_added_later_keep_the_sample_ordered_and_single() {
        let events = history(400, 10);
        let mut kept = sample(&events, 1_000);
        let missing: Vec<Event> = events.iter().filter(|e| !kept.holds(e)).take(3).cloned().collect();
        let before = kept.events.len();
        kept.add(missing.clone());
        kept.add(missing);
        assert_eq!(kept.events.len(), before + 3);
        assert!(kept.events.windows(2).all(|pair| pair[0].index < pair[1].index));
    }
}
