//! The store interface: the few primitive, typed operations the rules need inside one
//! transaction. The rules (in `rules.rs`) decide; a store only reads and writes rows.
//! A store for another database implements [`Tx`] and [`Store`] and keeps every rule.

use protocol::{AttemptState, JobSpec, JobState, LedgerEntry, Outcome};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("store holds a value it cannot read: {0}")]
    Corrupt(String),
    #[error("postgres: {}", describe_postgres(.0))]
    Postgres(#[from] postgres::Error),
    /// The database cannot be reached or used: a bad URL, no connection within the bound,
    /// a schema that cannot be created.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// COMMIT was sent and its answer never came: the transaction may or may not have
    /// committed. Never read as a refusal.
    #[error("the outcome of a commit is unknown: {0}")]
    CommitUnknown(String),
    /// A transaction asked to wait for a lock out of the one order every transaction takes
    /// them in (a programmer's error: two such transactions could wait for each other).
    #[error("lock out of order: {0}")]
    LockOrder(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    /// Whether the database could not be used and the transaction surely did not commit:
    /// no connection, a connection lost before COMMIT, a lock or statement timeout, the
    /// server shutting down. The API answers these 503 (a request that may be repeated).
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Unavailable(_) => true,
            StoreError::Postgres(error) => match error.code() {
                None => true,
                Some(code) => {
                    let code = code.code();
                    // 08: connection exception; 57: operator intervention (timeouts,
                    // shutdown); 55P03: lock not available; 53: insufficient resources;
                    // 40001 and 40P01: a serialization failure or deadlock (the rules' lock
                    // order leaves none; if one comes, it is answered, never retried).
                    code.starts_with("08")
                        || code.starts_with("57")
                        || code == "55P03"
                        || code.starts_with("53")
                        || code == "40001"
                        || code == "40P01"
                }
            },
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(error, _)) => {
                matches!(error.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            }
            _ => false,
        }
    }
}

