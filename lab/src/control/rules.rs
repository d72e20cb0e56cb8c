//! The rules of the control plane, in one place: claim, heartbeat, capability, result,
//! expiry and reconcile. Each public method is one transaction over a [`Store`] (the sweep,
//! [`Rules::expire`], one per job it expires).
//!
//! Time comes in as an argument ([`Now`], the server's clock), so the rules can be tested
//! with any instant; the runner's clock (`observed_ms`) is only recorded, never trusted —
//! except under the planted bug `trust-runner-clock`.

use std::collections::HashSet;

use super::store::{AttemptChange, AttemptRow, Guard, JobRow, Principal, Store, StoreError, Tx};
use crate::bugs::{Bug, Bugs};
use crate::capability;
use history::{ClosedBy, Decision, Op, Reason, RecordedAs};
use protocol::*;

/// The server's clock at the receipt of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Unix ms, server wall clock: what leases are measured on.
    pub ms: i64,
    /// Host monotonic ns: where the ledger entry sits in a run's history.
    pub mono_ns: u64,
}

impl Now {
    pub fn read() -> Now {
        Now { ms: protocol::wall_ms(), mono_ns: protocol::monotonic_ns() }
    }
}

/// Lease policy.
#[derive(Clone, Debug)]
pub struct Policy {
    /// How long a claim or heartbeat keeps the attempt's authority (default 2000 ms).
    pub lease_ms: u64,
    /// Life of a capability (default 30 000 ms). It may outlive the lease on purpose: like
    /// real deployment credentials it is coarse, and the target enforces the fence, not time.
    pub capability_ttl_ms: u64,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy { lease_ms: 2_000, capability_ttl_ms: 30_000 }
    }
}

/// A refusal with an HTTP status and a stable code, or a store failure.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    #[error("{message}")]
    Refused { status: u16, code: &'static str, message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn refuse<T>(status: u16, code: &'static str, message: impl Into<String>) -> Result<T, RuleError> {
    Err(RuleError::Refused { status, code, message: message.into() })
}

pub type RuleResult<T> = Result<T, RuleError>;

pub struct Rules<S: Store> {
    pub store: S,
    pub policy: Policy,
    pub bugs: Bugs,
    secret: Vec<u8>,
}

fn operator_only(principal: &Principal) -> RuleResult<()> {
    match principal {
        Principal::Operator => Ok(()),
        _ => refuse(403, "forbidden", "this call needs the operator token"),
    }
}

/// The runner a report is made by (see [`acting_runner`]), for a claim whose fence is in
/// range: the checks of a report that come before its transaction, in this order.
fn reporting_runner<'p>(principal: &'p Principal, claim: &ClaimRef) -> RuleResult<&'p str> {
    let (_, project) = acting_runner(principal, &claim.runner)?;
    if claim.fence > i64::MAX as u64 {
        return refuse(400, "invalid_field", format!("`fence` must be at most {}", i64::MAX));
    }
    Ok(project)
}

/// The runner a runner-only call is made by, checked against the runner the body names.
fn acting_runner<'p>(principal: &'p Principal, named: &str) -> RuleResult<(&'p str, &'p str)> {
    match principal {
        Principal::Runner { id, project } if id == named => Ok((id, project)),
        Principal::Runner { id, .. } => {
            refuse(403, "runner_mismatch", format!("token belongs to runner `{id}`, not `{named}`"))
        }
        _ => refuse(403, "forbidden", "this call needs a runner token"),
    }
}

fn check_id(field: &str, value: &str) -> RuleResult<()> {
    let fine = !value.is_empty()
        && value.len() <= 128
        && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if fine {
        return Ok(());
    }
    refuse(400, "invalid_field", format!("`{field}` must be 1 to 128 characters of [A-Za-z0-9-_.:]"))
}

/// Most generated ids tried past ids that callers chose themselves.
const JOB_ID_TRIES_MAX: u32 = 10_000;

/// The next generated job id (`j<n>`) that no caller-chosen id has taken.
fn free_job_id(tx: &mut dyn Tx) -> RuleResult<String> {
    for _ in 0..JOB_ID_TRIES_MAX {
        let id = format!("j{}", tx.next_counter("job-id")?);
        if tx.job(&id)?.is_none() {
            return Ok(id);
        }
    }
    refuse(409, "exists", "no free generated job id; give the job an `id`")
}

fn new_token() -> String {
    let bytes: [u8; 24] = rand::random();
    hex::encode(bytes)
}

/// Whether a claim is the current, live claim of its job on the server's clock; if not,
/// why not: `unknown`, `not_current` (scope mismatch or closed), `superseded`, `expired`.
fn standing(
    job: Option<&JobRow>,
    attempt: Option<&AttemptRow>,
    claim: &ClaimRef,
    project: &str,
    now_ms: i64,
) -> Result<(), Reason> {
    let (Some(job), Some(attempt)) = (job, attempt) else {
        return Err(Reason::Unknown);
    };
    let scoped = attempt.job == claim.job
        && attempt.runner == claim.runner
        && attempt.fence == claim.fence
        && attempt.project == project;
    if !scoped {
        return Err(Reason::NotCurrent);
    }
    if job.current_attempt.as_deref() != Some(attempt.id.as_str()) {
        return Err(Reason::Superseded);
    }
    if attempt.state == AttemptState::Uncertain || lapsed(attempt, now_ms) {
        return Err(Reason::Expired);
    }
    if attempt.state != AttemptState::Running {
        return Err(Reason::NotCurrent);
    }
    Ok(())
}

