//! Bad input against a real control plane and target: a table of malformed, unauthorised and
//! unknown-id requests. Each must be answered with its 4xx and the error body
//! `{"error", "code", "status"}`, and must change nothing: the jobs, every job's attempts and
//! ledger, the whole ledger and the target's step log are compared after every row with a
//! snapshot taken before the table.
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
const JSON: Option<&str> = Some("application/json");
const ROWS_MIN: usize = 35;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    Control,
    Target,
}

enum Payload {
    /// No body at all.
    Empty,
    Json(Value),
    Raw(Vec<u8>),
}

/// One request of the table and the answer it must get.
struct Row {
    name: &'static str,
    server: Server,
    method: &'static str,
    path: String,
    /// The `Authorization` header exactly as sent, if any.
    authorization: Option<String>,
    body: Payload,
    content_type: Option<&'static str>,
    status: u16,
    code: &'static str,
}

#[allow(clippy::too_many_arguments)]
fn control(
    name: &'static str,
    method: &'static str,
    path: impl Into<String>,
    authorization: Option<String>,
    body: Payload,
    content_type: Option<&'static str>,
    status: u16,
    code: &'static str,
) -> Row {
    Row { name, server: Server::Control, method, path: path.into(), authorization, body, content_type, status, code }
}

#[allow(clippy::too_many_arguments)]
fn target(
    name: &'static str,
    method: &'static str,
    path: impl Into<String>,
    body: Payload,
    content_type: Option<&'static str>,
    status: u16,
    code: &'static str,
) -> Row {
    Row {
        name,
        server: Server::Target,
        method,
        path: path.into(),
        authorization: None,
        body,
        content_type,
        status,
        code,
    }
}

fn bearer(token: &str) -> Option<String> {
    Some(format!("Bearer {token}"))
}

fn raw(text: &str) -> Payload {
    Payload::Raw(text.as_bytes().to_vec())
}

/// What the table needs to know of the state built before it.
struct Fixture {
    operator: String,
    /// Runners `r1`, `r2` of project `demo` and `o1` of project `other`.
    r1: String,
    r2: String,
    o1: String,
    other_registration: String,
    /// The running attempt `j1-a1` of `r1`.
    running: ClaimRef,
    /// A capability redeemed for `running`: valid, so a step the target wrongly took would apply.
    capability: Capability,
}

fn claim_body(claim: &ClaimRef) -> Value {
    json!({"job": claim.job, "attempt": claim.attempt, "runner": claim.runner, "fence": claim.fence, "observed_ms": 0})
}

/// A claim report as a JSON array of its fields in order, then `more`.
fn claim_array(claim: &ClaimRef, more: &[Value]) -> Value {
    let mut fields = vec![json!(claim.job), json!(claim.attempt), json!(claim.runner), json!(claim.fence), json!(0)];
    fields.extend(more.iter().cloned());
    Value::Array(fields)
}

/// A capability as a JSON array of its fields in order.
fn capability_array(capability: &Capability) -> Value {
    let c = capability;
    json!([c.deployment_key, c.job, c.attempt, c.runner, c.fence, c.expires_ms, c.signature])
}

/// `body` with `field` set to `value`.
fn with(mut body: Value, field: &str, value: Value) -> Value {
    body[field] = value;
    body
}

/// `body` without `field`.
fn without(mut body: Value, field: &str) -> Value {
    body.as_object_mut().expect("an object").remove(field);
    body
}

