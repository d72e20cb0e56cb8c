//! The PostgreSQL store: the same tables as the SQLite store, in a schema of their own,
//! reached through a small bounded pool of `tokio_postgres` connections, each driven from
//! the blocking thread a rule runs on; BEGIN goes with a transaction's first statement and
//! COMMIT with its ledger append, each in one round trip.
//!
//! Concurrency (see "The PostgreSQL store" in `docs/protocol.md`): every transaction runs
//! READ COMMITTED, begun with its first read other than a token lookup or a ledger page
//! (which run as single statements). It takes the row locks the rules ask for — a
//! deployment key's row (`lock_key`), a job's (`lock_job`, which guards the job and its
//! attempts) — and the counter rows its writes take (the ledger's `seq` last), each held to
//! COMMIT or ROLLBACK: transactions on other keys and jobs run side by side, across every
//! process that shares the schema, each statement seeing every earlier commit. The rules
//! take the locks in one order, so no transaction waits in a cycle; nothing retries a
//! transaction, and a deadlock or serialization failure PostgreSQL reports anyway is a
//! store error like a lock timeout.
//!
//! Every wait is bounded: a connection from the pool, connecting, each lock, each statement,
//! and an idle transaction on the server (a replica cut from the database loses its locks).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use postgres::types::ToSql;
use postgres::{NoTls, Row, Statement};

use super::store::{self, AttemptChange, AttemptRow, Guard, JobRow, Principal, Store, StoreError, StoreResult, Tx};
use protocol::{JobSpec, JobState, LedgerEntry};

/// The schema's tables. `deployment_keys` holds a row per deployment key a job was ever
/// submitted on: the row claims of that key lock.
fn schema() -> String {
    format!(
        "\nCREATE TABLE IF NOT EXISTS deployment_keys (key TEXT PRIMARY KEY);\n{}\
         INSERT INTO deployment_keys (key) SELECT DISTINCT deployment_key FROM jobs ON CONFLICT DO NOTHING;\n",
        store::tables_sql("BIGINT", "BIGINT PRIMARY KEY")
    )
}

/// Every table and index [`schema`] creates: a schema holding them all is complete.
const SCHEMA_RELATIONS: [&str; 12] = [
    "deployment_keys",
    "counters",
    "projects",
    "runners",
    "jobs",
    "jobs_by_state",
    "jobs_by_key",
    "attempts",
    "attempts_by_job",
    "attempts_by_state",
    "ledger",
    "ledger_by_job",
];

/// The schema a control plane uses when none is named.
pub const DEFAULT_SCHEMA: &str = "fencelab";

/// How a [`Postgres`] store connects and how long it waits. Every field is a bound.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// A libpq-style URL or key=value string (no TLS: the lab's database is on loopback).
    pub url: String,
    /// The schema holding the tables; created with them when absent.
    pub schema: String,
    /// Most connections open at once.
    pub pool_size: usize,
    /// Longest wait for a free connection.
    pub pool_wait: Duration,
    /// Longest wait to connect.
    pub connect_timeout: Duration,
    /// Longest wait for a lock (`lock_timeout`): a key's, a job's, a counter's.
    pub lock_wait: Duration,
    /// Longest statement (`statement_timeout`).
    pub statement_max: Duration,
    /// Longest a transaction may sit idle on the server (`idle_in_transaction_session_timeout`):
    /// a replica that stops talking mid-transaction loses its lock after this.
    pub idle_in_transaction_max: Duration,
    /// Whether the database's clock is the lease authority (the default). Off, the
    /// caller's instant is used: for tests of the rules at chosen instants.
    pub database_clock: bool,
}

impl PgOptions {
    pub fn new(url: &str, schema: &str) -> PgOptions {
        PgOptions {
            url: url.to_string(),
            schema: schema.to_string(),
            pool_size: 8,
            pool_wait: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            lock_wait: Duration::from_secs(5),
            statement_max: Duration::from_secs(10),
            idle_in_transaction_max: Duration::from_secs(10),
            database_clock: true,
        }
    }
}

/// Whether `name` may name a schema: 1 to 63 of `[a-z0-9_]`, not starting with a digit
/// (so it needs no quoting and cannot be mistaken for another identifier).
pub fn valid_schema(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with("pg_")
}

pub struct Postgres {
    pool: Pool,
    operator_token: String,
    database_clock: bool,
    principals: Principals,
}

/// Most token lookups a store remembers; past it, it forgets them all and starts again.
const PRINCIPALS_MAX: usize = 100_000;

/// Tokens already looked up. A token never changes owner once inserted, so a remembered
/// answer stays true, also when another replica inserted it.
type Principals = Mutex<HashMap<String, Principal>>;

impl Postgres {
    /// Connects, creates the schema and its tables when absent, and keeps a pool.
    pub fn open(options: &PgOptions, operator_token: &str) -> StoreResult<Postgres> {
        if !valid_schema(&options.schema) {
            return Err(StoreError::Unavailable(format!(
                "schema name `{}` must be 1 to 63 of [a-z0-9_], not starting with a digit or pg_",
                options.schema
            )));
        }
        let mut config = tokio_postgres::Config::from_str(&options.url)
            .map_err(|error| StoreError::Unavailable(format!("database URL: {error}")))?;
        config.connect_timeout(options.connect_timeout);
        config.tcp_user_timeout(options.statement_max + options.lock_wait);
        config.application_name("fencelab-control-plane");
        let setup = format!(
            "SET search_path TO {schema}; SET lock_timeout = {lock}; SET statement_timeout = {statement}; \
             SET idle_in_transaction_session_timeout = {idle}",
            schema = options.schema,
            lock = options.lock_wait.as_millis(),
            statement = options.statement_max.as_millis(),
            idle = options.idle_in_transaction_max.as_millis(),
        );
        let pool = Pool::new(config, setup, options.pool_size.max(1), options.pool_wait);
        let store = Postgres {
            pool,
            operator_token: operator_token.to_string(),
            database_clock: options.database_clock,
            principals: Mutex::new(HashMap::new()),
        };
        store.create_schema(&options.schema)?;
        Ok(store)
    }

