//! Planted bugs: each removes exactly one protection of the lab, so that fencelab can show
//! its checkers catch the violation. With no bug switched on, the lab is correct.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bug {
    AcceptStaleResult,
    HeartbeatRevivesExpired,
    RequeueOnExpiry,
    TrustRunnerClock,
    OverwriteTerminalResult,
    UnscopedFence,
    BlindRetryOnZeroRows,
    AckBeforeCommit,
    TargetIgnoresFence,
    RefuseDuplicateResult,
    SelfReconcile,
    ExpireEarly,
    TargetRefusesCurrentFence,
    ReplicaClock,
    ClaimWithoutLock,
    SweeperWithoutLock,
    RetryLostCommit,
    TrustNamedRunner,
    CapabilityOutlivesLease,
    UnrecordedLateResult,
    AcceptBorrowedClaim,
    LeaseJudgedBySweeper,
    TargetFencesPerRunner,
    ExpiryLeavesJobRunning,
    DuplicateAckUnrecorded,
    RefusalUnrecorded,
    RefusalDropsExpiries,
    DeadlineFromAnswer,
    DeadlineFromServerLease,
    WallClockDeadline,
    UnansweredHeartbeatRenews,
    StepWithHeldCapability,
    ResendStepOnLostAnswer,
    LeaseEndInclusive,
    ClaimLedgerInSecondTransaction,
    TargetExpiryInWholeSeconds,
}

/// Which process a bug lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    ControlPlane,
    Target,
    Runner,
}

