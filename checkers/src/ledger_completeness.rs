//! `ledger-completeness`: every answer a runner got names the ledger entry that records
//! the report (`value.ledger_seq`); that entry must exist and say the same thing.
//!
//! From the runners' answers and the ledger: a heartbeat, capability or result answered
//! with `ledger_seq = N` needs a ledger event with `value.seq = N` of the same kind, for
//! the same attempt, with the same decision (an answer given before the commit — the
//! planted `ack-before-commit` — names a seq the ledger never held, or gave to another
//! entry). Ledger entries are held by seq until an answer matches them; an answer seen
//! before its entry waits for it, so the check does not depend on which comes first.
//!
//! And each report is applied once: for every attempt, the ledger holds no more heartbeat,
//! capability or result entries than were sent for it (runners' `request`s, results the
//! nemesis sent, reports a scenario played). One more means the control plane applied a
//! request twice — a transaction run again after its COMMIT's answer was lost. Reports the
//! nemesis sent with another runner's token than the claim's (`value.token_of`) do not
//! count as sent: the control plane must refuse them unrecorded, and one in the ledger is
//! a report applied for a runner that never made it. The count holds at every entry's
//! receipt too, on the history's clock: a report is logged before it is sent, so an entry
//! received before its runner had sent as many reports is no one's, whatever the runner
//! sends later.
//!
//! And each claim is applied once: every attempt the ledger granted a runner is one its
//! runner was told of (an answer naming it, or a scenario's played claim), or one of its
//! claim requests that got no answer may have made it. More grants nobody was told of
//! than unanswered claims means a claim was applied twice (a claim transaction run again
//! after its COMMIT's answer was lost grants a second attempt).
//!
//! Every answer counts, whoever received it: a runner's (its log), the nemesis's for a report
//! it sent itself (`value.ledger_seq` of its `ok`), the operator's for a reconcile (the entry
//! the answer's view shows, `value.ledger_seq`; without one, a reconcile entry of the attempt
//! with the same finding, one per answer). An acknowledged `duplicate` is an entry as any
//! ruling is.
//!
//! And every report gets a ruling: one answered with an error where the contract rules — a
//! 4xx whose code is none of the errors that come before a ruling (the body, the token, the
//! runner, the job in the runner's project), a 409 error body (`409 not_current`, no
//! `decision`, no `ledger_seq`), or one of those errors where the history shows it untrue (a
//! runner token `forbidden`, its own runner's report a `runner_mismatch`, a job the ledger
//! holds in the runner's project `unknown_job`) — was decided and kept nowhere
//! (`result-not-ruled`; a heartbeat's or capability's, `report-not-ruled`).

use crate::driver::{Check, Findings, Found};
use crate::model::{FxMap, Index, Observed, Op, Source};
use history::Decision;

pub const NAME: &str = "ledger-completeness";
pub const ABOUT: &str = "every report a runner got an answer for is recorded in the ledger as answered";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<LedgerCompleteness>::default(), events)
}

/// What a ledger entry or an answer says: kind, attempt, decision (a reconcile: its finding).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Says {
    op: Op,
    attempt: Option<u32>,
    decision: Option<Decision>,
    finding: Option<u32>,
}

/// Who received an answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sender {
    Runner,
    Nemesis,
    Operator,
}

impl Sender {
    fn of(ev: &Observed) -> Sender {
        match ev.src {
            Source::NemesisAnswer => Sender::Nemesis,
            Source::OperatorAnswer => Sender::Operator,
            _ => Sender::Runner,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Sender::Runner => "a runner",
            Sender::Nemesis => "the nemesis",
            Sender::Operator => "the operator",
        }
    }
}

/// One answer: what it says, its event, who received it.
type Answer = (Says, u64, Sender);