/// The lease boundary, on the server's clock: a running attempt's lease has lapsed when
/// its end is not after now (a lease ending at `now_ms` is over).
fn lapsed(attempt: &AttemptRow, now_ms: i64) -> bool {
    attempt.state == AttemptState::Running && attempt.lease_expires_ms <= now_ms
}

/// The states in which a job holds its deployment key: a running job, and an uncertain one
/// whose old execution may still be mutating the target, until a reconcile finding.
const HOLDING_KEY: [JobState; 2] = [JobState::Running, JobState::Uncertain];

/// The oldest queued job of the project whose deployment key no job holds, passing over
/// the keys in `busy`.
fn claimable_job(tx: &mut dyn Tx, project: &str, busy: &HashSet<String>) -> Result<Option<JobRow>, StoreError> {
    tx.claimable_job(project, &HOLDING_KEY, busy)
}

/// Most candidates one claim looks at when other claims take the ones it picked first.
const CLAIM_TRIES_MAX: usize = 32;

/// The job a claim takes: the oldest queued job of the project whose deployment key no job
/// holds, returned with its key's lock and its own. The claims of one key take the key's
/// lock, so they run one at a time: once it is held, the job and the key are read again and
/// stay as read until the claim commits. Only the first key and job are waited for; a claim
/// that holds them already (its first pick was taken meanwhile) takes another pair only if
/// it is free at once, and passes over it otherwise, so no two claims wait for each other.
fn claim_candidate(tx: &mut dyn Tx, project: &str) -> Result<Option<JobRow>, StoreError> {
    let mut busy = HashSet::new();
    for tries in 0..CLAIM_TRIES_MAX {
        let Some(seen) = claimable_job(tx, project, &busy)? else { return Ok(None) };
        let key = seen.deployment_key;
        let locked = match tries {
            0 => {
                tx.lock_key(&key)?;
                tx.lock_job(&seen.id)?
            }
            _ if tx.try_lock_key(&key)? => tx.try_lock_job(&seen.id)?,
            _ => None,
        };
        let Some(job) = locked else {
            busy.insert(key);
            continue;
        };
        if job.state == JobState::Queued && tx.jobs_on_key(&key, &HOLDING_KEY)?.is_empty() {
            return Ok(Some(job));
        }
    }
    Ok(None)
}

/// Appends the entries of the expiries a transaction ran, then its own entry, and answers
/// the seq of its own. Appending takes the ledger's counter, held to COMMIT: it comes last.
fn append(tx: &mut dyn Tx, mut expired: Vec<LedgerEntry>, entry: &LedgerEntry) -> RuleResult<u64> {
    expired.push(entry.clone());
    let seqs = tx.append_ledger(&expired)?;
    seqs.last().copied().ok_or_else(|| RuleError::Store(StoreError::Corrupt("a ledger append answered no seq".into())))
}

struct Report<'a> {
    kind: Op,
    claim: &'a ClaimRef,
    project: &'a str,
    observed_ms: i64,
}

impl<S: Store> Rules<S> {
    pub fn new(store: S, policy: Policy, bugs: Bugs, secret: &[u8]) -> Rules<S> {
        Rules { store, policy, bugs, secret: secret.to_vec() }
    }

    /// Runs a rule transaction. `unlocked` runs it without the store's serialisation (only
    /// planted bugs ask for that). A transaction whose COMMIT went unanswered fails with
    /// [`StoreError::CommitUnknown`], which the API answers as an unknown outcome; under the
    /// planted `retry-lost-commit` it is run again instead, and may apply twice.
    fn transact<T>(&self, unlocked: bool, work: impl Fn(&mut dyn Tx) -> RuleResult<T>) -> RuleResult<T> {
        let once = || match unlocked {
            true => self.store.transact_unlocked(&work),
            false => self.store.transact(&work),
        };
        match once() {
            Err(RuleError::Store(StoreError::CommitUnknown(why))) if self.bugs.has(Bug::RetryLostCommit) => {
                let again = once();
                let how = match &again {
                    Ok(_) => "it succeeded".to_string(),
                    Err(error) => format!("it failed: {error}"),
                };
                eprintln!("control-plane: retry-lost-commit: at {} ms ran again a transaction whose COMMIT went unanswered ({why}): {how}", Now::read().ms);
                again
            }
            done => done,
        }
    }

    /// The instant a transaction's decisions are made at: the store's clock when it has one
    /// (PostgreSQL's, one authority for every replica), else `received`, the receiving
    /// process's clock at receipt. Under the planted `replica-clock`, always `received`.
    ///
    /// Each rule asks once it holds the locks of the key and job it decides on, and before
    /// it decides: a wait for those locks never ages the instant, and no other transaction
    /// changes those rows between the instant and the commit. The locks taken after it (the
    /// counters', the ledger's last) are held only by transactions that wait for no row.
    fn now_in(&self, tx: &mut dyn Tx, received: Now) -> RuleResult<Now> {
        if self.bugs.has(Bug::ReplicaClock) {
            return Ok(received);
        }
        Ok(match tx.clock()? {
            Some((ms, mono_ns)) => Now { ms, mono_ns },
            None => received,
        })
    }

    pub fn principal(&self, token: &str) -> RuleResult<Principal> {
        let found = self.store.transact(|tx| tx.principal(token).map_err(RuleError::from))?;
        match found {
            Some(principal) => Ok(principal),
            None => refuse(401, "unauthorized", "the bearer token is not known"),
        }
    }

