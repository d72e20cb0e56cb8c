//! `rules-model`: the rules of the contract as an executable model. The control plane's
//! ledger is replayed in order (`seq`) and every entry is decided again from the state the
//! entries before it left: which claim may be granted, where a lease ends on the server's
//! clock, whether a heartbeat, capability or result is accepted and why not, duplicate
//! against conflict against late observation, when a lease may be expired, and that a
//! reconcile concerns an uncertain attempt and follows an operator's decision. Every
//! divergence between the ledger and the model is an anomaly naming the rule and the
//! entry; the replay then follows the ledger, so one divergence does not cascade. At the
//! end, every job's final outcome must be the one the ledger replays to.
//!
//! The model is pure and knows nothing of the lab: it reads only what `docs/protocol.md`
//! says a ledger entry holds, so it judges any control plane that writes that ledger. Its
//! one policy parameter, the lease, comes from the run's `config` event (`lease_ms`);
//! without it, lease lengths are not judged.

use crate::driver::{Check, Findings, Found};
use crate::model::{FxMap, Index, Observed, Op, Source};
use history::{Decision, OutcomeWord, Reason, RecordedAs};

pub const NAME: &str = "rules-model";
pub const ABOUT: &str =
    "every ledger entry is the decision the contract's rules give from the state before it, and the final state is the ledger's";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<RulesModel>::default(), events)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum JobState {
    #[default]
    Unknown,
    Queued,
    Running,
    Uncertain,
    Succeeded,
    Failed,
}

impl JobState {
    fn name(self) -> &'static str {
        match self {
            JobState::Unknown => "unknown",
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Uncertain => "uncertain",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
        }
    }

    /// A running or uncertain job holds its deployment key: its execution may still be
    /// mutating the target.
    fn holds_key(self) -> bool {
        matches!(self, JobState::Running | JobState::Uncertain)
    }

    fn terminal(outcome: OutcomeWord) -> Option<JobState> {
        match outcome {
            OutcomeWord::Succeeded => Some(JobState::Succeeded),
            OutcomeWord::Failed => Some(JobState::Failed),
            _ => None,
        }
    }

    /// The state a job view names, terminal or not.
    fn of_view(word: OutcomeWord) -> Option<JobState> {
        match word {
            OutcomeWord::Queued => Some(JobState::Queued),
            OutcomeWord::Running => Some(JobState::Running),
            OutcomeWord::Uncertain => Some(JobState::Uncertain),
            word => JobState::terminal(word),
        }
    }

    fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum AttemptState {
    #[default]
    Unknown,
    Running,
    Uncertain,
    Closed,
}

#[derive(Clone, Debug, Default)]
struct Job {
    state: JobState,
    key: Option<u32>,
    current: Option<u32>,
}

#[derive(Clone, Debug, Default)]
struct Attempt {
    state: AttemptState,
    job: u32,
    runner: Option<u32>,
    fence: u64,
    project: Option<String>,
    lease_end_ms: i64,
    /// The outcome its own accepted result committed.
    committed: Option<OutcomeWord>,
    /// The state its close left it in: its result's outcome, `failed` when reconciled as
    /// stopped, the finding's outcome when reconciled as completed.
    closed_as: Option<OutcomeWord>,
    claimed_at: u64,
}

#[derive(Default)]
pub(crate) struct RulesModel {
    lease_ms: Option<i64>,
    jobs: crate::model::Slots<Job>,
    attempts: crate::model::Slots<Attempt>,
    /// Deployment key → the job holding it.
    holders: FxMap<u32, u32>,
    fence_max: u64,
    /// Operator reconcile decisions, by attempt: when each was sent (run clock).
    decided: FxMap<u32, Vec<u64>>,
    /// Ledger reconcile entries: attempt, receipt (run clock), the anomaly if unauthorised.
    reconciled: Vec<(u32, u64, crate::Anomaly)>,
    /// Attempts a decision found lapsed with no expiry recorded (each reported once).
    unexpired: std::collections::HashSet<u32>,
}

/// A divergence: the rule the ledger broke, in a kind and a sentence.
struct Divergence {
    kind: &'static str,
    message: String,
}

fn diverge(kind: &'static str, message: String) -> Option<Divergence> {
    Some(Divergence { kind, message })
}

