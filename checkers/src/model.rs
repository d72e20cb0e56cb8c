//! The shared index of a history, built in one pass and read by every checker.
//!
//! Every checker needs the same few facts about the ledger: which attempt a claim started,
//! with which fence, runner and key; where its lease ends on the server's clock; whether it
//! was expired, reconciled or committed. Computing them once, here, keeps the checkers
//! short and the whole check linear. Names (jobs, attempts, runners, keys, outcomes) are
//! interned to small integers so per-attempt state is a few words and no event is cloned:
//! memory grows with the number of jobs and attempts, not with the number of events.
//!
//! [`Observed`] is one event decoded once (names interned, `value.seq` and friends read out).
//! [`Index`] is the index *before* the event being observed: a checker sees the event and
//! the facts established by everything earlier, and the driver then applies the event.

use history::{Decision, Event, EventType, Process, RecordedAs};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A small, fast, non-cryptographic hasher (the Fx hash of rustc) for interning names.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word =
                u64::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7]]);
            self.add(word);
        }
        for &byte in chunks.remainder() {
            self.add(u64::from(byte));
        }
    }
    fn write_u8(&mut self, byte: u8) {
        self.add(u64::from(byte));
    }
    fn write_u64(&mut self, word: u64) {
        self.add(word);
    }
}

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Ids per block of a [`Slots`] table.
const SLOTS_BLOCK_BITS: u32 = 12;

/// A table indexed by dense ids (`0..len`), kept in blocks of 4,096 that never move once
/// made. A vector grown by doubling copies all it holds into memory the kernel must zero
/// first; at 10^7 events those page faults cost more than the checking (`perf record` of
/// `fencelab check`). Here each slot's memory is touched once, when its id first appears.
pub struct Slots<T> {
    blocks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Slots<T> {
        Slots { blocks: Vec::new(), len: 0 }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Slots<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T> Slots<T> {
    /// How many ids the table holds (one more than the largest slot made).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, id: usize) -> Option<&T> {
        self.blocks.get(id >> SLOTS_BLOCK_BITS)?.get(id & ((1 << SLOTS_BLOCK_BITS) - 1))
    }

    pub fn get_mut(&mut self, id: usize) -> Option<&mut T> {
        self.blocks.get_mut(id >> SLOTS_BLOCK_BITS)?.get_mut(id & ((1 << SLOTS_BLOCK_BITS) - 1))
    }

    /// The slots in id order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.blocks.iter().flatten()
    }

    /// The slots in id order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.blocks.iter_mut().flatten()
    }
}

impl<T: Default> Slots<T> {
    /// The slot of `id`, the table grown with defaults up to it.
    pub fn slot(&mut self, id: usize) -> &mut T {
        while self.len <= id {
            if self.len >> SLOTS_BLOCK_BITS == self.blocks.len() {
                self.blocks.push(Vec::with_capacity(1 << SLOTS_BLOCK_BITS));
            }
            self.blocks.last_mut().expect("a block").push(T::default());
            self.len += 1;
        }
        self.get_mut(id).expect("a slot just made")
    }
}

impl<T> std::ops::Index<usize> for Slots<T> {
    type Output = T;
    fn index(&self, id: usize) -> &T {
        let len = self.len;
        self.get(id).unwrap_or_else(|| panic!("slot {id} of {len}"))
    }
}

impl<T> std::ops::IndexMut<usize> for Slots<T> {
    fn index_mut(&mut self, id: usize) -> &mut T {
        let len = self.len;
        self.get_mut(id).unwrap_or_else(|| panic!("slot {id} of {len}"))
    }
}

/// Names of one kind mapped to dense ids `0..n`. Each name is kept once, in one text
/// (`text[ends[id - 1]..ends[id]]`), and the table holds only ids. The name looked up
/// last is tried first: a history names one attempt in runs of events (its request, the
/// ledger's entry, the answer, the target's step).
#[derive(Default)]
pub struct Interner {
    ids: hashbrown::HashTable<u32>,
    text: String,
    ends: Vec<usize>,
    /// The id looked up last, if any.
    last: Option<u32>,
}

fn hash_name(name: &str) -> u64 {
    let mut hasher = FxHasher::default();
    hasher.write(name.as_bytes());
    hasher.finish()
}

