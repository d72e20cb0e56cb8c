//! `runner-contract` on literal runner logs: each rule's anomaly, and the histories next to
//! it that keep the rule. Times are the runner's monotonic clock, in ms from its claim.

use history::{Decision, Event, EventType, Op, Process};
use serde_json::json;

use crate::check;

const CHECKER: &str = "runner-contract";

/// A runner log of r1 for j1-a1 (fence 1), claimed at 0 ms, with a 1000 ms lease and a
/// 200 ms renewal margin.
struct Log {
    events: Vec<Event>,
    /// The claim the next events are for: job, attempt, fence.
    claim: (String, String, u64),
}

impl Log {
    fn new() -> Log {
        let mut config = Event::new(0, Process::HARNESS, EventType::Ok, Op::Config);
        config.value = Some(json!({"target_mode": "fenced", "bugs": [], "lease_ms": 1_000, "renewal_margin_ms": 200}));
        Log { events: vec![config], claim: ("j1".into(), "j1-a1".into(), 1) }.claimed(0)
    }

    fn runner(&self, at_ms: u64, kind: EventType, f: Op) -> Event {
        let (job, attempt, fence) = &self.claim;
        Event::new(at_ms * 1_000_000, Process::runner("r1"), kind, f).with_claim(job, attempt, "r1", *fence)
    }

    /// r1 claims j2-a1 (fence 2) at `at_ms`; what follows is for it.
    fn claim_again(mut self, at_ms: u64) -> Log {
        self.claim = ("j2".into(), "j2-a1".into(), 2);
        self.claimed(at_ms)
    }

    fn claimed(mut self, at_ms: u64) -> Log {
        let mut request = self.runner(at_ms, EventType::Request, Op::Claim);
        request.attempt = None;
        request.job = None;
        request.fence = None;
        self.push(request);
        let mut answer = self.runner(at_ms + 1, EventType::Response, Op::Claim).with_decision(Decision::Accepted, None);
        answer.key = Some("k1".into());
        answer.lease_expires_ms = Some(at_ms as i64 + 1_000);
        self.push(answer);
        self
    }

    fn push(&mut self, mut event: Event) -> u64 {
        event.index = self.events.len() as u64;
        self.events.push(event);
        self.events.len() as u64 - 1
    }

    fn request(mut self, at_ms: u64, f: Op) -> Log {
        let event = self.runner(at_ms, EventType::Request, f);
        self.push(event);
        self
    }

    fn step(mut self, at_ms: u64, step: u64, steps: u64) -> Log {
        let mut event = self.runner(at_ms, EventType::Request, Op::Step);
        event.value = Some(json!({"step": step, "steps": steps}));
        self.push(event);
        self
    }

    fn answer(mut self, at_ms: u64, f: Op, decision: Decision) -> Log {
        let event = self.runner(at_ms, EventType::Response, f).with_decision(decision, None);
        self.push(event);
        self
    }

    fn result(mut self, at_ms: u64, outcome: &str) -> Log {
        let mut event = self.runner(at_ms, EventType::Request, Op::Result);
        event.outcome = Some(outcome.into());
        self.push(event);
        self
    }

    /// r1 stopped at `from_ms` and resumed at `to_ms`: the nemesis's pause, or the operator's
    /// freeze and thaw.
    fn stopped(mut self, from_ms: u64, to_ms: u64, by_operator: bool) -> Log {
        let at = |ms: u64| ms * 1_000_000;
        let (stop, resume) = if by_operator {
            let stop = self.runner(0, EventType::Ok, Op::Freeze);
            let resume = self.runner(0, EventType::Ok, Op::Thaw);
            (
                Event { process: Process::OPERATOR, time_ns: at(from_ms), ..stop },
                Event { process: Process::OPERATOR, time_ns: at(to_ms), ..resume },
            )
        } else {
            let pause = |phase: &str, ms: u64| {
                let mut event = Event::new(at(ms), Process::NEMESIS, EventType::Ok, Op::DelayedHeartbeats);
                event.runner = Some("r1".into());
                event.value = Some(json!({"phase": phase, "effective": true, "variant": {"how": "pause"}}));
                event
            };
            (pause("start", from_ms), pause("heal", to_ms))
        };
        self.push(stop);
        self.push(resume);
        self
    }

    fn build(mut self) -> Vec<Event> {
        let every = history::Source::ALL.iter().copied().collect();
        let at = self.events.last().map_or(0, |event| event.time_ns);
        let mut sources = history::sources_event(&every);
        sources.time_ns = at;
        self.push(sources);
        self.events
    }
}

