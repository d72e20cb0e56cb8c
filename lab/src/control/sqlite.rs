//! The SQLite store: one file, WAL journal, one connection behind a mutex.
//!
//! `synchronous=NORMAL` in WAL mode makes every committed transaction survive a killed
//! process (the durability a control-plane restart needs); only an operating-system crash
//! may lose the last commits.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::store::{self, AttemptChange, AttemptRow, Guard, JobRow, Principal, Store, StoreError, StoreResult, Tx};
use protocol::{JobSpec, JobState, LedgerEntry};

/// The store's tables: SQLite's 64-bit `INTEGER`, the ledger's `seq` its rowid.
fn schema() -> String {
    format!("\n{}", store::tables_sql("INTEGER", "INTEGER PRIMARY KEY AUTOINCREMENT"))
}

pub struct Sqlite {
    connection: Mutex<Connection>,
    operator_token: String,
    /// Whether a transaction's instant is this process's clock read once the transaction
    /// holds the store (after any wait for it), rather than the request's receipt.
    process_clock: bool,
}

impl Sqlite {
    pub fn open(path: &Path, operator_token: &str) -> StoreResult<Sqlite> {
        let connection = Connection::open(path)?;
        connection.pragma_update(None, "journal_mode", "WAL")?;
        connection.pragma_update(None, "synchronous", "NORMAL")?;
        connection.pragma_update(None, "foreign_keys", "ON")?;
        connection.busy_timeout(std::time::Duration::from_secs(5))?;
        connection.execute_batch(&schema())?;
        Ok(Sqlite {
            connection: Mutex::new(connection),
            operator_token: operator_token.to_string(),
            process_clock: false,
        })
    }

    /// Decides every lease on this process's clock read once a transaction holds the store,
    /// so that a wait for the store (every request queues for its one connection) never ages
    /// the instant a decision is taken at. Without it (tests that set the clock), the
    /// instant is the request's receipt.
    pub fn with_process_clock(mut self) -> Sqlite {
        self.process_clock = true;
        self
    }

    fn run<T, E: From<StoreError>>(
        &self,
        commit: bool,
        work: impl FnOnce(&mut dyn Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut connection = self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let transaction =
            connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(StoreError::from)?;
        let mut tx = SqliteTx {
            tx: &transaction,
            operator_token: &self.operator_token,
            process_clock: self.process_clock,
            clock: None,
        };
        let value = work(&mut tx)?;
        if commit {
            transaction.commit().map_err(StoreError::from)?;
        }
        Ok(value)
    }
}

impl Store for Sqlite {
    fn transact<T, E: From<StoreError>>(&self, work: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E> {
        self.run(true, work)
    }

    fn dry_run<T, E: From<StoreError>>(&self, work: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E> {
        self.run(false, work)
    }
}

struct SqliteTx<'a> {
    tx: &'a rusqlite::Transaction<'a>,
    operator_token: &'a str,
    process_clock: bool,
    /// The process's clock, read when the rules first asked (Unix ms, monotonic ns).
    clock: Option<(i64, u64)>,
}

fn corrupt(what: &str, value: &str) -> StoreError {
    StoreError::Corrupt(format!("{what} `{value}`"))
}

fn parse_enum<T: serde::de::DeserializeOwned>(what: &str, value: &str) -> StoreResult<T> {
    serde_json::from_value(serde_json::Value::String(value.to_string())).map_err(|_| corrupt(what, value))
}

fn enum_text<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        _ => unreachable!("store enums serialise as strings"),
    }
}

const JOB_COLUMNS: &str = "id, project, deployment_key, steps, step_ms, state, current_attempt, outcome";
const ATTEMPT_COLUMNS: &str =
    "id, job, project, runner, fence, state, lease_expires_ms, claimed_ms, closed_by, outcome";
const LEDGER_COLUMNS: &str = "seq, kind, project, job, attempt, runner, fence, deployment_key, decision, reason, recorded_as, outcome, received_ms, observed_ms, mono_ns, lease_expires_ms";

struct RawJob(String, String, String, u32, u64, String, Option<String>, Option<String>);

fn raw_job(row: &Row) -> rusqlite::Result<RawJob> {
    Ok(RawJob(row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?, row.get(6)?, row.get(7)?))
}