/// The table: one request a line, kept unformatted so that it reads as a table.
#[rustfmt::skip]
fn rows(fx: &Fixture) -> Vec<Row> {
    let op = || bearer(&fx.operator);
    let r1 = || bearer(&fx.r1);
    let r2 = || bearer(&fx.r2);
    let o1 = || bearer(&fx.o1);
    let reg = || bearer(&fx.other_registration);
    let heartbeat = claim_body(&fx.running);
    let result = with(claim_body(&fx.running), "outcome", json!("succeeded"));
    let job = json!({"project": "demo", "id": "j9", "deployment_key": "k9", "spec": {"steps": 1, "step_ms": 1}});
    let spec = |steps: Value, step_ms: Value| with(job.clone(), "spec", json!({"steps": steps, "step_ms": step_ms}));
    let reconcile = |job: &str, attempt: &str, finding: &str| json!({"job": job, "attempt": attempt, "finding": finding});
    let step = json!({"capability": fx.capability, "step": 0, "steps": 3, "duration_ms": 0});
    let oversized = format!("{{\"id\": \"{}\"}}", "a".repeat(70 * 1024));
    use Payload::{Empty, Json as J};
    vec![
        // Bodies that are not the JSON object the endpoint takes.
        control("malformed JSON", "POST", "/v1/jobs", op(), raw("{project: demo}"), JSON, 400, "malformed_json"),
        control("truncated JSON", "POST", "/v1/jobs", op(), raw(r#"{"project": "demo", "id": "j9", "spec": {"steps": 1,"#), JSON, 400, "malformed_json"),
        control("empty body", "POST", "/v1/jobs", op(), Empty, JSON, 400, "malformed_json"),
        control("trailing garbage after the object", "POST", "/v1/projects", op(), raw(r#"{"id": "p9"} {"id": "p10"}"#), JSON, 400, "malformed_json"),
        control("invalid UTF-8 in the body", "POST", "/v1/projects", op(), Payload::Raw(b"{\"id\": \"p\xff\"}".to_vec()), JSON, 400, "malformed_json"),
        control("JSON array of the fields instead of an object (project)", "POST", "/v1/projects", op(), J(json!(["p9"])), JSON, 400, "invalid_body"),
        control("JSON array of the fields instead of an object (claim)", "POST", "/v1/claim", r1(), J(json!(["r1", 0])), JSON, 400, "invalid_body"),
        control("JSON array of objects instead of an object", "POST", "/v1/jobs", op(), J(json!([job])), JSON, 400, "invalid_body"),
        control("JSON string instead of an object", "POST", "/v1/projects", op(), J(json!("p9")), JSON, 400, "invalid_body"),
        control("JSON array of the spec's fields", "POST", "/v1/jobs", op(), J(with(job.clone(), "spec", json!([1, 1]))), JSON, 400, "invalid_body"),
        control("JSON array of a heartbeat's fields", "POST", "/v1/heartbeat", r1(), J(claim_array(&fx.running, &[])), JSON, 400, "invalid_body"),
        control("JSON array of a capability request's fields", "POST", "/v1/capability", r1(), J(claim_array(&fx.running, &[])), JSON, 400, "invalid_body"),
        control("JSON array of a result's fields", "POST", "/v1/result", r1(), J(claim_array(&fx.running, &[json!("succeeded")])), JSON, 400, "invalid_body"),
        control("a type error before a syntax error", "POST", "/v1/jobs", op(), raw(r#"{"project": 5, "id": "j9""#), JSON, 400, "malformed_json"),
        control("a JSON number with a plus sign", "POST", "/v1/heartbeat", r1(), raw(&heartbeat.to_string().replace(&format!(":{}", fx.running.fence), &format!(":+{}", fx.running.fence))), JSON, 400, "malformed_json"),
        control("a JSON number with a leading zero", "POST", "/v1/heartbeat", r1(), raw(&heartbeat.to_string().replace(&format!(":{}", fx.running.fence), &format!(":0{}", fx.running.fence))), JSON, 400, "malformed_json"),
        control("unknown field", "POST", "/v1/projects", op(), J(json!({"id": "p9", "colour": "red"})), JSON, 400, "invalid_body"),
        control("unknown field in a flattened claim", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "extra", json!(1))), JSON, 400, "invalid_body"),
        control("unknown field in the spec", "POST", "/v1/jobs", op(), J(with(job.clone(), "spec", json!({"steps": 1, "step_ms": 1, "retries": 2}))), JSON, 400, "invalid_body"),
        control("duplicate field", "POST", "/v1/projects", op(), raw(r#"{"id": "p9", "id": "p10"}"#), JSON, 400, "invalid_body"),
        control("string fence", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "fence", json!(fx.running.fence.to_string()))), JSON, 400, "invalid_body"),
        control("negative fence", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "fence", json!(-1))), JSON, 400, "invalid_body"),
        control("fence beyond i64::MAX", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "fence", json!(u64::MAX))), JSON, 400, "invalid_field"),
        control("fence beyond i64::MAX on a result", "POST", "/v1/result", r1(), J(with(result.clone(), "fence", json!(1u64 << 63))), JSON, 400, "invalid_field"),
        control("float steps", "POST", "/v1/jobs", op(), J(spec(json!(1.5), json!(1))), JSON, 400, "invalid_body"),
        control("null runner", "POST", "/v1/claim", r1(), J(json!({"runner": null, "observed_ms": 0})), JSON, 400, "invalid_body"),
        control("missing deployment_key", "POST", "/v1/jobs", op(), J(without(job.clone(), "deployment_key")), JSON, 400, "invalid_body"),
        control("missing fence", "POST", "/v1/heartbeat", r1(), J(without(heartbeat.clone(), "fence")), JSON, 400, "invalid_body"),
        control("missing outcome on a result", "POST", "/v1/result", r1(), J(without(result.clone(), "outcome")), JSON, 400, "invalid_body"),
        control("unknown outcome", "POST", "/v1/result", r1(), J(with(result.clone(), "outcome", json!("maybe"))), JSON, 400, "invalid_body"),
        control("wrong content type", "POST", "/v1/projects", op(), J(json!({"id": "p9"})), Some("text/plain"), 415, "unsupported_media_type"),
        control("no content type", "POST", "/v1/claim", r1(), J(json!({"runner": "r1", "observed_ms": 0})), None, 415, "unsupported_media_type"),
        control("a JSON suffix is not JSON", "POST", "/v1/jobs", op(), J(job.clone()), Some("application/problem+json"), 415, "unsupported_media_type"),
        control("a longer subtype is not JSON", "POST", "/v1/jobs", op(), J(job.clone()), Some("application/jsonp"), 415, "unsupported_media_type"),
        control("text/json is not JSON", "POST", "/v1/claim", r1(), J(json!({"runner": "r1", "observed_ms": 0})), Some("text/json"), 415, "unsupported_media_type"),
        control("oversized body (> 64 KiB)", "POST", "/v1/projects", op(), Payload::Raw(oversized.clone().into_bytes()), JSON, 413, "body_too_large"),
        // Who is asking.
        control("missing Authorization", "POST", "/v1/jobs", None, J(job.clone()), JSON, 401, "unauthorized"),
        control("missing Authorization on a read", "GET", "/v1/jobs", None, Empty, None, 401, "unauthorized"),
        control("missing Authorization on the ledger", "GET", "/v1/ledger", None, Empty, None, 401, "unauthorized"),
        control("non-Bearer scheme", "POST", "/v1/jobs", Some(format!("Basic {}", fx.operator)), J(job.clone()), JSON, 401, "unauthorized"),
        control("empty bearer", "POST", "/v1/jobs", Some("Bearer ".into()), J(job.clone()), JSON, 401, "unauthorized"),
        control("lower-case bearer scheme", "POST", "/v1/jobs", Some(format!("bearer {}", fx.operator)), J(job.clone()), JSON, 401, "unauthorized"),
        control("two spaces after the scheme", "POST", "/v1/jobs", Some(format!("Bearer  {}", fx.operator)), J(job.clone()), JSON, 401, "unauthorized"),
        control("a tab after the scheme", "POST", "/v1/claim", Some(format!("Bearer\t{}", fx.r1)), J(json!({"runner": "r1", "observed_ms": 0})), JSON, 401, "unauthorized"),
        control("unknown token", "POST", "/v1/jobs", bearer("not-a-token"), J(job.clone()), JSON, 401, "unauthorized"),
        control("unknown token is refused before a malformed body is read", "POST", "/v1/jobs", bearer("not-a-token"), raw("{"), JSON, 401, "unauthorized"),
        control("runner token submits a job", "POST", "/v1/jobs", r1(), J(job.clone()), JSON, 403, "forbidden"),
        control("runner token creates a project", "POST", "/v1/projects", r1(), J(json!({"id": "p9"})), JSON, 403, "forbidden"),
        control("runner token registers a runner", "POST", "/v1/runners", r1(), J(json!({"project": "demo", "id": "r9"})), JSON, 403, "forbidden"),
        control("runner token lists jobs", "GET", "/v1/jobs", r1(), Empty, None, 403, "forbidden"),
        control("runner token reads a job", "GET", "/v1/jobs/j1", r1(), Empty, None, 403, "forbidden"),
        control("runner token reads the ledger", "GET", "/v1/ledger", r1(), Empty, None, 403, "forbidden"),
        control("runner token reconciles", "POST", "/v1/reconcile", r1(), J(reconcile("ju", "ju-a1", "stopped")), JSON, 403, "forbidden"),
        control("registration token submits a job", "POST", "/v1/jobs", reg(), J(job.clone()), JSON, 403, "forbidden"),
        control("registration token registers into another project", "POST", "/v1/runners", reg(), J(json!({"project": "demo", "id": "r9"})), JSON, 403, "forbidden"),
        control("registration token claims", "POST", "/v1/claim", reg(), J(json!({"runner": "o1", "observed_ms": 0})), JSON, 403, "forbidden"),
        control("operator token claims", "POST", "/v1/claim", op(), J(json!({"runner": "r1", "observed_ms": 0})), JSON, 403, "forbidden"),
        control("operator token heartbeats", "POST", "/v1/heartbeat", op(), J(heartbeat.clone()), JSON, 403, "forbidden"),
        control("operator token redeems a capability", "POST", "/v1/capability", op(), J(heartbeat.clone()), JSON, 403, "forbidden"),
        control("operator token reports a result", "POST", "/v1/result", op(), J(result.clone()), JSON, 403, "forbidden"),
        control("runner claims as another runner", "POST", "/v1/claim", r1(), J(json!({"runner": "r2", "observed_ms": 0})), JSON, 403, "runner_mismatch"),
        control("runner heartbeats as another runner", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "runner", json!("r2"))), JSON, 403, "runner_mismatch"),
        control("runner reports another runner's result", "POST", "/v1/result", r2(), J(result.clone()), JSON, 403, "runner_mismatch"),
        control("runner of another project heartbeats a demo job", "POST", "/v1/heartbeat", o1(), J(with(heartbeat.clone(), "runner", json!("o1"))), JSON, 404, "unknown_job"),
        control("runner of another project redeems for a demo job", "POST", "/v1/capability", o1(), J(with(heartbeat.clone(), "runner", json!("o1"))), JSON, 404, "unknown_job"),
        control("runner of another project reports a demo job", "POST", "/v1/result", o1(), J(with(result.clone(), "runner", json!("o1"))), JSON, 404, "unknown_job"),
        control("heartbeat for a job that does not exist", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "job", json!("nope"))), JSON, 404, "unknown_job"),
        // Two rules broken at once: the first check in the documented order answers.
        control("unknown token and the wrong content type", "POST", "/v1/heartbeat", bearer("not-a-token"), J(heartbeat.clone()), Some("text/plain"), 401, "unauthorized"),
        control("wrong content type and malformed JSON", "POST", "/v1/heartbeat", r1(), raw("{"), Some("text/plain"), 415, "unsupported_media_type"),
        control("oversized and malformed", "POST", "/v1/heartbeat", r1(), Payload::Raw(format!("{{{oversized}").into_bytes()), JSON, 413, "body_too_large"),
        control("operator token and a fence beyond i64::MAX", "POST", "/v1/capability", op(), J(with(heartbeat.clone(), "fence", json!(u64::MAX))), JSON, 403, "forbidden"),
        control("another runner named and a fence beyond i64::MAX", "POST", "/v1/heartbeat", r1(), J(with(with(heartbeat.clone(), "runner", json!("r2")), "fence", json!(u64::MAX))), JSON, 403, "runner_mismatch"),
        control("a fence beyond i64::MAX for a job that does not exist", "POST", "/v1/result", r1(), J(with(with(result.clone(), "job", json!("nope")), "fence", json!(u64::MAX))), JSON, 400, "invalid_field"),
        control("another runner named for another project's job", "POST", "/v1/heartbeat", o1(), J(heartbeat.clone()), JSON, 403, "runner_mismatch"),
        // Registration and submission.
        control("runner in an unknown project", "POST", "/v1/runners", op(), J(json!({"project": "nope", "id": "r9"})), JSON, 404, "unknown_project"),
        control("operator registers without a project", "POST", "/v1/runners", op(), J(json!({"id": "r9"})), JSON, 400, "missing_field"),
        control("duplicate project", "POST", "/v1/projects", op(), J(json!({"id": "other"})), JSON, 409, "exists"),
        control("duplicate runner", "POST", "/v1/runners", op(), J(json!({"project": "demo", "id": "r1"})), JSON, 409, "exists"),
        control("runner id taken in another project", "POST", "/v1/runners", op(), J(json!({"project": "demo", "id": "o1"})), JSON, 409, "exists"),
        control("duplicate job id", "POST", "/v1/jobs", op(), J(with(job.clone(), "id", json!("j1"))), JSON, 409, "exists"),
        control("job in an unknown project", "POST", "/v1/jobs", op(), J(with(job.clone(), "project", json!("nope"))), JSON, 404, "unknown_project"),
        control("empty project id", "POST", "/v1/projects", op(), J(json!({"id": ""})), JSON, 400, "invalid_field"),
        control("project id too long", "POST", "/v1/projects", op(), J(json!({"id": "p".repeat(129)})), JSON, 400, "invalid_field"),
        control("runner id with a space", "POST", "/v1/runners", op(), J(json!({"project": "demo", "id": "r 9"})), JSON, 400, "invalid_field"),
        control("job id with a slash", "POST", "/v1/jobs", op(), J(with(job.clone(), "id", json!("j/9"))), JSON, 400, "invalid_field"),
        control("empty job id", "POST", "/v1/jobs", op(), J(with(job.clone(), "id", json!(""))), JSON, 400, "invalid_field"),
        control("deployment key with non-ASCII", "POST", "/v1/jobs", op(), J(with(job.clone(), "deployment_key", json!("kä"))), JSON, 400, "invalid_field"),
        control("spec with 0 steps", "POST", "/v1/jobs", op(), J(spec(json!(0), json!(1))), JSON, 400, "invalid_field"),
        control("spec with too many steps", "POST", "/v1/jobs", op(), J(spec(json!(1001), json!(1))), JSON, 400, "invalid_field"),
        control("spec with too long a step", "POST", "/v1/jobs", op(), J(spec(json!(1), json!(600_001))), JSON, 400, "invalid_field"),
        // Reconcile.
        control("reconcile an unknown job", "POST", "/v1/reconcile", op(), J(reconcile("nope", "ju-a1", "stopped")), JSON, 404, "unknown_job"),
        control("reconcile an unknown attempt", "POST", "/v1/reconcile", op(), J(reconcile("ju", "ju-a9", "stopped")), JSON, 404, "unknown_attempt"),
        control("reconcile another job's attempt", "POST", "/v1/reconcile", op(), J(reconcile("j2", "ju-a1", "stopped")), JSON, 404, "unknown_attempt"),
        control("reconcile a running attempt", "POST", "/v1/reconcile", op(), J(reconcile("j1", "j1-a1", "stopped")), JSON, 409, "not_uncertain"),
        control("reconcile a succeeded attempt", "POST", "/v1/reconcile", op(), J(with(reconcile("jd", "jd-a1", "completed"), "outcome", json!("failed"))), JSON, 409, "not_uncertain"),
        control("reconcile completed without outcome", "POST", "/v1/reconcile", op(), J(reconcile("ju", "ju-a1", "completed")), JSON, 400, "missing_field"),
        control("reconcile stopped with an outcome", "POST", "/v1/reconcile", op(), J(with(reconcile("ju", "ju-a1", "stopped"), "outcome", json!("failed"))), JSON, 400, "invalid_field"),
        control("reconcile still-running with an outcome", "POST", "/v1/reconcile", op(), J(with(reconcile("ju", "ju-a1", "still-running"), "outcome", json!("succeeded"))), JSON, 400, "invalid_field"),
        control("reconcile with an unknown finding", "POST", "/v1/reconcile", op(), J(reconcile("ju", "ju-a1", "vanished")), JSON, 400, "invalid_body"),
        // Routes, methods, paths and queries.
        control("read an unknown job", "GET", "/v1/jobs/nope", op(), Empty, None, 404, "unknown_job"),
        control("job id in the path that is not UTF-8", "GET", "/v1/jobs/%FF", op(), Empty, None, 400, "invalid_path"),
        control("unknown route", "GET", "/v1/nope", op(), Empty, None, 404, "no_route"),
        control("unknown API version", "POST", "/v2/jobs", op(), J(job.clone()), JSON, 404, "no_route"),
        control("path below a job", "GET", "/v1/jobs/j1/attempts", op(), Empty, None, 404, "no_route"),
        control("wrong method on jobs", "DELETE", "/v1/jobs", op(), Empty, None, 405, "method_not_allowed"),
        control("wrong method on claim", "GET", "/v1/claim", r1(), Empty, None, 405, "method_not_allowed"),
        control("wrong method on a job", "PUT", "/v1/jobs/j1", op(), J(job.clone()), JSON, 405, "method_not_allowed"),
        control("ledger with a non-number after", "GET", "/v1/ledger?after=abc", op(), Empty, None, 400, "invalid_query"),
        control("ledger with a negative limit", "GET", "/v1/ledger?limit=-1", op(), Empty, None, 400, "invalid_query"),
        control("ledger with an unknown parameter", "GET", "/v1/ledger?job=j1", op(), Empty, None, 400, "invalid_query"),
        control("ledger with a plus sign", "GET", "/v1/ledger?after=%2B1", op(), Empty, None, 400, "invalid_query"),
        control("ledger with an empty limit", "GET", "/v1/ledger?limit=", op(), Empty, None, 400, "invalid_query"),
        control("ledger with after beyond u64::MAX", "GET", "/v1/ledger?after=18446744073709551616", op(), Empty, None, 400, "invalid_query"),
        control("ledger with after twice", "GET", "/v1/ledger?after=1&after=2", op(), Empty, None, 400, "invalid_query"),
        // The target.
        target("target: malformed step", "POST", "/v1/steps", raw(r#"{"capability": "#), JSON, 400, "malformed_json"),
        target("target: step index equal to steps", "POST", "/v1/steps", J(with(step.clone(), "step", json!(3))), JSON, 400, "invalid_field"),
        target("target: step index beyond steps", "POST", "/v1/steps", J(with(step.clone(), "step", json!(7))), JSON, 400, "invalid_field"),
        target("target: zero steps", "POST", "/v1/steps", J(with(with(step.clone(), "steps", json!(0)), "step", json!(0))), JSON, 400, "invalid_field"),
        target("target: step longer than the maximum", "POST", "/v1/steps", J(with(step.clone(), "duration_ms", json!(600_001))), JSON, 400, "invalid_field"),
        target("target: missing capability", "POST", "/v1/steps", J(without(step.clone(), "capability")), JSON, 400, "invalid_body"),
        target("target: unknown field in the capability", "POST", "/v1/steps", J(with(step.clone(), "capability", with(json!(fx.capability), "scope", json!("all")))), JSON, 400, "invalid_body"),
        target("target: JSON array instead of an object", "POST", "/v1/steps", J(json!([fx.capability, 0, 3, 0])), JSON, 400, "invalid_body"),
        target("target: JSON array of the capability's fields", "POST", "/v1/steps", J(with(step.clone(), "capability", capability_array(&fx.capability))), JSON, 400, "invalid_body"),
        target("target: capability fence beyond i64::MAX", "POST", "/v1/steps", J(with(step.clone(), "capability", with(json!(fx.capability), "fence", json!(1u64 << 63)))), JSON, 400, "invalid_field"),
        target("target: wrong content type", "POST", "/v1/steps", J(step.clone()), Some("text/plain"), 415, "unsupported_media_type"),
        target("target: oversized body", "POST", "/v1/steps", Payload::Raw(oversized.into_bytes()), JSON, 413, "body_too_large"),
        target("target: unknown route", "GET", "/v1/nope", Empty, None, 404, "no_route"),
        target("target: wrong method", "PUT", "/v1/steps", J(step.clone()), JSON, 405, "method_not_allowed"),
        target("target: unknown deployment", "GET", "/v1/deployments/nope", Empty, None, 404, "unknown_deployment"),
        target("target: deployment key in the path that is not UTF-8", "GET", "/v1/deployments/%FF", Empty, None, 400, "invalid_path"),
        target("target: step log with a non-number after", "GET", "/v1/steps?after=abc", Empty, None, 400, "invalid_query"),
        target("target: step log with a negative limit", "GET", "/v1/steps?limit=-1", Empty, None, 400, "invalid_query"),
        target("target: step log with a plus sign", "GET", "/v1/steps?after=%2B1", Empty, None, 400, "invalid_query"),
    ]
}

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

    /// Sends a row's request exactly as the table says; returns (status, content type, body).
    async fn send(&self, row: &Row) -> Result<(u16, String, Vec<u8>), String> {
        let method = reqwest::Method::from_bytes(row.method.as_bytes()).map_err(|error| error.to_string())?;
        let mut request = self.http.request(method, format!("{}{}", self.base(row.server), row.path));
        if let Some(authorization) = &row.authorization {
            request = request.header(reqwest::header::AUTHORIZATION, authorization);
        }
        if let Some(content_type) = row.content_type {
            request = request.header(reqwest::header::CONTENT_TYPE, content_type);
        }
        request = match &row.body {
            Payload::Empty => request,
            Payload::Json(value) => request.body(serde_json::to_vec(value).expect("a value serialises")),
            Payload::Raw(bytes) => request.body(bytes.clone()),
        };
        let response = request.send().await.map_err(|error| format!("no answer: {error}"))?;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
            .to_string();
        let bytes = response.bytes().await.map_err(|error| format!("answer unreadable: {error}"))?;
        Ok((status, content_type, bytes.to_vec()))
    }
}