    /// Creates the schema and tables; an advisory lock keeps replicas starting together
    /// from racing on the catalog. A schema that holds every table and index already is
    /// left alone: `CREATE INDEX IF NOT EXISTS` takes its table's lock before it looks, so
    /// a replica restarting among running ones would hold up their writes, table by table,
    /// and could deadlock with a transaction that writes two of them.
    fn create_schema(&self, schema: &str) -> StoreResult<()> {
        let mut lease = self.pool.get()?;
        let conn = lease.conn();
        let present = conn.runtime.block_on(conn.client.query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = ANY($2::TEXT[])",
            &[&schema, &SCHEMA_RELATIONS.as_slice()],
        ));
        if present.is_ok_and(|row| row.try_get::<_, i64>(0).ok() == Some(SCHEMA_RELATIONS.len() as i64)) {
            lease.clean = true;
            return Ok(());
        }
        let sql = format!(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtext('fencelab-schema')); \
             CREATE SCHEMA IF NOT EXISTS {schema}; {} COMMIT",
            self::schema()
        );
        match conn.batch_execute(&sql) {
            Ok(()) => {
                lease.clean = true;
                Ok(())
            }
            Err(error) => Err(StoreError::Unavailable(format!(
                "creating schema `{schema}`: {}",
                super::store::describe_postgres(&error)
            ))),
        }
    }

    fn run<T, E: From<StoreError>>(
        &self,
        commit: bool,
        locks: bool,
        work: impl FnOnce(&mut dyn Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut lease = self.pool.get()?;
        let conn = lease.conn();
        let mut tx = PgTx {
            conn,
            operator_token: &self.operator_token,
            principals: &self.principals,
            locks,
            begun: false,
            pending_begin: false,
            failed: false,
            commit_with_ledger: commit,
            ended: false,
            committed: false,
            database_clock: self.database_clock,
            clock: None,
            running: None,
            held: Held::default(),
        };
        let value = work(&mut tx);
        let (failed, begun, ended, committed, conn) = (tx.failed, tx.begun, tx.ended, tx.committed, tx.conn);
        if committed {
            // COMMIT went with the ledger append, the rules' last write, and was answered.
            lease.clean = true;
            return match value {
                Ok(value) => Ok(value),
                Err(_) => Err(StoreError::CommitUnknown(
                    "a rule failed after its transaction had committed with its ledger entries".into(),
                )
                .into()),
            };
        }
        if ended {
            // COMMIT went with the ledger append and did not commit, or no answer came: the
            // error the append returned says which.
            return match value {
                Ok(_) => Err(StoreError::CommitUnknown("a transaction's COMMIT went unanswered".into()).into()),
                Err(error) => Err(error),
            };
        }
        if !begun {
            // Only lock-free reads ran, each a statement of its own: nothing to end.
            lease.clean = !conn.is_closed();
            return match value {
                Ok(_) if failed => {
                    Err(StoreError::Unavailable("a statement failed and was not reported".into()).into())
                }
                value => value,
            };
        }
        match value {
            Ok(value) if commit && !failed => match conn.batch_execute("COMMIT") {
                Ok(()) => {
                    lease.clean = true;
                    Ok(value)
                }
                Err(error) if error.is_closed() || error.code().is_none() => {
                    Err(StoreError::CommitUnknown(error.to_string()).into())
                }
                Err(error) => Err(StoreError::from(error).into()),
            },
            Ok(value) => {
                lease.clean = conn.batch_execute("ROLLBACK").is_ok();
                if failed {
                    return Err(StoreError::Unavailable("a statement failed inside the transaction".into()).into());
                }
                Ok(value)
            }
            Err(error) => {
                lease.clean = conn.batch_execute("ROLLBACK").is_ok();
                Err(error)
            }
        }
    }
}

impl Store for Postgres {
    fn transact<T, E: From<StoreError>>(&self, work: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E> {
        self.run(true, true, work)
    }

    fn dry_run<T, E: From<StoreError>>(&self, work: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E> {
        self.run(false, true, work)
    }

    fn transact_unlocked<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce(&mut dyn Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        self.run(true, false, work)
    }
}

/// Most statements a connection keeps prepared (guards come in a few shapes only).
const STATEMENTS_MAX: usize = 256;

/// One connection: a `tokio_postgres` client and the small runtime that drives it, used
/// from the blocking thread a request runs on (as the synchronous `postgres` client does).
/// Requests sent together go in one round trip: BEGIN with a transaction's first statement,
/// COMMIT with its last ledger append.
struct Conn {
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    statements: HashMap<String, Statement>,
}

/// What one round trip of [`Conn::pipelined`] answered: BEGIN's answer when it went first,
/// the statement's, and COMMIT's when it went last.
struct Pipelined<T> {
    begin: Option<Result<(), postgres::Error>>,
    answer: Result<T, postgres::Error>,
    commit: Option<Result<(), postgres::Error>>,
}

impl Conn {
    fn connect(config: &tokio_postgres::Config) -> Result<Conn, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| format!("a runtime for the connection: {error}"))?;
        let (client, connection) =
            runtime.block_on(config.connect(NoTls)).map_err(|error| super::store::describe_postgres(&error))?;
        // Driven whenever the runtime runs: during each request's `block_on`.
        runtime.spawn(async move {
            let _ = connection.await;
        });
        Ok(Conn { runtime, client, statements: HashMap::new() })
    }

    fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    fn batch_execute(&self, sql: &str) -> Result<(), postgres::Error> {
        self.runtime.block_on(self.client.batch_execute(sql))
    }

    fn prepare(&self, sql: &str) -> Result<Statement, postgres::Error> {
        self.runtime.block_on(self.client.prepare(sql))
    }

    /// Runs `work` (one statement's request), with `begin` sent before it and COMMIT after
    /// it when `commit`, in one round trip: each request goes out, in order, before any
    /// answer is awaited.
    fn pipelined<T>(
        &self,
        begin: Option<&str>,
        work: impl std::future::Future<Output = Result<T, postgres::Error>>,
        commit: bool,
    ) -> Pipelined<T> {
        let client = &self.client;
        let (begin, answer, commit) = self.runtime.block_on(async {
            let begin = async {
                match begin {
                    Some(sql) => Some(client.batch_execute(sql).await),
                    None => None,
                }
            };
            let commit = async {
                match commit {
                    true => Some(client.batch_execute("COMMIT").await),
                    false => None,
                }
            };
            tokio::join!(begin, work, commit)
        });
        Pipelined { begin, answer, commit }
    }
}