impl Bug {
    pub const ALL: [Bug; 36] = [
        Bug::AcceptStaleResult,
        Bug::HeartbeatRevivesExpired,
        Bug::RequeueOnExpiry,
        Bug::TrustRunnerClock,
        Bug::OverwriteTerminalResult,
        Bug::UnscopedFence,
        Bug::BlindRetryOnZeroRows,
        Bug::AckBeforeCommit,
        Bug::TargetIgnoresFence,
        Bug::RefuseDuplicateResult,
        Bug::SelfReconcile,
        Bug::ExpireEarly,
        Bug::TargetRefusesCurrentFence,
        Bug::ReplicaClock,
        Bug::ClaimWithoutLock,
        Bug::SweeperWithoutLock,
        Bug::RetryLostCommit,
        Bug::TrustNamedRunner,
        Bug::CapabilityOutlivesLease,
        Bug::UnrecordedLateResult,
        Bug::AcceptBorrowedClaim,
        Bug::LeaseJudgedBySweeper,
        Bug::TargetFencesPerRunner,
        Bug::ExpiryLeavesJobRunning,
        Bug::DuplicateAckUnrecorded,
        Bug::RefusalUnrecorded,
        Bug::RefusalDropsExpiries,
        Bug::DeadlineFromAnswer,
        Bug::DeadlineFromServerLease,
        Bug::WallClockDeadline,
        Bug::UnansweredHeartbeatRenews,
        Bug::StepWithHeldCapability,
        Bug::ResendStepOnLostAnswer,
        Bug::LeaseEndInclusive,
        Bug::ClaimLedgerInSecondTransaction,
        Bug::TargetExpiryInWholeSeconds,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bug::AcceptStaleResult => "accept-stale-result",
            Bug::HeartbeatRevivesExpired => "heartbeat-revives-expired",
            Bug::RequeueOnExpiry => "requeue-on-expiry",
            Bug::TrustRunnerClock => "trust-runner-clock",
            Bug::OverwriteTerminalResult => "overwrite-terminal-result",
            Bug::UnscopedFence => "unscoped-fence",
            Bug::BlindRetryOnZeroRows => "blind-retry-on-zero-rows",
            Bug::AckBeforeCommit => "ack-before-commit",
            Bug::TargetIgnoresFence => "target-ignores-fence",
            Bug::RefuseDuplicateResult => "refuse-duplicate-result",
            Bug::SelfReconcile => "self-reconcile",
            Bug::ExpireEarly => "expire-early",
            Bug::TargetRefusesCurrentFence => "target-refuses-current-fence",
            Bug::ReplicaClock => "replica-clock",
            Bug::ClaimWithoutLock => "claim-without-lock",
            Bug::SweeperWithoutLock => "sweeper-without-lock",
            Bug::RetryLostCommit => "retry-lost-commit",
            Bug::TrustNamedRunner => "trust-named-runner",
            Bug::CapabilityOutlivesLease => "capability-outlives-lease",
            Bug::UnrecordedLateResult => "unrecorded-late-result",
            Bug::AcceptBorrowedClaim => "accept-borrowed-claim",
            Bug::LeaseJudgedBySweeper => "lease-judged-by-sweeper",
            Bug::TargetFencesPerRunner => "target-fences-per-runner",
            Bug::ExpiryLeavesJobRunning => "expiry-leaves-job-running",
            Bug::DuplicateAckUnrecorded => "duplicate-ack-unrecorded",
            Bug::RefusalUnrecorded => "refusal-unrecorded",
            Bug::RefusalDropsExpiries => "refusal-drops-expiries",
            Bug::DeadlineFromAnswer => "deadline-from-answer",
            Bug::DeadlineFromServerLease => "deadline-from-server-lease",
            Bug::WallClockDeadline => "wall-clock-deadline",
            Bug::UnansweredHeartbeatRenews => "unanswered-heartbeat-renews",
            Bug::StepWithHeldCapability => "step-with-held-capability",
            Bug::ResendStepOnLostAnswer => "resend-step-on-lost-answer",
            Bug::LeaseEndInclusive => "lease-end-inclusive",
            Bug::ClaimLedgerInSecondTransaction => "claim-ledger-in-second-transaction",
            Bug::TargetExpiryInWholeSeconds => "target-expiry-in-whole-seconds",
        }
    }

    /// The protection the bug removes, in one line.
    pub fn removes(self) -> &'static str {
        match self {
            Bug::AcceptStaleResult => {
                "result acceptance no longer checks that the attempt is current, running and unexpired"
            }
            Bug::HeartbeatRevivesExpired => "a heartbeat after lease expiry revives the attempt and extends its lease",
            Bug::RequeueOnExpiry => {
                "lease expiry silently returns the job to the queue instead of marking it uncertain"
            }
            Bug::TrustRunnerClock => "lease validity is judged on the runner's reported clock instead of the server's",
            Bug::OverwriteTerminalResult => "a conflicting terminal result replaces the committed outcome",
            Bug::UnscopedFence => "reports are matched by bare fence number, not by job, attempt, runner and project",
            Bug::BlindRetryOnZeroRows => "a zero-row conditional update is retried without its predicates",
            Bug::AckBeforeCommit => "results are acknowledged before they are committed to the store",
            Bug::TargetIgnoresFence => "the fenced target applies steps without comparing their fence",
            Bug::RefuseDuplicateResult => {
                "an identical retry of a committed result is refused as late instead of acknowledged as a duplicate"
            }
            Bug::SelfReconcile => {
                "the sweeper reconciles an expired attempt as stopped on its own, without an operator's decision"
            }
            Bug::ExpireEarly => "the sweeper expires a lease half a lease before it ends on the server's clock",
            Bug::TargetRefusesCurrentFence => {
                "the fenced target refuses a step whose fence equals the key's highest as stale"
            }
            Bug::ReplicaClock => {
                "leases are judged on the receiving replica's own clock instead of the database's (PostgreSQL)"
            }
            Bug::ClaimWithoutLock => {
                "a claim checks that its job and deployment key are free and then takes them, without the key's and the job's row locks (PostgreSQL)"
            }
            Bug::SweeperWithoutLock => {
                "the sweeper reads lapsed leases and expires them by id, without the jobs' row locks (PostgreSQL)"
            }
            Bug::RetryLostCommit => {
                "a transaction whose COMMIT answer was lost is run again instead of answered as unknown (PostgreSQL)"
            }
            Bug::TrustNamedRunner => {
                "a runner token acts for whichever runner of its project the body names, not only its own runner"
            }
            Bug::CapabilityOutlivesLease => {
                "a capability lives its whole time to live, past the lease it was granted under"
            }
            Bug::UnrecordedLateResult => {
                "a refused result is answered with an error and kept nowhere, instead of ruled and recorded as a late observation"
            }
            Bug::AcceptBorrowedClaim => {
                "a report is matched to its attempt by job, attempt and fence, not by the runner holding it: a runner may report under another's claim"
            }
            Bug::LeaseJudgedBySweeper => {
                "a report is judged on its attempt's state alone: a lapsed lease counts as live until the sweeper marks it uncertain"
            }
            Bug::TargetFencesPerRunner => {
                "the fenced target compares a step's fence with the highest its own runner applied on the key, not the key's highest"
            }
            Bug::ExpiryLeavesJobRunning => {
                "lease expiry marks the attempt uncertain but leaves its job running, where no reconcile reaches it and its deployment key stays held"
            }
            Bug::DuplicateAckUnrecorded => {
                "an identical retry of a committed result is acknowledged as a duplicate with no ledger entry of its own, answering the committed result's entry"
            }
            Bug::RefusalUnrecorded => {
                "a refused result is answered 410 `stale_report`, an error code none of the contract's, and kept nowhere, instead of ruled and recorded as a late observation"
            }
            Bug::RefusalDropsExpiries => {
                "a refused report's transaction keeps the expiries it ran but appends only its own entry: the lapsed attempt turns uncertain with no expiry in the ledger"
            }
            Bug::DeadlineFromAnswer => {
                "the runner's renewal deadline runs from when a claim's or heartbeat's answer arrived, not from when it was sent: a renewal answered late stretches its authority past the lease"
            }
            Bug::DeadlineFromServerLease => {
                "the runner's renewal deadline is the lease end the control plane answered, on the server's clock, read on the runner's wall clock, not its own send time on its monotonic clock"
            }
            Bug::WallClockDeadline => {
                "the runner keeps its renewal deadline on its wall clock: a clock moved back stretches its authority"
            }
            Bug::UnansweredHeartbeatRenews => {
                "a heartbeat that got no answer (a transport error) moves the runner's renewal deadline as an accepted one does"
            }
            Bug::StepWithHeldCapability => {
                "the runner looks at its authority before asking for a capability, not before sending the step it was granted for: a capability answered after its deadline is used"
            }
            Bug::ResendStepOnLostAnswer => {
                "a step whose answer never came is sent again (with a fresh capability) instead of ending the attempt with its outcome unknown: the target may have applied it already"
            }
            Bug::ClaimLedgerInSecondTransaction => {
                "a claim commits its attempt and then appends its ledger entry in a second transaction: a claim whose second transaction fails leaves an attempt the ledger never granted (PostgreSQL)"
            }
            Bug::TargetExpiryInWholeSeconds => "the target judges a capability's expiry in whole seconds: a capability lives to the end of the second it expires in",
            Bug::LeaseEndInclusive => {
                "a lease is judged live in the millisecond it ends (its end is inclusive): a report received at its lease's end is taken, and a heartbeat renews it"
            }
        }
    }

    pub fn home(self) -> Home {
        match self {
            Bug::TargetIgnoresFence
            | Bug::TargetRefusesCurrentFence
            | Bug::TargetFencesPerRunner
            | Bug::TargetExpiryInWholeSeconds => Home::Target,
            Bug::DeadlineFromAnswer
            | Bug::DeadlineFromServerLease
            | Bug::WallClockDeadline
            | Bug::UnansweredHeartbeatRenews
            | Bug::StepWithHeldCapability
            | Bug::ResendStepOnLostAnswer => Home::Runner,
            _ => Home::ControlPlane,
        }
    }
}

