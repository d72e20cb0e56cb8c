//! The conformance session: the running system, the operator's client, clients that act as
//! runners, raw requests for what the typed client cannot send, and bounded waits on the
//! server's own answers. Every wait polls what the server says (a job's state, a ledger
//! entry's receipt time) up to a named bound; none sleeps for a time that happens to work.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use history::{Event, EventType, Op, Process, Reason};
use protocol::client::Client;
use protocol::*;
use serde_json::Value;

use super::case::{Case, Finding};
use system::file::Provides;
use system::{RunningSystem, Server, StartError};

/// How long one request may wait for its answer (5 s).
pub const REQUEST_MAX: Duration = Duration::from_secs(5);
/// How often a wait asks again (10 ms).
const POLL: Duration = Duration::from_millis(10);
/// How many times a case whose reports must land inside a lease tries with a fresh job.
pub const TRIES_MAX: u32 = 3;

/// The server's clock, as far as a runner may know it: the wall clock of this host, Unix ms.
/// Sent only as `observed_ms`, which decides nothing.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

pub struct Session {
    system: tokio::sync::Mutex<RunningSystem>,
    pub control: String,
    /// The system's target (its mode is `fenced` when the mode can be chosen).
    pub target: Option<String>,
    /// Targets started in the other modes, by mode, when the system's target mode can be
    /// chosen (`{target_mode}` in its command).
    mode_urls: BTreeMap<&'static str, String>,
    /// Whether the target's mode could be chosen (the system's own runs `fenced`).
    modes_chosen: bool,
    mode_targets: tokio::sync::Mutex<Vec<Server>>,
    pub operator: Client,
    pub operator_token: String,
    pub lease_ms: u64,
    pub provides: Provides,
    http: reqwest::Client,
    /// A client that keeps no connection: a server may close one after an error answer,
    /// and that must not fail the request after it.
    once: reqwest::Client,
    start_ns: u64,
    /// The operator's reconcile decisions, as history events (for the rules model).
    decisions: std::sync::Mutex<Vec<Event>>,
}

/// A client acting as one registered runner.
#[derive(Clone)]
pub struct Runner {
    pub id: String,
    pub project: String,
    pub token: String,
    pub client: Client,
}

/// A case's project and its runners.
pub struct Team {
    pub project: String,
    pub registration_token: String,
    pub runners: Vec<Runner>,
}

fn answer<T>(what: &str, result: Result<T, ClientError>) -> Result<T, Finding> {
    result.map_err(|error| Finding::Fail(format!("{what}: {error}")))
}

impl Runner {
    pub async fn claim(&self) -> Result<Option<Grant>, Finding> {
        let request = ClaimRequest { runner: self.id.clone(), observed_ms: now_ms() };
        Ok(answer(&format!("{} POST /v1/claim", self.id), self.client.claim(&request).await)?.grant)
    }

    /// Claims and expects a grant.
    pub async fn claim_some(&self) -> Result<Grant, Finding> {
        self.claim().await?.ok_or_else(|| Finding::Fail(format!("{}'s claim was granted nothing", self.id)))
    }

    pub async fn heartbeat(&self, claim: &ClaimRef, observed_ms: i64) -> Result<Ruling, Finding> {
        let request = HeartbeatRequest { claim: claim.clone(), observed_ms };
        answer(&format!("{} POST /v1/heartbeat", self.id), self.client.heartbeat(&request).await)
    }

    pub async fn capability(&self, claim: &ClaimRef, observed_ms: i64) -> Result<Ruling, Finding> {
        let request = CapabilityRequest { claim: claim.clone(), observed_ms };
        answer(&format!("{} POST /v1/capability", self.id), self.client.capability(&request).await)
    }

    pub async fn result(&self, claim: &ClaimRef, outcome: Outcome, observed_ms: i64) -> Result<Ruling, Finding> {
        let request = ResultRequest { claim: claim.clone(), outcome, observed_ms, detail: None };
        answer(&format!("{} POST /v1/result", self.id), self.client.result(&request).await)
    }

    /// Sends `body` to `path` as this runner: the status and the JSON answered.
    pub async fn post(&self, path: &str, body: &Value) -> Result<(u16, Value), Finding> {
        answer(&format!("{} POST {path}", self.id), self.client.raw(reqwest::Method::POST, path, Some(body)).await)
    }

