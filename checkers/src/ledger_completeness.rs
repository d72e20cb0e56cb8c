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
//! And every result gets a ruling: one answered with an error that names a verdict's reason
//! (`409 not_current` as an error body, no `decision`, no `ledger_seq`) was decided and kept
//! nowhere (`result-not-ruled`).

use crate::driver::{Check, Findings, Found};
use crate::model::{FxMap, Index, Observed, Op, Source};
use history::Decision;

pub const NAME: &str = "ledger-completeness";
pub const ABOUT: &str = "every report a runner got an answer for is recorded in the ledger as answered";

/// Runs this checker alone over a history.
pub fn check(events: &[history::Event]) -> crate::CheckerResult {
    crate::driver::single(Box::<LedgerCompleteness>::default(), events)
}

/// What a ledger entry or an answer says: kind, attempt, decision.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Says {
    op: Op,
    attempt: Option<u32>,
    decision: Option<Decision>,
}

#[derive(Default)]
pub(crate) struct LedgerCompleteness {
    /// Ledger report entries not yet matched by an answer, by seq.
    entries: FxMap<u64, (Says, u64)>,
    /// Answers whose entry had not been seen yet, by seq: what they say, event.
    waiting: FxMap<u64, Vec<(Says, u64)>>,
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

/// A result answered with an error naming a ruling's reason (`409 not_current: …`, or the
/// bare code): the server decided the result and kept no ruling. The contract answers every
/// result of a claim with a verdict and a ledger entry, a late one as a late observation.
fn not_ruled(ev: &Observed, ctx: &Index, attempt: u32, out: &mut Findings) {
    let Some(said) = ev.raw.reason.as_deref() else { return };
    let code = said.strip_prefix("409 ").unwrap_or(said);
    let code = code.split(':').next().unwrap_or(code).trim();
    let ruled = said.starts_with("409 ") || (code == said.trim() && history::Reason::parse(code).is_some());
    if !ruled || history::Reason::parse(code).is_none() {
        return;
    }
    let message = format!(
        "the result for {} was answered with the error `{said}`: no ruling and no ledger entry, where the contract rules every result (a late one as a late observation)",
        ctx.label(attempt)
    );
    let found = Found::new(NAME, "result-not-ruled").job(ctx, ev.job).attempt(ctx, attempt).reported(ctx, ev);
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
        if !ev.op.is_report() {
            return;
        }
        if let (Source::RunnerResponse, Op::Result, None, Some(attempt)) = (ev.src, ev.op, ev.decision, ev.attempt) {
            not_ruled(ev, ctx, attempt, out);
        }
        let says = Says { op: ev.op, attempt: ev.attempt, decision: ev.decision };
        match (ev.src, ev.seq, ev.ledger_seq) {
            (Source::Ledger, Some(seq), _) => {
                for (answer, at) in self.waiting.remove(&seq).unwrap_or_default() {
                    judge(ctx, at, seq, answer, Some((says, ev.index)), out);
                }
                self.entries.insert(seq, (says, ev.index));
            }
            (Source::RunnerResponse, _, Some(seq)) => {
                self.answers += 1;
                match self.entries.remove(&seq) {
                    Some((entry, at)) => judge(ctx, ev.index, seq, says, Some((entry, at)), out),
                    None => self.waiting.entry(seq).or_default().push((says, ev.index)),
                }
            }
            _ => {}
        }
    }

    fn finish(&mut self, ctx: &Index, out: &mut Findings) {
        self.claims_applied_twice(ctx, out);
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
                let what = describe(ctx, Says { op, attempt: Some(attempt), decision: None });
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
        let mut waiting: Vec<(u64, Vec<(Says, u64)>)> = std::mem::take(&mut self.waiting).into_iter().collect();
        waiting.sort_unstable_by_key(|(seq, _)| *seq);
        for (seq, answers) in waiting {
            for (says, at) in answers {
                judge(ctx, at, seq, says, None, out);
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

fn judge(ctx: &Index, at: u64, seq: u64, says: Says, entry: Option<(Says, u64)>, out: &mut Findings) {
    if entry.is_some_and(|(entry, _)| entry == says) {
        return;
    }
    let what = describe(ctx, says);
    let (kind, message, events) = match entry {
        Some((other, entry_at)) => (
            "answer-differs-from-ledger",
            format!(
                "a runner was answered {what} recorded as ledger entry {seq}, but that entry is {}",
                describe(ctx, other)
            ),
            vec![entry_at, at],
        ),
        None => (
            "answer-missing-from-ledger",
            format!("a runner was answered {what} recorded as ledger entry {seq}, which the ledger does not hold"),
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
    let op = match says.op {
        Op::Heartbeat => "heartbeat",
        Op::Capability => "capability",
        _ => "result",
    };
    let attempt = says.attempt.map_or("an unnamed attempt", |attempt| ctx.attempt_name(attempt));
    let decision = says.decision.map_or("undecided", crate::terminal_stability::decision_name);
    format!("`{decision}` to a {op} for {attempt}")
}
