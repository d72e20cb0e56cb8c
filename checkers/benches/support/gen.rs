//! A seeded, deterministic generator of realistic *correct* histories, streamed in chunks
//! so that 10^7 events never sit in memory at once: jobs on a few deployment keys, each
//! claimed, heartbeated, stepped and reported, with clock skew, retried (duplicate)
//! results, conflicting results, expiries reconciled as `stopped` and retried, and late
//! observations — everything a correct control plane and a fenced target would log.

use history::{Decision, Event, EventType};
use history::{Op, Process, Reason};
use serde_json::json;

/// xorshift64*: small, fast, deterministic.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

const LEASE_MS: i64 = 2_000;

struct Claim {
    job: String,
    attempt: String,
    runner: String,
    fence: u64,
    key: String,
}

pub struct Gen {
    rng: Rng,
    now_ms: i64,
    seq: u64,
    fence: u64,
    jobs: u64,
    index: u64,
    finals: Vec<(u64, u32, &'static str)>,
}

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen { rng: Rng::new(seed), now_ms: 1_700_000_000_000, seq: 0, fence: 0, jobs: 0, index: 0, finals: vec![] }
    }

    fn push(&mut self, out: &mut Vec<Event>, mut event: Event) {
        event.index = self.index;
        event.time_ns = self.index * 1_000;
        self.index += 1;
        out.push(event);
    }

    fn tick(&mut self, ms: i64) -> i64 {
        self.now_ms += 1 + self.rng.below(ms as u64) as i64;
        self.now_ms
    }

    fn ledger(&mut self, out: &mut Vec<Event>, mut entry: Event, recorded_as: Option<&str>) -> u64 {
        self.seq += 1;
        entry.value = Some(match recorded_as {
            Some(recorded_as) => json!({"seq": self.seq, "recorded_as": recorded_as}),
            None => json!({"seq": self.seq}),
        });
        entry.project = Some("demo".into());
        self.push(out, entry);
        self.seq
    }

    fn entry(&self, f: Op, c: &Claim, at: i64) -> Event {
        let mut entry = Event::new(0, Process::CONTROL_PLANE, EventType::Ledger, f)
            .with_claim(&c.job, &c.attempt, &c.runner, c.fence);
        entry.key = Some(c.key.clone());
        entry.received_ms = Some(at);
        entry
    }

    /// A report (request, ledger entry, answer) as a correct control plane decides it.
    #[allow(clippy::too_many_arguments)]
    fn report(
        &mut self,
        out: &mut Vec<Event>,
        f: Op,
        c: &Claim,
        skew: i64,
        decision: Decision,
        lease: Option<i64>,
        outcome: Option<&str>,
    ) {
        let at = self.tick(40);
        let process = Process::runner(&c.runner);
        let mut request =
            Event::new(0, process.clone(), EventType::Request, f).with_claim(&c.job, &c.attempt, &c.runner, c.fence);
        request.observed_ms = Some(at + skew);
        request.outcome = outcome.map(str::to_string);
        self.push(out, request.clone());
        let reason = match decision {
            Decision::Rejected => Some(Reason::Superseded),
            Decision::Conflict => Some(Reason::Conflict),
            _ => None,
        };
        let mut entry = self.entry(f, c, at).with_decision(decision, reason);
        entry.observed_ms = Some(at + skew);
        entry.lease_expires_ms = lease;
        entry.outcome = outcome.map(str::to_string);
        let recorded_as = match (f, decision) {
            (Op::Result, Decision::Rejected) => Some("late_observation"),
            (_, Decision::Conflict) => Some("conflict"),
            _ => None,
        };
        let seq = self.ledger(out, entry, recorded_as);
        let mut answer = request;
        answer.kind = EventType::Response;
        answer.decision = Some(decision);
        answer.reason = reason.map(|reason| reason.as_str().to_string());
        answer.lease_expires_ms = lease;
        answer.value = Some(json!({"ledger_seq": seq}));
        self.push(out, answer);
    }
}

impl Gen {
    /// At least `min` events: whole job lifecycles.
    pub fn chunk(&mut self, min: usize) -> Vec<Event> {
        let mut out = Vec::with_capacity(min + 64);
        while out.len() < min {
            self.job(&mut out);
        }
        out
    }

    /// The harness's final state of every job generated so far.
    pub fn finals(&mut self) -> Vec<Event> {
        let mut out = Vec::with_capacity(self.finals.len());
        for (job, attempt, state) in std::mem::take(&mut self.finals) {
            let mut event = Event::new(0, Process::HARNESS, EventType::Ok, Op::Final).with_job(&format!("j{job}"));
            event.key = Some(format!("k{}", job % 32));
            event.attempt = Some(format!("j{job}-a{attempt}"));
            event.outcome = Some(state.into());
            self.push(&mut out, event);
        }
        // A generated run declares every source, as fencelab's runs do: a run without
        // faults still had a nemesis, and an operator that had nothing to reconcile.
        let every = history::Source::ALL.iter().copied().collect();
        self.push(&mut out, history::sources_event(&every));
        out
    }

