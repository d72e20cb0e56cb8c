//! Checkers: pure functions from a history to a verdict. No I/O, no async, no clock.
//!
//! Each checker reads the events of one run and answers [`Verdict::Valid`],
//! [`Verdict::Invalid`] with anomalies, or [`Verdict::Unknown`] with a reason (for example
//! an incomplete history). An anomaly is a value, not an error.

use serde::{Deserialize, Serialize};

pub mod clock_authority;
mod driver;
pub mod explicit_uncertainty;
pub mod fence_order;
pub mod heartbeat_resurrection;
pub mod ledger_completeness;
pub mod lost_work;
mod model;
mod moment;
pub mod progress;
pub mod rules_model;
pub mod runner_contract;
pub mod single_owner;
pub mod stale_completion;
pub mod stale_side_effect;
pub mod terminal_stability;

use driver::{Check, Pass};
use history::{Event, EventType};
pub use model::{FxHasher, FxMap};

/// One fencing violation, in the seed's words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    /// The checker that found it, e.g. `stale-completion`.
    pub checker: String,
    /// A short machine name for the kind of violation, e.g. `late-report-accepted`.
    pub kind: String,
    pub job: Option<String>,
    pub attempts: Vec<String>,
    pub runners: Vec<String>,
    pub fences: Vec<u64>,
    pub key: Option<String>,
    /// Indices of the history events that prove it.
    pub events: Vec<u64>,
    /// One plain sentence, e.g. "late report for j1-a1 (fence 7) accepted as current
    /// completion while j1-a2 (fence 8) was current".
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Valid,
    Invalid { anomalies: Vec<Anomaly> },
    Unknown { reason: String },
}

/// One checker's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckerResult {
    pub checker: String,
    /// What the checker enforces, in one sentence.
    pub description: String,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// Every checker, in the fixed order: name and what it enforces, in one sentence.
pub fn names() -> &'static [(&'static str, &'static str)] {
    &[
        (stale_completion::NAME, stale_completion::ABOUT),
        (heartbeat_resurrection::NAME, heartbeat_resurrection::ABOUT),
        (single_owner::NAME, single_owner::ABOUT),
        (fence_order::NAME, fence_order::ABOUT),
        (terminal_stability::NAME, terminal_stability::ABOUT),
        (explicit_uncertainty::NAME, explicit_uncertainty::ABOUT),
        (clock_authority::NAME, clock_authority::ABOUT),
        (stale_side_effect::NAME, stale_side_effect::ABOUT),
        (lost_work::NAME, lost_work::ABOUT),
        (ledger_completeness::NAME, ledger_completeness::ABOUT),
        (rules_model::NAME, rules_model::ABOUT),
        (progress::NAME, progress::ABOUT),
        (runner_contract::NAME, runner_contract::ABOUT),
    ]
}

fn all_checks() -> Vec<Box<dyn Check>> {
    vec![
        Box::new(stale_completion::StaleCompletion),
        Box::<heartbeat_resurrection::HeartbeatResurrection>::default(),
        Box::<single_owner::SingleOwner>::default(),
        Box::<fence_order::FenceOrder>::default(),
        Box::<terminal_stability::TerminalStability>::default(),
        Box::new(explicit_uncertainty::ExplicitUncertainty),
        Box::<clock_authority::ClockAuthority>::default(),
        Box::<stale_side_effect::StaleSideEffect>::default(),
        Box::<lost_work::LostWork>::default(),
        Box::<ledger_completeness::LedgerCompleteness>::default(),
        Box::<rules_model::RulesModel>::default(),
        Box::<progress::Progress>::default(),
        Box::<runner_contract::RunnerContract>::default(),
    ]
}

pub(crate) fn results(pass: Pass) -> Vec<CheckerResult> {
    pass.finish().into_iter().map(|(name, verdict)| driver::result(name, verdict)).collect()
}

/// Runs every checker over one history, in one pass, in the order of [`names`].
pub fn check_all(events: &[Event]) -> Vec<CheckerResult> {
    let mut pass = Pass::new(all_checks());
    pass.feed_all(events);
    results(pass)
}

/// Every checker's answer for a history that could not be read: unknown, with the reason.
/// A history fencelab cannot read is never valid.
pub fn unreadable(reason: &str) -> Vec<CheckerResult> {
    let reason = format!("the history cannot be read: {reason}");
    names().iter().map(|(name, _)| driver::result(name, Verdict::Unknown { reason: reason.clone() })).collect()
}

/// Runs the checker with this name alone; `None` for a name [`names`] does not list.
pub fn check_one(name: &str, events: &[Event]) -> Option<CheckerResult> {
    check_named(&[name], events).pop()
}

/// Runs the checkers with these names in one pass, in the order of [`names`]; a name it
/// does not list is left out.
pub fn check_named(wanted: &[&str], events: &[Event]) -> Vec<CheckerResult> {
    let checks = all_checks().into_iter().filter(|check| wanted.contains(&check.name())).collect();
    let mut pass = Pass::new(checks);
    pass.feed_all(events);
    results(pass)
}

