//! The event model: one flat record for every kind of observation a run makes.

use serde::{Deserialize, Serialize};

use crate::vocab::{Op, OutcomeWord, Process, Reason, RecordedAs, WordError};

/// What kind of record an event is.
///
/// `Invoke`/`Ok`/`Fail`/`Info` are operations of the client, the operator and the nemesis,
/// in Jepsen's sense: `Info` means the outcome is unknown (a timeout, a cut link) and must
/// never be read as either `Ok` or `Fail`. `Request`/`Response` are a runner's own log of
/// what it sent and what it got back (`Info` when no answer came). `Ledger` is an entry of
/// the control plane's ledger; `Step` is an entry of the target's step log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    Invoke,
    Ok,
    Fail,
    Info,
    Request,
    Response,
    Ledger,
    Step,
}

/// What the party that received a report decided about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Taken as the current claim's report (or, on the target, the step was applied).
    Accepted,
    /// Refused as current; a result refused this way is kept as a late observation.
    Rejected,
    /// An identical retry of an already committed terminal result, acknowledged.
    Duplicate,
    /// A different terminal result for an attempt that already committed; recorded, refused.
    Conflict,
}

/// One observation of a run. Fields that do not apply stay `None` and are not written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// Position in the history, from 0, contiguous. A runner's log has none (it defaults
    /// to 0 there); the merge numbers the history.
    #[serde(default)]
    pub index: u64,
    /// Monotonic nanoseconds since the run started (the one clock of the history).
    pub time_ns: u64,
    /// Who recorded it: `client`, `operator`, `nemesis`, `runner:<id>`, `control-plane`, `target`, ...
    pub process: Process,
    #[serde(rename = "type")]
    pub kind: EventType,
    /// The operation: `submit`, `claim`, `heartbeat`, `capability`, `result`, `expire`,
    /// `reconcile`, `step`, a fault name for the nemesis, ...
    pub f: Op,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// Deployment key: the target resource the job mutates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The server's receipt time, Unix ms on the server's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_ms: Option<i64>,
    /// The runner's observation time, Unix ms on the runner's clock (diagnostic only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_ms: Option<i64>,
    /// The lease's expiry after this event, Unix ms on the server's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Why: on a decided event a protocol code ([`Reason`]: `expired`, `superseded`,
    /// `stale_fence`, ...); elsewhere free text (a transport error, a reconcile's evidence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A terminal outcome, a job's final state or a reconcile finding ([`OutcomeWord`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Anything else the source wants to keep, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
}

impl Event {
    /// An event with only the fields every event has.
    pub fn new(time_ns: u64, process: Process, kind: EventType, f: Op) -> Event {
        Event {
            index: 0,
            time_ns,
            process,
            kind,
            f,
            project: None,
            job: None,
            attempt: None,
            runner: None,
            fence: None,
            key: None,
            received_ms: None,
            observed_ms: None,
            lease_expires_ms: None,
            decision: None,
            reason: None,
            outcome: None,
            value: None,
        }
    }

    pub fn with_job(mut self, job: &str) -> Event {
        self.job = Some(job.to_string());
        self
    }

    /// Sets the whole claim an event concerns.
    pub fn with_claim(mut self, job: &str, attempt: &str, runner: &str, fence: u64) -> Event {
        self.job = Some(job.to_string());
        self.attempt = Some(attempt.to_string());
        self.runner = Some(runner.to_string());
        self.fence = Some(fence);
        self
    }

    pub fn with_decision(mut self, decision: Decision, reason: Option<Reason>) -> Event {
        self.decision = Some(decision);
        self.reason = reason.map(|reason| reason.as_str().to_string());
        self
    }

    /// The protocol code of a decided event's reason.
    pub fn reason_code(&self) -> Option<Reason> {
        self.decision?;
        Reason::parse(self.reason.as_deref()?)
    }

    /// The event's outcome word.
    pub fn outcome_word(&self) -> Option<OutcomeWord> {
        OutcomeWord::parse(self.outcome.as_deref()?)
    }

    /// How a ledger entry was recorded (`value.recorded_as`).
    pub fn recorded_as(&self) -> Option<RecordedAs> {
        RecordedAs::parse(self.value.as_ref()?.get("recorded_as")?.as_str()?)
    }

    /// Checks the words the event carries outside its typed fields: a decided event's
    /// reason is a protocol code, an outcome is a known word, a ledger entry's
    /// `recorded_as` is a known word. The error says which word is unknown.
    pub fn check_vocabulary(&self) -> Result<(), WordError> {
        if let (Some(_), Some(reason)) = (self.decision, self.reason.as_deref()) {
            if Reason::parse(reason).is_none() {
                return Err(WordError::unknown("reason", reason, Reason::ALL.iter().map(|w| w.as_str())));
            }
        }
        if let Some(outcome) = self.outcome.as_deref() {
            if OutcomeWord::parse(outcome).is_none() {
                return Err(WordError::unknown("outcome", outcome, OutcomeWord::ALL.iter().map(|w| w.as_str())));
            }
        }
        let recorded = self.value.as_ref().and_then(|value| value.get("recorded_as"));
        if let Some(recorded) = recorded.filter(|value| !value.is_null()) {
            let word = recorded.as_str().unwrap_or("<not a string>");
            if RecordedAs::parse(word).is_none() {
                return Err(WordError::unknown("recorded_as", word, RecordedAs::ALL.iter().map(|w| w.as_str())));
            }
        }
        Ok(())
    }
}
