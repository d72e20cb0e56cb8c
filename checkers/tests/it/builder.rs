//! A small builder for literal histories: each method appends the events one source
//! would write (a ledger entry with its next `seq`, a runner's request and answer, a
//! target step, the final state), numbered and timed in order.

#![allow(dead_code)]

use history::{Decision, Event, EventType, Op, Process, Reason};
use serde_json::json;
use std::collections::HashMap;

/// A claim: job, attempt, runner, fence.
#[derive(Clone, Debug)]
pub struct C {
    pub job: String,
    pub attempt: String,
    pub runner: String,
    pub fence: u64,
}

pub fn claim(job: &str, attempt: &str, runner: &str, fence: u64) -> C {
    C { job: job.into(), attempt: attempt.into(), runner: runner.into(), fence }
}

#[derive(Default)]
pub struct H {
    events: Vec<Event>,
    time_ns: u64,
    seq: u64,
    keys: HashMap<String, String>,
}

fn decision_str(decision: Decision) -> &'static str {
    match decision {
        Decision::Accepted => "accepted",
        Decision::Rejected => "rejected",
        Decision::Duplicate => "duplicate",
        Decision::Conflict => "conflict",
    }
}

impl H {
    pub fn new() -> H {
        H::default()
    }

    /// Appends an event; returns its index.
    pub fn push(&mut self, mut event: Event) -> u64 {
        self.time_ns += 1_000;
        event.time_ns = self.time_ns;
        event.index = self.events.len() as u64;
        self.events.push(event);
        self.events.len() as u64 - 1
    }

    /// The history, declaring every source as a fencelab run does (last, so that no
    /// event's index moves).
    pub fn build(mut self) -> Vec<Event> {
        let every = history::Source::ALL.iter().copied().collect();
        self.push(history::sources_event(&every));
        self.events
    }

    /// The history as records gathered by hand would give it: no declaration of sources,
    /// which are then read off the events.
    pub fn build_undeclared(self) -> Vec<Event> {
        self.events
    }

    pub fn len(&self) -> u64 {
        self.events.len() as u64
    }

    fn key(&self, job: &str) -> String {
        self.keys.get(job).cloned().unwrap_or_else(|| "prod".into())
    }

    pub fn config(&mut self, target_mode: &str) -> u64 {
        let mut event = Event::new(0, Process::HARNESS, EventType::Ok, Op::Config);
        event.value = Some(json!({"target_mode": target_mode, "bugs": [], "lease_ms": 2_000}));
        self.push(event)
    }

    /// The harness's `config` event for a system that lacks the optional parts `absent`.
    pub fn config_lacking(&mut self, absent: &[&str]) -> u64 {
        let mut event = Event::new(0, Process::HARNESS, EventType::Ok, Op::Config);
        event.value = Some(json!({"target_mode": "fenced", "lease_ms": 2_000, "system": {"absent": absent}}));
        self.push(event)
    }

    /// The client's submit (invoke, ledger `submit`, ok); returns the ok's index.
    pub fn submit(&mut self, job: &str, key: &str, at_ms: i64) -> u64 {
        self.keys.insert(job.into(), key.into());
        let mut invoke = Event::new(0, Process::CLIENT, EventType::Invoke, Op::Submit).with_job(job);
        invoke.key = Some(key.into());
        let ok = Event { kind: EventType::Ok, ..invoke.clone() };
        self.push(invoke);
        let mut entry = Event::new(0, Process::CONTROL_PLANE, EventType::Ledger, Op::Submit).with_job(job);
        entry.key = Some(key.into());
        entry.received_ms = Some(at_ms);
        self.ledger(entry);
        self.push(ok)
    }

    /// Appends a ledger entry with the next seq (plus `extra` in its value); returns the seq.
    pub fn ledger(&mut self, mut entry: Event) -> u64 {
        self.seq += 1;
        let mut value = json!({"seq": self.seq});
        if let (Some(extra), Some(map)) = (entry.value.take(), value.as_object_mut()) {
            if let Some(extra) = extra.as_object() {
                map.extend(extra.clone());
            }
        }
        entry.value = Some(value);
        self.push(entry);
        self.seq
    }

    fn entry(&self, f: Op, c: &C, at_ms: i64) -> Event {
        let mut entry = Event::new(0, Process::CONTROL_PLANE, EventType::Ledger, f)
            .with_claim(&c.job, &c.attempt, &c.runner, c.fence);
        entry.key = Some(self.key(&c.job));
        entry.project = Some("demo".into());
        entry.received_ms = Some(at_ms);
        entry
    }

    /// A ledger claim and the runner's granted answer; returns the ledger event's index.
    pub fn ledger_claim(&mut self, c: &C, at_ms: i64, lease_end_ms: i64) -> u64 {
        let at = self.ledger_claim_untold(c, at_ms, lease_end_ms);
        self.runner_claim(c, lease_end_ms);
        at
    }

