//! The runner: claims jobs, redeems a capability per step, executes the deployment as timed
//! steps against the target, heartbeats on its own timer and reports the result.
//!
//! It fences itself: when a heartbeat or capability is definitely refused, or when its own
//! renewal deadline passes (measured on the monotonic clock from when it *sent* the last
//! accepted renewal, minus a margin), it stops at once and sends no further target step.
//! Every request and response goes to a JSONL log of [`history::Event`]s on the host's
//! monotonic clock, with the claim it concerns. The planted bugs that live here
//! ([`crate::bugs::Home::Runner`], `--bug`) each break one of these rules.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use history::{Decision, Event, EventType, Op, Process, Reason};
use tokio::time::Instant;

use crate::bugs::{Bug, Bugs};

use protocol::client::{Client, ClientError};
use protocol::*;

/// Most times the planted `resend-step-on-lost-answer` sends one step again (a poll apart).
const STEP_RESENDS_MAX: u32 = 100;

#[derive(Clone, Debug)]
pub struct RunnerConfig {
    pub id: String,
    pub control_url: String,
    pub target_url: String,
    pub token: String,
    /// Between heartbeats (default 250 ms); must be well below the lease.
    pub heartbeat_interval_ms: u64,
    /// Stop this long before the lease would end by the runner's own reckoning (default 200 ms).
    pub renewal_margin_ms: u64,
    /// Between claims when nothing is claimable (default 100 ms).
    pub poll_ms: u64,
    /// Each request's timeout (default 1000 ms).
    pub request_timeout_ms: u64,
    /// Most tries to deliver a result on transport errors (default 5).
    pub result_tries_max: u32,
    /// Added to the runner's wall clock in `observed_ms` (clock skew without libfaketime).
    pub clock_offset_ms: i64,
    /// A file holding a further offset in ms, read at every observation, so that a harness
    /// can move the runner's clock while it runs (jumps).
    pub clock_offset_file: Option<PathBuf>,
    /// Stop after this many jobs (default: never).
    pub jobs_max: Option<u64>,
    pub log: Option<PathBuf>,
    /// The planted bugs switched on in this runner (none: the runner keeps its rules).
    pub bugs: Bugs,
}

/// The runner's JSONL log: [`history::log_line`]s, appended to the file (a restarted runner
/// continues it). The time is taken under the lock, so lines are in time order.
#[derive(Clone)]
pub struct RunnerLog {
    process: Process,
    file: Option<Arc<Mutex<std::fs::File>>>,
}

impl RunnerLog {
    pub fn open(runner: &str, path: Option<&std::path::Path>) -> std::io::Result<RunnerLog> {
        let file = match path {
            Some(path) => Some(Arc::new(Mutex::new(std::fs::OpenOptions::new().create(true).append(true).open(path)?))),
            None => None,
        };
        Ok(RunnerLog { process: Process::runner(runner), file })
    }

    /// Writes one line; answers the instant its time was read at. A request's send is that
    /// instant: the runner's authority then runs from the time its log shows, however long
    /// the runner is stopped (SIGSTOP) on either side of the line.
    fn record(&self, kind: EventType, f: Op, fill: impl FnOnce(&mut Event)) -> Instant {
        let Some(file) = &self.file else { return Instant::now() };
        let mut file = file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Two reads of one clock (CLOCK_MONOTONIC) side by side, no system call between.
        let at = Instant::now();
        let mut event = Event::new(protocol::monotonic_ns(), self.process.clone(), kind, f);
        fill(&mut event);
        let written = history::log_line(&event)
            .map_err(std::io::Error::other)
            .and_then(|line| writeln!(file, "{line}").and_then(|_| file.flush()));
        if let Err(error) = written {
            eprintln!("{}: cannot write the log: {error}", self.process);
        }
        at
    }
}

fn reason_text(reason: Option<Reason>) -> &'static str {
    reason.map_or("", Reason::as_str)
}

