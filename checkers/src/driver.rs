//! The one pass: decodes each event once, shows it to every checker with the index of
//! everything before it, then folds it into the index; and the anomaly builder the
//! checkers share.
//!
//! Ledger events are visited in ledger order (`value.seq`), not in the history's time
//! order: a ledger entry's time is the request's *receipt*, read before its transaction,
//! so two concurrent requests can sit in the history in the opposite order of their
//! commits (a claim received just before the reconcile that made its job claimable). The
//! ledger events keep their slots in the history; only their order among themselves is
//! that of `seq`. When a ledger event has no `seq`, or a `seq` repeats, the history's order
//! is kept.

use crate::model::{Index, Observed};
use crate::{Anomaly, CheckerResult, Verdict};
use history::{Event, EventType};

/// Most anomalies a checker lists; the rest are counted in one last anomaly.
const LISTED_MAX: usize = 1_000;

/// One checker, fed the history one event at a time.
pub(crate) trait Check {
    fn name(&self) -> &'static str;
    /// The evidence the checker needs that the history lacks, if any (then it cannot say
    /// Valid, only Invalid or Unknown). Most checkers read the ledger, hence the default.
    fn lacking(&self, ctx: &Index) -> Option<String> {
        need_ledger(ctx)
    }
    fn observe(&mut self, ev: &Observed, ctx: &Index, out: &mut Findings);
    fn finish(&mut self, _ctx: &Index, _out: &mut Findings) {}
    /// Each anomaly kind of this checker that stands on a source besides the ledger (or on
    /// the absence of something a source would show): when the history lacks one, the rule
    /// is not judged — unknown, with that reason — and its anomalies are not raised.
    fn needs(&self) -> &'static [(&'static str, &'static [history::Source])] {
        &[]
    }
}

/// The rules of `needs` a history holding what `ctx` says cannot judge: each kind and the
/// first source it lacks.
fn unjudged(needs: &[(&'static str, &'static [history::Source])], ctx: &Index) -> Vec<(&'static str, history::Source)> {
    needs
        .iter()
        .filter_map(|(kind, sources)| sources.iter().find(|source| !ctx.holds(**source)).map(|source| (*kind, *source)))
        .collect()
}

/// The anomalies one checker found.
#[derive(Default)]
pub(crate) struct Findings {
    listed: Vec<Anomaly>,
    unlisted: usize,
}

impl Findings {
    pub fn push(&mut self, anomaly: Anomaly) {
        if self.listed.len() < LISTED_MAX {
            self.listed.push(anomaly);
        } else {
            self.unlisted += 1;
        }
    }

    fn into_vec(mut self, checker: &str) -> Vec<Anomaly> {
        if self.unlisted > 0 {
            let message = format!("{} more anomalies of {checker} are not listed", self.unlisted);
            self.listed.push(Found::new(checker, "more").says(message));
        }
        self.listed
    }
}

/// A ledger event's `seq`, if it has one.
pub(crate) fn seq_of(event: &Event) -> Option<u64> {
    event.value.as_ref().and_then(|value| value.get("seq")).and_then(|seq| seq.as_u64())
}

/// The positions of the ledger events in `seq` order, when that differs from the
/// history's order and every ledger event has a distinct `seq`.
fn ledger_slots(events: &[Event]) -> Option<Vec<u32>> {
    let mut ledger: Vec<(u64, u32)> = Vec::new();
    for (position, event) in events.iter().enumerate() {
        if event.kind == EventType::Ledger {
            let seq = seq_of(event)?;
            ledger.push((seq, u32::try_from(position).ok()?));
        }
    }
    if ledger.windows(2).all(|pair| pair[0].0 < pair[1].0) {
        return None;
    }
    ledger.sort_unstable();
    if ledger.windows(2).any(|pair| pair[0].0 == pair[1].0) {
        return None;
    }
    Some(ledger.into_iter().map(|(_, position)| position).collect())
}

/// The checkers and the index, fed one event at a time.
pub(crate) struct Pass {
    ctx: Index,
    checks: Vec<Box<dyn Check>>,
    found: Vec<Findings>,
}

impl Pass {
    pub fn new(checks: Vec<Box<dyn Check>>) -> Pass {
        let found = checks.iter().map(|_| Findings::default()).collect();
        Pass { ctx: Index::default(), checks, found }
    }

    /// Shows one event, which should sit at `position` in the history, to every checker.
    pub fn feed(&mut self, event: &Event, position: usize) {
        let Some(ev) = self.ctx.decode(event, position) else { return };
        for (check, out) in self.checks.iter_mut().zip(self.found.iter_mut()) {
            check.observe(&ev, &self.ctx, out);
        }
        self.ctx.apply(&ev);
    }

