//! Checkers: pure functions from a history to a verdict. No I/O, no async, no clock.
//!
//! Each checker reads the events of one run and answers [`Verdict::Valid`],
//! [`Verdict::Invalid`] with anomalies, or [`Verdict::Unknown`] with a reason (for example
//! an incomplete history). An anomaly is a value, not an error.

use serde::{Deserialize, Serialize};

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