    pub fn create_project(&self, principal: &Principal, request: &CreateProject) -> RuleResult<ProjectCreated> {
        operator_only(principal)?;
        check_id("id", &request.id)?;
        let registration_token = new_token();
        self.store.transact(|tx| {
            if !tx.insert_project(&request.id, &registration_token)? {
                return refuse(409, "exists", format!("project `{}` already exists", request.id));
            }
            Ok(ProjectCreated { id: request.id.clone(), registration_token: registration_token.clone() })
        })
    }

    pub fn register_runner(&self, principal: &Principal, request: &RegisterRunner) -> RuleResult<RunnerRegistered> {
        check_id("id", &request.id)?;
        let project = match (principal, &request.project) {
            (Principal::Operator, Some(project)) => project.clone(),
            (Principal::Operator, None) => {
                return refuse(400, "missing_field", "`project` is required with the operator token")
            }
            (Principal::Registration { project }, None) => project.clone(),
            (Principal::Registration { project }, Some(named)) if named == project => project.clone(),
            _ => {
                return refuse(
                    403,
                    "forbidden",
                    "registering a runner needs the operator token or this project's registration token",
                )
            }
        };
        let token = new_token();
        self.store.transact(|tx| {
            if !tx.project_exists(&project)? {
                return refuse(404, "unknown_project", format!("project `{project}` does not exist"));
            }
            if !tx.insert_runner(&request.id, &project, &token)? {
                return refuse(409, "exists", format!("runner `{}` already exists", request.id));
            }
            Ok(RunnerRegistered { id: request.id.clone(), project: project.clone(), token: token.clone() })
        })
    }

    pub fn submit(&self, principal: &Principal, request: &SubmitJob, now: Now) -> RuleResult<JobSubmitted> {
        operator_only(principal)?;
        check_id("project", &request.project)?;
        check_id("deployment_key", &request.deployment_key)?;
        if let Some(id) = &request.id {
            check_id("id", id)?;
        }
        if request.spec.steps == 0 || request.spec.steps > 1_000 || request.spec.step_ms > 600_000 {
            return refuse(400, "invalid_field", "`spec.steps` must be 1..=1000 and `spec.step_ms` at most 600000");
        }
        self.transact(false, |tx| {
            if !tx.project_exists(&request.project)? {
                return refuse(404, "unknown_project", format!("project `{}` does not exist", request.project));
            }
            let id = match &request.id {
                Some(id) => id.clone(),
                None => free_job_id(tx)?,
            };
            let job = JobRow {
                id: id.clone(),
                project: request.project.clone(),
                deployment_key: request.deployment_key.clone(),
                spec: request.spec.clone(),
                state: JobState::Queued,
                current_attempt: None,
                outcome: None,
            };
            if !tx.insert_job(&job)? {
                return refuse(409, "exists", format!("job `{id}` already exists"));
            }
            // Read after every lock the submit waits for (its counters'): see `Rules::now_in`.
            let now = self.now_in(tx, now)?;
            tx.append_ledger(&[self.entry(Op::Submit, &job, None, now)])?;
            Ok(JobSubmitted { id })
        })
    }

    /// A ledger entry about a job with the fields every entry has.
    fn entry(&self, kind: Op, job: &JobRow, attempt: Option<&AttemptRow>, now: Now) -> LedgerEntry {
        LedgerEntry {
            seq: 0,
            kind,
            project: job.project.clone(),
            job: job.id.clone(),
            attempt: attempt.map(|attempt| attempt.id.clone()),
            runner: attempt.map(|attempt| attempt.runner.clone()),
            fence: attempt.map(|attempt| attempt.fence),
            deployment_key: job.deployment_key.clone(),
            decision: None,
            reason: None,
            recorded_as: None,
            outcome: None,
            received_ms: now.ms,
            observed_ms: None,
            mono_ns: now.mono_ns,
            lease_expires_ms: attempt.map(|attempt| attempt.lease_expires_ms),
        }
    }

    /// An entry for a report as the runner made it (its claim, not the stored one).
    fn report_entry(
        &self,
        report: &Report,
        key: &str,
        decision: Decision,
        reason: Option<Reason>,
        now: Now,
    ) -> LedgerEntry {
        LedgerEntry {
            seq: 0,
            kind: report.kind,
            project: report.project.to_string(),
            job: report.claim.job.clone(),
            attempt: Some(report.claim.attempt.clone()),
            runner: Some(report.claim.runner.clone()),
            fence: Some(report.claim.fence),
            deployment_key: key.to_string(),
            decision: Some(decision),
            reason: reason.map(|reason| reason.as_str().to_string()),
            recorded_as: None,
            outcome: None,
            received_ms: now.ms,
            observed_ms: Some(report.observed_ms),
            mono_ns: now.mono_ns,
            lease_expires_ms: None,
        }
    }
}

