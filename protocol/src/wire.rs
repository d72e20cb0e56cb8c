//! The wire protocol: every request and response body of the control plane, the runner
//! and the target, shared by the lab and the harness. `docs/protocol.md` describes it for
//! people. Protocol codes (reasons, ledger kinds, how an entry was recorded, how an attempt
//! closed) are the history's typed words, so an answer with a word fencelab does not know
//! fails to parse instead of being read as something else.
//!
//! Every body that comes in from the network denies unknown fields, so that a typo is a
//! clear 400 instead of a silently ignored field, and reads a nested struct only from a
//! JSON object ([`crate::body::object`]).

use history::{ClosedBy, Op, Reason, RecordedAs};
use serde::{Deserialize, Serialize};

/// The four fields that identify a claim. Every current-attempt message carries all four.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRef {
    pub job: String,
    pub attempt: String,
    pub runner: String,
    pub fence: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateProject {
    pub id: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProjectCreated {
    pub id: String,
    /// Lets a runner register itself into this project.
    pub registration_token: String,
}

/// Registers a runner: by the operator (`project` given) or by the runner itself with a
/// project's registration token as bearer (`project` omitted).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRunner {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub id: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunnerRegistered {
    pub id: String,
    pub project: String,
    /// Bearer token bound to this runner and its project.
    pub token: String,
}

/// What a runner does for a job: `steps` target steps of `step_ms` each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub steps: u32,
    pub step_ms: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitJob {
    pub project: String,
    /// Optional caller-chosen id; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub deployment_key: String,
    #[serde(deserialize_with = "crate::body::object")]
    pub spec: JobSpec,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobSubmitted {
    pub id: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    pub runner: String,
    /// The runner's clock, Unix ms: diagnostic only.
    pub observed_ms: i64,
}

/// A granted claim: the attempt, its fence and its lease on the server's clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub claim: ClaimRef,
    pub project: String,
    pub deployment_key: String,
    pub spec: JobSpec,
    pub lease_ms: u64,
    pub lease_expires_ms: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClaimResponse {
    /// `None` when no job is claimable now.
    pub grant: Option<Grant>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    #[serde(flatten)]
    pub claim: ClaimRef,
    pub observed_ms: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilityRequest {
    #[serde(flatten)]
    pub claim: ClaimRef,
    pub observed_ms: i64,
}

/// A short-lived target token: what the target checks before a step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capability {
    pub deployment_key: String,
    pub job: String,
    pub attempt: String,
    pub runner: String,
    pub fence: u64,
    pub expires_ms: i64,
    /// Hex HMAC-SHA256 over the fields above, with the secret the control plane shares with the target.
    pub signature: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Succeeded,
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultRequest {
    #[serde(flatten)]
    pub claim: ClaimRef,
    pub outcome: Outcome,
    pub observed_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The control plane's ruling on a heartbeat, capability or result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ruling {
    pub decision: history::Decision,
    /// Why it was not accepted: `expired`, `superseded`, `not_current`, `unknown`, `conflict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// Ledger sequence number of the entry that records this report.
    pub ledger_seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<Capability>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Finding {
    /// The old execution was observed stopped: the attempt closes as failed.
    Stopped,
    /// The old execution finished with `outcome`: the job takes it.
    Completed,
    /// Still running: the attempt stays uncertain.
    StillRunning,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileRequest {
    pub job: String,
    pub attempt: String,
    pub finding: Finding,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Uncertain,
    Succeeded,
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    Running,
    Uncertain,
    Succeeded,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptView {
    pub id: String,
    pub job: String,
    pub runner: String,
    pub fence: u64,
    pub state: AttemptState,
    pub current: bool,
    /// The last lease granted (server clock), kept after the attempt closes; none for a
    /// system that grants no lease (an observed system's build, owned while its connection
    /// lasts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_ms: Option<i64>,
    pub claimed_ms: i64,
    /// How it closed: `result`, `observed-stopped`, `reconciled-completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_by: Option<ClosedBy>,
}

impl AttemptView {
    /// The last lease granted, or 0 when the view gives none: a reader that judges leases
    /// (conform, the operator's grace period) treats a missing one as long ended.
    pub fn lease_end_ms(&self) -> i64 {
        self.lease_expires_ms.unwrap_or(0)
    }
}

/// One entry of the append-only ledger: every report received, and every state change the
/// control plane made on its own (expiry) or by the operator (reconcile).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub seq: u64,
    /// `claim`, `heartbeat`, `capability`, `result`, `expire`, `reconcile`, `submit`.
    pub kind: Op,
    pub project: String,
    pub job: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    pub deployment_key: String,
    /// For reports: what was decided. `None` for the control plane's own entries
    /// (`submit`, `expire`) and for `reconcile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<history::Decision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `late_observation` for a result refused as current but kept; `conflict` for a
    /// conflict; `uncertain` (or `requeued`) for an expiry; the outcome of a `completed`
    /// reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_as: Option<RecordedAs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<history::OutcomeWord>,
    /// The server's receipt time, Unix ms, server clock.
    pub received_ms: i64,
    /// The runner's observation time, Unix ms, runner clock; diagnostic only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_ms: Option<i64>,
    /// Host monotonic ns at receipt, to merge the ledger into a run's history.
    pub mono_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_ms: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    pub id: String,
    pub project: String,
    pub deployment_key: String,
    pub spec: JobSpec,
    pub state: JobState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_attempt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    pub attempts: Vec<AttemptView>,
    pub ledger: Vec<LedgerEntry>,
}

/// Every error body: a stable code for programs and a sentence for people.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub code: String,
    pub status: u16,
}

/// A step a runner asks the target to apply.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRequest {
    #[serde(deserialize_with = "crate::body::object")]
    pub capability: Capability,
    /// 0-based index of the step within the deployment.
    pub step: u32,
    pub steps: u32,
    /// How long the step runs on the target before it answers.
    pub duration_ms: u64,
}

/// One entry of the target's step log: the ground truth of physical side effects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    pub seq: u64,
    pub deployment_key: String,
    pub job: String,
    pub attempt: String,
    pub runner: String,
    pub fence: u64,
    pub step: u32,
    pub steps: u32,
    /// `true` when the step changed the deployment.
    pub applied: bool,
    /// Why it was not applied: `stale_fence`, `bad_signature`, `expired`, `duplicate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// The deployment's revision after this step.
    pub revision: u64,
    /// Highest fence the target had seen for the key before this step.
    pub highest_fence_before: u64,
    pub received_ms: i64,
    pub mono_ns: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepResponse {
    pub record: StepRecord,
}

impl From<Outcome> for history::OutcomeWord {
    fn from(outcome: Outcome) -> history::OutcomeWord {
        match outcome {
            Outcome::Succeeded => history::OutcomeWord::Succeeded,
            Outcome::Failed => history::OutcomeWord::Failed,
        }
    }
}

impl From<Outcome> for RecordedAs {
    fn from(outcome: Outcome) -> RecordedAs {
        match outcome {
            Outcome::Succeeded => RecordedAs::Succeeded,
            Outcome::Failed => RecordedAs::Failed,
        }
    }
}

impl From<Finding> for history::OutcomeWord {
    fn from(finding: Finding) -> history::OutcomeWord {
        match finding {
            Finding::Stopped => history::OutcomeWord::Stopped,
            Finding::Completed => history::OutcomeWord::Completed,
            Finding::StillRunning => history::OutcomeWord::StillRunning,
        }
    }
}