    fn job(&mut self, out: &mut Vec<Event>) {
        self.jobs += 1;
        let (job, key) = (format!("j{}", self.jobs), format!("k{}", self.jobs % 32));
        let mut submit = Event::new(0, Process::CLIENT, EventType::Invoke, Op::Submit).with_job(&job);
        submit.key = Some(key.clone());
        self.push(out, submit.clone());
        let mut entry = Event::new(0, Process::CONTROL_PLANE, EventType::Ledger, Op::Submit).with_job(&job);
        entry.key = Some(key.clone());
        entry.received_ms = Some(self.tick(5));
        self.ledger(out, entry, None);
        submit.kind = EventType::Ok;
        self.push(out, submit);
        let mut previous: Option<Claim> = None;
        for number in 1..=3u32 {
            let c = self.claim(out, &job, &key, number);
            if let Some(old) = previous.take() {
                self.report(out, Op::Result, &old, -200, Decision::Rejected, None, Some("succeeded"));
            }
            let lease = self.run(out, &c);
            if number < 3 && self.rng.chance(5) {
                self.lose(out, &c, lease);
                previous = Some(c);
                continue;
            }
            let outcome = if self.rng.chance(90) { "succeeded" } else { "failed" };
            self.report(out, Op::Result, &c, 100, Decision::Accepted, None, Some(outcome));
            if self.rng.chance(3) {
                self.report(out, Op::Result, &c, 100, Decision::Duplicate, None, Some(outcome));
            }
            if self.rng.chance(2) {
                let other = if outcome == "failed" { "succeeded" } else { "failed" };
                self.report(out, Op::Result, &c, 100, Decision::Conflict, None, Some(other));
            }
            self.finals.push((self.jobs, number, outcome));
            return;
        }
    }

    fn claim(&mut self, out: &mut Vec<Event>, job: &str, key: &str, number: u32) -> Claim {
        self.fence += 1;
        let runner = format!("r{}", self.rng.below(8));
        let c =
            Claim { job: job.into(), attempt: format!("{job}-a{number}"), runner, fence: self.fence, key: key.into() };
        let at = self.tick(20);
        let process = Process::runner(&c.runner);
        let mut request = Event::new(0, process.clone(), EventType::Request, Op::Claim);
        request.runner = Some(c.runner.clone());
        self.push(out, request);
        let mut entry = self.entry(Op::Claim, &c, at).with_decision(Decision::Accepted, None);
        entry.lease_expires_ms = Some(at + LEASE_MS);
        entry.observed_ms = Some(at);
        self.ledger(out, entry, None);
        let mut answer = Event::new(0, process.clone(), EventType::Response, Op::Claim)
            .with_claim(&c.job, &c.attempt, &c.runner, c.fence)
            .with_decision(Decision::Accepted, None);
        answer.key = Some(c.key.clone());
        answer.lease_expires_ms = Some(at + LEASE_MS);
        self.push(out, answer);
        c
    }

    /// Heartbeats, capabilities and steps; returns the lease end after the last heartbeat.
    fn run(&mut self, out: &mut Vec<Event>, c: &Claim) -> i64 {
        let skew = self.rng.below(1_000) as i64 - 500;
        let mut lease = 0;
        for step in 0..1 + self.rng.below(4) {
            self.report(out, Op::Heartbeat, c, skew, Decision::Accepted, Some(self.now_ms + 41 + LEASE_MS), None);
            lease = self.now_ms + LEASE_MS;
            if let Some(last) = out.iter().rev().find(|event| event.kind == EventType::Ledger) {
                lease = last.lease_expires_ms.unwrap_or(lease);
            }
            self.report(out, Op::Capability, c, skew, Decision::Accepted, Some(lease), None);
            let at = self.tick(10);
            let mut record = Event::new(0, Process::TARGET, EventType::Step, Op::Step)
                .with_claim(&c.job, &c.attempt, &c.runner, c.fence)
                .with_decision(Decision::Accepted, None);
            record.key = Some(c.key.clone());
            record.received_ms = Some(at);
            record.value = Some(json!({"step": step}));
            self.push(out, record);
        }
        lease
    }

    /// The runner vanishes: the lease expires (uncertain) and the operator finds it stopped.
    fn lose(&mut self, out: &mut Vec<Event>, c: &Claim, lease: i64) {
        self.now_ms = self.now_ms.max(lease) + 10;
        let mut entry = self.entry(Op::Expire, c, self.now_ms);
        entry.lease_expires_ms = Some(lease);
        self.ledger(out, entry, Some("uncertain"));
        let at = self.tick(100);
        let mut decided = Event::new(0, Process::OPERATOR, EventType::Invoke, Op::Reconcile)
            .with_claim(&c.job, &c.attempt, &c.runner, c.fence);
        decided.outcome = Some("stopped".into());
        self.push(out, decided);
        let mut entry = self.entry(Op::Reconcile, c, at);
        entry.outcome = Some("stopped".into());
        entry.lease_expires_ms = Some(lease);
        self.ledger(out, entry, None);
    }
}