/// A working attempt that keeps every rule: heartbeats renew it in time, each step has its
/// capability, the result follows the last applied step.
fn kept() -> Log {
    Log::new()
        .request(10, Op::Capability)
        .answer(11, Op::Capability, Decision::Accepted)
        .step(12, 0, 2)
        .answer(300, Op::Step, Decision::Accepted)
        .request(700, Op::Heartbeat)
        .answer(701, Op::Heartbeat, Decision::Accepted)
        .request(1_500, Op::Capability)
        .answer(1_501, Op::Capability, Decision::Accepted)
        .step(1_502, 1, 2)
        .answer(1_600, Op::Step, Decision::Accepted)
}

#[test]
fn a_runner_that_keeps_its_rules_is_valid() {
    check(&kept().result(1_601, "succeeded").build(), CHECKER, &[]);
}

#[test]
fn a_capability_or_step_past_the_runners_own_deadline_is_flagged() {
    let late = Log::new().request(1_001, Op::Capability).build();
    let found = check(&late, CHECKER, &["acted-past-deadline"]);
    assert!(found[0].message.contains("after its authority ended"), "{found:?}");
    let late_step =
        Log::new().request(10, Op::Capability).answer(11, Op::Capability, Decision::Accepted).step(1_200, 0, 1);
    check(&late_step.build(), CHECKER, &["acted-past-deadline"]);
}

#[test]
fn a_heartbeat_moves_the_deadline_only_when_answered_accepted_and_sent_in_time() {
    let renewed = Log::new().request(900, Op::Heartbeat).answer(950, Op::Heartbeat, Decision::Accepted);
    check(&renewed.request(1_500, Op::Capability).build(), CHECKER, &[]);
    let unanswered = Log::new().request(900, Op::Heartbeat);
    check(&unanswered.request(1_500, Op::Capability).build(), CHECKER, &["acted-past-deadline"]);
    let given_up = Log::new().request(1_100, Op::Heartbeat).answer(1_101, Op::Heartbeat, Decision::Accepted);
    check(&given_up.request(1_500, Op::Capability).build(), CHECKER, &["acted-past-deadline"]);
    let late_beat_alone = Log::new().request(1_100, Op::Heartbeat).answer(1_101, Op::Heartbeat, Decision::Rejected);
    check(&late_beat_alone.build(), CHECKER, &[]);
}

/// The deadline runs from the send of the last renewal whose acceptance the runner had
/// heard by the time it acted: a heartbeat answered late stretches nothing before its answer
/// (the planted `deadline-from-answer`, `step-with-held-capability`), and once answered
/// counts from its send, not its answer. The anomaly names the renewal it ran from.
#[test]
fn a_renewal_answered_late_counts_from_its_send_once_answered() {
    let slow = || Log::new().request(500, Op::Heartbeat);
    let before = slow().request(1_100, Op::Capability).answer(1_200, Op::Heartbeat, Decision::Accepted).build();
    let found = check(&before, CHECKER, &["acted-past-deadline"]);
    assert!(found[0].message.contains("the claim of event 1, accepted"), "{found:?}");
    assert_eq!(found[0].events, [1, 4], "the claim's request and the act: {found:?}");
    let after = slow().answer(1_200, Op::Heartbeat, Decision::Accepted).request(1_300, Op::Capability);
    check(&after.build(), CHECKER, &[]);
    let past_its_send = slow().answer(1_200, Op::Heartbeat, Decision::Accepted).request(1_501, Op::Capability);
    let found = check(&past_its_send.build(), CHECKER, &["acted-past-deadline"]);
    assert!(found[0].message.contains("the heartbeat of event 3, accepted"), "{found:?}");
}

#[test]
fn work_after_a_refused_capability_or_step_is_flagged() {
    let refused = Log::new().request(10, Op::Capability).answer(11, Op::Capability, Decision::Rejected);
    check(&refused.step(12, 0, 1).build(), CHECKER, &["acted-after-refusal"]);
    let step_refused = Log::new()
        .request(10, Op::Capability)
        .answer(11, Op::Capability, Decision::Accepted)
        .step(12, 0, 2)
        .answer(20, Op::Step, Decision::Rejected);
    check(&step_refused.request(21, Op::Capability).build(), CHECKER, &["acted-after-refusal"]);
    let then_failed = Log::new().request(10, Op::Capability).answer(11, Op::Capability, Decision::Rejected);
    check(&then_failed.result(12, "failed").build(), CHECKER, &[]);
}