struct PoolState {
    idle: Vec<Conn>,
    open: usize,
}

/// A bounded pool: at most `size` connections, a bounded wait for one, broken ones dropped.
struct Pool {
    config: tokio_postgres::Config,
    setup: String,
    size: usize,
    wait: Duration,
    state: Mutex<PoolState>,
    freed: Condvar,
}

impl Pool {
    fn new(config: tokio_postgres::Config, setup: String, size: usize, wait: Duration) -> Pool {
        Pool {
            config,
            setup,
            size,
            wait,
            state: Mutex::new(PoolState { idle: vec![], open: 0 }),
            freed: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn get(&self) -> StoreResult<Lease<'_>> {
        let deadline = Instant::now() + self.wait;
        let mut state = self.lock();
        loop {
            if let Some(conn) = state.idle.pop() {
                return Ok(Lease { pool: self, conn: Some(conn), clean: false });
            }
            if state.open < self.size {
                state.open += 1;
                drop(state);
                return match self.connect() {
                    Ok(conn) => Ok(Lease { pool: self, conn: Some(conn), clean: false }),
                    Err(error) => {
                        self.lock().open -= 1;
                        self.freed.notify_one();
                        Err(error)
                    }
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StoreError::Unavailable(format!(
                    "no database connection free within {:?} ({} open)",
                    self.wait, self.size
                )));
            }
            state = self.freed.wait_timeout(state, left).unwrap_or_else(|poisoned| poisoned.into_inner()).0;
        }
    }

    fn connect(&self) -> StoreResult<Conn> {
        let conn = Conn::connect(&self.config)
            .map_err(|why| StoreError::Unavailable(format!("cannot connect to the database: {why}")))?;
        conn.batch_execute(&self.setup)?;
        Ok(conn)
    }

    fn put(&self, conn: Conn, clean: bool) {
        let mut state = self.lock();
        if clean && !conn.is_closed() {
            state.idle.push(conn);
        } else {
            state.open -= 1;
            drop(state);
            drop(conn);
        }
        self.freed.notify_one();
    }
}

impl Drop for Pool {
    /// Each connection owns a small runtime, which may not be dropped on an async
    /// thread: the idle connections are closed on a thread of their own.
    fn drop(&mut self) {
        let idle = std::mem::take(&mut self.lock().idle);
        if !idle.is_empty() {
            let _ = std::thread::spawn(move || drop(idle)).join();
        }
    }
}

/// A connection out of the pool; it goes back only if its transaction ended cleanly.
struct Lease<'p> {
    pool: &'p Pool,
    conn: Option<Conn>,
    clean: bool,
}

impl Lease<'_> {
    fn conn(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("a lease holds its connection until dropped")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.put(conn, self.clean);
        }
    }
}

struct PgTx<'a> {
    conn: &'a mut Conn,
    operator_token: &'a str,
    principals: &'a Principals,
    /// Whether `lock_key` and `lock_job` take their row locks (only planted bugs run
    /// without them).
    locks: bool,
    /// Whether the transaction has begun (BEGIN was sent). Token lookups and ledger pages
    /// that come before run as statements of their own.
    begun: bool,
    /// Whether BEGIN is to go with the next statement.
    pending_begin: bool,
    database_clock: bool,
    /// The database's clock read when the rules first asked (Unix ms), with the host's
    /// monotonic clock read when that answer came back.
    clock: Option<(i64, u64)>,
    /// The running attempts read in the clock's statement — of the one job the transaction
    /// has locked (`Some(job)`), else every one (`None`) — what `running_attempts_of` or
    /// `running_attempts` answers if it is the next statement (reports, reconciles and the
    /// sweep expire right after reading the clock, so one round trip serves both).
    running: Option<(Option<String>, Vec<AttemptRow>)>,
    /// Whether a statement failed (PostgreSQL then refuses the rest of the transaction).
    failed: bool,
    /// Whether the last ledger append carries COMMIT (a transaction to commit, not a dry run).
    commit_with_ledger: bool,
    /// Whether COMMIT was sent with the ledger append: no statement may follow.
    ended: bool,
    /// Whether the append's COMMIT was answered: the transaction committed.
    committed: bool,
    /// The locks taken so far, to keep the order.
    held: Held,
}

/// The locks a transaction holds, checked against the one order every transaction takes
/// them in: a deployment key's row, then a job's, then counter rows by name, the ledger's
/// counter last. A wait is allowed only for a lock that comes after every lock held, and
/// for at most one key and one job; a lock taken only if free at once (`try_`) may come in
/// any order, since it never waits. Then no two transactions wait for each other: a cycle
/// of waits would need one of them to wait for a lock that comes before one it holds.
/// Every write of a job or its attempts is under that job's lock.
#[derive(Default)]
struct Held {
    keys: usize,
    jobs: std::collections::HashSet<String>,
    counter: Option<String>,
    ledger: bool,
}

impl Held {
    fn out_of_order(why: String) -> StoreResult<()> {
        Err(StoreError::LockOrder(why))
    }

    fn wait_key(&mut self, key: &str) -> StoreResult<()> {
        if self.keys > 0 || !self.jobs.is_empty() || self.counter.is_some() || self.ledger {
            return Held::out_of_order(format!("waiting for key `{key}` with a key, job or counter held"));
        }
        self.keys += 1;
        Ok(())
    }

    fn wait_job(&mut self, job: &str) -> StoreResult<()> {
        if self.jobs.contains(job) {
            return Ok(());
        }
        if !self.jobs.is_empty() || self.counter.is_some() || self.ledger {
            return Held::out_of_order(format!("waiting for job `{job}` with a job or counter held"));
        }
        self.jobs.insert(job.to_string());
        Ok(())
    }