/// Expiry, claims and heartbeats.
impl<S: Store> Rules<S> {
    /// Marks every running attempt whose lease has passed uncertain, and its job with it
    /// (under `requeue-on-expiry`: failed, and the job back in the queue). Returns how many.
    /// One transaction reads which jobs have a lapsed attempt; then one transaction per job
    /// takes the job's lock, if free at once (its holder is deciding on the job, and expires
    /// its lapsed attempts itself), reads the clock and expires what has lapsed by then.
    pub fn expire(&self, now: Now) -> RuleResult<usize> {
        let early_ms = self.early_ms();
        let jobs: Vec<String> = self.store.dry_run(|tx| {
            let now = self.now_in(tx, now)?;
            let mut jobs: Vec<String> = vec![];
            for attempt in tx.running_attempts()?.into_iter().filter(|attempt| lapsed(attempt, now.ms + early_ms)) {
                if !jobs.contains(&attempt.job) {
                    jobs.push(attempt.job);
                }
            }
            Ok::<_, RuleError>(jobs)
        })?;
        let mut expired = 0;
        for id in &jobs {
            expired += self.transact(self.bugs.has(Bug::SweeperWithoutLock), |tx| {
                let Some(mut job) = tx.try_lock_job(id)? else { return Ok(0) };
                let now = self.now_in(tx, now)?;
                let entries = self.expire_job(tx, &mut job, now)?;
                let count = entries.iter().filter(|entry| entry.kind == Op::Expire).count();
                tx.append_ledger(&entries)?;
                Ok(count)
            })?;
        }
        Ok(expired)
    }

    /// How long before its end the planted `expire-early` takes a lease for lapsed (under
    /// `lease-end-inclusive`, -1: a lease is over only after its end).
    fn early_ms(&self) -> i64 {
        if self.bugs.has(Bug::ExpireEarly) {
            self.policy.lease_ms as i64 / 2
        } else {
            self.boundary_ms()
        }
    }

    /// Where a lease's end falls: 0, a lease ending at `now` is over; -1 under the planted
    /// `lease-end-inclusive`, which takes it as live for that millisecond.
    fn boundary_ms(&self) -> i64 {
        -i64::from(self.bugs.has(Bug::LeaseEndInclusive))
    }

    /// Expires the job's lapsed attempts before a report is judged, so that a lease counts
    /// from its end and not from when the sweeper notices it (under
    /// `lease-judged-by-sweeper`, only the sweeper expires).
    fn expire_unless_swept(&self, tx: &mut dyn Tx, job: &mut JobRow, now: Now) -> RuleResult<Vec<LedgerEntry>> {
        match self.bugs.has(Bug::LeaseJudgedBySweeper) {
            true => Ok(vec![]),
            false => self.expire_job(tx, job, now),
        }
    }

    /// Expires the job's lapsed attempts, the transaction holding the job's lock, and
    /// answers the ledger entries to append, in order: the caller appends them once it has
    /// decided (see [`append`]).
    fn expire_job(&self, tx: &mut dyn Tx, job: &mut JobRow, now: Now) -> RuleResult<Vec<LedgerEntry>> {
        let early_ms = self.early_ms();
        let ended: Vec<AttemptRow> =
            tx.running_attempts_of(&job.id)?.into_iter().filter(|attempt| lapsed(attempt, now.ms + early_ms)).collect();
        let mut entries = Vec::new();
        for attempt in &ended {
            let requeue = self.bugs.has(Bug::RequeueOnExpiry);
            let (state, closed_by) = if requeue {
                (AttemptState::Failed, Some(ClosedBy::ExpiredRequeued))
            } else {
                (AttemptState::Uncertain, None)
            };
            let change = AttemptChange { state, lease_expires_ms: None, closed_by, outcome: None };
            tx.unguarded_update(&attempt.id, &change)?;
            let mut entry = self.entry(Op::Expire, job, Some(attempt), now);
            entry.recorded_as = Some(if requeue { RecordedAs::Requeued } else { RecordedAs::Uncertain });
            let wedge = self.bugs.has(Bug::ExpiryLeavesJobRunning) && !requeue;
            if job.current_attempt.as_deref() == Some(attempt.id.as_str()) && job.state == JobState::Running && !wedge {
                job.state = if requeue { JobState::Queued } else { JobState::Uncertain };
                tx.update_job(job)?;
            }
            entries.push(entry);
            let current = job.current_attempt.as_deref() == Some(attempt.id.as_str());
            if self.bugs.has(Bug::SelfReconcile) && current && job.state == JobState::Uncertain {
                let request = ReconcileRequest {
                    job: job.id.clone(),
                    attempt: attempt.id.clone(),
                    finding: Finding::Stopped,
                    outcome: None,
                    evidence: Some("lease expired".into()),
                };
                let expired = AttemptRow { state: AttemptState::Uncertain, ..attempt.clone() };
                entries.push(self.apply_finding(tx, job, &expired, &request, None, now)?);
            }
        }
        Ok(entries)
    }