impl Interner {
    pub fn id(&mut self, name: &str) -> u32 {
        if let Some(last) = self.last.filter(|&last| self.name(last) == name) {
            return last;
        }
        let hash = hash_name(name);
        let Interner { ids, text, ends, last } = self;
        let name_of = |id: u32| -> &str {
            let end = ends[id as usize];
            let start = if id == 0 { 0 } else { ends[id as usize - 1] };
            &text[start..end]
        };
        let id = match ids.find(hash, |&id| name_of(id) == name) {
            Some(&id) => id,
            None => {
                let id = ends.len() as u32;
                ids.insert_unique(hash, id, |&id| hash_name(name_of(id)));
                text.push_str(name);
                ends.push(text.len());
                id
            }
        };
        *last = Some(id);
        id
    }
    /// The id of a name already seen.
    pub fn get(&self, name: &str) -> Option<u32> {
        self.ids.find(hash_name(name), |&id| self.name(id) == name).copied()
    }
    pub fn name(&self, id: u32) -> &str {
        let Some(&end) = self.ends.get(id as usize) else { return "?" };
        let start = if id == 0 { 0 } else { self.ends[id as usize - 1] };
        &self.text[start..end]
    }
    pub fn len(&self) -> usize {
        self.ends.len()
    }
}

/// Who recorded an event, as far as the checkers care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// An entry of the control plane's ledger (`type = ledger`).
    Ledger,
    /// A runner's log: `response` to one of its calls.
    RunnerResponse,
    /// The target's step log (`type = step`).
    Target,
    /// A report sent to the control plane: a runner's `request` (heartbeat, capability,
    /// result), or a result the nemesis sent with a runner's token (`invoke` of
    /// `duplicate-results` or `conflicting-results`).
    ReportSent,
    /// A runner's claim or step request (`request`): when it asked, on its own clock.
    RunnerRequest,
    /// A result the nemesis sent for a claim with the token of another runner than the one
    /// the claim names (`value.token_of`): a report nobody entitled to it made.
    ForeignReport,
    /// The control plane's answer to a report the nemesis sent itself (`ok` with the verdict
    /// and `value.ledger_seq`, or `fail` with the error, of `duplicate-results` or
    /// `conflicting-results`; `value.report` names the report's kind, `value.token_of` whose
    /// token it carried).
    NemesisAnswer,
    /// The control plane's answer to an operator's reconcile (`operator`, `ok`, `reconcile`):
    /// the finding in `outcome`, `value.ledger_seq` the entry the answer's view shows for it.
    OperatorAnswer,
    /// The client's acknowledged submit (`client`, `ok`, `submit`).
    SubmitOk,
    /// The harness's final state of one job (`harness`, `ok`, `final`).
    Final,
    /// The harness's run configuration (`harness`, `ok`, `config`).
    Config,
    /// The operator's decision to reconcile an attempt (`operator`, `invoke`, `reconcile`).
    OperatorReconcile,
    /// A runner process found exited on its own (`harness`, `ok`, `runner-exited`).
    RunnerExited,
    /// A runner stopped (SIGSTOP) or resumed: the operator's freeze (`ok`) and thaw (`ok`),
    /// the nemesis's `pause` taking effect (`ok` of its start) and healed (`ok`).
    RunnerStop,
    /// A claim a scenario played as a runner and was granted (`scenario`, `ok`, `claim`).
    PlayedClaim,
    /// Anything else: requests, operator and nemesis operations, faults.
    Other,
}

pub use history::Op;

/// One event, decoded once: names interned, the `value` fields the checkers use read out.
pub struct Observed<'a> {
    pub index: u64,
    pub src: Source,
    pub op: Op,
    pub job: Option<u32>,
    pub attempt: Option<u32>,
    pub runner: Option<u32>,
    pub key: Option<u32>,
    pub fence: Option<u64>,
    pub received_ms: Option<i64>,
    pub observed_ms: Option<i64>,
    pub lease_ms: Option<i64>,
    pub decision: Option<Decision>,
    /// The outcome (results, finals) or the finding (reconcile), interned.
    pub outcome: Option<u32>,
    /// `value.seq` of a ledger entry.
    pub seq: Option<u64>,
    /// `value.ledger_seq` of an answer: a runner's, the nemesis's or the operator's.
    pub ledger_seq: Option<u64>,
    pub recorded_as: Option<RecordedAs>,
    /// `recorded_as`, interned with the outcomes (a reconcile's `succeeded`/`failed`).
    pub recorded: Option<u32>,
    pub raw: &'a Event,
}