    /// Sends a report (`/v1/heartbeat`, `/v1/capability`, `/v1/result`) as this runner and
    /// reads its verdict: the status and the ruling, or the error answered.
    pub async fn report(&self, path: &str, body: &Value) -> Result<(u16, Result<Ruling, ErrorBody>), Finding> {
        let (status, value) = self.post(path, body).await?;
        if let Ok(ruling) = serde_json::from_value::<Ruling>(value.clone()) {
            return Ok((status, Ok(ruling)));
        }
        match serde_json::from_value::<ErrorBody>(value.clone()) {
            Ok(error) => Ok((status, Err(error))),
            Err(_) => Err(Finding::Fail(format!(
                "{} POST {path} answered {status} with neither a verdict nor an error body: {value}",
                self.id
            ))),
        }
    }

    /// Whether the lease of `claim` still stood a moment ago: its own heartbeat is accepted
    /// (then every report sent before it reached a live lease) or refused as `expired` (then
    /// the try shows nothing: `Some(why)`). Any other answer is a failure.
    pub async fn still_live(&self, claim: &ClaimRef) -> Result<Option<String>, Finding> {
        let ruling = self.heartbeat(claim, now_ms()).await?;
        match (ruling.decision, ruling.reason) {
            (history::Decision::Accepted, _) => Ok(None),
            (history::Decision::Rejected, Some(Reason::Expired)) => {
                Ok(Some(format!("{}'s lease had ended before its own heartbeat", claim.attempt)))
            }
            _ => Err(Finding::Fail(format!("{}'s own heartbeat on its claim was {}", claim.attempt, said(&ruling)))),
        }
    }
}

/// A verdict in words: `rejected (expired)`, `duplicate`.
pub fn said(ruling: &Ruling) -> String {
    let decision = match ruling.decision {
        history::Decision::Accepted => "accepted",
        history::Decision::Rejected => "rejected",
        history::Decision::Duplicate => "duplicate",
        history::Decision::Conflict => "conflict",
    };
    match ruling.reason {
        Some(reason) => format!("{decision} ({reason})"),
        None => decision.to_string(),
    }
}

/// A try of a case whose reports must reach the server while a lease stands.
pub enum Try<T> {
    Done(T),
    /// The server's answers show the lease had ended first: the try shows nothing.
    Late(String),
}

/// Runs `body` (given the try's number, from 1) until a try is not late, at most
/// [`TRIES_MAX`] times; all late is a skip: this machine is too slow for the lease.
pub async fn tries<T, F, Fut>(mut body: F) -> Result<T, Finding>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<Try<T>, Finding>>,
{
    let mut lates = Vec::new();
    for number in 1..=TRIES_MAX {
        match body(number).await? {
            Try::Done(value) => return Ok(value),
            Try::Late(why) => lates.push(why),
        }
    }
    Err(Finding::Skip(format!(
        "in {TRIES_MAX} tries the lease ended on the server's clock before the reports reached it ({}); \
         give a longer --lease-ms",
        lates.join("; ")
    )))
}

/// A request exactly as sent, for what the typed client cannot send.
pub struct Request {
    pub method: &'static str,
    pub url: String,
    /// The `Authorization` header exactly as sent, if any.
    pub authorization: Option<String>,
    pub content_type: Option<&'static str>,
    pub body: Payload,
}

/// A request's body: none, JSON, or bytes exactly as given.
pub use protocol::bad_input::Body as Payload;

/// An answer: status, content type, `Allow`, body (`json()`, `text()`).
pub use protocol::bad_input::Answered as Answer;

/// Why a request got no answer to judge.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("`{0}` is not an HTTP method")]
    Method(String),
    #[error("no answer: {0}")]
    NoAnswer(reqwest::Error),
    #[error("answer unreadable: {0}")]
    Unreadable(reqwest::Error),
}

/// A JSON POST to `base` + `path`, with `token` as bearer.
pub fn post(base: &str, path: &str, token: Option<&str>, body: Value) -> Request {
    Request {
        method: "POST",
        url: format!("{base}{path}"),
        authorization: token.map(|token| format!("Bearer {token}")),
        content_type: Some("application/json"),
        body: Payload::Json(body),
    }
}

/// The JSON body of a report on `claim`, with `observed_ms`.
pub fn report_body(claim: &ClaimRef, observed_ms: i64) -> Value {
    serde_json::json!({
        "job": claim.job, "attempt": claim.attempt, "runner": claim.runner, "fence": claim.fence,
        "observed_ms": observed_ms,
    })
}