impl Check for RulesModel {
    fn name(&self) -> &'static str {
        NAME
    }

    fn needs(&self) -> &'static [(&'static str, &'static [history::Source])] {
        &[
            ("reconcile-unauthorised", &[history::Source::Operator]),
            ("lease-not-the-policys", &[history::Source::Config, history::Source::Leases]),
            ("expired-early", &[history::Source::Leases]),
            ("expiry-not-recorded", &[history::Source::Leases]),
            ("heartbeat-accepted-wrongly", &[history::Source::Leases]),
            ("capability-accepted-wrongly", &[history::Source::Leases]),
            ("final-not-the-ledgers", &[history::Source::Finals, history::Source::Ledger]),
            ("final-attempt-not-the-ledgers", &[history::Source::Finals, history::Source::Ledger]),
        ]
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        match ev.src {
            Source::Config => self.lease_ms = ctx.config.lease_ms.and_then(|ms| i64::try_from(ms).ok()),
            Source::OperatorReconcile => {
                if let Some(attempt) = ev.attempt {
                    self.decided.entry(attempt).or_default().push(ev.raw.time_ns);
                }
            }
            Source::Ledger => {
                if let Some(anomaly) = self.expiry_not_recorded(ev, ctx) {
                    out.push(anomaly);
                }
                if let Some(divergence) = self.replay(ev, ctx) {
                    out.push(self.anomaly(ev, ctx, divergence));
                }
            }
            Source::Final => {
                if let Some(divergence) = self.final_state(ev, ctx) {
                    out.push(self.anomaly(ev, ctx, divergence));
                }
            }
            _ => {}
        }
    }

    /// Every reconcile entry needs an operator's decision about its attempt sent before
    /// the entry was received: the control plane may never reconcile on its own. Matched
    /// on the run's clock, as ledger entries are visited in commit order.
    fn finish(&mut self, _ctx: &Index, out: &mut Findings) {
        self.reconciled.sort_by_key(|(_, received_ns, _)| *received_ns);
        for decisions in self.decided.values_mut() {
            decisions.sort_unstable();
        }
        for (attempt, received_ns, anomaly) in std::mem::take(&mut self.reconciled) {
            let decisions = self.decided.entry(attempt).or_default();
            match decisions.iter().position(|&sent_ns| sent_ns <= received_ns) {
                Some(first) => drop(decisions.remove(first)),
                None => out.push(anomaly),
            }
        }
    }
}

impl RulesModel {
    fn anomaly(&self, ev: &Observed, ctx: &Index, divergence: Divergence) -> crate::Anomaly {
        let mut found = Found::new(NAME, divergence.kind).job(ctx, ev.job).key(ctx, ev.key).reported(ctx, ev);
        let mut events = vec![ev.index];
        if let Some(attempt) = ev.attempt.and_then(|attempt| self.attempts.get(attempt as usize)) {
            if attempt.state != AttemptState::Unknown {
                events.push(attempt.claimed_at);
            }
        }
        found = found.events(&events);
        found.says(divergence.message)
    }

    /// A refused report, or a reconcile, decided on a job whose current attempt the ledger
    /// still holds running with its lease ended at the entry's receipt: the rules expire a
    /// lapsed attempt in the transaction that decides on its job, before deciding (`docs/protocol.md`,
    /// "Expiry": no decision is taken on a lapsed attempt that still says running), and append
    /// the expiry's entry before the decision's. None precedes this one: the expiry was dropped
    /// (or never run). An accepted report on a lapsed lease is its own finding
    /// (`heartbeat-accepted-wrongly`, …). Reported once per attempt; the replay follows the
    /// ledger (the attempt stays running in it).
    fn expiry_not_recorded(&mut self, ev: &Observed, ctx: &Index) -> Option<crate::Anomaly> {
        let decided = (ev.op.is_report() && !ev.accepted()) || ev.op == Op::Reconcile;
        if !decided || ctx.lacks("lease") {
            return None;
        }
        let job = ev.job?;
        let current = self.job(job).current?;
        let facts = self.attempt(current);
        let received = ev.received_ms?;
        if facts.state != AttemptState::Running || facts.lease_end_ms > received || facts.job != job {
            return None;
        }
        if !self.unexpired.insert(current) {
            return None;
        }
        let at = crate::moment::Moment::of(ev, "server", received);
        let what = match ev.op {
            Op::Reconcile => "reconcile".to_string(),
            op => format!("{} {op} of {}", ev.decision.map_or("undecided", decision_name), ctx.label(ev.attempt?)),
        };
        let message = format!(
            "the {what} was decided on job {} at {at}, when its current attempt {}'s lease had ended (at {}) and the \
             ledger still held it running: the rules expire it in that transaction, before deciding, and the ledger \
             holds no expiry of it",
            ctx.jobs_names.name(job),
            ctx.label(current),
            at.then(facts.lease_end_ms)
        );
        let found = Found::new(NAME, "expiry-not-recorded").job(ctx, Some(job)).key(ctx, ev.key).attempt(ctx, current);
        Some(found.events(&[ev.index, facts.claimed_at]).says(message))
    }