impl Observed<'_> {
    pub fn accepted(&self) -> bool {
        self.decision == Some(Decision::Accepted)
    }
}

/// What a ledger `claim` established about an attempt.
#[derive(Clone, Copy, Debug)]
pub struct Claim {
    pub job: u32,
    pub runner: u32,
    pub key: Option<u32>,
    pub fence: u64,
    pub index: u64,
}

/// What the ledger has said about one attempt so far.
#[derive(Clone, Debug, Default)]
pub struct Attempt {
    pub claim: Option<Claim>,
    /// The lease's end on the server's clock: the claim's, moved by accepted heartbeats.
    pub lease_end: i64,
    /// The first `expire` entry for it.
    pub expired: Option<u64>,
    /// The first `reconcile` entry finding it `stopped`.
    pub stopped: Option<u64>,
    /// The first event that closed it: an accepted result or a `stopped`/`completed` reconcile.
    pub closed: Option<u64>,
    /// The first accepted result: its event and outcome.
    pub committed: Option<(u64, u32)>,
}

/// What is known of one job so far.
#[derive(Clone, Debug, Default)]
pub struct Job {
    pub key: Option<u32>,
    /// The attempt of the latest ledger claim.
    pub latest: Option<u32>,
    /// The newest claimed attempt seen anywhere (ledger claim or a runner's granted claim),
    /// with its fence and the event that showed it.
    pub newest_seen: Option<(u32, u64, u64)>,
}

/// How many events of each source the history holds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    pub ledger: u64,
    pub ledger_seqs: u64,
    pub finals: u64,
    pub steps: u64,
    pub responses: u64,
}

/// The index of everything before the current event.
#[derive(Default)]
pub struct Index {
    pub jobs_names: Interner,
    pub attempt_names: Interner,
    pub runner_names: Interner,
    pub key_names: Interner,
    pub outcome_names: Interner,
    pub attempts: Slots<Attempt>,
    pub jobs: Slots<Job>,
    pub seen: Seen,
    /// The run's configuration, from the harness's `config` event: the target's mode
    /// (`fenced` when absent), the lease, the optional parts of the contract the system
    /// lacks (`system.absent`, `docs/system.md`).
    pub config: history::Config,
    /// The first malformed event and why.
    pub malformed: Option<String>,
    /// The sources of evidence seen so far (`history::Source::of` of each event).
    pub sources_seen: std::collections::BTreeSet<history::Source>,
    /// The sources the history declares it holds (a `sources` event), if it does.
    pub sources_declared: Option<std::collections::BTreeSet<history::Source>>,
    /// Why the run's recovery did not settle every job (a `recovery` `info` event), if so.
    pub unsettled: Option<String>,
}

fn classify(event: &Event) -> Source {
    match event.kind {
        EventType::Ledger => Source::Ledger,
        EventType::Step => Source::Target,
        EventType::Response if event.process.is_runner() => Source::RunnerResponse,
        EventType::Request if event.process.is_runner() && event.f.is_report() => Source::ReportSent,
        EventType::Request if event.process.is_runner() && matches!(event.f, Op::Claim | Op::Step) => {
            Source::RunnerRequest
        }
        EventType::Invoke if is_nemesis_report(event) => {
            let token_of =
                event.value.as_ref().and_then(|value| value.get("token_of")).and_then(|value| value.as_str());
            match token_of {
                Some(token_of) if Some(token_of) != event.runner.as_deref() => Source::ForeignReport,
                _ => Source::ReportSent,
            }
        }
        EventType::Ok | EventType::Fail if is_nemesis_report(event) => Source::NemesisAnswer,
        EventType::Ok if event.process == Process::OPERATOR && event.f == Op::Reconcile => Source::OperatorAnswer,
        EventType::Ok if event.process == Process::CLIENT && event.f == Op::Submit => Source::SubmitOk,
        EventType::Ok if event.process == Process::HARNESS && event.f == Op::Final => Source::Final,
        EventType::Ok if event.process == Process::HARNESS && event.f == Op::Config => Source::Config,
        EventType::Ok if event.process == Process::HARNESS && event.f == Op::RunnerExited => Source::RunnerExited,
        EventType::Ok if event.process == Process::OPERATOR && matches!(event.f, Op::Freeze | Op::Thaw) => {
            Source::RunnerStop
        }
        EventType::Ok if event.process == Process::NEMESIS && event.f == Op::DelayedHeartbeats && is_pause(event) => {
            Source::RunnerStop
        }
        EventType::Ok if event.process == Process::SCENARIO && event.f == Op::Claim => Source::PlayedClaim,
        EventType::Invoke if event.process == Process::OPERATOR && event.f == Op::Reconcile => {
            Source::OperatorReconcile
        }
        _ => Source::Other,
    }
}