    fn wait_counter(&mut self, name: &str) -> StoreResult<()> {
        if self.ledger {
            return Held::out_of_order(format!("waiting for counter `{name}` with the ledger's counter held"));
        }
        if let Some(held) = self.counter.as_deref().filter(|held| *held > name) {
            return Held::out_of_order(format!("waiting for counter `{name}` with counter `{held}` held"));
        }
        self.counter = Some(name.to_string());
        Ok(())
    }

    fn writes(&self, job: &str) -> StoreResult<()> {
        match self.jobs.contains(job) {
            true => Ok(()),
            false => Held::out_of_order(format!("writing job `{job}` or its attempts without its lock")),
        }
    }
}

type Params<'p> = [&'p (dyn ToSql + Sync)];

impl PgTx<'_> {
    fn statement(&mut self, sql: &str) -> StoreResult<Statement> {
        self.open()?;
        self.running = None;
        if let Some(statement) = self.conn.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.conn.prepare(sql);
        let statement = self.noted(statement)?;
        if self.conn.statements.len() >= STATEMENTS_MAX {
            self.conn.statements.clear();
        }
        self.conn.statements.insert(sql.to_string(), statement.clone());
        Ok(statement)
    }

    fn noted<T>(&mut self, result: Result<T, postgres::Error>) -> StoreResult<T> {
        if result.is_err() {
            self.failed = true;
        }
        Ok(result?)
    }

    /// Refuses a statement once COMMIT has gone with the ledger append: it would run
    /// outside the transaction.
    fn open(&self) -> StoreResult<()> {
        match self.ended {
            true => Err(StoreError::LockOrder("a statement after the transaction's ledger append".into())),
            false => Ok(()),
        }
    }

    /// BEGIN, when the transaction is to begin with the next statement (sent with it).
    fn take_begin(&mut self) -> Option<&'static str> {
        if !self.pending_begin {
            return None;
        }
        // Marked first: if BEGIN's answer is lost, what began is rolled back.
        self.pending_begin = false;
        self.begun = true;
        Some("BEGIN ISOLATION LEVEL READ COMMITTED")
    }

    /// The answer of a statement sent with BEGIN or not (COMMIT's is the caller's).
    fn answered<T>(&mut self, pipelined: Pipelined<T>) -> StoreResult<T> {
        if let Some(Err(error)) = pipelined.begin {
            self.failed = true;
            return Err(error.into());
        }
        self.noted(pipelined.answer)
    }

    fn query(&mut self, sql: &str, params: &Params) -> StoreResult<Vec<Row>> {
        let statement = self.statement(sql)?;
        let begin = self.take_begin();
        let answer = self.conn.pipelined(begin, self.conn.client.query(&statement, params), false);
        self.answered(answer)
    }

    fn query_opt(&mut self, sql: &str, params: &Params) -> StoreResult<Option<Row>> {
        let statement = self.statement(sql)?;
        let begin = self.take_begin();
        let answer = self.conn.pipelined(begin, self.conn.client.query_opt(&statement, params), false);
        self.answered(answer)
    }

    fn execute(&mut self, sql: &str, params: &Params) -> StoreResult<u64> {
        let statement = self.statement(sql)?;
        let begin = self.take_begin();
        let answer = self.conn.pipelined(begin, self.conn.client.execute(&statement, params), false);
        self.answered(answer)
    }

    /// Runs the transaction's last statement, a ledger append, with COMMIT in the same round
    /// trip; from here on the connection is outside the transaction.
    fn query_opt_and_commit(&mut self, sql: &str, params: &Params) -> StoreResult<Option<Row>> {
        let statement = self.statement(sql)?;
        let begin = self.take_begin();
        self.ended = true;
        let answer = self.conn.pipelined(begin, self.conn.client.query_opt(&statement, params), true);
        let error = match answer {
            Pipelined { begin: Some(Err(error)), .. }
            | Pipelined { answer: Err(error), .. }
            | Pipelined { commit: Some(Err(error)), .. } => error,
            Pipelined { answer: Ok(row), .. } => {
                self.committed = true;
                return Ok(row);
            }
        };
        self.failed = true;
        if error.is_closed() || error.code().is_none() {
            return Err(StoreError::CommitUnknown(error.to_string()));
        }
        // A statement refused: PostgreSQL aborted the transaction, and the COMMIT that
        // followed rolled it back (or COMMIT itself failed and rolled back).
        Err(StoreError::from(error))
    }

    /// Begins the transaction before its first statement that reads or writes rules' rows
    /// (BEGIN goes with that statement).
    fn begin(&mut self) -> StoreResult<()> {
        self.open()?;
        if !self.begun {
            self.pending_begin = true;
        }
        Ok(())
    }

    /// The database's clock and, in the same statement, the running attempts.
    fn read_clock(&mut self) -> StoreResult<(i64, u64)> {
        self.begin()?;
        let columns: Vec<String> = ATTEMPT_COLUMNS.split(", ").map(|column| format!("a.{column}")).collect();
        // Only the locked job's attempts when the transaction decides on one job: the rows
        // read stay as few as that job's, however many attempts run elsewhere.
        let job = match self.held.jobs.len() {
            1 => self.held.jobs.iter().next().cloned(),
            _ => None,
        };
        let sql = format!(
            "SELECT now.ms, {} FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT AS ms) now \
             LEFT JOIN attempts a ON a.state = 'running' AND ($1::TEXT IS NULL OR a.job = $1) ORDER BY a.fence",
            columns.join(", ")
        );
        let rows = self.query(&sql, &[&job])?;
        let mono_ns = protocol::monotonic_ns();
        let ms: i64 = rows.first().ok_or_else(|| corrupt("database clock", "(none)"))?.try_get(0)?;
        let mut running = Vec::with_capacity(rows.len());
        for row in &rows {
            if row.try_get::<_, Option<String>>(1)?.is_some() {
                running.push(attempt_at(row, 1)?);
            }
        }
        self.running = Some((job, running));
        Ok((ms, mono_ns))
    }

    /// Whose token this is, as the tables say (a statement of its own).
    fn lookup(&mut self, token: &str) -> StoreResult<Option<Principal>> {
        if let Some(row) = self.query_opt("SELECT id, project FROM runners WHERE token = $1", &[&token])? {
            return Ok(Some(Principal::Runner { id: row.try_get(0)?, project: row.try_get(1)? }));
        }
        let row = self.query_opt("SELECT id FROM projects WHERE registration_token = $1", &[&token])?;
        row.map(|row| Ok(Principal::Registration { project: row.try_get(0)? })).transpose()
    }

    /// The job with the row lock `lock` (a `FOR …` clause); with `SKIP LOCKED`, `None` also
    /// when another transaction holds it.
    fn locked_job(&mut self, id: &str, lock: &str) -> StoreResult<Option<JobRow>> {
        self.begin()?;
        let waits = !lock.ends_with("SKIP LOCKED");
        let lock = if self.locks { lock } else { "" };
        if self.locks && waits {
            self.held.wait_job(id)?;
        }
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1{lock}");
        let job = self.query_opt(&sql, &[&id])?.as_ref().map(job_from).transpose()?;
        if self.locks && job.is_some() {
            self.held.jobs.insert(id.to_string());
        }
        Ok(job)
    }

    /// Checks that a write of `job` or its attempts is under the job's lock.
    fn writes(&self, job: &str) -> StoreResult<()> {
        match self.locks {
            true => self.held.writes(job),
            false => Ok(()),
        }
    }
}