    pub fn claim(&self, principal: &Principal, request: &ClaimRequest, now: Now) -> RuleResult<ClaimResponse> {
        let (runner, project) = acting_runner(principal, &request.runner)?;
        let second_transaction = self.bugs.has(Bug::ClaimLedgerInSecondTransaction);
        let (response, entry) = self.transact(self.bugs.has(Bug::ClaimWithoutLock), |tx| {
            // A queued job has no running attempt to expire, and a lapsed lease holds its key
            // as an uncertain one does: a claim's decision needs no expiry.
            let Some(mut job) = claim_candidate(tx, project)? else {
                return Ok((ClaimResponse { grant: None }, None));
            };
            // From a durable counter per job (as many as its attempts): unique even when two
            // claims of one job race, which only a planted bug lets happen.
            let number = tx.next_counter(&format!("attempts:{}", job.id))?;
            let fence = tx.next_counter("fence")?;
            let now = self.now_in(tx, now)?;
            let attempt = AttemptRow {
                id: format!("{}-a{number}", job.id),
                job: job.id.clone(),
                project: project.to_string(),
                runner: runner.to_string(),
                fence,
                state: AttemptState::Running,
                lease_expires_ms: now.ms + self.policy.lease_ms as i64,
                claimed_ms: now.ms,
                closed_by: None,
                outcome: None,
            };
            tx.insert_attempt(&attempt)?;
            job.state = JobState::Running;
            job.current_attempt = Some(attempt.id.clone());
            tx.update_job(&job)?;
            let mut entry = self.entry(Op::Claim, &job, Some(&attempt), now);
            entry.decision = Some(Decision::Accepted);
            entry.observed_ms = Some(request.observed_ms);
            if !second_transaction {
                tx.append_ledger(std::slice::from_ref(&entry))?;
            }
            let claim =
                ClaimRef { job: job.id.clone(), attempt: attempt.id, runner: runner.to_string(), fence: attempt.fence };
            let grant = Grant {
                claim,
                project: job.project,
                deployment_key: job.deployment_key,
                spec: job.spec,
                lease_ms: self.policy.lease_ms,
                lease_expires_ms: attempt.lease_expires_ms,
            };
            Ok((ClaimResponse { grant: Some(grant) }, second_transaction.then_some(entry)))
        })?;
        if let Some(entry) = entry {
            // Planted: the claim committed; its ledger entry comes in a transaction of its own.
            self.transact(false, |tx| Ok(tx.append_ledger(std::slice::from_ref(&entry))?))?;
        }
        Ok(response)
    }

    /// The predicates a current-claim report must meet, as the planted bugs leave them.
    fn guard(&self, report: &Report, now: Now) -> Guard {
        let claim = report.claim;
        if self.bugs.has(Bug::UnscopedFence) {
            let lease = Some(now.ms);
            return Guard {
                job: claim.job.clone(),
                fence_at_most: Some(claim.fence),
                current: true,
                states: vec![AttemptState::Running],
                lease_valid_at_ms: lease,
                ..Guard::default()
            };
        }
        let mut guard = Guard {
            job: claim.job.clone(),
            project: Some(report.project.to_string()),
            attempt: Some(claim.attempt.clone()),
            runner: (!self.bugs.has(Bug::AcceptBorrowedClaim)).then(|| claim.runner.clone()),
            fence: Some(claim.fence),
            current: true,
            states: vec![AttemptState::Running],
            lease_valid_at_ms: (!self.bugs.has(Bug::LeaseJudgedBySweeper)).then_some(now.ms + self.boundary_ms()),
            fence_at_most: None,
        };
        if self.bugs.has(Bug::TrustRunnerClock) {
            guard.states.push(AttemptState::Uncertain);
            guard.lease_valid_at_ms = Some(report.observed_ms);
        }
        if report.kind == Op::Heartbeat && self.bugs.has(Bug::HeartbeatRevivesExpired) {
            guard.states.push(AttemptState::Uncertain);
            guard.lease_valid_at_ms = None;
        }
        if report.kind == Op::Result && self.bugs.has(Bug::AcceptStaleResult) {
            guard.current = false;
            guard.states.extend([AttemptState::Uncertain, AttemptState::Failed]);
            guard.lease_valid_at_ms = None;
        }
        guard
    }

    /// Runs the conditional update; on zero rows, the planted `blind-retry-on-zero-rows`
    /// retries it without predicates. Returns the attempt changed.
    fn conditional(
        &self,
        tx: &mut dyn Tx,
        report: &Report,
        change: &AttemptChange,
        now: Now,
    ) -> RuleResult<Option<String>> {
        if let Some(id) = tx.guarded_update(&self.guard(report, now), change)? {
            return Ok(Some(id));
        }
        if self.bugs.has(Bug::BlindRetryOnZeroRows) && tx.unguarded_update(&report.claim.attempt, change)? {
            return Ok(Some(report.claim.attempt.clone()));
        }
        Ok(None)
    }

    /// The job a report names, which must belong to the reporting runner's project, with
    /// its lock: the report is decided on the job and its attempts as they stand until it
    /// commits. A report's first read.
    fn reported_job(&self, tx: &mut dyn Tx, report: &Report) -> RuleResult<JobRow> {
        match tx.lock_job(&report.claim.job)? {
            Some(job) if job.project == report.project || self.bugs.has(Bug::UnscopedFence) => Ok(job),
            _ => refuse(
                404,
                "unknown_job",
                format!("job `{}` does not exist in this runner's project", report.claim.job),
            ),
        }
    }

    pub fn heartbeat(&self, principal: &Principal, request: &HeartbeatRequest, now: Now) -> RuleResult<Ruling> {
        let project = reporting_runner(principal, &request.claim)?;
        let report = Report { kind: Op::Heartbeat, claim: &request.claim, project, observed_ms: request.observed_ms };
        self.transact(false, |tx| {
            let mut job = self.reported_job(tx, &report)?;
            let now = self.now_in(tx, now)?;
            let expired = self.expire_unless_swept(tx, &mut job, now)?;
            let lease_expires_ms = now.ms + self.policy.lease_ms as i64;
            let change = AttemptChange {
                state: AttemptState::Running,
                lease_expires_ms: Some(lease_expires_ms),
                closed_by: None,
                outcome: None,
            };
            let Some(changed) = self.conditional(tx, &report, &change, now)? else {
                return self.reject(tx, &report, &job, None, expired, now);
            };
            if job.current_attempt.as_deref() == Some(changed.as_str()) && job.state == JobState::Uncertain {
                job.state = JobState::Running;
                tx.update_job(&job)?;
            }
            let mut entry = self.report_entry(&report, &job.deployment_key, Decision::Accepted, None, now);
            entry.lease_expires_ms = Some(lease_expires_ms);
            let ledger_seq = append(tx, expired, &entry)?;
            Ok(Ruling {
                decision: Decision::Accepted,
                reason: None,
                ledger_seq,
                lease_expires_ms: Some(lease_expires_ms),
                capability: None,
            })
        })
    }

