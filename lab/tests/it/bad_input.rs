//! Bad input against a real control plane and target: the contract's table
//! (`protocol::bad_input`) of malformed, unauthorised and unknown-id requests. Each must be
//! answered with its 4xx and the error body `{"error", "code", "status"}`, and must change
//! nothing: the jobs, every job's attempts and ledger, the whole ledger and the target's step
//! log are compared after every row with a snapshot taken before the table.
//!
//! Refused *reports* (a heartbeat with a wrong fence, a late result) are not bad input: they
//! are answered 409 with a Ruling and recorded in the ledger, so they are not in this table.
//!
//! Repeat with: `cargo nextest run -p lab bad_input`

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use history::Decision;
use lab::demo::{LabOptions, LocalLab, OPERATOR_TOKEN};
use protocol::bad_input::{error_problems, exchange, rows, Answered, Body, Fixture, Registered, Row, Server};
use protocol::client::Client;
use protocol::*;
use serde_json::{json, Value};

const REPEAT: &str = "cargo nextest run -p lab bad_input";
/// Every wait on a condition (generous: the machine may be loaded).
const WAIT_MAX: Duration = Duration::from_secs(30);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The lease while the table runs: nothing may expire in the middle of it.
const LONG_LEASE_MS: u64 = 600_000;
/// The lease of the first phase, short so that one attempt becomes uncertain.
const SHORT_LEASE_MS: u64 = 300;

/// What a request changed would show in: read with the operator token.
#[derive(Clone, PartialEq)]
struct Snapshot {
    jobs: Value,
    views: BTreeMap<String, Value>,
    ledger: Value,
    steps: Value,
}

struct Lab {
    http: reqwest::Client,
    control: String,
    target: String,
}

impl Lab {
    fn base(&self, server: Server) -> &str {
        match server {
            Server::Control => &self.control,
            Server::Target => &self.target,
        }
    }

    async fn read(&self, server: Server, path: &str) -> Result<Value, String> {
        let url = format!("{}{path}", self.base(server));
        let response = self
            .http
            .get(&url)
            .bearer_auth(OPERATOR_TOKEN)
            .send()
            .await
            .map_err(|error| format!("GET {path}: no answer: {error}"))?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(|error| format!("GET {path}: {error}"))?;
        if status != 200 {
            return Err(format!("GET {path}: answered {status}: {}", String::from_utf8_lossy(&bytes)));
        }
        serde_json::from_slice(&bytes).map_err(|error| format!("GET {path}: not JSON: {error}"))
    }

    async fn snapshot(&self) -> Result<Snapshot, String> {
        let jobs = self.read(Server::Control, "/v1/jobs").await?;
        let mut views = BTreeMap::new();
        for job in jobs.as_array().ok_or("GET /v1/jobs: not an array")? {
            let id = job["id"].as_str().ok_or("GET /v1/jobs: a job without an id")?;
            views.insert(id.to_string(), self.read(Server::Control, &format!("/v1/jobs/{id}")).await?);
        }
        let ledger = self.read(Server::Control, "/v1/ledger?after=0&limit=10000").await?;
        let steps = self.read(Server::Target, "/v1/steps?after=0&limit=100000").await?;
        Ok(Snapshot { jobs, views, ledger, steps })
    }

    /// Sends a row's request exactly as the table says: on a raw connection when it carries
    /// a wire, else through reqwest.
    async fn send(&self, row: &Row) -> Result<Answered, String> {
        let base = self.base(row.server);
        let host = base.trim_start_matches("http://").to_string();
        if let Some((bytes, half_close)) = row.raw_request(&host) {
            let exchanged = tokio::task::spawn_blocking(move || exchange(&host, &bytes, half_close, REQUEST_TIMEOUT));
            return exchanged.await.map_err(|error| error.to_string())?.map_err(|error| error.to_string());
        }
        let method = reqwest::Method::from_bytes(row.method.as_bytes()).map_err(|error| error.to_string())?;
        let mut request = self.http.request(method, format!("{base}{}", row.path));
        if let Some(authorization) = &row.authorization {
            request = request.header(reqwest::header::AUTHORIZATION, authorization);
        }
        if let Some(content_type) = row.content_type {
            request = request.header(reqwest::header::CONTENT_TYPE, content_type);
        }
        request = match &row.body {
            Body::Empty => request,
            Body::Json(value) => request.body(serde_json::to_vec(value).expect("a value serialises")),
            Body::Raw(bytes) => request.body(bytes.clone()),
        };
        let response = request.send().await.map_err(|error| format!("no answer: {error}"))?;
        let status = response.status().as_u16();
        let header = |name: reqwest::header::HeaderName| {
            response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_string)
        };
        let (content_type, allow) =
            (header(reqwest::header::CONTENT_TYPE).unwrap_or_default(), header(reqwest::header::ALLOW));
        let bytes = response.bytes().await.map_err(|error| format!("answer unreadable: {error}"))?;
        Ok(Answered { status, content_type, allow, bytes: bytes.to_vec() })
    }
}