fn corrupt(what: &str, value: &str) -> StoreError {
    StoreError::Corrupt(format!("{what} `{value}`"))
}

/// A typed word from its stored text; a word the type does not know is an error.
fn word<T: serde::de::DeserializeOwned>(what: &str, value: &str) -> StoreResult<T> {
    serde_json::from_value(serde_json::Value::String(value.to_string())).map_err(|_| corrupt(what, value))
}

fn optional_word<T: serde::de::DeserializeOwned>(what: &str, value: Option<String>) -> StoreResult<Option<T>> {
    value.map(|text| word(what, &text)).transpose()
}

fn enum_text<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        _ => unreachable!("store enums serialise as strings"),
    }
}

/// A stored BIGINT as an unsigned value; a negative one is corrupt.
fn unsigned<T: TryFrom<i64>>(what: &str, value: i64) -> StoreResult<T> {
    T::try_from(value).map_err(|_| corrupt(what, &value.to_string()))
}

/// An unsigned value as a BIGINT (the rules keep fences and times below `i64::MAX`).
fn signed(what: &str, value: u64) -> StoreResult<i64> {
    i64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what} {value} exceeds a BIGINT")))
}

const JOB_COLUMNS: &str = "id, project, deployment_key, steps, step_ms, state, current_attempt, outcome";
const ATTEMPT_COLUMNS: &str =
    "id, job, project, runner, fence, state, lease_expires_ms, claimed_ms, closed_by, outcome";
const LEDGER_COLUMNS: &str = "seq, kind, project, job, attempt, runner, fence, deployment_key, decision, reason, recorded_as, outcome, received_ms, observed_ms, mono_ns, lease_expires_ms";

fn job_from(row: &Row) -> StoreResult<JobRow> {
    Ok(JobRow {
        id: row.try_get(0)?,
        project: row.try_get(1)?,
        deployment_key: row.try_get(2)?,
        spec: JobSpec { steps: unsigned("steps", row.try_get(3)?)?, step_ms: unsigned("step_ms", row.try_get(4)?)? },
        state: word("job state", &row.try_get::<_, String>(5)?)?,
        current_attempt: row.try_get(6)?,
        outcome: optional_word("outcome", row.try_get(7)?)?,
    })
}

fn attempt_from(row: &Row) -> StoreResult<AttemptRow> {
    attempt_at(row, 0)
}

/// An attempt from the row's columns `first` onwards.
fn attempt_at(row: &Row, first: usize) -> StoreResult<AttemptRow> {
    Ok(AttemptRow {
        id: row.try_get(first)?,
        job: row.try_get(first + 1)?,
        project: row.try_get(first + 2)?,
        runner: row.try_get(first + 3)?,
        fence: unsigned("fence", row.try_get(first + 4)?)?,
        state: word("attempt state", &row.try_get::<_, String>(first + 5)?)?,
        lease_expires_ms: row.try_get(first + 6)?,
        claimed_ms: row.try_get(first + 7)?,
        closed_by: optional_word("closed_by", row.try_get(first + 8)?)?,
        outcome: optional_word("outcome", row.try_get(first + 9)?)?,
    })
}

fn ledger_from(row: &Row) -> StoreResult<LedgerEntry> {
    Ok(LedgerEntry {
        seq: unsigned("seq", row.try_get(0)?)?,
        kind: word("ledger kind", &row.try_get::<_, String>(1)?)?,
        project: row.try_get(2)?,
        job: row.try_get(3)?,
        attempt: row.try_get(4)?,
        runner: row.try_get(5)?,
        fence: row.try_get::<_, Option<i64>>(6)?.map(|fence| unsigned("fence", fence)).transpose()?,
        deployment_key: row.try_get(7)?,
        decision: optional_word("decision", row.try_get(8)?)?,
        reason: row.try_get(9)?,
        recorded_as: optional_word("recorded_as", row.try_get(10)?)?,
        outcome: optional_word("outcome", row.try_get(11)?)?,
        received_ms: row.try_get(12)?,
        observed_ms: row.try_get(13)?,
        mono_ns: unsigned("mono_ns", row.try_get(14)?)?,
        lease_expires_ms: row.try_get(15)?,
    })
}

fn rows<T>(rows: Vec<Row>, from: fn(&Row) -> StoreResult<T>) -> StoreResult<Vec<T>> {
    rows.iter().map(from).collect()
}

fn state_list(states: &[impl serde::Serialize]) -> String {
    let words: Vec<String> = states.iter().map(|state| format!("'{}'", enum_text(state))).collect();
    words.join(", ")
}

