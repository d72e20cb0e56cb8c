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
pub mod progress;
pub mod rules_model;
pub mod runner_contract;
pub mod single_owner;
pub mod stale_completion;
pub mod stale_side_effect;
pub mod terminal_stability;

use driver::{Check, Pass};
use history::Event;

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

/// Every checker over a history fed one event at a time, for histories too large to hold
/// in memory. The caller feeds events in index order, with ledger events in `seq` order
/// ([`check_all`] restores that order itself).
pub struct Stream {
    pass: Pass,
    position: usize,
}

impl Default for Stream {
    fn default() -> Stream {
        Stream::new()
    }
}

impl Stream {
    pub fn new() -> Stream {
        Stream { pass: Pass::new(all_checks()), position: 0 }
    }

    pub fn push(&mut self, event: &Event) {
        self.pass.feed(event, self.position);
        self.position += 1;
    }

    /// How many attempts, jobs, runners and keys the checkers' shared index tracks.
    pub fn tracked(&self) -> usize {
        self.pass.tracked()
    }

    pub fn finish(self) -> Vec<CheckerResult> {
        results(self.pass)
    }
}