#[derive(Default)]
pub(crate) struct LedgerCompleteness {
    /// Ledger report entries not yet matched by an answer, by seq.
    entries: FxMap<u64, (Says, u64)>,
    /// Answers whose entry had not been seen yet, by seq.
    waiting: FxMap<u64, Vec<Answer>>,
    /// The largest ledger `seq` seen: an answer left waiting for one below it names an entry
    /// that is not its own (another report's, or one an earlier answer already named).
    seq_max: u64,
    /// Reconcile entries per attempt and finding, and the operator's answers naming no entry
    /// (matched by count at the end).
    reconciles: FxMap<(u32, Option<u32>), u64>,
    reconciles_answered: Vec<(u32, Option<u32>, u64)>,
    /// Reports answered `404 unknown_job` (judged at the end, when every job's project is
    /// known): the job, the reporting runner, the attempt, the event.
    unknown_job: Vec<(Op, u32, u32, u32, u64)>,
    /// Each job's and each runner's project, from the ledger (an index into `projects`).
    job_project: FxMap<u32, u32>,
    runner_project: FxMap<u32, u32>,
    projects: Vec<String>,
    answers: u64,
    /// Per attempt (its id is its place), per report kind ([`REPORTS`]).
    applied: crate::model::Slots<[Applied; 3]>,
    sent: u64,
    /// Per runner: its claims.
    claims: FxMap<u32, Claims>,
    /// Attempts a runner was told it was granted (its answers, a scenario's played claims).
    told: std::collections::HashSet<u32>,
    /// The runners whose logs the history holds: the counts judge only them (evidence that
    /// gathered some runners' logs says nothing of what the others sent).
    logged: std::collections::HashSet<u32>,
}

/// One runner's claims: requests it logged, answers it got, and the attempts the ledger
/// granted it (attempt, history index).
#[derive(Default)]
struct Claims {
    requests: u64,
    answered: u64,
    granted: Vec<(u32, u64)>,
}

/// The report kinds, in the order of an attempt's [`Applied`] slots.
const REPORTS: [Op; 3] = [Op::Heartbeat, Op::Capability, Op::Result];

/// Times kept in place up to a few (most attempts send and record a handful of each kind).
type Times = smallvec::SmallVec<[u64; 3]>;

/// For one attempt and kind: the reports its runner sent, its ledger entries, those
/// entries' history indexes (the first two, then the latest), and the reports sent with
/// another runner's token with their history indexes.
#[derive(Default)]
struct Applied {
    sent: u64,
    ledgered: u64,
    entries: smallvec::SmallVec<[u64; 3]>,
    foreign: Vec<u64>,
    /// Reports a scenario played, counted when their answer is seen (after their entry).
    played: u64,
    /// When each report the runner sent was logged (before it was sent).
    sent_ns: Times,
    /// When each entry was received.
    entry_ns: Times,
}

impl Applied {
    /// Entries beyond what was sent: `(entries, sent)`, judged over the whole history and at
    /// every entry's receipt on the history's clock (a report is logged before it is sent
    /// and received before it is recorded, so an entry received before its runner had sent
    /// as many reports is no one's). Times, not the order entries are visited in (`seq`),
    /// decide what came first.
    fn over(&mut self) -> Option<(u64, u64)> {
        let sent = self.sent + self.played;
        if self.ledgered > sent {
            return Some((self.ledgered, sent));
        }
        self.sent_ns.sort_unstable();
        self.entry_ns.sort_unstable();
        self.entry_ns.iter().enumerate().find_map(|(before, &at_ns)| {
            let entries = before as u64 + 1;
            let sent = self.sent_ns.partition_point(|&sent_ns| sent_ns < at_ns) as u64;
            (entries > sent + self.played).then_some((entries, sent))
        })
    }
}

/// An attempt's report kind with more entries than were sent: the kind and attempt, its
/// counts, and `(entries, sent)` where they first disagreed.
type Over<'a> = ((Op, u32), &'a Applied, (u64, u64));