impl Tx for PgTx<'_> {
    fn clock(&mut self) -> StoreResult<Option<(i64, u64)>> {
        if !self.database_clock {
            return Ok(None);
        }
        if self.clock.is_none() {
            self.clock = Some(self.read_clock()?);
        }
        Ok(self.clock)
    }

    fn principal(&mut self, token: &str) -> StoreResult<Option<Principal>> {
        if !token.is_empty() && token == self.operator_token {
            return Ok(Some(Principal::Operator));
        }
        let known = self.principals.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(token).cloned();
        if known.is_some() {
            return Ok(known);
        }
        let found = self.lookup(token)?;
        if let Some(principal) = &found {
            let mut principals = self.principals.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if principals.len() >= PRINCIPALS_MAX {
                principals.clear();
            }
            principals.insert(token.to_string(), principal.clone());
        }
        Ok(found)
    }

    fn insert_project(&mut self, id: &str, registration_token: &str) -> StoreResult<bool> {
        self.begin()?;
        let sql = "INSERT INTO projects (id, registration_token) VALUES ($1, $2) ON CONFLICT DO NOTHING";
        Ok(self.execute(sql, &[&id, &registration_token])? == 1)
    }

    fn project_exists(&mut self, id: &str) -> StoreResult<bool> {
        self.begin()?;
        Ok(self.query_opt("SELECT 1 FROM projects WHERE id = $1", &[&id])?.is_some())
    }

    fn insert_runner(&mut self, id: &str, project: &str, token: &str) -> StoreResult<bool> {
        self.begin()?;
        let sql = "INSERT INTO runners (id, project, token) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
        Ok(self.execute(sql, &[&id, &project, &token])? == 1)
    }

    fn next_counter(&mut self, name: &str) -> StoreResult<u64> {
        self.begin()?;
        if self.locks {
            self.held.wait_counter(name)?;
        }
        let sql = "INSERT INTO counters (name, value) VALUES ($1, 1) \
                   ON CONFLICT (name) DO UPDATE SET value = counters.value + 1 RETURNING value";
        let row = self.query_opt(sql, &[&name])?.ok_or_else(|| corrupt("counter", name))?;
        unsigned("counter", row.try_get(0)?)
    }

    /// The job's order is the next value of the `job-order` counter, and its key gets its
    /// row (the one claims of the key lock) when it has none: one statement.
    fn insert_job(&mut self, job: &JobRow) -> StoreResult<bool> {
        self.begin()?;
        if self.locks {
            self.held.wait_counter("job-order")?;
        }
        let (steps, step_ms) = (i64::from(job.spec.steps), signed("step_ms", job.spec.step_ms)?);
        let state = enum_text(&job.state);
        let outcome = job.outcome.map(|outcome| enum_text(&outcome));
        let sql = "WITH next AS (INSERT INTO counters (name, value) VALUES ('job-order', 1)
                     ON CONFLICT (name) DO UPDATE SET value = counters.value + 1 RETURNING value),
                   key_row AS (INSERT INTO deployment_keys (key) VALUES ($3) ON CONFLICT DO NOTHING)
                   INSERT INTO jobs (id, project, deployment_key, steps, step_ms, state, current_attempt, outcome, created)
                   SELECT $1, $2, $3, $4, $5, $6, $7, $8, next.value FROM next ON CONFLICT DO NOTHING";
        let inserted = self.execute(
            sql,
            &[&job.id, &job.project, &job.deployment_key, &steps, &step_ms, &state, &job.current_attempt, &outcome],
        )?;
        Ok(inserted == 1)
    }

    fn job(&mut self, id: &str) -> StoreResult<Option<JobRow>> {
        self.begin()?;
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1");
        self.query_opt(&sql, &[&id])?.as_ref().map(job_from).transpose()
    }

    fn jobs(&mut self) -> StoreResult<Vec<JobRow>> {
        self.begin()?;
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs ORDER BY created");
        rows(self.query(&sql, &[])?, job_from)
    }

    fn lock_key(&mut self, key: &str) -> StoreResult<()> {
        self.begin()?;
        if self.locks {
            self.held.wait_key(key)?;
            let sql = "SELECT 1 FROM deployment_keys WHERE key = $1 FOR NO KEY UPDATE";
            self.query_opt(sql, &[&key])?.ok_or_else(|| corrupt("deployment key without its row", key))?;
        }
        Ok(())
    }

    fn try_lock_key(&mut self, key: &str) -> StoreResult<bool> {
        self.begin()?;
        if !self.locks {
            return Ok(true);
        }
        let sql = "SELECT 1 FROM deployment_keys WHERE key = $1 FOR NO KEY UPDATE SKIP LOCKED";
        let locked = self.query_opt(sql, &[&key])?.is_some();
        self.held.keys += usize::from(locked);
        Ok(locked)
    }

    fn lock_job(&mut self, id: &str) -> StoreResult<Option<JobRow>> {
        self.locked_job(id, " FOR NO KEY UPDATE")
    }

    fn try_lock_job(&mut self, id: &str) -> StoreResult<Option<JobRow>> {
        self.locked_job(id, " FOR NO KEY UPDATE SKIP LOCKED")
    }

    /// `FOR SHARE`: a reader's lock (a transaction holding it writes nothing, so that a cut
    /// COMMIT of it is not taken for a write's).
    fn share_job(&mut self, id: &str) -> StoreResult<Option<JobRow>> {
        self.locked_job(id, " FOR SHARE")
    }

    fn jobs_on_key(&mut self, key: &str, states: &[JobState]) -> StoreResult<Vec<JobRow>> {
        self.begin()?;
        if states.is_empty() {
            return Ok(vec![]);
        }
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE deployment_key = $1 AND state IN ({}) ORDER BY created",
            state_list(states)
        );
        rows(self.query(&sql, &[&key])?, job_from)
    }

    fn attempt(&mut self, id: &str) -> StoreResult<Option<AttemptRow>> {
        self.begin()?;
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE id = $1");
        self.query_opt(&sql, &[&id])?.as_ref().map(attempt_from).transpose()
    }

    fn attempts_of(&mut self, job: &str) -> StoreResult<Vec<AttemptRow>> {
        self.begin()?;
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job = $1 ORDER BY fence");
        rows(self.query(&sql, &[&job])?, attempt_from)
    }

    fn jobs_in(&mut self, project: Option<&str>, states: &[JobState]) -> StoreResult<Vec<JobRow>> {
        self.begin()?;
        if states.is_empty() {
            return Ok(vec![]);
        }
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE ($1::TEXT IS NULL OR project = $1) AND state IN ({}) ORDER BY created",
            state_list(states)
        );
        rows(self.query(&sql, &[&project])?, job_from)
    }

    fn insert_attempt(&mut self, attempt: &AttemptRow) -> StoreResult<()> {
        self.begin()?;
        self.writes(&attempt.job)?;
        let fence = signed("fence", attempt.fence)?;
        let state = enum_text(&attempt.state);
        let closed_by = attempt.closed_by.map(|closed_by| closed_by.as_str());
        let outcome = attempt.outcome.map(|outcome| enum_text(&outcome));
        let sql = format!("INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)");
        self.execute(
            &sql,
            &[
                &attempt.id,
                &attempt.job,
                &attempt.project,
                &attempt.runner,
                &fence,
                &state,
                &attempt.lease_expires_ms,
                &attempt.claimed_ms,
                &closed_by,
                &outcome,
            ],
        )?;
        Ok(())
    }

    fn update_job(&mut self, job: &JobRow) -> StoreResult<()> {
        self.begin()?;
        self.writes(&job.id)?;
        let state = enum_text(&job.state);
        let outcome = job.outcome.map(|outcome| enum_text(&outcome));
        let sql = "UPDATE jobs SET state = $2, current_attempt = $3, outcome = $4 WHERE id = $1";
        self.execute(sql, &[&job.id, &state, &job.current_attempt, &outcome])?;
        Ok(())
    }

    fn guarded_update(&mut self, guard: &Guard, change: &AttemptChange) -> StoreResult<Option<String>> {
        self.begin()?;
        self.writes(&guard.job)?;
        let shape = GuardSql::of(guard)?;
        let sql = format!(
            "UPDATE attempts SET state = $1, lease_expires_ms = COALESCE($2, lease_expires_ms), \
             closed_by = COALESCE($3, closed_by), outcome = COALESCE($4, outcome) WHERE {} RETURNING id",
            shape.predicates.join(" AND ")
        );
        let values = ChangeValues::of(change);
        let mut params = values.params();
        params.extend(shape.values.iter().map(|value| value.as_param()));
        let updated = self.query(&sql, &params)?;
        assert!(updated.len() <= 1, "a guarded update matched {} attempts", updated.len());
        updated.first().map(|row| Ok(row.try_get(0)?)).transpose()
    }

    fn unguarded_update(&mut self, attempt: &str, change: &AttemptChange) -> StoreResult<bool> {
        self.begin()?;
        let values = ChangeValues::of(change);
        let mut params = values.params();
        params.push(&attempt);
        let changed = self.execute(
            "UPDATE attempts SET state = $1, lease_expires_ms = COALESCE($2, lease_expires_ms), \
             closed_by = COALESCE($3, closed_by), outcome = COALESCE($4, outcome) WHERE id = $5",
            &params,
        )?;
        Ok(changed == 1)
    }

    fn running_attempts(&mut self) -> StoreResult<Vec<AttemptRow>> {
        if let Some((None, running)) = self.running.take() {
            return Ok(running);
        }
        self.begin()?;
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE state = 'running' ORDER BY fence");
        rows(self.query(&sql, &[])?, attempt_from)
    }

    fn running_attempts_of(&mut self, job: &str) -> StoreResult<Vec<AttemptRow>> {
        match self.running.take() {
            Some((Some(read), running)) if read == job => return Ok(running),
            Some((None, running)) => return Ok(running.into_iter().filter(|attempt| attempt.job == job).collect()),
            _ => {}
        }
        self.begin()?;
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job = $1 AND state = 'running' ORDER BY fence");
        rows(self.query(&sql, &[&job])?, attempt_from)
    }

    fn claimable_job(
        &mut self,
        project: &str,
        holding: &[JobState],
        busy: &std::collections::HashSet<String>,
    ) -> StoreResult<Option<JobRow>> {
        self.begin()?;
        let busy: Vec<&str> = busy.iter().map(String::as_str).collect();
        let not_busy = "NOT (q.deployment_key = ANY($2::TEXT[]))";
        let sql = super::store::claimable_sql(JOB_COLUMNS, holding, "$1", not_busy);
        self.query_opt(&sql, &[&project, &busy])?.as_ref().map(job_from).transpose()
    }

    fn append_ledger(&mut self, entries: &[LedgerEntry]) -> StoreResult<Vec<u64>> {
        if self.held.ledger {
            return Err(StoreError::LockOrder("a second ledger append in one transaction".into()));
        }
        if entries.is_empty() {
            return Ok(vec![]);
        }
        self.begin()?;
        self.held.ledger = true;
        // The next value of a durable counter row, taken in the same statement and rolled
        // back with the transaction. The row stays locked until COMMIT, so the next
        // transaction to take it waits for this one to commit or roll back: one past the
        // largest committed, gapless and in commit order. The append is the transaction's
        // last write and COMMIT goes with its last entry, in one round trip: the row is held
        // while the server inserts and commits, never while an answer travels.
        let sql = "WITH next AS (INSERT INTO counters (name, value) VALUES ('ledger-seq', 1)
                     ON CONFLICT (name) DO UPDATE SET value = counters.value + 1 RETURNING value)
                   INSERT INTO ledger (seq, kind, project, job, attempt, runner, fence, deployment_key, decision, reason,
                   recorded_as, outcome, received_ms, observed_ms, mono_ns, lease_expires_ms)
                   SELECT next.value, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15
                   FROM next RETURNING seq";
        let mut seqs = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let fence = entry.fence.map(|fence| signed("fence", fence)).transpose()?;
            let decision = entry.decision.map(|decision| enum_text(&decision));
            let recorded_as = entry.recorded_as.map(|word| word.as_str());
            let outcome = entry.outcome.map(|word| word.as_str());
            let mono_ns = signed("mono_ns", entry.mono_ns)?;
            let params: [&(dyn ToSql + Sync); 15] = [
                &entry.kind.as_str(),
                &entry.project,
                &entry.job,
                &entry.attempt,
                &entry.runner,
                &fence,
                &entry.deployment_key,
                &decision,
                &entry.reason,
                &recorded_as,
                &outcome,
                &entry.received_ms,
                &entry.observed_ms,
                &mono_ns,
                &entry.lease_expires_ms,
            ];
            let row = match self.commit_with_ledger && index + 1 == entries.len() {
                true => self.query_opt_and_commit(sql, &params)?,
                false => self.query_opt(sql, &params)?,
            };
            let row = row.ok_or_else(|| corrupt("ledger append", "no row"))?;
            seqs.push(unsigned("seq", row.try_get(0)?)?);
        }
        Ok(seqs)
    }

    /// A page of the ledger needs no lock: a sequence number is taken only once every smaller
    /// one has committed (see `append_ledger`), so what one statement sees is always a prefix
    /// of the ledger.
    fn ledger_after(&mut self, after_seq: u64, limit: u32) -> StoreResult<Vec<LedgerEntry>> {
        let after = signed("seq", after_seq.min(i64::MAX as u64))?;
        let limit = i64::from(limit);
        let sql = format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE seq > $1 ORDER BY seq LIMIT $2");
        rows(self.query(&sql, &[&after, &limit])?, ledger_from)
    }

    fn ledger_of(&mut self, job: &str) -> StoreResult<Vec<LedgerEntry>> {
        self.begin()?;
        let sql = format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE job = $1 ORDER BY seq");
        rows(self.query(&sql, &[&job])?, ledger_from)
    }
}