/// Where `after` differs from `before`, one line per changed place.
fn changes(before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let mut changed = Vec::new();
    diff("GET /v1/jobs", &before.jobs, &after.jobs, &mut changed);
    let ids: std::collections::BTreeSet<&String> = before.views.keys().chain(after.views.keys()).collect();
    for id in ids {
        let (old, new) = (before.views.get(id).unwrap_or(&Value::Null), after.views.get(id).unwrap_or(&Value::Null));
        diff(&format!("GET /v1/jobs/{id}"), old, new, &mut changed);
    }
    diff("GET /v1/ledger", &before.ledger, &after.ledger, &mut changed);
    diff("target GET /v1/steps", &before.steps, &after.steps, &mut changed);
    changed
}

/// The places where two JSON values differ, as `place: before -> after` (appended array
/// entries as `place: + entry`).
fn diff(place: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    match (old, new) {
        _ if old == new => {}
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                diff(
                    &format!("{place}.{key}"),
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                diff(&format!("{place}[{index}]"), x, y, out);
            }
            out.extend(b.iter().skip(a.len()).map(|entry| format!("{place}: + {entry}")));
            out.extend(a.iter().skip(b.len()).map(|entry| format!("{place}: - {entry}")));
        }
        _ => out.push(format!("{place}: {old} -> {new}")),
    }
}

fn now_ms() -> i64 {
    lab::control::Now::read().ms
}

/// Builds the state the table runs against; returns the fixture.
///
/// Project `demo`: runners `r1`, `r2`; job `ju` whose attempt `ju-a1` is uncertain (its lease
/// lapsed under a short lease before the control plane restarted with a long one), `jd`
/// succeeded (`jd-a1`), `j1` running (`j1-a1` of `r1`, a capability redeemed), `j2` queued
/// and claimable. Project `other`: runner `o1`, job `oj1` queued and claimable. A request
/// wrongly taken as a claim, reconcile or step therefore changes something visible.
async fn build(lab: &mut LocalLab) -> Fixture {
    let spec = JobSpec { steps: 3, step_ms: 1 };
    let other = lab.operator.create_project("other").await.expect("project other");
    let mut tokens = BTreeMap::new();
    for (project, id) in [("demo", "r1"), ("demo", "r2"), ("other", "o1")] {
        let registered = lab
            .operator
            .register_runner(&RegisterRunner { project: Some(project.into()), id: id.into() })
            .await
            .expect("runner registers");
        tokens.insert(id, registered.token);
    }
    lab.submit("ju", "ku", spec.clone()).await.expect("submit ju");
    let runner = lab.operator.with_token(&tokens["r1"]);
    let grant = runner
        .claim(&ClaimRequest { runner: "r1".into(), observed_ms: now_ms() })
        .await
        .expect("claim")
        .grant
        .expect("ju is claimable");
    assert_eq!(grant.claim.attempt, "ju-a1");
    let uncertain = grant.claim;
    lab.wait_job("ju", WAIT_MAX, |view| view.state == JobState::Uncertain).await.expect("ju becomes uncertain");

    lab.options.lease_ms = LONG_LEASE_MS;
    lab.restart_control().await.expect("the control plane restarts");
    let control = lab.control_url();
    let operator = Client::new(&control, Some(OPERATOR_TOKEN), REQUEST_TIMEOUT);
    let runner = operator.with_token(&tokens["r1"]);

    lab.submit("jd", "kd", spec.clone()).await.expect("submit jd");
    let grant = runner
        .claim(&ClaimRequest { runner: "r1".into(), observed_ms: now_ms() })
        .await
        .expect("claim")
        .grant
        .expect("jd is claimable");
    assert_eq!(grant.claim.attempt, "jd-a1");
    let done = ResultRequest { claim: grant.claim, outcome: Outcome::Succeeded, observed_ms: now_ms(), detail: None };
    assert_eq!(runner.result(&done).await.expect("result").decision, Decision::Accepted);
    let done = done.claim;

    lab.submit("j1", "k1", spec.clone()).await.expect("submit j1");
    let grant = runner
        .claim(&ClaimRequest { runner: "r1".into(), observed_ms: now_ms() })
        .await
        .expect("claim")
        .grant
        .expect("j1 is claimable");
    assert_eq!(grant.claim.attempt, "j1-a1");
    assert_eq!(grant.lease_ms, LONG_LEASE_MS);
    let redeem = CapabilityRequest { claim: grant.claim.clone(), observed_ms: now_ms() };
    let verdict = runner.capability(&redeem).await.expect("capability");
    let capability = verdict.capability.expect("a capability for the running attempt");

    lab.submit("j2", "k2", spec.clone()).await.expect("submit j2");
    let other_job = SubmitJob { project: "other".into(), id: Some("oj1".into()), deployment_key: "ko".into(), spec };
    operator.submit(&other_job).await.expect("submit oj1");

    let runner = |id: &str| Registered { id: id.to_string(), token: tokens[id].clone() };
    Fixture {
        operator: OPERATOR_TOKEN.to_string(),
        project: "demo".into(),
        other: "other".into(),
        r1: runner("r1"),
        r2: runner("r2"),
        o1: runner("o1"),
        other_registration: other.registration_token,
        fresh: String::new(),
        report: grant.claim.clone(),
        uncertain,
        done,
        running: Some(grant.claim),
        other_job: "oj1".into(),
        capability: serde_json::to_value(&capability).expect("a capability serialises"),
    }
}