    fn job_mut(&mut self, job: u32) -> &mut Job {
        self.jobs.slot(job as usize)
    }

    fn attempt_mut(&mut self, attempt: u32) -> &mut Attempt {
        self.attempts.slot(attempt as usize)
    }

    fn job(&self, job: u32) -> Job {
        self.jobs.get(job as usize).cloned().unwrap_or_default()
    }

    fn attempt(&self, attempt: u32) -> Attempt {
        self.attempts.get(attempt as usize).cloned().unwrap_or_default()
    }

    /// Moves a job to `state`, taking or releasing its deployment key.
    fn set_job(&mut self, job: u32, state: JobState) {
        let facts = self.job_mut(job);
        facts.state = state;
        let key = facts.key;
        if let Some(key) = key {
            if state.holds_key() {
                self.holders.insert(key, job);
            } else if self.holders.get(&key) == Some(&job) {
                self.holders.remove(&key);
            }
        }
    }

    /// Decides the entry again, then applies what the ledger says.
    fn replay(&mut self, ev: &Observed, ctx: &Index) -> Option<Divergence> {
        let job = ev.job?;
        match ev.op {
            Op::Submit => self.submit(ev, ctx, job),
            Op::Claim => self.claim(ev, ctx, job),
            Op::Heartbeat | Op::Capability => self.renewal(ev, ctx),
            Op::Result => self.result(ev, ctx),
            Op::Expire => self.expire(ev, ctx),
            Op::Reconcile => self.reconcile(ev, ctx),
            _ => diverge("unknown-entry", format!("the ledger holds a `{}` entry, which the contract has not", ev.op)),
        }
    }

    fn submit(&mut self, ev: &Observed, ctx: &Index, job: u32) -> Option<Divergence> {
        let before = self.job(job).state;
        let facts = self.job_mut(job);
        facts.key = ev.key;
        if before != JobState::Unknown {
            return diverge(
                "submitted-twice",
                format!("job {} was submitted again while {}", ctx.jobs_names.name(job), before.name()),
            );
        }
        self.set_job(job, JobState::Queued);
        None
    }

    /// Whether a claim may be granted: a queued job, its key free, a fence above every
    /// fence before, a lease from the server's receipt time no longer than the policy's.
    fn claim(&mut self, ev: &Observed, ctx: &Index, job: u32) -> Option<Divergence> {
        let attempt = ev.attempt?;
        let (fence, received) = (ev.fence.unwrap_or(0), ev.received_ms.unwrap_or(0));
        let facts = self.job(job);
        let key = facts.key.or(ev.key);
        let holder = key.and_then(|key| self.holders.get(&key).copied()).filter(|&holder| holder != job);
        let name = ctx.jobs_names.name(job);
        let divergence = if facts.state != JobState::Queued {
            diverge(
                "claim-not-queued",
                format!("{} was granted while job {name} was {}", ctx.label(attempt), facts.state.name()),
            )
        } else if let Some(holder) = holder {
            let state = self.job(holder).state.name();
            let key = ctx.key_names.name(key.unwrap_or(0));
            diverge(
                "claim-key-held",
                format!(
                    "{} was granted on key {key}, held by job {} ({state})",
                    ctx.label(attempt),
                    ctx.jobs_names.name(holder)
                ),
            )
        } else if fence <= self.fence_max {
            diverge(
                "claim-fence-not-above",
                format!("{} has fence {fence}, not above fence {} granted before", ctx.label(attempt), self.fence_max),
            )
        } else {
            self.lease_divergence(ev, received, "claim")
        };
        self.fence_max = self.fence_max.max(fence);
        let record = self.attempt_mut(attempt);
        *record = Attempt {
            state: AttemptState::Running,
            job,
            runner: ev.runner,
            fence,
            project: ev.raw.project.clone(),
            // A system that grants no lease: the attempt owns its job until the system ends it.
            lease_end_ms: ev.lease_ms.unwrap_or(if ctx.lacks("lease") { i64::MAX } else { received }),
            committed: None,
            closed_as: None,
            claimed_at: ev.index,
        };
        let facts = self.job_mut(job);
        facts.current = Some(attempt);
        facts.key = key;
        self.set_job(job, JobState::Running);
        divergence
    }