/// The report kind a sent event stands for: a runner's request's own; a report the
/// nemesis sent names its kind (`value.report`: a borrowed claim's heartbeat, capability
/// or result), and a resend without one is a result.
fn sent_kind(ev: &Observed) -> Op {
    if ev.op.is_report() {
        return ev.op;
    }
    let named = ev.raw.value.as_ref().and_then(|value| value.get("report")?.as_str()).and_then(Op::parse);
    named.filter(|op| op.is_report()).unwrap_or(Op::Result)
}

/// The contract's errors that come before a report is ruled (`docs/protocol.md`, "Errors" and
/// "Authentication"): the request's head and body, the token, the runner the body names, the
/// job in the runner's project. Any other error answer to a report is a refusal where the
/// contract rules.
const BEFORE_RULING: [&str; 12] = [
    "malformed_request",
    "malformed_json",
    "invalid_body",
    "invalid_field",
    "missing_field",
    "unauthorized",
    "forbidden",
    "runner_mismatch",
    "unknown_job",
    "body_too_large",
    "unsupported_media_type",
    "headers_too_large",
];

/// An error answer's status and code: `409 not_current: …` is (409, `not_current`),
/// `unexpected answer 410 from URL: …` (410, ``), and a bare verdict reason `not_current` (a
/// recorder that keeps the code alone) (409, `not_current`).
fn status_and_code(said: &str) -> Option<(u16, &str)> {
    let said = said.trim();
    if history::Reason::parse(said).is_some() {
        return Some((409, said));
    }
    if let Some(rest) = said.strip_prefix("unexpected answer ") {
        return Some((rest.split_whitespace().next()?.parse().ok()?, ""));
    }
    let (status, rest) = said.split_once(' ')?;
    let code = rest.split(':').next().unwrap_or(rest).trim();
    Some((status.parse().ok()?, code))
}

/// The runner whose token sent a report: a runner's own (its log's process), or the one the
/// nemesis names (`value.token_of`).
fn token_of<'a>(ev: &'a Observed) -> Option<&'a str> {
    match &ev.raw.process {
        history::Process::Runner(id) => Some(id.as_str()),
        _ => ev.raw.value.as_ref()?.get("token_of")?.as_str(),
    }
}

/// The kind of a report left unruled: a result's, or a heartbeat's or capability's.
fn unruled_kind(op: Op) -> &'static str {
    if op == Op::Result {
        "result-not-ruled"
    } else {
        "report-not-ruled"
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Heartbeat => "heartbeat",
        Op::Capability => "capability request",
        Op::Reconcile => "reconcile",
        _ => "result",
    }
}

/// A report of `sender`'s answered with an error that says what a ruling says, or with an
/// error the contract does not answer a report with: the server decided it and kept no
/// ruling. The contract answers every report of a claim past the request's own checks with a
/// verdict and a ledger entry (a late result as a late observation).
fn unruled(op: Op, attempt: u32, said: &str, why: &str, ev: &Observed, ctx: &Index, out: &mut Findings) {
    let sender = match ev.src {
        Source::NemesisAnswer => "the nemesis",
        _ => "a runner",
    };
    let message = format!(
        "{sender}'s {} for {} was answered with the error `{said}`{why}: no ruling and no ledger entry, where the \
         contract rules every report past its request's own checks (a late result as a late observation)",
        op_name(op),
        ctx.label(attempt)
    );
    let found = Found::new(NAME, unruled_kind(op)).job(ctx, ev.job).attempt(ctx, attempt).reported(ctx, ev);
    out.push(found.events(&[ev.index]).says(message));
}