fn options(dir: &Path, lease_ms: u64) -> LabOptions {
    let mut options = LabOptions::new(Path::new(env!("CARGO_BIN_EXE_fencelab-lab")), dir);
    options.lease_ms = lease_ms;
    options
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_refused_with_their_code_and_change_nothing() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut lab = LocalLab::start(options(dir.path(), SHORT_LEASE_MS)).await.expect("the lab starts");
    let fixture = build(&mut lab).await;
    // Every request on a connection of its own: a server may answer a row before reading
    // its whole body and then close the connection, which a pooled one would not survive.
    let http = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .pool_max_idle_per_host(0)
        .build()
        .expect("an HTTP client builds");
    let client = Lab { http, control: lab.control_url(), target: lab.target_url() };

    let table = rows(&fixture);

    let mut baseline = client.snapshot().await.expect("the snapshot before the table");
    assert_eq!(baseline.views.len(), 5, "the fixture has five jobs");
    let mut failures = Vec::new();
    for row in &table {
        let mut problems = match client.send(row).await {
            Ok(answer) => error_problems(row.status, row.code, &answer),
            Err(error) => vec![error],
        };
        match client.snapshot().await {
            Ok(after) => {
                let changed = changes(&baseline, &after);
                if !changed.is_empty() {
                    problems.push(format!("the store changed:\n    {}", changed.join("\n    ")));
                    // Judge the next rows against the state this one left.
                    baseline = after;
                }
            }
            Err(error) => problems.push(format!("the snapshot after the row failed: {error}")),
        }
        if !problems.is_empty() {
            failures.push(format!(
                "row `{}` ({} {} on the {:?}):\n  - {}",
                row.name,
                row.method,
                row.path,
                row.server,
                problems.join("\n  - ")
            ));
        }
    }
    lab.shutdown().await;
    assert!(
        failures.is_empty(),
        "{} of {} bad-input rows failed:\n\n{}\n\nrepeat with: {REPEAT}",
        failures.len(),
        table.len(),
        failures.join("\n\n")
    );
}

/// Positions beyond any stored sequence number read as an empty page, not a server error
/// (the ledger's sequence is SQLite's INTEGER: at most i64::MAX).
#[tokio::test(flavor = "multi_thread")]
async fn read_positions_beyond_the_end_are_empty_pages() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let lab = LocalLab::start(options(dir.path(), LONG_LEASE_MS)).await.expect("the lab starts");
    let http = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build().expect("an HTTP client builds");
    let client = Lab { http, control: lab.control_url(), target: lab.target_url() };
    for (server, path) in [
        (Server::Control, format!("/v1/ledger?after={}", u64::MAX)),
        (Server::Control, format!("/v1/ledger?after={}&limit={}", i64::MAX, u32::MAX)),
        (Server::Target, format!("/v1/steps?after={}", u64::MAX)),
    ] {
        let page = client.read(server, &path).await.unwrap_or_else(|error| panic!("{error}\nrepeat with: {REPEAT}"));
        assert_eq!(page, json!([]), "{server:?} {path}\nrepeat with: {REPEAT}");
    }
    lab.shutdown().await;
}