    /// Feeds a whole history, its ledger events in `seq` order.
    pub fn feed_all(&mut self, events: &[Event]) {
        let slots = ledger_slots(events);
        let mut next_slot = 0usize;
        for (position, event) in events.iter().enumerate() {
            match &slots {
                Some(slots) if event.kind == EventType::Ledger => {
                    let slot = slots.get(next_slot).map_or(position, |&slot| slot as usize);
                    next_slot += 1;
                    self.feed(events.get(slot).unwrap_or(event), slot);
                }
                _ => self.feed(event, position),
            }
        }
    }

    /// How many attempts, jobs and names the index holds (its memory, roughly).
    pub fn tracked(&self) -> usize {
        self.ctx.attempts.len() + self.ctx.jobs.len() + self.ctx.runner_names.len() + self.ctx.key_names.len()
    }

    pub fn finish(mut self) -> Vec<(&'static str, Verdict)> {
        let mut verdicts = Vec::with_capacity(self.checks.len());
        for (check, mut out) in self.checks.iter_mut().zip(std::mem::take(&mut self.found)) {
            check.finish(&self.ctx, &mut out);
            let name = check.name();
            let unjudged = unjudged(check.needs(), &self.ctx);
            out.listed.retain(|anomaly| !unjudged.iter().any(|(kind, _)| anomaly.kind == *kind));
            let lacking = check.lacking(&self.ctx).or_else(|| not_judged(&unjudged));
            verdicts.push((name, verdict(name, out, lacking, self.ctx.malformed.as_deref())));
        }
        verdicts
    }
}

