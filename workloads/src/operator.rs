//! The operator: for an uncertain attempt, first make sure the old execution has stopped,
//! then record what the target shows. It never records "stopped" for an execution it has
//! not stopped.

use serde::{Deserialize, Serialize};

/// What the operator knows about one uncertain attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// The runner process holding the attempt is stopped (frozen with SIGSTOP, or dead).
    pub execution_stopped: bool,
    /// Steps of this attempt the target applied.
    pub steps_applied: u32,
    /// Steps the job has.
    pub steps: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Stop the old execution first (freeze its runner).
    StopExecution,
    /// It stopped before finishing: close the attempt; the job gets a new attempt.
    ReconcileStopped,
    /// Every step reached the target: the deployment completed; the job takes success.
    ReconcileCompleted,
}

pub fn decide(evidence: &Evidence) -> Action {
    if !evidence.execution_stopped {
        return Action::StopExecution;
    }
    if evidence.steps > 0 && evidence.steps_applied >= evidence.steps {
        return Action::ReconcileCompleted;
    }
    Action::ReconcileStopped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_first_then_record_what_the_target_shows() {
        let check = |execution_stopped, steps_applied, expected| {
            assert_eq!(decide(&Evidence { execution_stopped, steps_applied, steps: 3 }), expected);
        };
        check(false, 3, Action::StopExecution);
        check(false, 0, Action::StopExecution);
        check(true, 0, Action::ReconcileStopped);
        check(true, 2, Action::ReconcileStopped);
        check(true, 3, Action::ReconcileCompleted);
    }
}