/// The values a change writes, as `$1` to `$4`.
struct ChangeValues {
    state: String,
    lease_expires_ms: Option<i64>,
    closed_by: Option<&'static str>,
    outcome: Option<String>,
}

impl ChangeValues {
    fn of(change: &AttemptChange) -> ChangeValues {
        ChangeValues {
            state: enum_text(&change.state),
            lease_expires_ms: change.lease_expires_ms,
            closed_by: change.closed_by.map(|closed_by| closed_by.as_str()),
            outcome: change.outcome.map(|outcome| enum_text(&outcome)),
        }
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![&self.state, &self.lease_expires_ms, &self.closed_by, &self.outcome]
    }
}

enum GuardValue {
    Text(String),
    Int(i64),
}

impl GuardValue {
    fn as_param(&self) -> &(dyn ToSql + Sync) {
        match self {
            GuardValue::Text(text) => text,
            GuardValue::Int(number) => number,
        }
    }
}

/// The WHERE clause of a guarded update; placeholders start at `$5` (after the change's four).
struct GuardSql {
    predicates: Vec<String>,
    values: Vec<GuardValue>,
}

impl GuardSql {
    fn of(guard: &Guard) -> StoreResult<GuardSql> {
        let mut shape = GuardSql { predicates: vec![], values: vec![] };
        shape.add("job = $", GuardValue::Text(guard.job.clone()));
        if let Some(project) = &guard.project {
            shape.add("project = $", GuardValue::Text(project.clone()));
        }
        if let Some(attempt) = &guard.attempt {
            shape.add("id = $", GuardValue::Text(attempt.clone()));
        }
        if let Some(runner) = &guard.runner {
            shape.add("runner = $", GuardValue::Text(runner.clone()));
        }
        if let Some(fence) = guard.fence {
            shape.add("fence = $", GuardValue::Int(signed("fence", fence)?));
        }
        if let Some(fence) = guard.fence_at_most {
            shape.add("fence <= $", GuardValue::Int(signed("fence", fence)?));
        }
        if guard.current {
            shape.add("id = (SELECT current_attempt FROM jobs WHERE jobs.id = $)", GuardValue::Text(guard.job.clone()));
        }
        if let Some(now_ms) = guard.lease_valid_at_ms {
            shape.add("lease_expires_ms > $", GuardValue::Int(now_ms));
        }
        assert!(!guard.states.is_empty(), "a guard names the states it allows");
        shape.predicates.push(format!("state IN ({})", state_list(&guard.states)));
        Ok(shape)
    }