impl Check for LedgerCompleteness {
    fn name(&self) -> &'static str {
        NAME
    }

    fn needs(&self) -> &'static [(&'static str, &'static [history::Source])] {
        &[
            ("answer-missing-from-ledger", &[history::Source::RunnerLogs]),
            ("answer-differs-from-ledger", &[history::Source::RunnerLogs]),
            ("applied-more-than-sent", &[history::Source::RunnerLogs, history::Source::Nemesis]),
            ("foreign-report-applied", &[history::Source::RunnerLogs, history::Source::Nemesis]),
            ("result-not-ruled", &[history::Source::RunnerLogs]),
            ("report-not-ruled", &[history::Source::RunnerLogs]),
        ]
    }

    fn lacking(&self, ctx: &Index) -> Option<String> {
        if ctx.seen.ledger == 0 {
            return crate::driver::need_ledger(ctx);
        }
        if self.answers > 0 && ctx.seen.ledger_seqs == 0 {
            return Some("runners got answers naming ledger entries, but the history has no ledger `seq`s".into());
        }
        None
    }

    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings) {
        let played = ev.src == Source::RunnerResponse
            && ev.raw.value.as_ref().is_some_and(|value| value.get("played") == Some(&serde_json::Value::Bool(true)));
        if let (true, Some(attempt)) = (ev.src == Source::ReportSent || played, ev.attempt) {
            self.sent += 1;
            let counts = self.applied_mut(sent_kind(ev), attempt);
            if played {
                counts.played += 1;
            } else {
                counts.sent += 1;
                counts.sent_ns.push(ev.raw.time_ns);
            }
        }
        if let (Source::ForeignReport, Some(attempt)) = (ev.src, ev.attempt) {
            self.sent += 1;
            self.applied_mut(sent_kind(ev), attempt).foreign.push(ev.index);
        }
        if let (Source::Ledger, Some(attempt), true) = (ev.src, ev.attempt, ev.op.is_report()) {
            let counts = self.applied_mut(ev.op, attempt);
            counts.ledgered += 1;
            counts.entry_ns.push(ev.raw.time_ns);
            if counts.entries.len() >= 3 {
                counts.entries.pop();
            }
            counts.entries.push(ev.index);
        }
        if let (true, Some(runner)) = (ev.raw.process.is_runner(), ev.runner) {
            self.logged.insert(runner);
        }
        if ev.op == Op::Claim {
            self.observe_claim(ev);
        }
        if ev.src == Source::Ledger {
            self.observe_project(ev);
            self.seq_max = self.seq_max.max(ev.seq.unwrap_or(0));
        }
        // What an entry or an answer is about: a report, or an operator's reconcile.
        let op = match ev.src {
            Source::NemesisAnswer => sent_kind(ev),
            Source::OperatorAnswer => Op::Reconcile,
            _ => ev.op,
        };
        let answer = matches!(ev.src, Source::RunnerResponse | Source::NemesisAnswer | Source::OperatorAnswer);
        let reconcile = op == Op::Reconcile && matches!(ev.src, Source::Ledger | Source::OperatorAnswer);
        if !(op.is_report() && (answer || ev.src == Source::Ledger) || reconcile) {
            return;
        }
        if let (true, true, None, Some(attempt)) = (answer, op.is_report(), ev.decision, ev.attempt) {
            self.refusal(ev, ctx, op, attempt, out);
        }
        let finding = if reconcile { ev.outcome } else { None };
        let says = Says { op, attempt: ev.attempt, decision: ev.decision, finding };
        if let (true, Some(attempt)) = (reconcile, ev.attempt) {
            match (ev.src, ev.ledger_seq) {
                (Source::Ledger, _) => *self.reconciles.entry((attempt, finding)).or_default() += 1,
                (_, None) => self.reconciles_answered.push((attempt, finding, ev.index)),
                _ => {}
            }
        }
        match (ev.src, ev.seq, ev.ledger_seq) {
            (Source::Ledger, Some(seq), _) => {
                for waiting in self.waiting.remove(&seq).unwrap_or_default() {
                    judge(ctx, waiting, seq, Some((says, ev.index)), out, true);
                }
                self.entries.insert(seq, (says, ev.index));
            }
            (_, _, Some(seq)) if answer => {
                self.answers += 1;
                let answer = (says, ev.index, Sender::of(ev));
                match self.entries.remove(&seq) {
                    Some(entry) => judge(ctx, answer, seq, Some(entry), out, true),
                    None => self.waiting.entry(seq).or_default().push(answer),
                }
            }
            _ => {}
        }
    }

    fn finish(&mut self, ctx: &Index, out: &mut Findings) {
        self.claims_applied_twice(ctx, out);
        self.unknown_jobs_known(ctx, out);
        if ctx.seen.ledger > 0 {
            self.reconciles_unrecorded(ctx, out);
        }
        if self.sent > 0 {
            // Judged in place, then read in the same order.
            let counts: Vec<(u64, u64)> =
                self.applied.iter_mut().flatten().map(|applied| applied.over().unwrap_or((0, 0))).collect();
            let mut over: Vec<Over> = self
                .applied
                .iter()
                .enumerate()
                .flat_map(|(attempt, kinds)| {
                    REPORTS.iter().zip(kinds).map(move |(&op, applied)| ((op, attempt as u32), applied))
                })
                .zip(counts)
                .filter(|(_, counts)| counts.0 > 0)
                .map(|((key, applied), counts)| (key, applied, counts))
                .filter(|((_, attempt), _, _)| {
                    ctx.attempt(*attempt).claim.is_none_or(|claim| self.logged.contains(&claim.runner))
                })
                .collect();
            over.sort_unstable_by_key(|(_, applied, _)| applied.entries.first().copied());
            for ((op, attempt), applied, (ledgered, sent)) in over {
                let what = describe(ctx, Says { op, attempt: Some(attempt), decision: None, finding: None });
                let what = what.trim_start_matches("`undecided` to ");
                let (kind, message, mut events) = if applied.foreign.is_empty() {
                    let why = "a request was applied more than once";
                    let message =
                        format!("the ledger held {ledgered} entries for {what} when {sent} had been sent: {why}");
                    ("applied-more-than-sent", message, applied.entries.to_vec())
                } else {
                    let foreign = applied.foreign.len();
                    let message = format!(
                        "the ledger held {ledgered} entries for {what} when its runner had sent {sent}: \
                         {foreign} sent with another runner's token should have been refused, and one was applied"
                    );
                    ("foreign-report-applied", message, [&applied.foreign[..], &applied.entries[..]].concat())
                };
                events.sort_unstable();
                let found = Found::new(NAME, kind)
                    .attempt(ctx, attempt)
                    .job(ctx, ctx.attempt(attempt).claim.map(|claim| claim.job));
                out.push(found.events(&events).says(message));
            }
        }
        if ctx.seen.ledger_seqs == 0 {
            return;
        }
        let mut waiting: Vec<(u64, Vec<Answer>)> = std::mem::take(&mut self.waiting).into_iter().collect();
        waiting.sort_unstable_by_key(|(seq, _)| *seq);
        for (seq, answers) in waiting {
            for answer in answers {
                // An entry the ledger holds that is not this answer's: another report's, or
                // one an earlier answer already named.
                let held = seq > 0 && seq <= self.seq_max;
                judge(ctx, answer, seq, None, out, held);
            }
        }
    }
}

