//! A conformance case: its name, the optional parts of the contract it needs, and its
//! answer — pass, fail or skip, each with one line of evidence. A case body returns the
//! evidence of a pass, or a [`Finding`]: a failure, or a reason it could not be judged.

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

use super::session::Session;
use system::Feature;

/// A case's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Fail,
    /// Not judged: the system lacks a part the case needs, or the evidence could not be had.
    Skip,
}

impl Status {
    /// The word printed at the start of the case's line.
    pub fn word(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        }
    }
}

/// One case's answer, as `conform.json` holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseResult {
    /// `group/name`, e.g. `rule/stale-completion`.
    pub name: String,
    pub status: Status,
    /// One line: what was shown, what went wrong, or why it was skipped.
    pub evidence: String,
    pub duration_ms: u64,
}

/// Why a case did not pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// The system broke the contract; the sentence says how.
    Fail(String),
    /// The case could not be judged; the sentence says why.
    Skip(String),
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Fail(why) | Finding::Skip(why) => f.write_str(why),
        }
    }
}

impl From<String> for Finding {
    fn from(message: String) -> Finding {
        Finding::Fail(message)
    }
}

impl From<crate::session::SendError> for Finding {
    /// A request with no answer to judge fails the case, saying why.
    fn from(error: crate::session::SendError) -> Finding {
        Finding::Fail(error.to_string())
    }
}

/// What a case body answers: the evidence of a pass, or a finding.
pub type CaseOutcome = Result<String, Finding>;

/// Fails with `message` unless `holds`.
pub fn ensure(holds: bool, message: impl FnOnce() -> String) -> Result<(), Finding> {
    if holds {
        Ok(())
    } else {
        Err(Finding::Fail(message()))
    }
}

/// The identity a case gives its ids: its project, jobs, runners and keys are all
/// `<tag>.<name>`, so that cases running side by side never claim each other's jobs and a
/// ledger entry names the case it came from.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: &'static str,
    pub tag: String,
}

impl Case {
    /// `<tag>.<local>`.
    pub fn id(&self, local: &str) -> String {
        format!("{}.{local}", self.tag)
    }
}

pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = CaseOutcome> + Send + 'a>>;

/// A case as the suite lists it.
pub struct Def {
    pub name: &'static str,
    /// The optional parts of the contract it needs; a system without one skips it.
    pub needs: &'static [Feature],
    pub run: for<'a> fn(&'a Session, Case) -> CaseFuture<'a>,
}

/// The tag of the `index`-th case: short, an id, unique in a session.
pub fn tag(index: usize) -> String {
    format!("c{index:02}")
}