/// How many events after a ledger event that waits for its turn the [`Stream`] reads
/// ahead for the entry whose `seq` comes next, before it takes the smallest it has.
pub const LOOKAHEAD_EVENTS: usize = 100_000;

/// Every checker over a history fed one event at a time in the history's order, for
/// histories too large to hold in memory. It visits ledger events in `seq` order as
/// [`check_all`] does: the k-th ledger event of the history is checked as the entry with
/// the k-th smallest `seq`. An entry whose turn comes before it has been read is waited
/// for (the events after it held back, at most [`LOOKAHEAD_EVENTS`] past the next `seq`
/// expected). When a history breaks that order beyond repair — a ledger event without a
/// `seq`, a `seq` repeated, or one read after a larger one was checked —
/// [`Stream::ordered`] turns false and the history must be checked whole with
/// [`check_all`].
pub struct Stream {
    pass: Pass,
    /// Events read and not yet checked, from the first that waits, with their positions; a
    /// ledger event is a slot (`None`), its entry kept in `ledger`.
    held: std::collections::VecDeque<(usize, Option<Event>)>,
    /// The ledger events read and not yet checked, by `seq`, with their positions.
    ledger: std::collections::BTreeMap<u64, (usize, Event)>,
    /// The position of the next event read.
    position: usize,
    /// The largest `seq` checked so far.
    last_seq: Option<u64>,
    ordered: bool,
    lookahead: usize,
}

impl Default for Stream {
    fn default() -> Stream {
        Stream::new()
    }
}

impl Stream {
    pub fn new() -> Stream {
        Stream::of(all_checks())
    }

    /// The checkers with these names only (see [`check_named`]).
    pub fn named(wanted: &[&str]) -> Stream {
        Stream::of(all_checks().into_iter().filter(|check| wanted.contains(&check.name())).collect())
    }

    fn of(checks: Vec<Box<dyn Check>>) -> Stream {
        Stream {
            pass: Pass::new(checks),
            held: std::collections::VecDeque::new(),
            ledger: std::collections::BTreeMap::new(),
            position: 0,
            last_seq: None,
            ordered: true,
            lookahead: LOOKAHEAD_EVENTS,
        }
    }

    /// The same stream reading at most `events` ahead (instead of [`LOOKAHEAD_EVENTS`]).
    pub fn lookahead(mut self, events: usize) -> Stream {
        self.lookahead = events;
        self
    }

    /// Reads the next event of the history (copied only when it must wait for its turn).
    pub fn push(&mut self, event: &Event) {
        let position = self.position;
        self.position += 1;
        if !self.ordered {
            return;
        }
        if event.kind != EventType::Ledger && self.held.is_empty() {
            self.pass.feed(event, position);
            return;
        }
        if event.kind == EventType::Ledger {
            let Some(seq) = driver::seq_of(event) else {
                self.ordered = false;
                return;
            };
            if self.last_seq.is_some_and(|last| seq <= last) || self.ledger.contains_key(&seq) {
                self.ordered = false;
                return;
            }
            let next = self.last_seq.map_or(seq <= 1, |last| seq == last + 1);
            if next && self.held.is_empty() {
                self.pass.feed(event, position);
                self.last_seq = Some(seq);
                return;
            }
            self.ledger.insert(seq, (position, event.clone()));
            self.held.push_back((position, None));
        } else {
            self.held.push_back((position, Some(event.clone())));
        }
        self.drain(false);
    }

    /// Checks what can be checked: each held event in turn, a ledger slot taking the entry
    /// whose `seq` comes next once it has been read (or, at the end or past the lookahead,
    /// the smallest read).
    fn drain(&mut self, end: bool) {
        while let Some((position, slot)) = self.held.front() {
            if let Some(event) = slot {
                self.pass.feed(event, *position);
                self.held.pop_front();
                continue;
            }
            let Some((&seq, _)) = self.ledger.first_key_value() else { break };
            let next = self.last_seq.map_or(seq <= 1, |last| seq == last + 1);
            let waited = self.held.len() > self.lookahead;
            if !(next || waited || end) {
                break;
            }
            let (_, (at, entry)) = self.ledger.pop_first().expect("a ledger entry was read");
            self.pass.feed(&entry, at);
            self.last_seq = Some(seq);
            self.held.pop_front();
        }
    }

    /// False once the history broke the ledger's order beyond what a stream can restore.
    pub fn ordered(&self) -> bool {
        self.ordered
    }

    /// How many attempts, jobs, runners and keys the checkers' shared index tracks.
    pub fn tracked(&self) -> usize {
        self.pass.tracked()
    }

    /// The verdicts; `None` when the history was not [`Stream::ordered`].
    pub fn finish(mut self) -> Option<Vec<CheckerResult>> {
        if !self.ordered {
            return None;
        }
        self.drain(true);
        Some(results(self.pass))
    }
}