fn job_from(raw: RawJob) -> StoreResult<JobRow> {
    Ok(JobRow {
        id: raw.0,
        project: raw.1,
        deployment_key: raw.2,
        spec: JobSpec { steps: raw.3, step_ms: raw.4 },
        state: parse_enum("job state", &raw.5)?,
        current_attempt: raw.6,
        outcome: raw.7.map(|text| parse_enum("outcome", &text)).transpose()?,
    })
}

type RawAttempt = (String, String, String, String, u64, String, i64, i64, Option<String>, Option<String>);

fn raw_attempt(row: &Row) -> rusqlite::Result<RawAttempt> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
        row.get(8)?,
        row.get(9)?,
    ))
}

fn attempt_from(raw: RawAttempt) -> StoreResult<AttemptRow> {
    Ok(AttemptRow {
        id: raw.0,
        job: raw.1,
        project: raw.2,
        runner: raw.3,
        fence: raw.4,
        state: parse_enum("attempt state", &raw.5)?,
        lease_expires_ms: raw.6,
        claimed_ms: raw.7,
        closed_by: raw.8.map(|text| parse_enum("closed_by", &text)).transpose()?,
        outcome: raw.9.map(|text| parse_enum("outcome", &text)).transpose()?,
    })
}

/// A column holding a typed word; a word the type does not know is an error, never `None`.
fn word_column<T: serde::de::DeserializeOwned>(row: &Row, index: usize) -> rusqlite::Result<Option<T>> {
    let text: Option<String> = row.get(index)?;
    text.map(|text| {
        serde_json::from_value(serde_json::Value::String(text)).map_err(|error| {
            rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, Box::new(error))
        })
    })
    .transpose()
}

fn ledger_from(row: &Row) -> rusqlite::Result<LedgerEntry> {
    let kind = word_column(row, 1)?.ok_or(rusqlite::Error::FromSqlConversionFailure(
        1,
        rusqlite::types::Type::Null,
        "no kind".into(),
    ))?;
    Ok(LedgerEntry {
        seq: row.get(0)?,
        kind,
        project: row.get(2)?,
        job: row.get(3)?,
        attempt: row.get(4)?,
        runner: row.get(5)?,
        fence: row.get(6)?,
        deployment_key: row.get(7)?,
        decision: word_column(row, 8)?,
        reason: row.get(9)?,
        recorded_as: word_column(row, 10)?,
        outcome: word_column(row, 11)?,
        received_ms: row.get(12)?,
        observed_ms: row.get(13)?,
        mono_ns: row.get(14)?,
        lease_expires_ms: row.get(15)?,
    })
}

fn is_constraint(error: &rusqlite::Error) -> bool {
    matches!(error, rusqlite::Error::SqliteFailure(failure, _) if failure.code == rusqlite::ErrorCode::ConstraintViolation)
}

/// Turns a uniqueness violation into `false` and anything else into an error.
fn inserted(result: rusqlite::Result<usize>) -> StoreResult<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(error) if is_constraint(&error) => Ok(false),
        Err(error) => Err(error.into()),
    }
}