    /// Records a refused report (a result as a late observation) and answers why.
    fn reject(
        &self,
        tx: &mut dyn Tx,
        report: &Report,
        job: &JobRow,
        outcome: Option<Outcome>,
        expired: Vec<LedgerEntry>,
        now: Now,
    ) -> RuleResult<Ruling> {
        let attempt = tx.attempt(&report.claim.attempt)?;
        let reason = standing(Some(job), attempt.as_ref(), report.claim, report.project, now.ms)
            .err()
            .unwrap_or(Reason::NotCurrent);
        if report.kind == Op::Result && self.bugs.has(Bug::UnrecordedLateResult) {
            return refuse(409, reason.as_str(), "the result is not the attempt's current one");
        }
        if report.kind == Op::Result && self.bugs.has(Bug::RefusalUnrecorded) {
            return refuse(410, "stale_report", "the attempt no longer takes results");
        }
        let mut entry = self.report_entry(report, &job.deployment_key, Decision::Rejected, Some(reason), now);
        entry.outcome = outcome.map(Into::into);
        if report.kind == Op::Result {
            entry.recorded_as = Some(RecordedAs::LateObservation);
        }
        // The attempts it expired stay expired; under `refusal-drops-expiries` their entries go.
        let expired = if self.bugs.has(Bug::RefusalDropsExpiries) { vec![] } else { expired };
        let ledger_seq = append(tx, expired, &entry)?;
        Ok(Ruling {
            decision: Decision::Rejected,
            reason: Some(reason),
            ledger_seq,
            lease_expires_ms: None,
            capability: None,
        })
    }

    pub fn capability(&self, principal: &Principal, request: &CapabilityRequest, now: Now) -> RuleResult<Ruling> {
        let project = reporting_runner(principal, &request.claim)?;
        let report = Report { kind: Op::Capability, claim: &request.claim, project, observed_ms: request.observed_ms };
        self.transact(false, |tx| {
            let mut job = self.reported_job(tx, &report)?;
            let now = self.now_in(tx, now)?;
            let expired = self.expire_unless_swept(tx, &mut job, now)?;
            let attempt = tx.attempt(&request.claim.attempt)?;
            let mut claim = request.claim.clone();
            if let Some(holder) = attempt.as_ref().filter(|_| self.bugs.has(Bug::AcceptBorrowedClaim)) {
                claim.runner = holder.runner.clone();
            }
            let judged_ms =
                if self.bugs.has(Bug::LeaseJudgedBySweeper) { i64::MIN } else { now.ms + self.boundary_ms() };
            let live = standing(Some(&job), attempt.as_ref(), &claim, project, judged_ms).ok().and(attempt);
            let Some(attempt) = live else {
                return self.reject(tx, &report, &job, None, expired, now);
            };
            // A capability never outlives the lease it is granted under: a runner that lost
            // its authority cannot mutate the target, even where no newer fence has written.
            let mut expires_ms = now.ms + self.policy.capability_ttl_ms as i64;
            if !self.bugs.has(Bug::CapabilityOutlivesLease) {
                expires_ms = expires_ms.min(attempt.lease_expires_ms);
            }
            let unsigned = Capability {
                deployment_key: job.deployment_key.clone(),
                job: job.id.clone(),
                attempt: attempt.id.clone(),
                runner: attempt.runner.clone(),
                fence: attempt.fence,
                expires_ms,
                signature: String::new(),
            };
            let token = capability::sign(&self.secret, unsigned);
            let mut entry = self.report_entry(&report, &job.deployment_key, Decision::Accepted, None, now);
            entry.lease_expires_ms = Some(attempt.lease_expires_ms);
            let ledger_seq = append(tx, expired, &entry)?;
            Ok(Ruling {
                decision: Decision::Accepted,
                reason: None,
                ledger_seq,
                lease_expires_ms: Some(attempt.lease_expires_ms),
                capability: Some(token),
            })
        })
    }
}

/// Results, reconciliation and reads.
impl<S: Store> Rules<S> {
    pub fn result(&self, principal: &Principal, request: &ResultRequest, now: Now) -> RuleResult<Ruling> {
        let project = reporting_runner(principal, &request.claim)?;
        self.transact(false, |tx| self.result_in(tx, project, request, now))
    }

    /// Decides a result without committing it: what `ack-before-commit` answers with.
    pub fn result_uncommitted(&self, principal: &Principal, request: &ResultRequest, now: Now) -> RuleResult<Ruling> {
        let project = reporting_runner(principal, &request.claim)?;
        self.store.dry_run(|tx| self.result_in(tx, project, request, now))
    }

