//! `ledger-completeness`: every answer a runner got names the ledger entry that records
//! the report (`value.ledger_seq`); that entry must exist and say the same thing.
//!
//! From the runners' answers and the ledger: a heartbeat, capability or result answered
//! with `ledger_seq = N` needs a ledger event with `value.seq = N` of the same kind, for
//! the same attempt, with the same decision (an answer given before the commit — the
//! planted `ack-before-commit` — names a seq the ledger never held, or gave to another
//! entry). Ledger entries are held by seq until an answer matches them; an answer seen
//! before its entry waits for it, so the check does not depend on which comes first.

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
}

impl Check for LedgerCompleteness {
    fn name(&self) -> &'static str {
        NAME
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
        if !ev.op.is_report() {
            return;
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