/// Whether a nemesis event is of a `pause` (SIGSTOP of a runner).
/// A report the nemesis sent itself in a runner's name: a replayed, conflicting, crossed or
/// borrowed report (its kind in `value.report`, a result where a history leaves it out), or
/// a stale heartbeat or capability request sent at another fault's heal (`value.report`).
fn is_nemesis_report(event: &Event) -> bool {
    let named = event.value.as_ref().is_some_and(|value| value.get("report").is_some_and(serde_json::Value::is_string));
    event.process == Process::NEMESIS
        && event.attempt.is_some()
        && (named || matches!(event.f, Op::DuplicateResults | Op::ConflictingResults))
}

fn is_pause(event: &Event) -> bool {
    event.value.as_ref().and_then(|value| value.pointer("/variant/how")?.as_str()) == Some("pause")
}

fn value_u64(event: &Event, field: &str) -> Option<u64> {
    event.value.as_ref()?.get(field)?.as_u64()
}

/// Whether the fields a source must carry are present; if not, why not. A claim of a system
/// that grants no lease (`leaseless`) carries none.
fn missing_fields(ev: &Observed, leaseless: bool) -> Option<&'static str> {
    let claim = ev.job.is_some() && ev.attempt.is_some() && ev.runner.is_some() && ev.fence.is_some();
    match (ev.src, ev.op) {
        (Source::Ledger, Op::Claim) if !claim || ev.received_ms.is_none() || (ev.lease_ms.is_none() && !leaseless) => {
            Some("a ledger claim needs job, attempt, runner, fence, received_ms and lease_expires_ms")
        }
        (Source::Ledger, op) if op.is_report() && (!claim || ev.received_ms.is_none() || ev.decision.is_none()) => {
            Some("a ledger report needs job, attempt, runner, fence, received_ms and decision")
        }
        (Source::Ledger, Op::Expire | Op::Reconcile) if ev.job.is_none() || ev.attempt.is_none() => {
            Some("a ledger expire or reconcile needs job and attempt")
        }
        (Source::Target, _) if ev.key.is_none() || ev.fence.is_none() || ev.decision.is_none() => {
            Some("a target step needs key, fence and decision")
        }
        (Source::RunnerResponse, Op::Claim | Op::Result) if ev.accepted() && !claim => {
            Some("an accepted claim or result answer needs job, attempt, runner and fence")
        }
        (Source::Final | Source::SubmitOk, _) if ev.job.is_none() => Some("a submit or final event needs a job"),
        _ => None,
    }
}

impl Index {
    /// Whether the history holds `source`: declared, or (without a declaration) seen; the
    /// leases with the ledger, unless the run's config says the system grants none.
    pub fn holds(&self, source: history::Source) -> bool {
        if source == history::Source::Leases {
            return self.holds(history::Source::Ledger) && !self.lacks("lease");
        }
        match &self.sources_declared {
            Some(declared) => declared.contains(&source),
            None => self.sources_seen.contains(&source),
        }
    }