#[test]
fn a_result_the_log_does_not_back_is_flagged() {
    let short = Log::new()
        .request(10, Op::Capability)
        .answer(11, Op::Capability, Decision::Accepted)
        .step(12, 0, 2)
        .answer(300, Op::Step, Decision::Accepted)
        .result(301, "succeeded");
    let found = check(&short.build(), CHECKER, &["result-unbacked"]);
    assert!(found[0].message.contains("after 1 of 2 steps"), "{found:?}");
    // A log that records no step or capability of this runner says nothing of its work.
    check(&Log::new().result(5, "succeeded").build(), CHECKER, &[]);
    check(&Log::new().result(5, "failed").build(), CHECKER, &[]);
    let idle = |at_ms| kept().result(1_601, "succeeded").claim_again(2_000).result(at_ms, "failed");
    check(&idle(2_005).build(), CHECKER, &["result-unbacked"]);
    // Failing once its authority is within the renewal margin of its end is the rule.
    check(&idle(2_850).build(), CHECKER, &[]);
    let tried = Log::new().request(10, Op::Capability).result(500, "failed");
    check(&tried.build(), CHECKER, &[]);
}

#[test]
fn without_the_runners_logs_or_the_lease_the_rules_are_not_judged() {
    let late = Log::new().request(1_001, Op::Capability).build();
    let keep = [history::Source::Ledger].into_iter().collect();
    let result = checkers::check_one(CHECKER, &history::cut(&late, &keep)).unwrap();
    assert!(matches!(result.verdict, checkers::Verdict::Unknown { .. }), "{result:?}");
    let no_config = [history::Source::RunnerLogs].into_iter().collect();
    let result = checkers::check_one(CHECKER, &history::cut(&late, &no_config)).unwrap();
    let checkers::Verdict::Unknown { reason } = result.verdict else { panic!("{result:?}") };
    assert!(reason.contains("`acted-past-deadline` needs"), "{reason}");
}

/// `ledger-completeness`'s `result-not-ruled`: a result answered with an error naming a
/// ruling's reason, in the lab's form (`409 CODE: sentence`) and as a bare code; or with an
/// error the contract has (`403 forbidden`) that a runner's own report never deserves.
#[test]
fn a_result_answered_with_an_error_instead_of_a_ruling_is_flagged() {
    let answered = |reason: &str| {
        let mut log = Log::new().result(10, "succeeded");
        let mut answer = log.runner(11, EventType::Response, Op::Result);
        answer.reason = Some(reason.into());
        answer.outcome = Some("succeeded".into());
        log.push(answer);
        log.build()
    };
    let kinds = |events: &[Event]| -> Vec<String> {
        match checkers::check_one("ledger-completeness", events).unwrap().verdict {
            checkers::Verdict::Invalid { anomalies } => anomalies.into_iter().map(|anomaly| anomaly.kind).collect(),
            _ => Vec::new(),
        }
    };
    assert_eq!(kinds(&answered("409 not_current: the result is not current")), ["result-not-ruled"]);
    assert_eq!(kinds(&answered("superseded")), ["result-not-ruled"]);
    assert_eq!(kinds(&answered("403 forbidden: not this runner's claim")), ["result-not-ruled"]);
    assert!(kinds(&answered("400 invalid_field: outcome")).is_empty());
}

#[test]
fn the_first_act_after_a_stop_that_spanned_the_deadline_is_excused() {
    // Stopped at 900 ms, before its deadline, and resumed at 2000 ms: the capability request
    // it may have decided on before it stopped goes out at once.
    for by_operator in [false, true] {
        let resumed = || {
            Log::new().request(10, Op::Capability).answer(11, Op::Capability, Decision::Accepted).stopped(
                900,
                2_000,
                by_operator,
            )
        };
        check(&resumed().request(2_001, Op::Capability).build(), CHECKER, &[]);
        // The second act after it had time to look at its clock is not.
        let twice = resumed()
            .request(2_001, Op::Capability)
            .answer(2_002, Op::Capability, Decision::Accepted)
            .step(2_003, 0, 1);
        check(&twice.build(), CHECKER, &["acted-past-deadline"]);
    }
    // Stopped only after its deadline: it had time to see it, and acted anyway.
    let late_stop = Log::new().stopped(1_100, 2_000, false).request(2_001, Op::Capability);
    check(&late_stop.build(), CHECKER, &["acted-past-deadline"]);
}