    fn result_in(&self, tx: &mut dyn Tx, project: &str, request: &ResultRequest, now: Now) -> RuleResult<Ruling> {
        let report = Report { kind: Op::Result, claim: &request.claim, project, observed_ms: request.observed_ms };
        let mut job = self.reported_job(tx, &report)?;
        let now = self.now_in(tx, now)?;
        let expired = self.expire_unless_swept(tx, &mut job, now)?;
        let attempt = tx.attempt(&request.claim.attempt)?;
        let committed = attempt.as_ref().filter(|attempt| {
            attempt.closed_by == Some(ClosedBy::Result)
                && attempt.job == job.id
                && attempt.runner == request.claim.runner
                && attempt.fence == request.claim.fence
        });
        if let Some(committed) = committed {
            let overwrite = self.bugs.has(Bug::OverwriteTerminalResult) && committed.outcome != Some(request.outcome);
            if !overwrite {
                let (ruling, entry) = self.repeat(&report, &job, committed, request.outcome, now);
                if ruling.decision == Decision::Duplicate && self.bugs.has(Bug::DuplicateAckUnrecorded) {
                    return self.duplicate_unrecorded(tx, &job, committed, expired, ruling);
                }
                let ledger_seq = append(tx, expired, &entry)?;
                return Ok(Ruling { ledger_seq, ..ruling });
            }
        }
        let state = match request.outcome {
            Outcome::Succeeded => AttemptState::Succeeded,
            Outcome::Failed => AttemptState::Failed,
        };
        let change = AttemptChange {
            state,
            lease_expires_ms: None,
            closed_by: Some(ClosedBy::Result),
            outcome: Some(request.outcome),
        };
        let changed = match committed {
            Some(committed) => tx.unguarded_update(&committed.id, &change)?.then(|| committed.id.clone()),
            None => self.conditional(tx, &report, &change, now)?,
        };
        if changed.is_none() {
            return self.reject(tx, &report, &job, Some(request.outcome), expired, now);
        }
        job.state = if request.outcome == Outcome::Succeeded { JobState::Succeeded } else { JobState::Failed };
        job.outcome = Some(request.outcome);
        tx.update_job(&job)?;
        let mut entry = self.report_entry(&report, &job.deployment_key, Decision::Accepted, None, now);
        entry.outcome = Some(request.outcome.into());
        let ledger_seq = append(tx, expired, &entry)?;
        Ok(Ruling { decision: Decision::Accepted, reason: None, ledger_seq, lease_expires_ms: None, capability: None })
    }

    /// The planted `duplicate-ack-unrecorded`: an identical retry acknowledged from the
    /// committed result's own entry (its `seq` as the answer's `ledger_seq`), nothing appended
    /// for it (the expiries the transaction ran still are).
    fn duplicate_unrecorded(
        &self,
        tx: &mut dyn Tx,
        job: &JobRow,
        committed: &AttemptRow,
        expired: Vec<LedgerEntry>,
        ruling: Ruling,
    ) -> RuleResult<Ruling> {
        let recorded = tx.ledger_of(&job.id)?.into_iter().rev().find(|entry| {
            entry.kind == Op::Result
                && entry.attempt.as_deref() == Some(committed.id.as_str())
                && entry.decision == Some(Decision::Accepted)
        });
        if !expired.is_empty() {
            tx.append_ledger(&expired)?;
        }
        Ok(Ruling { ledger_seq: recorded.map_or(0, |entry| entry.seq), ..ruling })
    }

    /// A result for an attempt whose terminal result is already committed: an identical one is
    /// a duplicate (acknowledged, renews nothing), a different one a recorded conflict. The
    /// ruling (its `ledger_seq` still to come) and the entry to append.
    fn repeat(
        &self,
        report: &Report,
        job: &JobRow,
        committed: &AttemptRow,
        outcome: Outcome,
        now: Now,
    ) -> (Ruling, LedgerEntry) {
        let identical = committed.outcome == Some(outcome);
        let (decision, reason) = match identical {
            true if self.bugs.has(Bug::RefuseDuplicateResult) => (Decision::Rejected, Some(Reason::NotCurrent)),
            true => (Decision::Duplicate, None),
            false => (Decision::Conflict, Some(Reason::Conflict)),
        };
        let mut entry = self.report_entry(report, &job.deployment_key, decision, reason, now);
        entry.outcome = Some(outcome.into());
        entry.recorded_as = match decision {
            Decision::Conflict => Some(RecordedAs::Conflict),
            Decision::Rejected => Some(RecordedAs::LateObservation),
            _ => None,
        };
        (Ruling { decision, reason, ledger_seq: 0, lease_expires_ms: None, capability: None }, entry)
    }