    /// Decodes one event; `None` for the events no checker reads (requests, faults, …).
    pub fn decode<'a>(&mut self, event: &'a Event, position: usize) -> Option<Observed<'a>> {
        if event.index != position as u64 && self.malformed.is_none() {
            self.malformed = Some(format!("event at position {position} has index {}", event.index));
        }
        if event.f == Op::Unreadable && self.malformed.is_none() {
            let why = event.reason.as_deref().unwrap_or("a source");
            self.malformed = Some(format!("event {} says evidence could not be read: {why}", event.index));
        }
        if let Some(source) = history::Source::of(event) {
            self.sources_seen.insert(source);
        }

        if event.f == Op::Sources {
            match history::declared(event) {
                Some(declared) => self.sources_declared = Some(declared),
                None if self.malformed.is_none() => {
                    let why = format!("event {} declares sources outside the vocabulary", event.index);
                    self.malformed = Some(why);
                }
                None => {}
            }
        }
        if event.f == Op::Recovery && event.kind == EventType::Info && event.process == Process::HARNESS {
            self.unsettled = Some(event.reason.clone().unwrap_or_else(|| "some jobs did not settle".to_string()));
        }
        let src = classify(event);
        if src == Source::Other {
            return None;
        }
        if src == Source::Config {
            self.config = history::Config::of(event).unwrap_or_default();
        }
        let ev = Observed {
            index: event.index,
            src,
            op: event.f,
            job: event.job.as_deref().map(|name| self.jobs_names.id(name)),
            attempt: event.attempt.as_deref().map(|name| self.attempt_names.id(name)),
            runner: event.runner.as_deref().map(|name| self.runner_names.id(name)),
            key: event.key.as_deref().map(|name| self.key_names.id(name)),
            fence: event.fence,
            received_ms: event.received_ms,
            observed_ms: event.observed_ms,
            lease_ms: event.lease_expires_ms,
            decision: event.decision,
            outcome: event.outcome.as_deref().map(|name| self.outcome_names.id(name)),
            seq: if src == Source::Ledger { value_u64(event, "seq") } else { None },
            ledger_seq: match src {
                Source::RunnerResponse | Source::NemesisAnswer | Source::OperatorAnswer => {
                    value_u64(event, "ledger_seq")
                }
                _ => None,
            },
            recorded_as: if src == Source::Ledger { event.recorded_as() } else { None },
            recorded: None,
            raw: event,
        };
        let mut ev = ev;
        ev.recorded = ev.recorded_as.map(|word| self.outcome_names.id(word.as_str()));
        self.grow(&ev);
        if let (None, Some(why)) = (&self.malformed, missing_fields(&ev, self.lacks("lease"))) {
            self.malformed = Some(format!("event {} is malformed: {why}", ev.index));
        }
        Some(ev)
    }

    fn grow(&mut self, ev: &Observed) {
        if let Some(job) = ev.job {
            self.jobs.slot(job as usize);
        }
        if let Some(attempt) = ev.attempt {
            self.attempts.slot(attempt as usize);
        }
    }

    pub fn attempt(&self, id: u32) -> &Attempt {
        static EMPTY: Attempt =
            Attempt { claim: None, lease_end: 0, expired: None, stopped: None, closed: None, committed: None };
        self.attempts.get(id as usize).unwrap_or(&EMPTY)
    }

    pub fn job(&self, id: u32) -> &Job {
        static EMPTY: Job = Job { key: None, latest: None, newest_seen: None };
        self.jobs.get(id as usize).unwrap_or(&EMPTY)
    }

    pub fn job_name(&self, id: Option<u32>) -> Option<String> {
        id.map(|id| self.jobs_names.name(id).to_string())
    }

    pub fn attempt_name(&self, id: u32) -> &str {
        self.attempt_names.name(id)
    }

    pub fn runner_name(&self, id: u32) -> &str {
        self.runner_names.name(id)
    }

    pub fn outcome_name(&self, id: u32) -> &str {
        self.outcome_names.name(id)
    }

    /// `j1-a1 (fence 7)`, with the claim's fence when the ledger knows it.
    pub fn label(&self, attempt: u32) -> String {
        match self.attempt(attempt).claim {
            Some(claim) => format!("{} (fence {})", self.attempt_name(attempt), claim.fence),
            None => self.attempt_name(attempt).to_string(),
        }
    }

    /// Whether the system lacks the optional part `part` (`target`, `ledger`, …).
    pub fn lacks(&self, part: &str) -> bool {
        self.config.absent().iter().any(|absent| absent == part)
    }

    /// Whether the target ran without fencing (the harness's `config` says so).
    pub fn target_unfenced(&self) -> bool {
        self.config.target_unfenced()
    }
}

/// Applying an event to the index, after every checker has observed it.
impl Index {
    pub fn apply(&mut self, ev: &Observed) {
        match ev.src {
            Source::Ledger => {
                self.seen.ledger += 1;
                self.seen.ledger_seqs += u64::from(ev.seq.is_some());
                self.apply_ledger(ev);
            }
            Source::RunnerResponse => {
                self.seen.responses += 1;
                if ev.op == Op::Claim && ev.accepted() {
                    self.see_claim(ev);
                }
            }
            Source::Target => self.seen.steps += 1,
            Source::Final => self.seen.finals += 1,
            _ => {}
        }
    }

