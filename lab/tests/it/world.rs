//! A control plane's rules over a real store — a SQLite file or a fresh PostgreSQL schema —
//! driven with a clock the test controls. [`on_every_store!`] runs each test body once per
//! store, so the rules are shown to hold on both without the bodies being written twice.

use std::cell::Cell;
use std::sync::{Mutex, OnceLock};

use lab::bugs::{Bug, Bugs};
use lab::control::store::Principal;
use lab::control::{Backend, Now, PgOptions, Policy, Postgres, RuleError, Rules, Sqlite};
use procs::pg::TempCluster;
use protocol::*;

/// The store a [`World`] is built on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

thread_local! {
    static KIND: Cell<Kind> = const { Cell::new(Kind::Sqlite) };
}

impl Kind {
    /// Runs a test body with every `World` it builds on this store. Without PostgreSQL a
    /// PostgreSQL run says it skipped, unless `FENCELAB_REQUIRE_ALL=1`.
    pub fn run(self, body: fn()) {
        if self == Kind::Postgres && !postgres_or_skip() {
            return;
        }
        KIND.with(|kind| kind.set(self));
        body();
    }
}

/// Whether PostgreSQL is here; prints SKIPPED (or panics under `FENCELAB_REQUIRE_ALL=1`).
pub fn postgres_or_skip() -> bool {
    let Some(why) = procs::pg::unavailable() else { return true };
    assert!(std::env::var("FENCELAB_REQUIRE_ALL").as_deref() != Ok("1"), "FENCELAB_REQUIRE_ALL=1 and {why}");
    eprintln!("SKIPPED: {why}");
    false
}

/// This test process's cluster, started on first use and stopped when the process exits.
static CLUSTER: Mutex<Option<TempCluster>> = Mutex::new(None);
static CLUSTER_URL: OnceLock<String> = OnceLock::new();

extern "C" fn stop_cluster() {
    if let Ok(mut cluster) = CLUSTER.lock() {
        drop(cluster.take());
    }
}

/// The URL of this process's throwaway cluster.
pub fn cluster_url() -> String {
    CLUSTER_URL
        .get_or_init(|| {
            let cluster = TempCluster::start().expect("a throwaway PostgreSQL cluster starts");
            let url = cluster.url();
            *CLUSTER.lock().unwrap() = Some(cluster);
            // SAFETY: registers a plain function with no arguments, run once at exit.
            unsafe { libc::atexit(stop_cluster) };
            url
        })
        .clone()
}

/// A schema no other store of this cluster uses.
pub fn fresh_schema() -> String {
    static SCHEMAS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!("t{}_{}", std::process::id(), SCHEMAS.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Opens a PostgreSQL store on `schema` with at most `pool_size` connections.
pub fn postgres_store(schema: &str, pool_size: usize) -> Postgres {
    let mut options = PgOptions::new(&cluster_url(), schema);
    options.pool_size = pool_size;
    // The rules are tested at chosen instants; `the_database_clock_is_the_lease_authority`
    // tests the database's clock.
    options.database_clock = false;
    Postgres::open(&options, "operator").expect("the PostgreSQL store opens")
}

/// The lease of every store-level test.
pub const LEASE_MS: i64 = 1_000;
const T0_MS: i64 = 1_700_000_000_000;

pub struct World {
    pub rules: Rules<Backend>,
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
        let store: Backend = match KIND.with(Cell::get) {
            Kind::Sqlite => {
                Sqlite::open(&dir.path().join("control.sqlite"), "operator").expect("the store opens").into()
            }
            Kind::Postgres => postgres_store(&fresh_schema(), 2).into(),
        };
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

/// Defines each test body once and a `#[test]` for it per store: `sqlite::NAME` and
/// `postgres::NAME`.
macro_rules! on_every_store {
    ($($(#[$meta:meta])* fn $name:ident() $body:block)*) => {
        $($(#[$meta])* fn $name() $body)*

        mod sqlite {
            $(#[test]
            fn $name() {
                crate::world::Kind::Sqlite.run(super::$name)
            })*
        }

        mod postgres {
            $(#[test]
            fn $name() {
                crate::world::Kind::Postgres.run(super::$name)
            })*
        }
    };
}
pub(crate) use on_every_store;