    fn add(&mut self, predicate: &str, value: GuardValue) {
        self.values.push(value);
        self.predicates.push(predicate.replace('$', &format!("${}", self.values.len() + 4)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::AttemptState;

    #[test]
    fn the_schemas_relations_are_every_table_and_index_it_creates() {
        let schema = schema();
        let created: Vec<&str> =
            schema.split("IF NOT EXISTS ").skip(1).filter_map(|rest| rest.split([' ', '(', ';']).next()).collect();
        let mut listed = SCHEMA_RELATIONS.to_vec();
        let mut created_sorted = created.clone();
        listed.sort_unstable();
        created_sorted.sort_unstable();
        assert_eq!(created_sorted, listed, "SCHEMA_RELATIONS names what schema() creates");
    }

    #[test]
    fn guard_placeholders_follow_the_change() {
        let guard = Guard {
            job: "j1".into(),
            attempt: Some("j1-a1".into()),
            fence: Some(7),
            current: true,
            states: vec![AttemptState::Running],
            ..Guard::default()
        };
        let shape = GuardSql::of(&guard).unwrap();
        assert_eq!(shape.predicates[0], "job = $5");
        assert_eq!(shape.predicates[2], "fence = $7");
        assert_eq!(shape.predicates[3], "id = (SELECT current_attempt FROM jobs WHERE jobs.id = $8)");
        assert_eq!(shape.predicates[4], "state IN ('running')");
        assert_eq!(shape.values.len(), 4);
    }

    #[test]
    fn schema_names_are_plain_identifiers() {
        for good in ["fencelab", "run_0001", "a"] {
            assert!(valid_schema(good), "{good}");
        }
        for bad in ["", "1run", "Run", "a-b", "a;drop", "pg_catalog", &"x".repeat(64)] {
            assert!(!valid_schema(bad), "{bad}");
        }
    }

    #[test]
    fn a_stored_word_the_type_does_not_know_is_an_error() {
        assert!(word::<JobState>("job state", "queued").is_ok());
        assert!(matches!(word::<JobState>("job state", "paused"), Err(StoreError::Corrupt(_))));
        assert!(matches!(unsigned::<u64>("fence", -1), Err(StoreError::Corrupt(_))));
    }
}