    /// Only the ledger's claim: an attempt granted and never told to its runner.
    pub fn ledger_claim_untold(&mut self, c: &C, at_ms: i64, lease_end_ms: i64) -> u64 {
        let mut entry = self.entry(Op::Claim, c, at_ms);
        entry.lease_expires_ms = Some(lease_end_ms);
        entry.observed_ms = Some(at_ms);
        entry.decision = Some(Decision::Accepted);
        self.ledger(entry);
        self.len() - 1
    }

    /// A claim request a runner logged and got no answer to (its `info`).
    pub fn runner_claim_unanswered(&mut self, runner: &str) {
        let process = Process::runner(runner);
        let mut request = Event::new(0, process.clone(), EventType::Request, Op::Claim);
        request.runner = Some(runner.into());
        self.push(request);
        let mut lost = Event::new(0, process, EventType::Info, Op::Claim);
        lost.runner = Some(runner.into());
        lost.reason = Some("no answer: the connection closed".into());
        self.push(lost);
    }

    /// Only the runner's log of a granted claim.
    pub fn runner_claim(&mut self, c: &C, lease_end_ms: i64) -> u64 {
        let process = Process::runner(&c.runner);
        let mut request = Event::new(0, process.clone(), EventType::Request, Op::Claim);
        request.runner = Some(c.runner.clone());
        self.push(request);
        let mut answer = Event::new(0, process.clone(), EventType::Response, Op::Claim)
            .with_claim(&c.job, &c.attempt, &c.runner, c.fence)
            .with_decision(Decision::Accepted, None);
        answer.key = Some(self.key(&c.job));
        answer.lease_expires_ms = Some(lease_end_ms);
        self.push(answer)
    }

    /// A ledger report entry: heartbeat, capability or result. Returns its seq.
    #[allow(clippy::too_many_arguments)]
    pub fn ledger_report(
        &mut self,
        f: Op,
        c: &C,
        at_ms: i64,
        observed_ms: i64,
        decision: Decision,
        reason: Option<Reason>,
        outcome: Option<&str>,
        lease_end_ms: Option<i64>,
        recorded_as: Option<&str>,
    ) -> u64 {
        let mut entry = self.entry(f, c, at_ms).with_decision(decision, reason);
        entry.observed_ms = Some(observed_ms);
        entry.outcome = outcome.map(str::to_string);
        entry.lease_expires_ms = lease_end_ms;
        entry.value = recorded_as.map(|recorded_as| json!({ "recorded_as": recorded_as }));
        self.ledger(entry)
    }

    /// A heartbeat decided by the ledger and answered to the runner; returns the ledger seq.
    pub fn heartbeat(
        &mut self,
        c: &C,
        at_ms: i64,
        observed_ms: i64,
        decision: Decision,
        lease_end: Option<i64>,
    ) -> u64 {
        self.answered(Op::Heartbeat, c, at_ms, observed_ms, decision, lease_end)
    }

    /// A heartbeat the ledger refused for `reason`, answered to the runner.
    pub fn heartbeat_refused(&mut self, c: &C, at_ms: i64, observed_ms: i64, reason: Reason) -> u64 {
        let seq = self.ledger_report(
            Op::Heartbeat,
            c,
            at_ms,
            observed_ms,
            Decision::Rejected,
            Some(reason),
            None,
            None,
            None,
        );
        self.answer_recorded(Op::Heartbeat, c, observed_ms, None, Decision::Rejected, seq);
        seq
    }

    pub fn capability(
        &mut self,
        c: &C,
        at_ms: i64,
        observed_ms: i64,
        decision: Decision,
        lease_end: Option<i64>,
    ) -> u64 {
        self.answered(Op::Capability, c, at_ms, observed_ms, decision, lease_end)
    }

    /// A heartbeat or capability decided by the ledger (refused as `expired`) and answered.
    fn answered(
        &mut self,
        kind: Op,
        c: &C,
        at_ms: i64,
        observed_ms: i64,
        decision: Decision,
        lease_end: Option<i64>,
    ) -> u64 {
        let reason = (decision != Decision::Accepted).then_some(Reason::Expired);
        let seq = self.ledger_report(kind, c, at_ms, observed_ms, decision, reason, None, lease_end, None);
        self.answer_recorded(kind, c, observed_ms, None, decision, seq);
        seq
    }