/// A PostgreSQL error with the server's message and SQLSTATE (the crate's own text is
/// only "db error").
pub(crate) fn describe_postgres(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => match std::error::Error::source(error) {
            Some(source) => format!("{error}: {source}"),
            None => error.to_string(),
        },
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRow {
    pub id: String,
    pub project: String,
    pub deployment_key: String,
    pub spec: JobSpec,
    pub state: JobState,
    pub current_attempt: Option<String>,
    pub outcome: Option<Outcome>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRow {
    pub id: String,
    pub job: String,
    pub project: String,
    pub runner: String,
    pub fence: u64,
    pub state: AttemptState,
    pub lease_expires_ms: i64,
    pub claimed_ms: i64,
    pub closed_by: Option<history::ClosedBy>,
    pub outcome: Option<Outcome>,
}

/// The predicates of one conditional update of an attempt. Every `Some` is a predicate;
/// the correct lab sets all of them, a planted bug leaves some out.
#[derive(Clone, Debug, Default)]
pub struct Guard {
    pub job: String,
    pub project: Option<String>,
    pub attempt: Option<String>,
    pub runner: Option<String>,
    pub fence: Option<u64>,
    /// Bare-number comparison: the attempt's fence is at most this.
    pub fence_at_most: Option<u64>,
    /// The attempt must be its job's current attempt.
    pub current: bool,
    /// The attempt must be in one of these states.
    pub states: Vec<AttemptState>,
    /// The lease must be unexpired at this instant (Unix ms).
    pub lease_valid_at_ms: Option<i64>,
}

/// The new values a conditional update writes.
#[derive(Clone, Debug)]
pub struct AttemptChange {
    pub state: AttemptState,
    pub lease_expires_ms: Option<i64>,
    pub closed_by: Option<history::ClosedBy>,
    pub outcome: Option<Outcome>,
}

/// Who a bearer token belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Operator,
    Runner { id: String, project: String },
    Registration { project: String },
}

/// One transaction's view of the store.
pub trait Tx {
    /// The store's own clock (Unix ms), read once, when first asked — the rules ask once
    /// they hold the locks of the rows they decide on — with the host's monotonic ns at that
    /// reading: the one clock every replica's lease decisions are made on. SQLite answers
    /// its process's clock, read the same way (after the wait for the store), when opened
    /// `with_process_clock`. `None`: the receipt time read by the handler is the instant.
    fn clock(&mut self) -> StoreResult<Option<(i64, u64)>> {
        Ok(None)
    }
    fn principal(&mut self, token: &str) -> StoreResult<Option<Principal>>;
    fn insert_project(&mut self, id: &str, registration_token: &str) -> StoreResult<bool>;
    fn project_exists(&mut self, id: &str) -> StoreResult<bool>;
    fn insert_runner(&mut self, id: &str, project: &str, token: &str) -> StoreResult<bool>;
    /// Next value of a named, durable, strictly increasing counter (from 1).
    fn next_counter(&mut self, name: &str) -> StoreResult<u64>;
    fn insert_job(&mut self, job: &JobRow) -> StoreResult<bool>;
    fn job(&mut self, id: &str) -> StoreResult<Option<JobRow>>;
    fn jobs(&mut self) -> StoreResult<Vec<JobRow>>;
    /// Takes the lock of a deployment key's row, waiting for it, until the transaction ends:
    /// the claims of one key take it, so they run one at a time. (A store whose writers run
    /// one at a time anyway takes nothing.)
    fn lock_key(&mut self, key: &str) -> StoreResult<()>;
    /// As [`Tx::lock_key`] only if no other transaction holds it: whether it was taken.
    fn try_lock_key(&mut self, key: &str) -> StoreResult<bool>;
    /// The job, its row locked, waiting for it, until the transaction ends. Every transaction
    /// that changes a job or any of its attempts holds its job's lock, so while it is held
    /// neither changes. (A store whose writers run one at a time anyway only reads it.)
    fn lock_job(&mut self, id: &str) -> StoreResult<Option<JobRow>>;
    /// As [`Tx::lock_job`] only if no other transaction holds it: `None` also when one does.
    fn try_lock_job(&mut self, id: &str) -> StoreResult<Option<JobRow>>;
    /// The job, its row locked for a reader until the transaction ends: no transaction
    /// changes the job or its attempts meanwhile, and readers do not wait for each other.
    fn share_job(&mut self, id: &str) -> StoreResult<Option<JobRow>>;
    /// The jobs on deployment key `key` in any of `states`, oldest first (every project).
    fn jobs_on_key(&mut self, key: &str, states: &[JobState]) -> StoreResult<Vec<JobRow>>;
    fn attempt(&mut self, id: &str) -> StoreResult<Option<AttemptRow>>;
    fn attempts_of(&mut self, job: &str) -> StoreResult<Vec<AttemptRow>>;
    /// The jobs in any of `states`, oldest first (`project` limits them when given).
    fn jobs_in(&mut self, project: Option<&str>, states: &[JobState]) -> StoreResult<Vec<JobRow>>;
    fn insert_attempt(&mut self, attempt: &AttemptRow) -> StoreResult<()>;
    fn update_job(&mut self, job: &JobRow) -> StoreResult<()>;
    /// The conditional update: returns the id of the attempt it changed, or `None` for zero rows.
    fn guarded_update(&mut self, guard: &Guard, change: &AttemptChange) -> StoreResult<Option<String>>;
    /// An update with no predicate but the id: for expiry and reconciliation (which the
    /// operator authorises), and for planted bugs.
    fn unguarded_update(&mut self, attempt: &str, change: &AttemptChange) -> StoreResult<bool>;
    /// Every running attempt, by fence.
    fn running_attempts(&mut self) -> StoreResult<Vec<AttemptRow>>;
    /// The job's running attempts, by fence: what a report's expiry reads (a store answers
    /// it from the job's attempts, not from every running one).
    fn running_attempts_of(&mut self, job: &str) -> StoreResult<Vec<AttemptRow>> {
        Ok(self.running_attempts()?.into_iter().filter(|attempt| attempt.job == job).collect())
    }
    /// The oldest queued job of `project` whose deployment key no job in a `holding` state
    /// holds, passing over the keys in `busy`. The default reads the holding jobs and the
    /// project's queue; a store may answer in one statement that returns one row.
    fn claimable_job(
        &mut self,
        project: &str,
        holding: &[JobState],
        busy: &std::collections::HashSet<String>,
    ) -> StoreResult<Option<JobRow>> {
        let held: std::collections::HashSet<String> =
            self.jobs_in(None, holding)?.into_iter().map(|job| job.deployment_key).collect();
        let free = |job: &JobRow| !held.contains(&job.deployment_key) && !busy.contains(&job.deployment_key);
        Ok(self.jobs_in(Some(project), &[JobState::Queued])?.into_iter().find(free))
    }
    /// Appends `entries` to the ledger, in order, and answers their seqs: a transaction's
    /// last write, made once, after every decision (only building the answer follows). A
    /// store may commit the transaction with it: PostgreSQL sends COMMIT in the same round
    /// trip as the last entry, so the ledger's counter is held only inside the server.
    fn append_ledger(&mut self, entries: &[LedgerEntry]) -> StoreResult<Vec<u64>>;
    fn ledger_after(&mut self, after_seq: u64, limit: u32) -> StoreResult<Vec<LedgerEntry>>;
    fn ledger_of(&mut self, job: &str) -> StoreResult<Vec<LedgerEntry>>;
}

/// A store: runs a closure in one transaction, committed when it returns `Ok`.
pub trait Store: Send + Sync + 'static {
    fn transact<T, E: From<StoreError>>(&self, work: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E>;
    /// Runs the closure and rolls it back whatever it returns: a decision without effect.
    fn dry_run<T, E: From<StoreError>>(&self, work: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E>;
    /// As [`Store::transact`], but the row locks the rules ask for ([`Tx::lock_key`],
    /// [`Tx::lock_job`] and their `try_` forms) are not taken: the rows are only read. Only
    /// planted bugs call it; a store whose every transaction is serialised anyway (SQLite's
    /// single writer) runs it as `transact`.
    fn transact_unlocked<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce(&mut dyn Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        self.transact(work)
    }
}

/// The statement of [`Tx::claimable_job`] in the SQL both stores speak: the oldest queued
/// job of the project (bound at `project`) on a key no job in a `holding` state holds and
/// that `not_busy` (a predicate on `q.deployment_key`) lets through, as `columns` (the
/// job's, each prefixed `q.`).
pub(super) fn claimable_sql(columns: &str, holding: &[JobState], project: &str, not_busy: &str) -> String {
    let words = |states: &[JobState]| -> String {
        let words: Vec<String> = states
            .iter()
            .map(|state| match serde_json::to_value(state) {
                Ok(serde_json::Value::String(word)) => format!("'{word}'"),
                _ => unreachable!("job states serialise as strings"),
            })
            .collect();
        words.join(", ")
    };
    let holds = match holding.is_empty() {
        true => String::new(),
        false => format!(
            " AND NOT EXISTS (SELECT 1 FROM jobs h WHERE h.deployment_key = q.deployment_key AND h.state IN ({}))",
            words(holding)
        ),
    };
    let columns: Vec<String> = columns.split(", ").map(|column| format!("q.{column}")).collect();
    format!(
        "SELECT {} FROM jobs q WHERE q.project = {project} AND q.state IN ({}) AND {not_busy}{holds} \
         ORDER BY q.created LIMIT 1",
        columns.join(", "),
        words(&[JobState::Queued])
    )
}

/// The tables and indexes both stores hold, in the SQL both speak, for one database's
/// integer columns: `integer` is the type of a 64-bit integer column, `seq` the definition
/// of the ledger's `seq` column (SQLite numbers entries itself, PostgreSQL's store takes the
/// number from its counter). Every statement is `IF NOT EXISTS`, so opening a store on its
/// own tables again changes nothing.
pub(super) fn tables_sql(integer: &str, seq: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value {integer} NOT NULL);
CREATE TABLE IF NOT EXISTS projects (id TEXT PRIMARY KEY, registration_token TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS runners (id TEXT PRIMARY KEY, project TEXT NOT NULL REFERENCES projects(id), token TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, project TEXT NOT NULL REFERENCES projects(id), deployment_key TEXT NOT NULL,
  steps {integer} NOT NULL, step_ms {integer} NOT NULL, state TEXT NOT NULL,
  current_attempt TEXT, outcome TEXT, created {integer} NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, created);
CREATE INDEX IF NOT EXISTS jobs_by_key ON jobs(deployment_key, state);
CREATE TABLE IF NOT EXISTS attempts (
  id TEXT PRIMARY KEY, job TEXT NOT NULL REFERENCES jobs(id), project TEXT NOT NULL, runner TEXT NOT NULL,
  fence {integer} NOT NULL UNIQUE, state TEXT NOT NULL, lease_expires_ms {integer} NOT NULL,
  claimed_ms {integer} NOT NULL, closed_by TEXT, outcome TEXT);
CREATE INDEX IF NOT EXISTS attempts_by_job ON attempts(job);
CREATE INDEX IF NOT EXISTS attempts_by_state ON attempts(state, lease_expires_ms);
CREATE TABLE IF NOT EXISTS ledger (
  seq {seq}, kind TEXT NOT NULL, project TEXT NOT NULL, job TEXT NOT NULL,
  attempt TEXT, runner TEXT, fence {integer}, deployment_key TEXT NOT NULL, decision TEXT, reason TEXT,
  recorded_as TEXT, outcome TEXT, received_ms {integer} NOT NULL, observed_ms {integer},
  mono_ns {integer} NOT NULL, lease_expires_ms {integer});
CREATE INDEX IF NOT EXISTS ledger_by_job ON ledger(job, seq);
"
    )
}