/// Why some rules were not judged, if any were not.
fn not_judged(unjudged: &[(&'static str, history::Source)]) -> Option<String> {
    if unjudged.is_empty() {
        return None;
    }
    let rules: Vec<String> =
        unjudged.iter().map(|(kind, source)| format!("`{kind}` needs {}", source.described())).collect();
    Some(format!("not judged for want of evidence: {}; the rest found nothing", rules.join("; ")))
}

/// Invalid when anything was found, unless the history is malformed (then nothing found is
/// trusted); Unknown when evidence is lacking and nothing was found; else Valid.
fn verdict(name: &str, out: Findings, lacking: Option<String>, malformed: Option<&str>) -> Verdict {
    let anomalies = out.into_vec(name);
    if let Some(why) = malformed {
        let found = anomalies.len();
        return Verdict::Unknown {
            reason: format!("{why}; the history cannot be checked ({found} possible anomalies are not trusted)"),
        };
    }
    match (anomalies.is_empty(), lacking) {
        (false, _) => Verdict::Invalid { anomalies },
        (true, Some(reason)) => Verdict::Unknown { reason },
        (true, None) => Verdict::Valid,
    }
}

/// A result for the checker with this name, with its description from [`crate::names`].
pub(crate) fn result(name: &str, verdict: Verdict) -> CheckerResult {
    let description = crate::names().iter().find(|(known, _)| *known == name).map_or("", |(_, what)| what);
    CheckerResult { checker: name.to_string(), description: description.to_string(), verdict }
}

/// Builds an anomaly; attempts bring their runner and fence from the ledger's claim.
pub(crate) struct Found(Anomaly);

impl Found {
    pub fn new(checker: &str, kind: &str) -> Found {
        Found(Anomaly {
            checker: checker.to_string(),
            kind: kind.to_string(),
            job: None,
            attempts: vec![],
            runners: vec![],
            fences: vec![],
            key: None,
            events: vec![],
            message: String::new(),
        })
    }

    pub fn kind(mut self, kind: &str) -> Found {
        self.0.kind = kind.to_string();
        self
    }

    pub fn job(mut self, ctx: &Index, job: Option<u32>) -> Found {
        self.0.job = ctx.job_name(job);
        self
    }

    pub fn key(mut self, ctx: &Index, key: Option<u32>) -> Found {
        self.0.key = key.map(|key| ctx.key_names.name(key).to_string());
        self
    }

    pub fn attempt(mut self, ctx: &Index, attempt: u32) -> Found {
        push_new(&mut self.0.attempts, ctx.attempt_name(attempt).to_string());
        if let Some(claim) = ctx.attempt(attempt).claim {
            self = self.runner(ctx, claim.runner).fence(claim.fence);
        }
        self
    }

    pub fn attempts_of(self, ctx: &Index, attempt: Option<u32>) -> Found {
        match attempt {
            Some(attempt) => self.attempt(ctx, attempt),
            None => self,
        }
    }

    pub fn runner(mut self, ctx: &Index, runner: u32) -> Found {
        push_new(&mut self.0.runners, ctx.runner_name(runner).to_string());
        self
    }

    pub fn fence(mut self, fence: u64) -> Found {
        push_new(&mut self.0.fences, fence);
        self
    }

    /// Adds the reporting claim of an event: its attempt, runner and fence as sent.
    pub fn reported(mut self, ctx: &Index, ev: &Observed) -> Found {
        if let Some(attempt) = ev.attempt {
            self = self.attempt(ctx, attempt);
        }
        if let Some(runner) = ev.runner {
            self = self.runner(ctx, runner);
        }
        if let Some(fence) = ev.fence {
            self = self.fence(fence);
        }
        self
    }

    pub fn events(mut self, events: &[u64]) -> Found {
        for &event in events {
            push_new(&mut self.0.events, event);
        }
        self.0.events.sort_unstable();
        self
    }

    pub fn says(mut self, message: String) -> Anomaly {
        self.0.message = message;
        self.0
    }
}

fn push_new<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

/// Unknown's reason when the history holds no ledger events.
pub(crate) fn need_ledger(ctx: &Index) -> Option<String> {
    (ctx.seen.ledger == 0)
        .then(|| "the history has no ledger events: nothing the control plane decided to check".into())
}

/// Unknown's reason for a checker every rule of which stands on leases: no ledger, or a
/// system that grants no lease (its config lacks `lease`).
pub(crate) fn need_leases(ctx: &Index) -> Option<String> {
    need_ledger(ctx).or_else(|| {
        (!ctx.holds(history::Source::Leases)).then(|| {
            "the system grants no lease (the run's config lacks `lease`): no lease to judge owners, heartbeats \
             or clocks by"
                .into()
        })
    })
}

/// Unknown's reason when the history holds no `final` events.
pub(crate) fn need_finals(ctx: &Index) -> Option<String> {
    (ctx.seen.finals == 0).then(|| "the history has no `final` events: the state after recovery is not known".into())
}

/// Runs one checker alone over a whole history.
pub(crate) fn single(check: Box<dyn Check>, events: &[Event]) -> CheckerResult {
    let mut pass = Pass::new(vec![check]);
    pass.feed_all(events);
    let (name, verdict) = pass.finish().pop().unwrap_or(("?", Verdict::Unknown { reason: "no checker ran".into() }));
    result(name, verdict)
}

#[cfg(test)]
mod tests {
    use super::*;
    use history::{Op, Process};
    use serde_json::json;

    fn ledger(seq: u64) -> Event {
        let mut event = Event::new(0, Process::CONTROL_PLANE, EventType::Ledger, Op::Claim);
        event.value = Some(json!({ "seq": seq }));
        event
    }

    #[test]
    fn ledger_slots_reorder_only_out_of_order_unique_seqs() {
        let other = Event::new(0, Process::CLIENT, EventType::Invoke, Op::Submit);
        assert_eq!(ledger_slots(&[ledger(1), other.clone(), ledger(2)]), None);
        assert_eq!(ledger_slots(&[ledger(2), other.clone(), ledger(1)]), Some(vec![2, 0]));
        assert_eq!(ledger_slots(&[ledger(2), ledger(2), ledger(1)]), None);
        let mut unnumbered = ledger(1);
        unnumbered.value = None;
        assert_eq!(ledger_slots(&[ledger(2), unnumbered, ledger(1)]), None);
    }

    #[test]
    fn findings_list_at_most_a_thousand_and_count_the_rest() {
        let mut found = Findings::default();
        for _ in 0..LISTED_MAX + 5 {
            found.push(Found::new("x", "y").says("z".into()));
        }
        let listed = found.into_vec("x");
        assert_eq!(listed.len(), LISTED_MAX + 1);
        assert_eq!(listed[LISTED_MAX].message, "5 more anomalies of x are not listed");
    }

    #[test]
    fn malformed_beats_invalid_and_lacking_evidence_only_beats_valid() {
        let mut found = Findings::default();
        found.push(Found::new("x", "y").says("z".into()));
        assert!(matches!(verdict("x", found, None, Some("bad")), Verdict::Unknown { .. }));
        let mut found = Findings::default();
        found.push(Found::new("x", "y").says("z".into()));
        assert!(matches!(verdict("x", found, Some("no ledger".into()), None), Verdict::Invalid { .. }));
        assert!(matches!(verdict("x", Findings::default(), Some("no ledger".into()), None), Verdict::Unknown { .. }));
        assert_eq!(verdict("x", Findings::default(), None, None), Verdict::Valid);
    }
}