fn set_claim(event: &mut Event, claim: &ClaimRef) {
    event.job = Some(claim.job.clone());
    event.attempt = Some(claim.attempt.clone());
    event.runner = Some(claim.runner.clone());
    event.fence = Some(claim.fence);
}

/// The runner's wall clock: the host's, plus the configured offsets (a harness moves it
/// through the offset file). What the runner reports as `observed_ms`: diagnostic only —
/// except under the planted bugs that keep the renewal deadline on it.
#[derive(Clone, Debug)]
struct WallClock {
    offset_ms: i64,
    offset_file: Option<PathBuf>,
}

impl WallClock {
    fn now_ms(&self) -> i64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        wall + self.offset_ms + self.file_offset_ms()
    }

    /// The offset in the clock file; 0 when there is none or it cannot be read.
    fn file_offset_ms(&self) -> i64 {
        let Some(path) = &self.offset_file else { return 0 };
        std::fs::read_to_string(path).ok().and_then(|text| text.trim().parse().ok()).unwrap_or(0)
    }
}

/// Where the renewal deadline is kept: on the monotonic clock (the rule), or — under the
/// planted `wall-clock-deadline` and `deadline-from-server-lease` — as a time of the
/// runner's wall clock, which a clock moved back stretches.
enum Deadline {
    Monotonic(Instant),
    Wall { clock: WallClock, at_ms: i64 },
}

/// What a runner knows of its authority over the current attempt.
struct Authority {
    deadline: Mutex<Deadline>,
    lost: Mutex<Option<String>>,
}

impl Authority {
    fn new(deadline: Deadline) -> Authority {
        Authority { deadline: Mutex::new(deadline), lost: Mutex::new(None) }
    }

    /// An accepted heartbeat sent at `sent` moves the deadline to `sent + lease`, if the
    /// authority still held when it was sent: authority given up is not taken back, even
    /// when the server, whose lease an unanswered heartbeat had moved, accepts a late one.
    fn renew(&self, sent: Instant, lease: Duration) {
        let mut current = self.deadline.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Deadline::Monotonic(current) = &mut *current {
            if sent < *current {
                *current = (*current).max(sent + lease);
            }
        }
    }

    /// As [`Authority::renew`], for a deadline kept on the wall clock (planted bugs):
    /// `until_ms` is the new deadline, moved to when the authority still held at `sent_ms`.
    fn renew_wall(&self, sent_ms: i64, until_ms: i64) {
        let mut current = self.deadline.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Deadline::Wall { at_ms, .. } = &mut *current {
            if sent_ms < *at_ms {
                *at_ms = (*at_ms).max(until_ms);
            }
        }
    }

    fn lose(&self, why: String) {
        self.lost.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get_or_insert(why);
    }

    /// The deadline on the monotonic clock; one kept on the wall clock is read as what is
    /// left of it now (or how long ago it passed).
    fn deadline(&self) -> Instant {
        match &*self.deadline.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) {
            Deadline::Monotonic(at) => *at,
            Deadline::Wall { clock, at_ms } => {
                let (now, left_ms) = (Instant::now(), at_ms - clock.now_ms());
                let by = Duration::from_millis(left_ms.unsigned_abs());
                if left_ms >= 0 {
                    now + by
                } else {
                    now.checked_sub(by).unwrap_or(now)
                }
            }
        }
    }

    /// Why the runner must stop, if it must.
    fn lost(&self) -> Option<String> {
        if let Some(why) = self.lost.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone() {
            return Some(why);
        }
        (self.deadline() <= Instant::now()).then(|| "renewal deadline passed".to_string())
    }
}

pub struct Runner {
    config: RunnerConfig,
    /// One client per control-plane replica (`control_url` is a comma-separated list).
    controls: Vec<Client>,
    /// The replica requests go to; after a transport error the next one takes over.
    current: std::sync::atomic::AtomicUsize,
    target: Client,
    log: RunnerLog,
}