/// A report body with an outcome: a result.
pub fn result_body(claim: &ClaimRef, outcome: Outcome, observed_ms: i64) -> Value {
    let mut body = report_body(claim, observed_ms);
    body["outcome"] = Value::from(outcome.as_str());
    body
}

impl Session {
    pub fn new(system: RunningSystem, mode_targets: BTreeMap<&'static str, Server>, lease_ms: u64) -> Session {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_MAX)
            .connect_timeout(REQUEST_MAX)
            .build()
            .expect("a plain HTTP client builds");
        let once = reqwest::Client::builder()
            .timeout(REQUEST_MAX)
            .connect_timeout(REQUEST_MAX)
            .pool_max_idle_per_host(0)
            .build()
            .expect("a plain HTTP client builds");
        let system_token = system.launch.file.operator_token.clone();
        let operator = Client::new(&system.control_url(), Some(&system_token), REQUEST_MAX);
        Session {
            control: system.control_url(),
            target: system.target_url(),
            provides: system.launch.file.provides.clone(),
            system: tokio::sync::Mutex::new(system),
            modes_chosen: !mode_targets.is_empty(),
            mode_urls: mode_targets.iter().map(|(mode, server)| (*mode, server.url())).collect(),
            mode_targets: tokio::sync::Mutex::new(mode_targets.into_values().collect()),
            operator,
            operator_token: system_token,
            lease_ms,
            http,
            once,
            start_ns: protocol::monotonic_ns(),
            decisions: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Longest wait for something the lease decides: four leases and 5 s.
    pub fn wait_bound(&self) -> Duration {
        Duration::from_millis(self.lease_ms.saturating_mul(4).saturating_add(5_000))
    }

    /// The target in `mode`: `fenced` is the system's own, the others were started for the
    /// session; none when the mode cannot be chosen.
    pub fn target_in(&self, mode: &str) -> Option<String> {
        match mode {
            "fenced" => self.target.clone().filter(|_| self.modes_chosen),
            other => self.mode_urls.get(other).cloned(),
        }
    }

    /// Creates the case's project `<tag>` and registers `runners` runners `<tag>.r1`, ….
    pub async fn team(&self, case: &Case, runners: usize) -> Result<Team, Finding> {
        self.team_named(&case.tag, runners).await
    }

    /// Creates project `project` and registers `runners` runners `<project>.r1`, ….
    pub async fn team_named(&self, project: &str, runners: usize) -> Result<Team, Finding> {
        let created = answer("operator POST /v1/projects", self.operator.create_project(project).await)?;
        let mut team =
            Team { project: project.to_string(), registration_token: created.registration_token, runners: vec![] };
        for number in 1..=runners {
            let id = format!("{project}.r{number}");
            let request = RegisterRunner { project: Some(project.to_string()), id: id.clone() };
            let registered = answer("operator POST /v1/runners", self.operator.register_runner(&request).await)?;
            let client = Client::new(&self.control, Some(&registered.token), REQUEST_MAX);
            team.runners.push(Runner { id, project: project.to_string(), token: registered.token, client });
        }
        Ok(team)
    }

    /// Submits job `id` on deployment key `key` to `project`.
    pub async fn submit(&self, project: &str, id: &str, key: &str, steps: u32) -> Result<String, Finding> {
        let request = SubmitJob {
            project: project.to_string(),
            id: Some(id.to_string()),
            deployment_key: key.to_string(),
            spec: JobSpec { steps, step_ms: 0 },
        };
        Ok(answer("operator POST /v1/jobs", self.operator.submit(&request).await)?.id)
    }

    pub async fn view(&self, job: &str) -> Result<JobView, Finding> {
        answer(&format!("operator GET /v1/jobs/{job}"), self.operator.job(job).await)
    }

    /// Polls job `job` until `holds`, at most [`Session::wait_bound`].
    pub async fn wait(&self, job: &str, what: &str, holds: impl Fn(&JobView) -> bool) -> Result<JobView, Finding> {
        let bound = self.wait_bound();
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let view = self.view(job).await?;
            if holds(&view) {
                return Ok(view);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Finding::Fail(format!(
                    "job {job} did not become {what} within {} ms (it is {:?})",
                    bound.as_millis(),
                    view.state
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until job `job` has left `running`: its lease lapsed on the server's clock and
    /// the server noticed.
    pub async fn wait_lapsed(&self, job: &str) -> Result<JobView, Finding> {
        self.wait(job, "anything but running (its lease lapsed)", |view| view.state != JobState::Running).await
    }

    /// The ledger entry `seq` of job `job`, from its view.
    pub async fn entry(&self, job: &str, seq: u64) -> Result<LedgerEntry, Finding> {
        let view = self.view(job).await?;
        view.ledger
            .into_iter()
            .find(|entry| entry.seq == seq)
            .ok_or_else(|| Finding::Fail(format!("job {job}'s ledger holds no entry {seq}, which an answer named")))
    }

    /// Sends a reconcile as the operator, first recording the decision (the rules model
    /// requires every reconcile to follow one).
    pub async fn reconcile(&self, request: &ReconcileRequest) -> Result<JobView, ClientError> {
        self.decided(&request.job, &request.attempt, Some(request.finding));
        self.operator.reconcile(request).await
    }

    /// Records that the operator decided about `attempt` of `job` now: any reconcile the
    /// session sends, even one meant to be refused, is an operator's decision.
    pub fn decided(&self, job: &str, attempt: &str, finding: Option<protocol::Finding>) {
        let mut event = Event::new(self.now_ns(), Process::OPERATOR, EventType::Invoke, Op::Reconcile);
        event.job = Some(job.to_string());
        event.attempt = Some(attempt.to_string());
        event.outcome = finding.map(|finding| history::OutcomeWord::from(finding).as_str().to_string());
        self.decisions.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(event);
    }

    /// Nanoseconds since the session started, on the host's monotonic clock.
    pub fn now_ns(&self) -> u64 {
        protocol::monotonic_ns().saturating_sub(self.start_ns)
    }

    /// `mono_ns` of a server record on the session's clock.
    pub fn rebase(&self, mono_ns: u64) -> u64 {
        mono_ns.saturating_sub(self.start_ns)
    }

    /// The operator's reconcile decisions so far.
    pub fn decisions(&self) -> Vec<Event> {
        self.decisions.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// SIGKILLs the control plane and starts it again on the same store and port.
    pub async fn restart_control(&self) -> Result<(), StartError> {
        self.system.lock().await.restart_control().await
    }

    /// Stops every process the session started.
    pub async fn stop(&self) {
        for server in self.mode_targets.lock().await.iter_mut() {
            server.proc.stop(Duration::from_secs(2)).await;
        }
        self.system.lock().await.stop().await;
    }

    /// Sends `request` exactly as given.
    pub async fn send(&self, request: &Request) -> Result<Answer, SendError> {
        self.send_on(&self.http, request).await
    }

    /// Sends `request` on a connection of its own, closed after the answer.
    pub async fn send_once(&self, request: &Request) -> Result<Answer, SendError> {
        self.send_on(&self.once, request).await
    }

    async fn send_on(&self, http: &reqwest::Client, request: &Request) -> Result<Answer, SendError> {
        let method = reqwest::Method::from_bytes(request.method.as_bytes())
            .map_err(|_| SendError::Method(request.method.to_string()))?;
        let mut builder = http.request(method, &request.url);
        if let Some(authorization) = &request.authorization {
            builder = builder.header(reqwest::header::AUTHORIZATION, authorization);
        }
        if let Some(content_type) = request.content_type {
            builder = builder.header(reqwest::header::CONTENT_TYPE, content_type);
        }
        builder = match &request.body {
            Payload::Empty => builder,
            Payload::Json(value) => builder.body(serde_json::to_vec(value).expect("a value serialises")),
            Payload::Raw(bytes) => builder.body(bytes.clone()),
        };
        let response = builder.send().await.map_err(SendError::NoAnswer)?;
        let status = response.status().as_u16();
        let header = |name| response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_string);
        let (content_type, allow) =
            (header(reqwest::header::CONTENT_TYPE).unwrap_or_default(), header(reqwest::header::ALLOW));
        let bytes = response.bytes().await.map_err(SendError::Unreadable)?;
        Ok(Answer { status, content_type, allow, bytes: bytes.to_vec() })
    }

    /// A GET with the operator token (or none), answered as JSON.
    pub async fn get(&self, base: &str, path: &str, token: Option<&str>) -> Result<Answer, Finding> {
        let request = Request {
            method: "GET",
            url: format!("{base}{path}"),
            authorization: token.map(|token| format!("Bearer {token}")),
            content_type: None,
            body: Payload::Empty,
        };
        self.send(&request).await.map_err(|error| Finding::Fail(format!("GET {path}: {error}")))
    }
}