    /// A granted lease must end after the receipt and no later than the policy allows.
    fn lease_divergence(&self, ev: &Observed, received: i64, what: &str) -> Option<Divergence> {
        let lease_ms = self.lease_ms?;
        let end = ev.lease_ms?;
        let at = crate::moment::Moment::of(ev, "server", received);
        (end <= received || end > received + lease_ms)
            .then(|| Divergence {
                kind: "lease-not-the-policys",
                message: format!(
                    "the {what} at {at} set the lease to end at {}; the policy's {lease_ms} ms lease ends at {}",
                    at.then(end),
                    at.then(received + lease_ms)
                ),
            })?
            .into()
    }

    /// Why a report's claim is not the job's current, live claim at `received_ms` on the
    /// server's clock, in the contract's order of checks.
    fn standing(&self, ev: &Observed) -> Result<(), Reason> {
        let (Some(job), Some(attempt)) = (ev.job, ev.attempt) else { return Err(Reason::Unknown) };
        let facts = self.attempt(attempt);
        if facts.state == AttemptState::Unknown || self.job(job).state == JobState::Unknown {
            return Err(Reason::Unknown);
        }
        let scoped = facts.job == job
            && facts.runner == ev.runner
            && Some(facts.fence) == ev.fence
            && facts.project == ev.raw.project;
        if !scoped {
            return Err(Reason::NotCurrent);
        }
        if self.job(job).current != Some(attempt) {
            return Err(Reason::Superseded);
        }
        let lapsed = facts.state == AttemptState::Running && facts.lease_end_ms <= ev.received_ms.unwrap_or(i64::MAX);
        if facts.state == AttemptState::Uncertain || lapsed {
            return Err(Reason::Expired);
        }
        if facts.state != AttemptState::Running {
            return Err(Reason::NotCurrent);
        }
        Ok(())
    }

    /// A heartbeat or a capability: accepted exactly when the claim is current and live.
    fn renewal(&mut self, ev: &Observed, ctx: &Index) -> Option<Divergence> {
        let expected = self.standing(ev);
        let divergence =
            compare(ev, ctx, expected.err().map_or(Decision::Accepted, |_| Decision::Rejected), expected.err())
                .or_else(|| {
                    let renews = ev.op == Op::Heartbeat && ev.accepted();
                    renews.then(|| self.lease_divergence(ev, ev.received_ms.unwrap_or(0), "heartbeat")).flatten()
                });
        if ev.op == Op::Heartbeat && ev.accepted() {
            let attempt = ev.attempt?;
            let job = self.attempt(attempt).job;
            let record = self.attempt_mut(attempt);
            record.lease_end_ms = ev.lease_ms.unwrap_or(record.lease_end_ms);
            if record.state == AttemptState::Uncertain {
                record.state = AttemptState::Running;
                if self.job(job).current == Some(attempt) {
                    self.set_job(job, JobState::Running);
                }
            }
        }
        divergence
    }

    /// A result: a duplicate or a conflict when its attempt already committed one, else
    /// accepted when current and live, else kept as a late observation.
    fn result(&mut self, ev: &Observed, ctx: &Index) -> Option<Divergence> {
        let attempt = ev.attempt?;
        let facts = self.attempt(attempt);
        let outcome = ev.raw.outcome_word();
        let same_claim = Some(facts.job) == ev.job && facts.runner == ev.runner && Some(facts.fence) == ev.fence;
        let (decision, reason, recorded) = match facts.committed.filter(|_| same_claim) {
            Some(committed) if Some(committed) == outcome => (Decision::Duplicate, None, None),
            Some(_) => (Decision::Conflict, Some(Reason::Conflict), Some(RecordedAs::Conflict)),
            None => match self.standing(ev) {
                Ok(()) => (Decision::Accepted, None, None),
                Err(reason) => (Decision::Rejected, Some(reason), Some(RecordedAs::LateObservation)),
            },
        };
        let divergence = compare(ev, ctx, decision, reason).or_else(|| {
            (ev.recorded_as != recorded).then(|| Divergence {
                kind: "recorded-as",
                message: format!(
                    "{}'s result ({}) was recorded as `{}`; the rules record it as `{}`",
                    ctx.label(attempt),
                    ev.decision.map_or("undecided", decision_name),
                    ev.recorded_as.map_or("nothing", RecordedAs::as_str),
                    recorded.map_or("nothing", RecordedAs::as_str)
                ),
            })
        });
        if ev.accepted() {
            let job = facts.job;
            let record = self.attempt_mut(attempt);
            record.state = AttemptState::Closed;
            record.committed = outcome;
            record.closed_as = outcome;
            if let Some(state) = outcome.and_then(JobState::terminal) {
                self.set_job(job, state);
            }
        }
        divergence
    }