impl Runner {
    pub fn new(config: RunnerConfig) -> std::io::Result<Runner> {
        let timeout = Duration::from_millis(config.request_timeout_ms);
        let urls: Vec<&str> = config.control_url.split(',').map(str::trim).filter(|url| !url.is_empty()).collect();
        if urls.is_empty() {
            return Err(std::io::Error::other("--control-url names no URL"));
        }
        let controls = urls.iter().map(|url| Client::new(url, Some(&config.token), timeout)).collect();
        let target = Client::new(&config.target_url, None, timeout);
        let log = RunnerLog::open(&config.id, config.log.as_deref())?;
        Ok(Runner { config, controls, current: std::sync::atomic::AtomicUsize::new(0), target, log })
    }

    /// The control-plane replica requests go to now.
    fn control(&self) -> &Client {
        &self.controls[self.current.load(std::sync::atomic::Ordering::Relaxed) % self.controls.len()]
    }

    /// After `answer`: a transport error moves the next request to the next replica. Every
    /// request the runner repeats after one is safe to repeat anywhere (claims and
    /// heartbeats are new requests; a repeated result is a duplicate at worst).
    fn fail_over_after<T>(&self, answer: &Result<T, ClientError>) {
        if answer.as_ref().is_err_and(ClientError::outcome_unknown) && self.controls.len() > 1 {
            self.current.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The runner's wall clock. Diagnostic only (as the rules have it).
    fn wall_clock(&self) -> WallClock {
        WallClock { offset_ms: self.config.clock_offset_ms, offset_file: self.config.clock_offset_file.clone() }
    }

    fn observed_ms(&self) -> i64 {
        self.wall_clock().now_ms()
    }

    fn has(&self, bug: Bug) -> bool {
        self.config.bugs.has(bug)
    }

    /// Claims and executes jobs until `jobs_max` is reached; errors on a definite refusal of a claim.
    pub async fn run(&self) -> Result<(), ClientError> {
        let mut done = 0u64;
        while self.config.jobs_max.is_none_or(|max| done < max) {
            match self.claim().await {
                Ok(Some((grant, sent))) => {
                    self.execute(grant, sent).await;
                    done += 1;
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(self.config.poll_ms)).await,
                Err(error) if error.outcome_unknown() => {
                    tokio::time::sleep(Duration::from_millis(self.config.poll_ms)).await
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Asks for a claim; a grant comes with when the request was sent.
    async fn claim(&self) -> Result<Option<(Grant, Sent)>, ClientError> {
        let request = ClaimRequest { runner: self.config.id.clone(), observed_ms: self.observed_ms() };
        // The send is counted from the log line's time: an instant read before it, with the
        // runner stopped in between, ended its authority earlier than its log says it could
        // (seen under `pause`: a claim self-fenced and reported failed 1 ms in, by the log a
        // whole lease early).
        let at = self.log.record(EventType::Request, Op::Claim, |event| {
            event.runner = Some(request.runner.clone());
            event.observed_ms = Some(request.observed_ms);
        });
        let sent = Sent { at, observed_ms: request.observed_ms };
        let answer = self.control().claim(&request).await;
        self.fail_over_after(&answer);
        self.log.record(answer_type(&answer), Op::Claim, |event| {
            event.runner = Some(request.runner.clone());
            event.observed_ms = Some(request.observed_ms);
            match &answer {
                Ok(ClaimResponse { grant: Some(grant) }) => {
                    set_claim(event, &grant.claim);
                    event.key = Some(grant.deployment_key.clone());
                    event.lease_expires_ms = Some(grant.lease_expires_ms);
                    event.decision = Some(Decision::Accepted);
                }
                Ok(ClaimResponse { grant: None }) => event.reason = Some("none_claimable".into()),
                Err(error) => event.reason = Some(error.to_string()),
            }
        });
        answer.map(|response| response.grant.map(|grant| (grant, self.renewal_start(sent))))
    }

    /// When a renewal's lease is counted from: its send. Under the planted
    /// `deadline-from-answer`, the arrival of its answer (now).
    fn renewal_start(&self, sent: Sent) -> Sent {
        if self.has(Bug::DeadlineFromAnswer) {
            Sent { at: Instant::now(), ..sent }
        } else {
            sent
        }
    }

    /// The renewal deadline a claim sent at `sent` starts with: `lease` after the send, on
    /// the monotonic clock. Under the planted bugs, on the wall clock: the lease end the
    /// grant names (`deadline-from-server-lease`), or the send's wall time plus `lease`
    /// (`wall-clock-deadline`).
    fn first_deadline(&self, grant: &Grant, sent: Sent, lease: Duration) -> Deadline {
        let clock = self.wall_clock();
        if self.has(Bug::DeadlineFromServerLease) {
            let at_ms = grant.lease_expires_ms - self.config.renewal_margin_ms as i64;
            Deadline::Wall { clock, at_ms }
        } else if self.has(Bug::WallClockDeadline) {
            Deadline::Wall { clock, at_ms: sent.observed_ms + lease.as_millis() as i64 }
        } else {
            Deadline::Monotonic(sent.at + lease)
        }
    }

    /// Moves the deadline for an accepted renewal sent at `sent` (answered with the lease
    /// end `lease_expires_ms`, if any), the way [`Runner::first_deadline`] set it.
    fn renewed(&self, authority: &Authority, sent: Sent, lease: Duration, lease_expires_ms: Option<i64>) {
        if self.has(Bug::DeadlineFromServerLease) {
            if let Some(end_ms) = lease_expires_ms {
                authority.renew_wall(sent.observed_ms, end_ms - self.config.renewal_margin_ms as i64);
            }
        } else if self.has(Bug::WallClockDeadline) {
            authority.renew_wall(sent.observed_ms, sent.observed_ms + lease.as_millis() as i64);
        } else {
            authority.renew(self.renewal_start(sent).at, lease);
        }
    }
}

/// When a renewal (a claim, a heartbeat) was sent, on the monotonic clock and on the
/// runner's wall clock (its `observed_ms`).
#[derive(Clone, Copy, Debug)]
struct Sent {
    at: Instant,
    observed_ms: i64,
}

/// Executing one claim.
impl Runner {
    async fn execute(&self, grant: Grant, sent: Sent) {
        let lease = Duration::from_millis(grant.lease_ms.saturating_sub(self.config.renewal_margin_ms));
        let authority = Arc::new(Authority::new(self.first_deadline(&grant, sent, lease)));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let heartbeats = self.heartbeats(grant.claim.clone(), lease, authority.clone(), stopped);
        let steps = self.steps(&grant, &authority);
        tokio::pin!(heartbeats, steps);
        let mut heartbeats_done = false;
        let (outcome, detail) = loop {
            tokio::select! {
                outcome = &mut steps => break outcome,
                _ = &mut heartbeats, if !heartbeats_done => heartbeats_done = true,
            }
        };
        let _ = stop.send(true);
        // A heartbeat already in flight is let finish (bounded by its own timeout): its answer
        // is where the claim stands, and the network has it whether or not we wait.
        if !heartbeats_done {
            let _ = tokio::time::timeout(Duration::from_millis(self.config.request_timeout_ms), heartbeats).await;
        }
        self.report(&grant.claim, outcome, detail).await;
    }

    /// Heartbeats every interval until stopped or definitely refused.
    async fn heartbeats(
        &self,
        claim: ClaimRef,
        lease: Duration,
        authority: Arc<Authority>,
        mut stopped: tokio::sync::watch::Receiver<bool>,
    ) {
        let interval = Duration::from_millis(self.config.heartbeat_interval_ms);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stopped.changed() => return,
            }
            if *stopped.borrow() || authority.lost.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                return;
            }
            let request = HeartbeatRequest { claim: claim.clone(), observed_ms: self.observed_ms() };
            let (at, answer) =
                self.logged(Op::Heartbeat, &claim, request.observed_ms, None, self.control().heartbeat(&request)).await;
            let sent = Sent { at, observed_ms: request.observed_ms };
            match answer {
                Ok(verdict) if verdict.decision == Decision::Accepted => {
                    self.renewed(&authority, sent, lease, verdict.lease_expires_ms)
                }
                Ok(verdict) => authority.lose(format!("heartbeat refused: {}", reason_text(verdict.reason))),
                // Planted: no answer taken for a renewal.
                Err(error) if error.outcome_unknown() && self.has(Bug::UnansweredHeartbeatRenews) => {
                    self.renewed(&authority, sent, lease, None)
                }
                Err(error) if error.outcome_unknown() => {}
                Err(error) => authority.lose(format!("heartbeat refused: {error}")),
            }
        }
    }

    /// Sends a verdict request, logging the request and its answer (or its absence); answers
    /// when it was sent too: its log line's time.
    async fn logged(
        &self,
        f: Op,
        claim: &ClaimRef,
        observed_ms: i64,
        outcome: Option<Outcome>,
        send: impl std::future::Future<Output = Result<Ruling, ClientError>>,
    ) -> (Instant, Result<Ruling, ClientError>) {
        let fill = |event: &mut Event| {
            set_claim(event, claim);
            event.observed_ms = Some(observed_ms);
            event.outcome = outcome.map(|outcome| outcome.as_str().to_string());
        };
        let sent = self.log.record(EventType::Request, f, fill);
        let answer = send.await;
        self.fail_over_after(&answer);
        self.log.record(answer_type(&answer), f, |event| {
            fill(event);
            match &answer {
                Ok(verdict) => {
                    event.decision = Some(verdict.decision);
                    event.reason = verdict.reason.map(|reason| reason.as_str().to_string());
                    event.lease_expires_ms = verdict.lease_expires_ms;
                    event.value = Some(serde_json::json!({"ledger_seq": verdict.ledger_seq}));
                }
                Err(error) => event.reason = Some(error.to_string()),
            }
        });
        (sent, answer)
    }

    /// Runs every step while the runner holds authority; returns the outcome and why.
    async fn steps(&self, grant: &Grant, authority: &Authority) -> (Outcome, Option<String>) {
        let mut resends_left = if self.has(Bug::ResendStepOnLostAnswer) { STEP_RESENDS_MAX } else { 0 };
        let mut step = 0;
        while step < grant.spec.steps {
            if let Some(why) = authority.lost() {
                return (Outcome::Failed, Some(format!("self-fenced before step {step}: {why}")));
            }
            if self.config.target_url.is_empty() {
                // No target (a system that provides none): the step is the runner's own work.
                let work = tokio::time::sleep(Duration::from_millis(grant.spec.step_ms));
                tokio::select! {
                    _ = work => {
                        step += 1;
                        continue;
                    }
                    _ = tokio::time::sleep_until(authority.deadline()) => return (Outcome::Failed, Some(format!("self-fenced during step {step}: renewal deadline passed"))),
                }
            }
            let capability = match self.redeem(&grant.claim, authority).await {
                Ok(capability) => capability,
                Err(why) => return (Outcome::Failed, Some(format!("self-fenced before step {step}: {why}"))),
            };
            let request = StepRequest { capability, step, steps: grant.spec.steps, duration_ms: grant.spec.step_ms };
            let answer = if self.has(Bug::StepWithHeldCapability) {
                // Planted: the capability in hand is authority enough, whatever the deadline.
                Some(self.step(&grant.claim, &request).await)
            } else {
                // The capability's answer may come after the deadline: look again before the step.
                if let Some(why) = authority.lost() {
                    return (Outcome::Failed, Some(format!("self-fenced before step {step}: {why}")));
                }
                within(|| authority.deadline(), self.step(&grant.claim, &request)).await
            };
            let Some(answer) = answer else {
                return (Outcome::Failed, Some(format!("self-fenced during step {step}: renewal deadline passed")));
            };
            match answer {
                Ok(response) if response.record.applied => {}
                Ok(response) => {
                    return (
                        Outcome::Failed,
                        Some(format!("target refused step {step}: {}", reason_text(response.record.reason))),
                    )
                }
                Err(_) if resends_left > 0 => {
                    // Planted: the step may have been applied; it is sent again all the same.
                    resends_left -= 1;
                    tokio::time::sleep(Duration::from_millis(self.config.poll_ms)).await;
                    continue;
                }
                Err(error) => return (Outcome::Failed, Some(format!("step {step} has no answer: {error}"))),
            }
            step += 1;
        }
        (Outcome::Succeeded, None)
    }

    /// Redeems a capability, retrying transport errors until the renewal deadline.
    async fn redeem(&self, claim: &ClaimRef, authority: &Authority) -> Result<Capability, String> {
        loop {
            // Before every try: a retry comes after a wait that may have outlasted authority.
            if let Some(why) = authority.lost() {
                return Err(why);
            }
            let request = CapabilityRequest { claim: claim.clone(), observed_ms: self.observed_ms() };
            match self
                .logged(Op::Capability, claim, request.observed_ms, None, self.control().capability(&request))
                .await
                .1
            {
                Ok(Ruling { capability: Some(capability), .. }) => return Ok(capability),
                Ok(verdict) => {
                    let why = format!("capability refused: {}", reason_text(verdict.reason));
                    authority.lose(why.clone());
                    return Err(why);
                }
                Err(error) if error.outcome_unknown() => {}
                Err(error) => return Err(format!("capability refused: {error}")),
            }
            tokio::time::sleep(Duration::from_millis(self.config.poll_ms)).await;
        }
    }

    async fn step(&self, claim: &ClaimRef, request: &StepRequest) -> Result<StepResponse, ClientError> {
        let fill = |event: &mut Event| {
            set_claim(event, claim);
            event.key = Some(request.capability.deployment_key.clone());
            event.value = Some(serde_json::json!({"step": request.step, "steps": request.steps}));
        };
        self.log.record(EventType::Request, Op::Step, fill);
        let answer = self.target.step(request).await;
        self.log.record(answer_type(&answer), Op::Step, |event| {
            fill(event);
            match &answer {
                Ok(response) => {
                    let decision = if response.record.applied { Decision::Accepted } else { Decision::Rejected };
                    event.decision = Some(decision);
                    event.reason = response.record.reason.map(|reason| reason.as_str().to_string());
                }
                Err(error) => event.reason = Some(error.to_string()),
            }
        });
        answer
    }

    /// Reports the result, retrying transport errors a bounded number of times with backoff.
    async fn report(&self, claim: &ClaimRef, outcome: Outcome, detail: Option<String>) {
        let mut backoff = Duration::from_millis(100);
        for _ in 0..self.config.result_tries_max {
            let request = ResultRequest {
                claim: claim.clone(),
                outcome,
                observed_ms: self.observed_ms(),
                detail: detail.clone(),
            };
            let answer = self
                .logged(Op::Result, claim, request.observed_ms, Some(outcome), self.control().result(&request))
                .await
                .1;
            match answer {
                Err(error) if error.outcome_unknown() => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                _ => return,
            }
        }
    }
}

/// `work`'s output if it comes before the renewal deadline; `None` once the deadline has
/// come. `deadline` is read again whenever the one waited for comes, so a renewal accepted
/// while `work` runs extends the wait. When both are due at once the deadline wins: an
/// answer at or after the deadline comes too late, and a step whose deadline has already
/// passed is never sent.
async fn within<T>(deadline: impl Fn() -> Instant, work: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::pin!(work);
    loop {
        let until = deadline();
        if Instant::now() >= until {
            return None;
        }
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(until) => {}
            output = &mut work => return (Instant::now() < deadline()).then_some(output),
        }
    }
}

fn answer_type<T>(answer: &Result<T, ClientError>) -> EventType {
    match answer {
        Err(error) if error.outcome_unknown() => EventType::Info,
        _ => EventType::Response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heartbeat sent while the authority held moves its deadline; one sent after the
    /// deadline passed does not, even when the server accepts it (an earlier heartbeat whose
    /// answer was lost had moved the server's lease): the runner stays stopped.
    #[test]
    fn a_heartbeat_sent_after_the_deadline_does_not_revive_the_authority() {
        let lease = Duration::from_millis(1_000);
        let start = Instant::now();
        let authority = Authority::new(Deadline::Monotonic(start + lease));
        authority.renew(start + Duration::from_millis(600), lease);
        assert_eq!(authority.deadline(), start + Duration::from_millis(1_600), "sent in time: renewed");
        authority.renew(start + Duration::from_millis(1_700), lease);
        assert_eq!(authority.deadline(), start + Duration::from_millis(1_600), "sent late: not renewed");
        authority.renew(start + Duration::from_millis(100), lease);
        assert_eq!(authority.deadline(), start + Duration::from_millis(1_600), "an older send never shortens it");
    }

    /// The planted `wall-clock-deadline` and `deadline-from-server-lease` keep the deadline
    /// on the wall clock: moved back a minute, it is a minute further away.
    #[test]
    fn a_deadline_kept_on_the_wall_clock_stretches_when_the_clock_moves_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("clock");
        let clock = WallClock { offset_ms: 0, offset_file: Some(file.clone()) };
        let authority = Authority::new(Deadline::Wall { at_ms: clock.now_ms() + 1_000, clock });
        assert!(authority.deadline() <= Instant::now() + Duration::from_millis(1_000));
        assert!(authority.lost().is_none());
        std::fs::write(&file, "-60000").unwrap();
        assert!(authority.deadline() > Instant::now() + Duration::from_secs(59), "a minute further away");
        assert!(authority.lost().is_none());
        std::fs::write(&file, "0").unwrap();
        std::thread::sleep(Duration::from_millis(1_050));
        assert!(authority.lost().is_some(), "true again, it has passed");
        std::fs::write(&file, "60000").unwrap();
        assert!(authority.deadline() < Instant::now(), "moved ahead, it passed long ago");
    }

    #[tokio::test]
    async fn the_renewal_deadline_wins_over_an_answer_due_at_the_same_time() {
        let sent = std::sync::atomic::AtomicBool::new(false);
        let step = async {
            sent.store(true, std::sync::atomic::Ordering::Relaxed);
            7
        };
        let now = Instant::now();
        assert_eq!(within(|| now, step).await, None, "an answer due at the deadline");
        assert!(!sent.load(std::sync::atomic::Ordering::Relaxed), "a step sent at its deadline");
        // An answer that arrives after the deadline, before the timer has been seen to fire.
        let late = async {
            std::thread::sleep(Duration::from_millis(20));
            7
        };
        let soon = Instant::now() + Duration::from_millis(5);
        assert_eq!(within(|| soon, late).await, None, "an answer after the deadline");
        let later = Instant::now() + Duration::from_secs(60);
        assert_eq!(within(|| later, std::future::ready(7)).await, Some(7));
    }

    #[tokio::test]
    async fn a_renewal_while_a_step_runs_extends_the_wait_for_its_answer() {
        let deadline = Mutex::new(Instant::now() + Duration::from_millis(200));
        let step = async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            7
        };
        let renew = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            *deadline.lock().unwrap() = Instant::now() + Duration::from_secs(60);
        };
        let (answer, ()) = tokio::join!(within(|| *deadline.lock().unwrap(), step), renew);
        assert_eq!(answer, Some(7), "the step's answer came before the renewed deadline");
        let expired = async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            7
        };
        let fixed = Instant::now() + Duration::from_millis(200);
        assert_eq!(within(|| fixed, expired).await, None, "no renewal: the deadline ends the wait");
    }
}