    /// A result as the correct ledger records it (reason and `recorded_as` from the
    /// decision), answered to the runner; returns the ledger seq.
    pub fn result(
        &mut self,
        c: &C,
        at_ms: i64,
        observed_ms: i64,
        outcome: &str,
        decision: Decision,
        reason: Option<Reason>,
    ) -> u64 {
        let recorded_as = match decision {
            Decision::Rejected => Some("late_observation"),
            Decision::Conflict => Some("conflict"),
            _ => None,
        };
        let reason = reason.or((decision == Decision::Conflict).then_some(Reason::Conflict));
        let seq =
            self.ledger_report(Op::Result, c, at_ms, observed_ms, decision, reason, Some(outcome), None, recorded_as);
        self.answer_recorded(Op::Result, c, observed_ms, Some(outcome), decision, seq);
        seq
    }

    /// A runner's request for the ledger entry just recorded, placed before it (a report is
    /// sent before it is recorded), and its answer naming `seq`; returns the answer's index.
    fn answer_recorded(
        &mut self,
        f: Op,
        c: &C,
        observed_ms: i64,
        outcome: Option<&str>,
        decision: Decision,
        seq: u64,
    ) -> u64 {
        let entry = self.events.pop().expect("the ledger entry the request is for");
        self.time_ns -= 1_000;
        self.answer(f, c, observed_ms, outcome, decision, seq);
        let answer = self.events.pop().expect("the answer just pushed");
        self.time_ns -= 1_000;
        self.push(entry);
        self.push(answer)
    }

    /// A runner's request and its answer naming a ledger seq; returns the answer's index.
    pub fn answer(
        &mut self,
        f: Op,
        c: &C,
        observed_ms: i64,
        outcome: Option<&str>,
        decision: Decision,
        seq: u64,
    ) -> u64 {
        let process = Process::runner(&c.runner);
        let mut request =
            Event::new(0, process.clone(), EventType::Request, f).with_claim(&c.job, &c.attempt, &c.runner, c.fence);
        request.observed_ms = Some(observed_ms);
        request.outcome = outcome.map(str::to_string);
        let mut answer = Event { kind: EventType::Response, ..request.clone() };
        self.push(request);
        answer.decision = Some(decision);
        answer.value = Some(json!({ "ledger_seq": seq }));
        self.push(answer)
    }

    pub fn expire(&mut self, c: &C, at_ms: i64, lease_end_ms: i64, recorded_as: &str) -> u64 {
        let mut entry = self.entry(Op::Expire, c, at_ms);
        entry.lease_expires_ms = Some(lease_end_ms);
        entry.value = Some(json!({ "recorded_as": recorded_as }));
        self.ledger(entry);
        self.len() - 1
    }

    /// The operator's reconcile and its ledger entry; returns the ledger event's index.
    pub fn reconcile(&mut self, c: &C, at_ms: i64, finding: &str, completed: Option<&str>) -> u64 {
        let mut op = Event::new(0, Process::OPERATOR, EventType::Invoke, Op::Reconcile)
            .with_claim(&c.job, &c.attempt, &c.runner, c.fence);
        op.outcome = Some(finding.into());
        self.push(op.clone());
        let mut entry = self.entry(Op::Reconcile, c, at_ms);
        entry.outcome = Some(finding.into());
        entry.value = completed.map(|outcome| json!({ "recorded_as": outcome }));
        self.ledger(entry);
        let at = self.len() - 1;
        self.push(Event { kind: EventType::Ok, ..op });
        at
    }

    /// A target step-log record; returns its index.
    pub fn step(&mut self, c: &C, at_ms: i64, decision: Decision, reason: Option<Reason>) -> u64 {
        let mut step = Event::new(0, Process::TARGET, EventType::Step, Op::Step)
            .with_claim(&c.job, &c.attempt, &c.runner, c.fence)
            .with_decision(decision, reason);
        step.key = Some(self.key(&c.job));
        step.received_ms = Some(at_ms);
        self.push(step)
    }

    /// A target step-log record naming its step number; returns its index.
    pub fn step_numbered(&mut self, c: &C, at_ms: i64, step: u64, decision: Decision, reason: Option<Reason>) -> u64 {
        let at = self.step(c, at_ms, decision, reason);
        self.events[at as usize].value = Some(serde_json::json!({"step": step, "steps": 3}));
        at
    }

    /// A step request in the runner's log (`value.step`), sent before it reached the target.
    pub fn runner_step_sent(&mut self, c: &C, step: u64) -> u64 {
        let mut request = Event::new(0, Process::runner(&c.runner), EventType::Request, Op::Step)
            .with_claim(&c.job, &c.attempt, &c.runner, c.fence);
        request.key = Some(self.key(&c.job));
        request.value = Some(serde_json::json!({"step": step, "steps": 3}));
        self.push(request)
    }

    pub fn final_state(&mut self, job: &str, attempt: Option<&str>, state: &str) -> u64 {
        let mut event = Event::new(0, Process::HARNESS, EventType::Ok, Op::Final).with_job(job);
        event.key = Some(self.key(job));
        event.attempt = attempt.map(str::to_string);
        event.outcome = Some(state.into());
        event.value = Some(json!({"attempts": []}));
        self.push(event)
    }