impl fmt::Display for Bug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown bug `{0}`; known bugs: {known}", known = Bug::ALL.map(Bug::name).join(", "))]
pub struct UnknownBug(pub String);

impl FromStr for Bug {
    type Err = UnknownBug;
    fn from_str(name: &str) -> Result<Bug, UnknownBug> {
        Bug::ALL.into_iter().find(|bug| bug.name() == name).ok_or_else(|| UnknownBug(name.to_string()))
    }
}

/// Every bug, one a line: its name, then the protection it removes.
pub fn listing() -> String {
    Bug::ALL.iter().map(|bug| format!("{:<28} {}\n", bug.name(), bug.removes())).collect()
}

/// The set of bugs switched on in one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bugs(BTreeSet<Bug>);

impl Bugs {
    pub fn none() -> Bugs {
        Bugs::default()
    }

    pub fn of(bugs: impl IntoIterator<Item = Bug>) -> Bugs {
        Bugs(bugs.into_iter().collect())
    }

    pub fn has(&self, bug: Bug) -> bool {
        self.0.contains(&bug)
    }

    pub fn iter(&self) -> impl Iterator<Item = Bug> + '_ {
        self.0.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_has_one_line_per_bug_naming_it_first() {
        let listing = listing();
        let lines: Vec<&str> = listing.lines().collect();
        assert_eq!(lines.len(), Bug::ALL.len());
        for (line, bug) in lines.iter().zip(Bug::ALL) {
            assert!(line.starts_with(bug.name()) && line.ends_with(bug.removes()), "{line}");
        }
    }

    #[test]
    fn every_name_parses_back() {
        for bug in Bug::ALL {
            assert_eq!(bug.name().parse::<Bug>().unwrap(), bug);
            assert_eq!(serde_json::to_value(bug).unwrap(), bug.name(), "serde speaks the same names");
        }
        let error = "stale".parse::<Bug>().unwrap_err().to_string();
        assert!(error.contains("unknown bug `stale`") && error.contains("ack-before-commit"), "{error}");
    }
}