impl Tx for SqliteTx<'_> {
    fn clock(&mut self) -> StoreResult<Option<(i64, u64)>> {
        if !self.process_clock {
            return Ok(None);
        }
        if self.clock.is_none() {
            let now = super::rules::Now::read();
            self.clock = Some((now.ms, now.mono_ns));
        }
        Ok(self.clock)
    }

    fn principal(&mut self, token: &str) -> StoreResult<Option<Principal>> {
        if !token.is_empty() && token == self.operator_token {
            return Ok(Some(Principal::Operator));
        }
        let runner = self
            .tx
            .query_row("SELECT id, project FROM runners WHERE token = ?1", [token], |row| {
                Ok(Principal::Runner { id: row.get(0)?, project: row.get(1)? })
            })
            .optional()?;
        if runner.is_some() {
            return Ok(runner);
        }
        Ok(self
            .tx
            .query_row("SELECT id FROM projects WHERE registration_token = ?1", [token], |row| {
                Ok(Principal::Registration { project: row.get(0)? })
            })
            .optional()?)
    }

    fn insert_project(&mut self, id: &str, registration_token: &str) -> StoreResult<bool> {
        inserted(
            self.tx.execute("INSERT INTO projects (id, registration_token) VALUES (?1, ?2)", [id, registration_token]),
        )
    }

    fn project_exists(&mut self, id: &str) -> StoreResult<bool> {
        Ok(self.tx.query_row("SELECT 1 FROM projects WHERE id = ?1", [id], |_| Ok(())).optional()?.is_some())
    }

    fn insert_runner(&mut self, id: &str, project: &str, token: &str) -> StoreResult<bool> {
        inserted(self.tx.execute("INSERT INTO runners (id, project, token) VALUES (?1, ?2, ?3)", [id, project, token]))
    }

    fn next_counter(&mut self, name: &str) -> StoreResult<u64> {
        self.tx.execute(
            "INSERT INTO counters (name, value) VALUES (?1, 1) ON CONFLICT(name) DO UPDATE SET value = value + 1",
            [name],
        )?;
        Ok(self.tx.query_row("SELECT value FROM counters WHERE name = ?1", [name], |row| row.get(0))?)
    }

    fn insert_job(&mut self, job: &JobRow) -> StoreResult<bool> {
        let created = self.next_counter("job-order")?;
        inserted(self.tx.execute(
            "INSERT INTO jobs (id, project, deployment_key, steps, step_ms, state, current_attempt, outcome, created)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                job.id,
                job.project,
                job.deployment_key,
                job.spec.steps,
                job.spec.step_ms,
                enum_text(&job.state),
                job.current_attempt,
                job.outcome.map(|outcome| enum_text(&outcome)),
                created
            ],
        ))
    }

    fn job(&mut self, id: &str) -> StoreResult<Option<JobRow>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1");
        self.tx.query_row(&sql, [id], raw_job).optional()?.map(job_from).transpose()
    }

    fn jobs(&mut self) -> StoreResult<Vec<JobRow>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs ORDER BY created");
        let mut statement = self.tx.prepare_cached(&sql)?;
        let raws = statement.query_map([], raw_job)?.collect::<rusqlite::Result<Vec<_>>>()?;
        raws.into_iter().map(job_from).collect()
    }

    /// Every transaction here holds the one writer's lock (`BEGIN IMMEDIATE`): no other
    /// writer runs, so there is no row of its own to lock.
    fn lock_key(&mut self, _key: &str) -> StoreResult<()> {
        Ok(())
    }

    fn try_lock_key(&mut self, _key: &str) -> StoreResult<bool> {
        Ok(true)
    }

    fn lock_job(&mut self, id: &str) -> StoreResult<Option<JobRow>> {
        self.job(id)
    }

    fn try_lock_job(&mut self, id: &str) -> StoreResult<Option<JobRow>> {
        self.job(id)
    }

    fn share_job(&mut self, id: &str) -> StoreResult<Option<JobRow>> {
        self.job(id)
    }

    fn jobs_on_key(&mut self, key: &str, states: &[JobState]) -> StoreResult<Vec<JobRow>> {
        let states: Vec<String> = states.iter().map(|state| format!("'{}'", enum_text(state))).collect();
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE deployment_key = ?1 AND state IN ({}) ORDER BY created",
            states.join(", ")
        );
        let mut statement = self.tx.prepare_cached(&sql)?;
        let raws = statement.query_map([key], raw_job)?.collect::<rusqlite::Result<Vec<_>>>()?;
        raws.into_iter().map(job_from).collect()
    }

    fn attempt(&mut self, id: &str) -> StoreResult<Option<AttemptRow>> {
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE id = ?1");
        self.tx.query_row(&sql, [id], raw_attempt).optional()?.map(attempt_from).transpose()
    }

    fn attempts_of(&mut self, job: &str) -> StoreResult<Vec<AttemptRow>> {
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job = ?1 ORDER BY fence");
        let mut statement = self.tx.prepare_cached(&sql)?;
        let raws = statement.query_map([job], raw_attempt)?.collect::<rusqlite::Result<Vec<_>>>()?;
        raws.into_iter().map(attempt_from).collect()
    }

    fn claimable_job(
        &mut self,
        project: &str,
        holding: &[JobState],
        busy: &std::collections::HashSet<String>,
    ) -> StoreResult<Option<JobRow>> {
        let not_busy = "q.deployment_key NOT IN (SELECT value FROM json_each(?2))";
        let sql = super::store::claimable_sql(JOB_COLUMNS, holding, "?1", not_busy);
        let busy = serde_json::to_string(&busy.iter().collect::<Vec<_>>())
            .map_err(|error| corrupt("busy keys", &error.to_string()))?;
        let mut statement = self.tx.prepare_cached(&sql)?;
        let raw = statement.query_map(params![project, busy], raw_job)?.next().transpose()?;
        raw.map(job_from).transpose()
    }

    fn jobs_in(&mut self, project: Option<&str>, states: &[JobState]) -> StoreResult<Vec<JobRow>> {
        let states: Vec<String> = states.iter().map(|state| format!("'{}'", enum_text(state))).collect();
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE (?1 IS NULL OR project = ?1) AND state IN ({}) ORDER BY created",
            states.join(", ")
        );
        let mut statement = self.tx.prepare_cached(&sql)?;
        let raws = statement.query_map([project], raw_job)?.collect::<rusqlite::Result<Vec<_>>>()?;
        raws.into_iter().map(job_from).collect()
    }

    fn insert_attempt(&mut self, attempt: &AttemptRow) -> StoreResult<()> {
        self.tx.execute(
            &format!("INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
            params![
                attempt.id,
                attempt.job,
                attempt.project,
                attempt.runner,
                attempt.fence,
                enum_text(&attempt.state),
                attempt.lease_expires_ms,
                attempt.claimed_ms,
                attempt.closed_by.map(|closed_by| closed_by.as_str()),
                attempt.outcome.map(|outcome| enum_text(&outcome))
            ],
        )?;
        Ok(())
    }

    fn update_job(&mut self, job: &JobRow) -> StoreResult<()> {
        self.tx.execute(
            "UPDATE jobs SET state = ?2, current_attempt = ?3, outcome = ?4 WHERE id = ?1",
            params![job.id, enum_text(&job.state), job.current_attempt, job.outcome.map(|outcome| enum_text(&outcome))],
        )?;
        Ok(())
    }

    fn guarded_update(&mut self, guard: &Guard, change: &AttemptChange) -> StoreResult<Option<String>> {
        let (predicates, mut values) = guard_sql(guard);
        let mut sql = String::from(
            "UPDATE attempts SET state = ?1, lease_expires_ms = COALESCE(?2, lease_expires_ms), \
             closed_by = COALESCE(?3, closed_by), outcome = COALESCE(?4, outcome) WHERE ",
        );
        sql.push_str(&predicates.join(" AND "));
        sql.push_str(" RETURNING id");
        let mut all: Vec<rusqlite::types::Value> = change_values(change);
        all.append(&mut values);
        let updated: Vec<String> = self
            .tx
            .prepare(&sql)?
            .query_map(rusqlite::params_from_iter(all), |row| row.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        assert!(updated.len() <= 1, "a guarded update matched {} attempts", updated.len());
        Ok(updated.into_iter().next())
    }

    fn unguarded_update(&mut self, attempt: &str, change: &AttemptChange) -> StoreResult<bool> {
        let mut values = change_values(change);
        values.push(attempt.to_string().into());
        let changed = self.tx.execute(
            "UPDATE attempts SET state = ?1, lease_expires_ms = COALESCE(?2, lease_expires_ms), \
             closed_by = COALESCE(?3, closed_by), outcome = COALESCE(?4, outcome) WHERE id = ?5",
            rusqlite::params_from_iter(values),
        )?;
        Ok(changed == 1)
    }

    fn running_attempts(&mut self) -> StoreResult<Vec<AttemptRow>> {
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE state = 'running' ORDER BY fence");
        let mut statement = self.tx.prepare_cached(&sql)?;
        let raws = statement.query_map([], raw_attempt)?.collect::<rusqlite::Result<Vec<_>>>()?;
        raws.into_iter().map(attempt_from).collect()
    }

    fn running_attempts_of(&mut self, job: &str) -> StoreResult<Vec<AttemptRow>> {
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job = ?1 AND state = 'running' ORDER BY fence");
        let mut statement = self.tx.prepare_cached(&sql)?;
        let raws = statement.query_map([job], raw_attempt)?.collect::<rusqlite::Result<Vec<_>>>()?;
        raws.into_iter().map(attempt_from).collect()
    }

    fn append_ledger(&mut self, entries: &[LedgerEntry]) -> StoreResult<Vec<u64>> {
        let mut seqs = Vec::with_capacity(entries.len());
        for entry in entries {
            self.tx.execute(
                "INSERT INTO ledger (kind, project, job, attempt, runner, fence, deployment_key, decision, reason,
             recorded_as, outcome, received_ms, observed_ms, mono_ns, lease_expires_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                params![
                    entry.kind.as_str(),
                    entry.project,
                    entry.job,
                    entry.attempt,
                    entry.runner,
                    entry.fence,
                    entry.deployment_key,
                    entry.decision.map(|decision| enum_text(&decision)),
                    entry.reason,
                    entry.recorded_as.map(|word| word.as_str()),
                    entry.outcome.map(|word| word.as_str()),
                    entry.received_ms,
                    entry.observed_ms,
                    entry.mono_ns,
                    entry.lease_expires_ms
                ],
            )?;
            seqs.push(self.tx.last_insert_rowid() as u64);
        }
        Ok(seqs)
    }

    fn ledger_after(&mut self, after_seq: u64, limit: u32) -> StoreResult<Vec<LedgerEntry>> {
        let sql = format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE seq > ?1 ORDER BY seq LIMIT ?2");
        let mut statement = self.tx.prepare_cached(&sql)?;
        let entries = statement.query_map(params![after_seq, limit], ledger_from)?.collect::<rusqlite::Result<_>>()?;
        Ok(entries)
    }

    fn ledger_of(&mut self, job: &str) -> StoreResult<Vec<LedgerEntry>> {
        let sql = format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE job = ?1 ORDER BY seq");
        let mut statement = self.tx.prepare_cached(&sql)?;
        let entries = statement.query_map([job], ledger_from)?.collect::<rusqlite::Result<_>>()?;
        Ok(entries)
    }
}

fn change_values(change: &AttemptChange) -> Vec<rusqlite::types::Value> {
    vec![
        enum_text(&change.state).into(),
        change.lease_expires_ms.into(),
        change.closed_by.map(|closed_by| closed_by.as_str().to_string()).into(),
        change.outcome.map(|outcome| enum_text(&outcome)).into(),
    ]
}

/// The WHERE clause of a guarded update; placeholders start at ?5 (after the change's four).
fn guard_sql(guard: &Guard) -> (Vec<String>, Vec<rusqlite::types::Value>) {
    let mut predicates = Vec::new();
    let mut values: Vec<rusqlite::types::Value> = Vec::new();
    let mut add = |predicate: &str, value: rusqlite::types::Value| {
        values.push(value);
        predicates.push(predicate.replace('?', &format!("?{}", values.len() + 4)));
    };
    add("job = ?", guard.job.clone().into());
    if let Some(project) = &guard.project {
        add("project = ?", project.clone().into());
    }
    if let Some(attempt) = &guard.attempt {
        add("id = ?", attempt.clone().into());
    }
    if let Some(runner) = &guard.runner {
        add("runner = ?", runner.clone().into());
    }
    if let Some(fence) = guard.fence {
        add("fence = ?", (fence as i64).into());
    }
    if let Some(fence) = guard.fence_at_most {
        add("fence <= ?", (fence as i64).into());
    }
    if guard.current {
        add("id = (SELECT current_attempt FROM jobs WHERE jobs.id = ?)", guard.job.clone().into());
    }
    if let Some(now_ms) = guard.lease_valid_at_ms {
        add("lease_expires_ms > ?", now_ms.into());
    }
    let states: Vec<String> = guard.states.iter().map(|state| format!("'{}'", enum_text(state))).collect();
    assert!(!states.is_empty(), "a guard names the states it allows");
    predicates.push(format!("state IN ({})", states.join(", ")));
    (predicates, values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::AttemptState;

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
        let (predicates, values) = guard_sql(&guard);
        assert_eq!(predicates[0], "job = ?5");
        assert_eq!(predicates[2], "fence = ?7");
        assert_eq!(predicates[3], "id = (SELECT current_attempt FROM jobs WHERE jobs.id = ?8)");
        assert_eq!(predicates[4], "state IN ('running')");
        assert_eq!(values.len(), 4);
    }
}