/// What is wrong with a row's answer: nothing, or one line per problem.
fn judge_answer(row: &Row, status: u16, content_type: &str, bytes: &[u8]) -> Vec<String> {
    let mut problems = Vec::new();
    let text = String::from_utf8_lossy(bytes);
    if status >= 500 {
        problems.push(format!("server error {status} (bad input must be a 4xx): {text}"));
    } else if status != row.status {
        problems.push(format!("status {status}, expected {}: {text}", row.status));
    }
    if !content_type.starts_with("application/json") {
        problems.push(format!("content type `{content_type}`, expected application/json"));
    }
    let body: Value = match serde_json::from_slice(bytes) {
        Ok(body) => body,
        Err(_) => {
            problems.push(format!("body is not JSON: {text:?}"));
            return problems;
        }
    };
    let keys: Vec<&String> = body.as_object().map(|object| object.keys().collect()).unwrap_or_default();
    if keys.len() != 3 {
        problems.push(format!("body is not exactly {{error, code, status}}: {body}"));
    }
    if body["error"].as_str().unwrap_or("").trim().is_empty() {
        problems.push(format!("`error` is not a non-empty sentence: {body}"));
    }
    if body["code"] != row.code {
        problems.push(format!("code {}, expected \"{}\"", body["code"], row.code));
    }
    if body["status"] != status {
        problems.push(format!("body status {} differs from the HTTP status {status}", body["status"]));
    }
    problems
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

    Fixture {
        operator: OPERATOR_TOKEN.to_string(),
        r1: tokens["r1"].clone(),
        r2: tokens["r2"].clone(),
        o1: tokens["o1"].clone(),
        other_registration: other.registration_token,
        running: grant.claim,
        capability,
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
    let http = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build().expect("an HTTP client builds");
    let client = Lab { http, control: lab.control_url(), target: lab.target_url() };

    let table = rows(&fixture);
    assert!(table.len() >= ROWS_MIN, "the table has {} rows, fewer than {ROWS_MIN}", table.len());
    let mut names = std::collections::BTreeSet::new();
    for row in &table {
        assert!(names.insert(row.name), "two rows are named `{}`", row.name);
    }

    let mut baseline = client.snapshot().await.expect("the snapshot before the table");
    assert_eq!(baseline.views.len(), 5, "the fixture has five jobs");
    let mut failures = Vec::new();
    for row in &table {
        let mut problems = match client.send(row).await {
            Ok((status, content_type, bytes)) => judge_answer(row, status, &content_type, &bytes),
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