    fn see_claim(&mut self, ev: &Observed) {
        let (Some(job), Some(attempt), Some(fence)) = (ev.job, ev.attempt, ev.fence) else { return };
        let Some(facts) = self.jobs.get_mut(job as usize) else { return };
        if facts.newest_seen.is_none_or(|(_, newest, _)| fence > newest) {
            facts.newest_seen = Some((attempt, fence, ev.index));
        }
    }

    fn apply_ledger(&mut self, ev: &Observed) {
        let (Some(job), Some(attempt)) = (ev.job, ev.attempt) else { return };
        match ev.op {
            Op::Claim => self.apply_claim(ev, job, attempt),
            Op::Heartbeat if ev.accepted() => {
                let target = self.heartbeat_target(job, attempt);
                if let (Some(facts), Some(lease)) = (self.attempts.get_mut(target as usize), ev.lease_ms) {
                    facts.lease_end = lease;
                }
            }
            Op::Result if ev.accepted() => {
                let facts = &mut self.attempts[attempt as usize];
                facts.closed = facts.closed.or(Some(ev.index));
                if let (None, Some(outcome)) = (facts.committed, ev.outcome) {
                    facts.committed = Some((ev.index, outcome));
                }
            }
            Op::Expire => {
                let facts = &mut self.attempts[attempt as usize];
                facts.expired = facts.expired.or(Some(ev.index));
            }
            Op::Reconcile => {
                let finding = ev.outcome.map(|outcome| self.outcome_names.name(outcome));
                let stopped = finding == Some("stopped");
                let closes = stopped || finding == Some("completed");
                let facts = &mut self.attempts[attempt as usize];
                if stopped {
                    facts.stopped = facts.stopped.or(Some(ev.index));
                }
                if closes {
                    facts.closed = facts.closed.or(Some(ev.index));
                }
            }
            _ => {}
        }
    }

    fn apply_claim(&mut self, ev: &Observed, job: u32, attempt: u32) {
        let (Some(runner), Some(fence)) = (ev.runner, ev.fence) else { return };
        let unleased = if self.lacks("lease") { Some(i64::MAX) } else { ev.received_ms };
        let facts = &mut self.attempts[attempt as usize];
        if facts.claim.is_none() {
            facts.claim = Some(Claim { job, runner, key: ev.key, fence, index: ev.index });
            facts.lease_end = ev.lease_ms.or(unleased).unwrap_or(0);
        }
        let facts = &mut self.jobs[job as usize];
        facts.latest = Some(attempt);
        facts.key = facts.key.or(ev.key);
        self.see_claim(ev);
    }

    /// The attempt an accepted heartbeat renewed: the one it names when the claim agrees on
    /// the job; otherwise (a report matched by bare fence) the job's current attempt.
    pub fn heartbeat_target(&self, job: u32, attempt: u32) -> u32 {
        match self.attempt(attempt).claim {
            Some(claim) if claim.job == job => attempt,
            _ => self.job(job).latest.unwrap_or(attempt),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interned_names_are_dense_and_stable() {
        let mut names = Interner::default();
        assert_eq!((names.id("j1"), names.id("j2"), names.id("j1")), (0, 1, 0));
        assert_eq!((names.name(1), names.name(7)), ("j2", "?"));
    }

    #[test]
    fn a_claim_then_an_accepted_heartbeat_move_the_lease_and_expire_is_remembered() {
        let mut ctx = Index::default();
        let mut claim =
            Event::new(0, Process::CONTROL_PLANE, EventType::Ledger, Op::Claim).with_claim("j1", "j1-a1", "r1", 7);
        claim.received_ms = Some(1_000);
        claim.lease_expires_ms = Some(3_000);
        claim.decision = Some(Decision::Accepted);
        let mut beat = claim.clone();
        beat.index = 1;
        beat.f = Op::Heartbeat;
        beat.lease_expires_ms = Some(3_500);
        let mut expire = beat.clone();
        expire.index = 2;
        expire.f = Op::Expire;
        for (position, event) in [claim, beat, expire].iter().enumerate() {
            let ev = ctx.decode(event, position).expect("a ledger event is decoded");
            ctx.apply(&ev);
        }
        let attempt = ctx.attempt(0);
        assert_eq!(
            (attempt.claim.map(|claim| claim.fence), attempt.lease_end, attempt.expired),
            (Some(7), 3_500, Some(2))
        );
        assert_eq!(ctx.job(0).latest, Some(0));
        assert_eq!(ctx.label(0), "j1-a1 (fence 7)");
        assert!(ctx.malformed.is_none());
    }
}