    /// An expiry: of a running attempt whose lease ended on the server's clock, naming
    /// it uncertain; the job stays claimed (its key held) until a reconcile.
    fn expire(&mut self, ev: &Observed, ctx: &Index) -> Option<Divergence> {
        let attempt = ev.attempt?;
        let facts = self.attempt(attempt);
        let received = ev.received_ms.unwrap_or(0);
        let divergence = if facts.state == AttemptState::Unknown {
            let message = format!("{} was expired, but the ledger holds no claim of it before", ctx.label(attempt));
            diverge("expired-not-running", message)
        } else if facts.state != AttemptState::Running {
            diverge("expired-not-running", format!("{} was expired while it was not running", ctx.label(attempt)))
        } else if facts.lease_end_ms > received && !ctx.lacks("lease") {
            diverge(
                "expired-early",
                format!(
                    "{} was expired at {} but its lease ends at {}",
                    ctx.label(attempt),
                    crate::moment::Moment::of(ev, "server", received),
                    crate::moment::Moment::of(ev, "server", received).then(facts.lease_end_ms)
                ),
            )
        } else if ev.recorded_as != Some(RecordedAs::Uncertain) {
            diverge(
                "expiry-not-uncertain",
                format!(
                    "{}'s expiry was recorded as `{}`: a lapsed lease is not a stopped process, the job is uncertain",
                    ctx.label(attempt),
                    ev.recorded_as.map_or("nothing", RecordedAs::as_str)
                ),
            )
        } else {
            None
        };
        let requeued = ev.recorded_as == Some(RecordedAs::Requeued);
        let record = self.attempt_mut(attempt);
        record.state = if requeued { AttemptState::Closed } else { AttemptState::Uncertain };
        let job = record.job;
        if self.job(job).current == Some(attempt) && self.job(job).state == JobState::Running {
            self.set_job(job, if requeued { JobState::Queued } else { JobState::Uncertain });
        }
        divergence
    }

    /// A reconcile: of an uncertain attempt, after an operator decided it.
    fn reconcile(&mut self, ev: &Observed, ctx: &Index) -> Option<Divergence> {
        let attempt = ev.attempt?;
        let facts = self.attempt(attempt);
        let unauthorised = Divergence {
            kind: "reconcile-unauthorised",
            message: format!(
                "{} was reconciled with no operator's decision before it: the control plane may not reconcile on its own",
                ctx.label(attempt)
            ),
        };
        let anomaly = self.anomaly(ev, ctx, unauthorised);
        self.reconciled.push((attempt, ev.raw.time_ns, anomaly));
        let divergence = if facts.state != AttemptState::Uncertain {
            let state = if facts.state == AttemptState::Running { "running" } else { "closed" };
            diverge(
                "reconcile-not-uncertain",
                format!("{} was reconciled while it was {state}, not uncertain", ctx.label(attempt)),
            )
        } else {
            None
        };
        let job = facts.job;
        let current = self.job(job).current == Some(attempt);
        match ev.raw.outcome_word() {
            Some(OutcomeWord::Stopped) => {
                let record = self.attempt_mut(attempt);
                record.state = AttemptState::Closed;
                record.closed_as = Some(OutcomeWord::Failed);
                if current {
                    self.set_job(job, JobState::Queued);
                }
            }
            Some(OutcomeWord::Completed) => {
                let outcome = ev.recorded_as.and_then(|word| OutcomeWord::parse(word.as_str()));
                let record = self.attempt_mut(attempt);
                record.state = AttemptState::Closed;
                record.closed_as = outcome;
                if let (true, Some(state)) = (current, outcome.and_then(JobState::terminal)) {
                    self.set_job(job, state);
                }
            }
            _ => {}
        }
        divergence
    }