    pub fn reconcile(&self, principal: &Principal, request: &ReconcileRequest, now: Now) -> RuleResult<JobView> {
        operator_only(principal)?;
        let outcome = match (request.finding, request.outcome) {
            (Finding::Completed, None) => {
                return refuse(400, "missing_field", "`outcome` is required with the finding `completed`")
            }
            (Finding::Completed, Some(outcome)) => Some(outcome),
            (_, Some(_)) => {
                return refuse(400, "invalid_field", "`outcome` is only allowed with the finding `completed`")
            }
            (_, None) => None,
        };
        self.transact(false, |tx| {
            let Some(mut job) = tx.lock_job(&request.job)? else {
                return refuse(404, "unknown_job", format!("job `{}` does not exist", request.job));
            };
            let now = self.now_in(tx, now)?;
            let expired = self.expire_job(tx, &mut job, now)?;
            let attempt = tx.attempt(&request.attempt)?.filter(|attempt| attempt.job == job.id);
            let Some(attempt) = attempt else {
                return refuse(
                    404,
                    "unknown_attempt",
                    format!("attempt `{}` of job `{}` does not exist", request.attempt, job.id),
                );
            };
            let current = job.current_attempt.as_deref() == Some(attempt.id.as_str());
            if attempt.state != AttemptState::Uncertain || !current {
                return refuse(
                    409,
                    "not_uncertain",
                    format!("attempt `{}` is not the uncertain current attempt of its job", attempt.id),
                );
            }
            let entry = self.apply_finding(tx, &mut job, &attempt, request, outcome, now)?;
            // The view is read before the entries are appended, so that the ledger's counter
            // is taken last; the appended entries of this job join it.
            let mut view = self.view_of(tx, job)?;
            let entries: Vec<LedgerEntry> = expired.into_iter().chain([entry]).collect();
            let seqs = tx.append_ledger(&entries)?;
            for (entry, seq) in entries.into_iter().zip(seqs) {
                if entry.job == view.id {
                    view.ledger.push(LedgerEntry { seq, ..entry });
                }
            }
            Ok(view)
        })
    }

    fn apply_finding(
        &self,
        tx: &mut dyn Tx,
        job: &mut JobRow,
        attempt: &AttemptRow,
        request: &ReconcileRequest,
        outcome: Option<Outcome>,
        now: Now,
    ) -> RuleResult<LedgerEntry> {
        let mut entry = self.entry(Op::Reconcile, job, Some(attempt), now);
        entry.outcome = Some(request.finding.into());
        entry.reason = request.evidence.clone();
        let change = match request.finding {
            Finding::StillRunning => None,
            Finding::Stopped => {
                job.state = JobState::Queued;
                Some(AttemptChange {
                    state: AttemptState::Failed,
                    lease_expires_ms: None,
                    closed_by: Some(ClosedBy::ObservedStopped),
                    outcome: Some(Outcome::Failed),
                })
            }
            Finding::Completed => {
                let outcome = outcome.expect("checked before the transaction");
                job.state = if outcome == Outcome::Succeeded { JobState::Succeeded } else { JobState::Failed };
                job.outcome = Some(outcome);
                entry.recorded_as = Some(outcome.into());
                let state = if outcome == Outcome::Succeeded { AttemptState::Succeeded } else { AttemptState::Failed };
                Some(AttemptChange {
                    state,
                    lease_expires_ms: None,
                    closed_by: Some(ClosedBy::ReconciledCompleted),
                    outcome: Some(outcome),
                })
            }
        };
        if let Some(change) = change {
            tx.unguarded_update(&attempt.id, &change)?;
            tx.update_job(job)?;
        }
        Ok(entry)
    }

    /// One job whole. Under its lock no other transaction changes the job or its attempts, or
    /// appends an entry about it, so the three reads agree.
    pub fn job_view(&self, principal: &Principal, id: &str) -> RuleResult<JobView> {
        operator_only(principal)?;
        self.store.transact(|tx| {
            let Some(job) = tx.share_job(id)? else {
                return refuse(404, "unknown_job", format!("job `{id}` does not exist"));
            };
            self.view_of(tx, job)
        })
    }

    fn view_of(&self, tx: &mut dyn Tx, job: JobRow) -> RuleResult<JobView> {
        let attempts = tx.attempts_of(&job.id)?.into_iter().map(|attempt| attempt_view(&job, attempt)).collect();
        let ledger = tx.ledger_of(&job.id)?;
        Ok(job_view(job, attempts, ledger))
    }

    /// Every job, without attempts and ledger (see [`Rules::job_view`] for one job whole).
    pub fn jobs(&self, principal: &Principal) -> RuleResult<Vec<JobView>> {
        operator_only(principal)?;
        let jobs = self.store.transact(|tx| tx.jobs().map_err(RuleError::from))?;
        Ok(jobs.into_iter().map(|job| job_view(job, vec![], vec![])).collect())
    }

    /// The ledger after `after_seq`, at most `limit` entries, in order.
    pub fn ledger(&self, principal: &Principal, after_seq: u64, limit: u32) -> RuleResult<Vec<LedgerEntry>> {
        operator_only(principal)?;
        // No sequence number exceeds i64::MAX (SQLite's INTEGER): a larger `after` reads nothing.
        let after_seq = after_seq.min(i64::MAX as u64);
        self.store.transact(|tx| tx.ledger_after(after_seq, limit.clamp(1, 10_000)).map_err(RuleError::from))
    }
}

fn job_view(job: JobRow, attempts: Vec<AttemptView>, ledger: Vec<LedgerEntry>) -> JobView {
    JobView {
        id: job.id,
        project: job.project,
        deployment_key: job.deployment_key,
        spec: job.spec,
        state: job.state,
        current_attempt: job.current_attempt,
        outcome: job.outcome,
        attempts,
        ledger,
    }
}

fn attempt_view(job: &JobRow, attempt: AttemptRow) -> AttemptView {
    AttemptView {
        current: job.current_attempt.as_deref() == Some(attempt.id.as_str()),
        id: attempt.id,
        job: attempt.job,
        runner: attempt.runner,
        fence: attempt.fence,
        state: attempt.state,
        lease_expires_ms: Some(attempt.lease_expires_ms),
        claimed_ms: attempt.claimed_ms,
        closed_by: attempt.closed_by,
    }
}