impl LedgerCompleteness {
    /// The counts of `attempt`'s reports of kind `op` (one of [`REPORTS`]).
    fn applied_mut(&mut self, op: Op, attempt: u32) -> &mut Applied {
        let kind = REPORTS.iter().position(|&report| report == op).expect("a report kind");
        &mut self.applied.slot(attempt as usize)[kind]
    }

    /// An answer to a report with no decision: an error. Judged unless it is one of the
    /// contract's errors before a ruling that the history does not show untrue.
    fn refusal(&mut self, ev: &Observed, ctx: &Index, op: Op, attempt: u32, out: &mut Findings) {
        let Some(said) = ev.raw.reason.as_deref() else { return };
        let Some((status, code)) = status_and_code(said) else { return };
        let sender = token_of(ev);
        // A report sent with another runner's token: its `403 runner_mismatch` is the answer.
        if !(400..500).contains(&status) || sender.is_some_and(|sender| Some(sender) != ev.raw.runner.as_deref()) {
            return;
        }
        let why = match code {
            _ if status == 409 => " (a 409 error body: what a verdict says, with no verdict)",
            "forbidden" => " (a runner's token is the kind a report needs)",
            "runner_mismatch" if sender.is_some() => " (the report named the runner whose token sent it)",
            "unknown_job" => {
                if let (Some(job), Some(runner)) = (ev.job, ev.runner) {
                    self.unknown_job.push((op, job, runner, attempt, ev.index));
                }
                return;
            }
            code if BEFORE_RULING.contains(&code) => return,
            _ => " (an error the contract never answers a report with)",
        };
        unruled(op, attempt, said, why, ev, ctx, out);
    }