    /// A result for `c` the nemesis sent with runner `token_of`'s token (the fault's
    /// `invoke`); returns its index.
    /// A final state whose attempts are `(attempt, state)`.
    pub fn final_with_attempts(&mut self, job: &str, attempt: Option<&str>, state: &str, attempts: &[(&str, &str)]) {
        let at = self.final_state(job, attempt, state) as usize;
        let attempts: Vec<serde_json::Value> =
            attempts.iter().map(|(attempt, state)| json!({"attempt": attempt, "state": state})).collect();
        self.events[at].value = Some(json!({ "attempts": attempts }));
    }

    pub fn nemesis_result(&mut self, c: &C, outcome: &str, token_of: &str) -> u64 {
        let mut sent = Event::new(0, Process::NEMESIS, EventType::Invoke, Op::ConflictingResults)
            .with_claim(&c.job, &c.attempt, &c.runner, c.fence);
        sent.outcome = Some(outcome.into());
        sent.value = Some(json!({ "token_of": token_of }));
        self.push(sent)
    }

    /// A report of kind `report` the nemesis sent for `c` under a borrowed claim: `c` names
    /// the sender as its runner and another runner's attempt; returns its index.
    pub fn nemesis_borrowed(&mut self, c: &C, report: Op) -> u64 {
        let mut sent = Event::new(0, Process::NEMESIS, EventType::Invoke, Op::ConflictingResults)
            .with_claim(&c.job, &c.attempt, &c.runner, c.fence);
        sent.value = Some(json!({ "token_of": c.runner, "report": report.as_str() }));
        self.push(sent)
    }

    /// The control plane's answer to a report of kind `report` the nemesis sent for `c` with
    /// runner `token_of`'s token: its `ok` with the verdict and the ledger entry it names, or
    /// its `fail` with the error said; returns its index.
    pub fn nemesis_answer(&mut self, c: &C, report: Op, token_of: &str, answer: Result<(Decision, u64), &str>) -> u64 {
        let kind = if answer.is_ok() { EventType::Ok } else { EventType::Fail };
        let mut event = Event::new(0, Process::NEMESIS, kind, Op::ConflictingResults)
            .with_claim(&c.job, &c.attempt, &c.runner, c.fence);
        event.value = Some(json!({ "token_of": token_of, "report": report.as_str() }));
        match answer {
            Ok((decision, seq)) => {
                event.decision = Some(decision);
                event.value.as_mut().unwrap()["ledger_seq"] = json!(seq);
            }
            Err(said) => event.reason = Some(said.into()),
        }
        self.push(event)
    }

    /// The harness's word that recovery did not settle every job (`recovery`, `info`).
    pub fn recovery_unsettled(&mut self, why: &str) -> u64 {
        let mut event = Event::new(0, Process::HARNESS, EventType::Info, Op::Recovery);
        event.reason = Some(why.into());
        self.push(event)
    }

    pub fn nemesis_restart(&mut self) {
        self.push(Event::new(0, Process::NEMESIS, EventType::Invoke, Op::RestartControlPlane));
        self.push(Event::new(0, Process::NEMESIS, EventType::Ok, Op::RestartControlPlane));
    }
}

impl H {
    /// Swaps the `value.seq` of the ledger event at `slot` with that of the next ledger
    /// event: the first was received first but committed second.
    /// Names ledger entry `seq` in the last event (an answer).
    pub fn answer_names(&mut self, seq: u64) {
        if let Some(value) = self.events.last_mut().and_then(|event| event.value.as_mut()) {
            value["ledger_seq"] = json!(seq);
        }
    }

    /// The `seq` of the first ledger event at or after `slot`.
    pub fn seq_at(&self, slot: u64) -> Option<u64> {
        let ledger = self.events[slot as usize..].iter().find(|event| event.kind == EventType::Ledger)?;
        ledger.value.as_ref()?.get("seq")?.as_u64()
    }

    pub fn swap_seq_with_next_ledger(&mut self, slot: u64) {
        let slot = slot as usize;
        let first = (slot..self.events.len()).find(|&i| self.events[i].kind == EventType::Ledger);
        let Some(first) = first else { return };
        let second = (first + 1..self.events.len()).find(|&i| self.events[i].kind == EventType::Ledger);
        let Some(second) = second else { return };
        let seq = |event: &Event| event.value.as_ref().and_then(|value| value.get("seq")).cloned();
        let (a, b) = (seq(&self.events[first]), seq(&self.events[second]));
        if let (Some(a), Some(b)) = (a, b) {
            self.events[first].value.as_mut().unwrap()["seq"] = b;
            self.events[second].value.as_mut().unwrap()["seq"] = a;
        }
    }
}
