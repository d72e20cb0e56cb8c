//! The step client of an observed system's job (`fencelab lab step`): a system that does
//! not speak the contract (a CI system's build, an orchestrator's task) runs it as its job's
//! work, and it sends the deployment's steps to fencelab's deployment target as one attempt.
//!
//! The attempt's fence is the generation the *system* gives the job (Buildbot's build id, a
//! task try's number): the client only carries it. It signs the capability itself with the
//! secret it shares with the target, since an observed system grants none, and the
//! capability lives `capability_ttl_ms` (a day by default): such a system has no lease the
//! capability could be bounded by, so only the fence the target compares (`--mode fenced`)
//! stands between a stale attempt and the deployment — the user-side fence on the system's
//! own generation, and exactly what it buys.

use std::time::Duration;

use history::Exit;
use protocol::client::Client;
use protocol::{Capability, StepRecord, StepRequest};

/// How much longer than its step's own duration a step's answer may take (10 s).
const ANSWER_MARGIN_MS: u64 = 10_000;

/// The most steps a deployment has (as `POST /v1/jobs`'s `spec.steps`).
pub const STEPS_MAX: u32 = 1_000;

/// The longest a step runs on the target (as `spec.step_ms`).
pub const STEP_MS_MAX: u64 = 600_000;

/// One attempt's deployment: what each step's capability names, and the steps.
#[derive(Clone, Debug)]
pub struct Deployment {
    pub target_url: String,
    pub secret: String,
    pub deployment_key: String,
    pub job: String,
    pub attempt: String,
    pub runner: String,
    pub fence: u64,
    pub steps: u32,
    pub step_ms: u64,
    pub capability_ttl_ms: u64,
}

/// How a deployment ended.
#[derive(Debug)]
pub enum Ended {
    /// Every step was applied.
    Applied(Vec<StepRecord>),
    /// The target refused a step (its record last): the attempt stops there.
    Refused(Vec<StepRecord>),
    /// A step got no answer: whether it was applied is unknown.
    NoAnswer(Vec<StepRecord>, String),
}

impl Ended {
    /// The exit of the one table: 0 every step applied, 1 a step refused, 2 unknown.
    pub fn exit(&self) -> Exit {
        match self {
            Ended::Applied(_) => Exit::Valid,
            Ended::Refused(_) => Exit::Invalid,
            Ended::NoAnswer(..) => Exit::Unknown,
        }
    }
}

impl Deployment {
    /// Why the deployment cannot be sent as given, if it cannot.
    pub fn invalid(&self) -> Option<String> {
        let ids = [
            ("deployment key", &self.deployment_key),
            ("job", &self.job),
            ("attempt", &self.attempt),
            ("runner", &self.runner),
        ];
        if let Some((what, _)) = ids.iter().find(|(_, id)| id.is_empty() || id.contains(['\n', '\r'])) {
            return Some(format!("the {what} must be a non-empty word without a line break"));
        }
        if !(1..=STEPS_MAX).contains(&self.steps) {
            return Some(format!("--steps must be 1..={STEPS_MAX}"));
        }
        if self.step_ms > STEP_MS_MAX {
            return Some(format!("--step-ms must be at most {STEP_MS_MAX}"));
        }
        if self.fence > i64::MAX as u64 {
            return Some(format!("--fence must be at most {}", i64::MAX));
        }
        if !self.target_url.starts_with("http://") {
            return Some(format!("the target URL `{}` is not an http:// URL", self.target_url));
        }
        None
    }

    /// The capability for every step, signed at `now_ms` (Unix ms).
    fn capability(&self, now_ms: i64) -> Capability {
        let capability = Capability {
            deployment_key: self.deployment_key.clone(),
            job: self.job.clone(),
            attempt: self.attempt.clone(),
            runner: self.runner.clone(),
            fence: self.fence,
            expires_ms: now_ms.saturating_add(self.capability_ttl_ms as i64),
            signature: String::new(),
        };
        crate::capability::sign(self.secret.as_bytes(), capability)
    }

    /// Sends the steps one at a time, in order, each waiting for its answer; stops at the
    /// first refusal or step without an answer. `each` sees every record as it comes.
    pub async fn send(&self, mut each: impl FnMut(&StepRecord)) -> Ended {
        let wait = Duration::from_millis(self.step_ms + ANSWER_MARGIN_MS);
        let target = Client::new(&self.target_url, None, wait);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as i64);
        let capability = self.capability(now_ms);
        let mut records = Vec::with_capacity(self.steps as usize);
        for step in 0..self.steps {
            let request =
                StepRequest { capability: capability.clone(), step, steps: self.steps, duration_ms: self.step_ms };
            match target.step(&request).await {
                Ok(answer) => {
                    each(&answer.record);
                    let applied = answer.record.applied;
                    records.push(answer.record);
                    if !applied {
                        return Ended::Refused(records);
                    }
                }
                Err(error) => return Ended::NoAnswer(records, format!("step {step}: {error}")),
            }
        }
        Ended::Applied(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment() -> Deployment {
        Deployment {
            target_url: "http://127.0.0.1:1".into(),
            secret: "s".into(),
            deployment_key: "prod".into(),
            job: "j1".into(),
            attempt: "j1-b7".into(),
            runner: "r1".into(),
            fence: 7,
            steps: 3,
            step_ms: 10,
            capability_ttl_ms: 86_400_000,
        }
    }

    #[test]
    fn a_deployment_out_of_the_contracts_bounds_is_refused_with_what_is_wrong() {
        assert_eq!(deployment().invalid(), None);
        let check = |change: fn(&mut Deployment), says: &str| {
            let mut bad = deployment();
            change(&mut bad);
            let why = bad.invalid().expect("refused");
            assert!(why.contains(says), "{why}");
        };
        check(|d| d.steps = 0, "--steps");
        check(|d| d.steps = STEPS_MAX + 1, "--steps");
        check(|d| d.step_ms = STEP_MS_MAX + 1, "--step-ms");
        check(|d| d.job = "j\n1".into(), "job");
        check(|d| d.attempt.clear(), "attempt");
        check(|d| d.fence = u64::MAX, "--fence");
        check(|d| d.target_url = "127.0.0.1:1".into(), "http://");
    }

    #[test]
    fn the_capability_carries_the_systems_generation_and_verifies_with_the_shared_secret() {
        let capability = deployment().capability(1_000);
        assert_eq!((capability.fence, capability.attempt.as_str()), (7, "j1-b7"));
        assert_eq!(capability.expires_ms, 1_000 + 86_400_000);
        assert!(crate::capability::verify(b"s", &capability));
        assert!(!crate::capability::verify(b"other", &capability));
    }

    #[tokio::test]
    async fn a_step_without_an_answer_ends_the_deployment_as_unknown() {
        let ended = deployment().send(|_| {}).await;
        assert!(matches!(ended, Ended::NoAnswer(ref records, _) if records.is_empty()), "{ended:?}");
        assert_eq!(ended.exit(), Exit::Unknown);
    }
}