    /// Each job's project (its submit's or claim's) and each runner's (its claims').
    fn observe_project(&mut self, ev: &Observed) {
        let Some(project) = ev.raw.project.as_deref() else { return };
        if !matches!(ev.op, Op::Submit | Op::Claim) {
            return;
        }
        let id = match self.projects.iter().position(|known| known == project) {
            Some(id) => id as u32,
            None => {
                self.projects.push(project.to_string());
                self.projects.len() as u32 - 1
            }
        };
        if let Some(job) = ev.job {
            self.job_project.entry(job).or_insert(id);
        }
        if let (Op::Claim, Some(runner)) = (ev.op, ev.runner) {
            self.runner_project.entry(runner).or_insert(id);
        }
    }

    /// Reports answered `404 unknown_job` for a job the ledger holds in the reporting runner's
    /// own project: the job exists there, so the contract rules the report.
    fn unknown_jobs_known(&mut self, ctx: &Index, out: &mut Findings) {
        for (op, job, runner, attempt, at) in std::mem::take(&mut self.unknown_job) {
            let project = self.job_project.get(&job);
            if project.is_none() || project != self.runner_project.get(&runner) {
                continue;
            }
            let message = format!(
                "{}'s {} for {} was answered `404 unknown_job`, but the ledger holds job {} in that runner's own \
                 project: no ruling and no ledger entry, where the contract rules every report of a job in the \
                 runner's project",
                ctx.runner_name(runner),
                op_name(op),
                ctx.label(attempt),
                ctx.jobs_names.name(job)
            );
            let found =
                Found::new(NAME, unruled_kind(op)).job(ctx, Some(job)).attempt(ctx, attempt).runner(ctx, runner);
            out.push(found.events(&[at]).says(message));
        }
    }

    /// The operator's reconciles answered with no entry named: each needs a reconcile entry of
    /// its attempt with its finding, one per answer.
    fn reconciles_unrecorded(&mut self, ctx: &Index, out: &mut Findings) {
        let mut answered = std::mem::take(&mut self.reconciles_answered);
        answered.sort_unstable_by_key(|(_, _, at)| *at);
        for (attempt, finding, at) in answered {
            let entries = self.reconciles.entry((attempt, finding)).or_default();
            if *entries > 0 {
                *entries -= 1;
                continue;
            }
            let says = Says { op: Op::Reconcile, attempt: Some(attempt), decision: None, finding };
            let message = format!(
                "the operator was answered {} as applied, but the ledger holds no such reconcile entry for it",
                describe(ctx, says)
            );
            let found = Found::new(NAME, "answer-missing-from-ledger")
                .attempt(ctx, attempt)
                .job(ctx, ctx.attempt(attempt).claim.map(|claim| claim.job));
            out.push(found.events(&[at]).says(message));
        }
    }

    fn observe_claim(&mut self, ev: &Observed) {
        match (ev.src, ev.runner, ev.attempt) {
            (Source::RunnerRequest, Some(runner), _) => self.claims.entry(runner).or_default().requests += 1,
            (Source::RunnerResponse, Some(runner), attempt) => {
                self.claims.entry(runner).or_default().answered += 1;
                self.told.extend(attempt);
            }
            (Source::Ledger, Some(runner), Some(attempt)) => {
                self.claims.entry(runner).or_default().granted.push((attempt, ev.index));
            }
            (Source::PlayedClaim, _, Some(attempt)) => {
                self.told.insert(attempt);
            }
            _ => {}
        }
    }

