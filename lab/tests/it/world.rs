//! A control plane's rules over a real SQLite file, driven with a clock the test controls.

use lab::bugs::{Bug, Bugs};
use lab::control::store::Principal;
use lab::control::{Now, Policy, RuleError, Rules, Sqlite};
use protocol::*;

/// The lease of every store-level test.
pub const LEASE_MS: i64 = 1_000;
const T0_MS: i64 = 1_700_000_000_000;

pub struct World {
    pub rules: Rules<Sqlite>,
    _dir: tempfile::TempDir,
}

pub const OPERATOR: Principal = Principal::Operator;

/// The server's clock `ms` after the world began.
pub fn at(ms: i64) -> Now {
    Now { ms: T0_MS + ms, mono_ns: ms as u64 * 1_000_000 }
}

/// A runner's clock reading `ms` after the world began (on the server's scale).
pub fn observed(ms: i64) -> i64 {
    T0_MS + ms
}

impl World {
    pub fn new(bugs: &[Bug]) -> World {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store = Sqlite::open(&dir.path().join("control.sqlite"), "operator").expect("the store opens");
        let policy = Policy { lease_ms: LEASE_MS as u64, capability_ttl_ms: 30 * LEASE_MS as u64 };
        let rules = Rules::new(store, policy, Bugs::of(bugs.iter().copied()), b"secret");
        rules.create_project(&OPERATOR, &CreateProject { id: "p".into() }).expect("project");
        rules.create_project(&OPERATOR, &CreateProject { id: "other".into() }).expect("project");
        World { rules, _dir: dir }
    }

    /// A world where runner `r1` holds a claim on job `j1` (key `k`), granted at 0.
    pub fn claimed(bugs: &[Bug]) -> (World, Principal, ClaimRef) {
        let world = World::new(bugs);
        let runner = world.runner("r1");
        world.submit("j1", "k", 0);
        let claim = world.claim(&runner, 0).expect("j1 is claimable").claim;
        (world, runner, claim)
    }

    /// A world where runner `r1` holds claims on `j1` (key `k1`) and `j2` (key `k2`), in that order.
    pub fn two_claims() -> (World, Principal, ClaimRef, ClaimRef) {
        let world = World::new(&[]);
        let runner = world.runner("r1");
        world.submit("j1", "k1", 0);
        world.submit("j2", "k2", 0);
        let first = world.claim(&runner, 0).expect("j1 is claimable").claim;
        let second = world.claim(&runner, 0).expect("j2 is claimable").claim;
        (world, runner, first, second)
    }

    pub fn runner(&self, id: &str) -> Principal {
        self.runner_in(id, "p")
    }

    pub fn runner_in(&self, id: &str, project: &str) -> Principal {
        let request = RegisterRunner { project: Some(project.into()), id: id.into() };
        self.rules.register_runner(&OPERATOR, &request).expect("runner");
        Principal::Runner { id: id.into(), project: project.into() }
    }

    pub fn submit(&self, job: &str, key: &str, when: i64) {
        let request = SubmitJob {
            project: "p".into(),
            id: Some(job.into()),
            deployment_key: key.into(),
            spec: JobSpec { steps: 1, step_ms: 1 },
        };
        self.rules.submit(&OPERATOR, &request, at(when)).expect("submit");
    }

    pub fn claim(&self, runner: &Principal, when: i64) -> Option<Grant> {
        let Principal::Runner { id, .. } = runner else { panic!("a runner claims") };
        let request = ClaimRequest { runner: id.clone(), observed_ms: observed(when) };
        self.rules.claim(runner, &request, at(when)).expect("claim").grant
    }

    pub fn heartbeat(&self, runner: &Principal, claim: &ClaimRef, when: i64, observed_ms: i64) -> Ruling {
        let request = HeartbeatRequest { claim: claim.clone(), observed_ms };
        self.rules.heartbeat(runner, &request, at(when)).expect("heartbeat answers")
    }

    pub fn result(&self, runner: &Principal, claim: &ClaimRef, outcome: Outcome, when: i64) -> Ruling {
        self.try_result(runner, claim, outcome, when, observed(when)).expect("result answers")
    }

    pub fn try_result(
        &self,
        runner: &Principal,
        claim: &ClaimRef,
        outcome: Outcome,
        when: i64,
        observed_ms: i64,
    ) -> Result<Ruling, RuleError> {
        let request = ResultRequest { claim: claim.clone(), outcome, observed_ms, detail: None };
        self.rules.result(runner, &request, at(when))
    }

    pub fn reconcile(
        &self,
        job: &str,
        attempt: &str,
        finding: Finding,
        outcome: Option<Outcome>,
        when: i64,
    ) -> Result<JobView, RuleError> {
        let request = ReconcileRequest {
            job: job.into(),
            attempt: attempt.into(),
            finding,
            outcome,
            evidence: Some("test".into()),
        };
        self.rules.reconcile(&OPERATOR, &request, at(when))
    }

    pub fn view(&self, job: &str) -> JobView {
        self.rules.job_view(&OPERATOR, job).expect("job view")
    }

    pub fn attempt(&self, job: &str, attempt: &str) -> AttemptView {
        self.view(job).attempts.into_iter().find(|view| view.id == attempt).expect("attempt exists")
    }

    /// The seed's walk-through up to the late report: A1 claimed by r1, expired,
    /// reconciled as stopped, A2 claimed by r2. Returns (r1, A1, r2, A2).
    pub fn superseded(&self) -> (Principal, ClaimRef, Principal, ClaimRef) {
        let (r1, r2) = (self.runner("r1"), self.runner("r2"));
        self.submit("j", "prod", 0);
        let a1 = self.claim(&r1, 0).expect("A1").claim;
        self.rules.expire(at(LEASE_MS + 1)).expect("expiry");
        self.reconcile("j", &a1.attempt, Finding::Stopped, None, LEASE_MS + 2).expect("reconcile");
        let a2 = self.claim(&r2, LEASE_MS + 3).expect("A2").claim;
        (r1, a1, r2, a2)
    }
}

pub fn refused_code(error: RuleError) -> &'static str {
    match error {
        RuleError::Refused { code, .. } => code,
        RuleError::Store(error) => panic!("store error: {error}"),
    }
}