    /// A job's final state must be the one the ledger replays to, terminal or not, complete
    /// run or not: the collector reads the jobs and the ledger as one snapshot. A job the
    /// ledger never named is judged only when its final state is terminal.
    fn final_state(&self, ev: &Observed, ctx: &Index) -> Option<Divergence> {
        let job = ev.job?;
        let replayed = self.job(job).state;
        let reported = ev.raw.outcome_word();
        let differs = match reported.and_then(JobState::of_view) {
            Some(state) if state.is_terminal() => state != replayed,
            Some(state) => replayed != JobState::Unknown && state != replayed,
            None => replayed.is_terminal(),
        };
        if differs {
            return Some(Divergence {
                kind: "final-not-the-ledgers",
                message: format!(
                    "job {} ended `{}` but its ledger replays to `{}`",
                    ctx.jobs_names.name(job),
                    reported.map_or("nothing", OutcomeWord::as_str),
                    replayed.name()
                ),
            });
        }
        self.final_attempts(ev, ctx)
    }

    /// Each closed attempt of a final state must be in the state its close gave it: its
    /// result's outcome, or its reconcile's; and an attempt the ledger leaves open must be
    /// `running` or `uncertain` as the ledger says (an expiry makes it uncertain, an
    /// accepted heartbeat after one running again).
    fn final_attempts(&self, ev: &Observed, ctx: &Index) -> Option<Divergence> {
        let attempts = ev.raw.value.as_ref()?.get("attempts")?.as_array()?;
        attempts.iter().find_map(|entry| {
            let id = ctx.attempt_names.get(entry.get("attempt")?.as_str()?)?;
            let facts = self.attempts.get(id as usize)?;
            let state = entry.get("state")?.as_str()?;
            let open = match facts.state {
                AttemptState::Running => Some("running"),
                AttemptState::Uncertain => Some("uncertain"),
                AttemptState::Unknown | AttemptState::Closed => None,
            };
            let closed = facts.closed_as.map(OutcomeWord::as_str);
            let terminal = matches!(state, "succeeded" | "failed");
            let ledgers = if terminal { closed } else { open.filter(|_| matches!(state, "running" | "uncertain")) }?;
            let verb = if terminal { "closed" } else { "left" };
            (state != ledgers).then(|| Divergence {
                kind: "final-attempt-not-the-ledgers",
                message: format!("{} ended `{state}` but its ledger {verb} it `{ledgers}`", ctx.label(id)),
            })
        })
    }
}

fn decision_name(decision: Decision) -> &'static str {
    match decision {
        Decision::Accepted => "accepted",
        Decision::Rejected => "rejected",
        Decision::Duplicate => "duplicate",
        Decision::Conflict => "conflict",
    }
}

/// The ledger's decision and reason against the model's.
fn compare(ev: &Observed, ctx: &Index, decision: Decision, reason: Option<Reason>) -> Option<Divergence> {
    let label = ev.attempt.map_or_else(|| "an unknown attempt".to_string(), |attempt| ctx.label(attempt));
    let recorded = ev.decision.map_or("undecided", decision_name);
    let why = reason.map_or(String::new(), |reason| format!(" ({reason})"));
    if ev.decision != Some(decision) {
        let kind = match (ev.op, ev.decision) {
            (Op::Heartbeat, Some(Decision::Accepted)) => "heartbeat-accepted-wrongly",
            (Op::Capability, Some(Decision::Accepted)) => "capability-accepted-wrongly",
            (Op::Result, Some(Decision::Accepted)) => "result-accepted-wrongly",
            (_, Some(Decision::Rejected)) => "refused-wrongly",
            _ => "decision",
        };
        return diverge(
            kind,
            format!("{}'s {} was {recorded}; the rules decide {}{why}", label, ev.op, decision_name(decision)),
        );
    }
    let got = ev.raw.reason_code();
    (decision == Decision::Rejected && got != reason).then(|| Divergence {
        kind: "reason",
        message: format!(
            "{}'s {} was rejected as `{}`; the rules give `{}`",
            label,
            ev.op,
            got.map_or("nothing", Reason::as_str),
            reason.map_or("nothing", Reason::as_str)
        ),
    })
}