    /// Per runner: grants nobody was told of, beyond its claims that got no answer.
    fn claims_applied_twice(&mut self, ctx: &Index, out: &mut Findings) {
        let mut runners: Vec<(&u32, &Claims)> = self.claims.iter().collect();
        runners.sort_unstable_by_key(|(runner, _)| **runner);
        for (&runner, claims) in runners.into_iter().filter(|(runner, _)| self.logged.contains(runner)) {
            let untold: Vec<&(u32, u64)> =
                claims.granted.iter().filter(|(attempt, _)| !self.told.contains(attempt)).collect();
            let unanswered = claims.requests.saturating_sub(claims.answered);
            if untold.len() as u64 <= unanswered {
                continue;
            }
            let names: Vec<&str> = untold.iter().map(|(attempt, _)| ctx.attempt_name(*attempt)).collect();
            let message = format!(
                "the ledger granted {} {} attempt{} it was never told of ({}) when only {unanswered} of its {} \
                 claim requests went unanswered: a claim was applied more than once",
                ctx.runner_name(runner),
                untold.len(),
                if untold.len() == 1 { "" } else { "s" },
                names.join(", "),
                claims.requests
            );
            let events: Vec<u64> = untold.iter().map(|(_, index)| *index).take(5).collect();
            let first = untold[0].0;
            let found = Found::new(NAME, "applied-more-than-sent")
                .runner(ctx, runner)
                .attempt(ctx, first)
                .job(ctx, ctx.attempt(first).claim.map(|claim| claim.job));
            out.push(found.events(&events).says(message));
        }
    }
}

fn judge(
    ctx: &Index,
    (says, at, sender): Answer,
    seq: u64,
    entry: Option<(Says, u64)>,
    out: &mut Findings,
    held: bool,
) {
    if entry.is_some_and(|(entry, _)| entry == says) {
        return;
    }
    let what = describe(ctx, says);
    let who = sender.name();
    let (kind, message, events) = match entry {
        Some((other, entry_at)) => (
            "answer-differs-from-ledger",
            format!(
                "{who} was answered {what} recorded as ledger entry {seq}, but that entry is {}",
                describe(ctx, other)
            ),
            vec![entry_at, at],
        ),
        None if held => (
            "answer-missing-from-ledger",
            format!(
                "{who} was answered {what} recorded as ledger entry {seq}, which is no entry of its own: that entry \
                 records another report, or an earlier answer named it"
            ),
            vec![at],
        ),
        None => (
            "answer-missing-from-ledger",
            format!("{who} was answered {what} recorded as ledger entry {seq}, which the ledger does not hold"),
            vec![at],
        ),
    };
    let mut found = Found::new(NAME, kind);
    if let Some(attempt) = says.attempt {
        found = found.attempt(ctx, attempt);
        found = found.job(ctx, ctx.attempt(attempt).claim.map(|claim| claim.job));
    }
    out.push(found.events(&events).says(message));
}

fn describe(ctx: &Index, says: Says) -> String {
    let attempt = says.attempt.map_or("an unnamed attempt", |attempt| ctx.attempt_name(attempt));
    if says.op == Op::Reconcile {
        let finding = says.finding.map_or("no finding", |finding| ctx.outcome_name(finding));
        return format!("the finding `{finding}` of a reconcile of {attempt}");
    }
    let op = match says.op {
        Op::Heartbeat => "heartbeat",
        Op::Capability => "capability",
        _ => "result",
    };
    let decision = says.decision.map_or("undecided", crate::terminal_stability::decision_name);
    format!("`{decision}` to a {op} for {attempt}")
}
