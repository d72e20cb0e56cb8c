//! The contract's bad-input table: malformed, unauthorised, out-of-domain and unknown-id
//! requests against every endpoint of both servers, each with the 4xx and error code
//! `docs/protocol.md` gives it, and the order of the checks when a request breaks two rules.
//! Conform runs it against any system (`conform/src/inputs.rs`), the lab's tests against the
//! lab (`lab/tests/it/bad_input.rs`): each builds the state the rows name (a [`Fixture`]),
//! sends every row and judges its answer ([`error_problems`]) and what it changed.
//!
//! Most rows are ordinary requests; a body cut short and an oversized chunked body cannot be
//! sent by an HTTP client, so those rows carry a [`Wire`] and go on a raw TCP connection
//! ([`exchange`]).

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{json, Value};

use crate::ClaimRef;

/// Which server a row is sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    Control,
    Target,
}

/// A row's body.
#[derive(Clone, Debug)]
pub enum Body {
    /// No body at all.
    Empty,
    Json(Value),
    Raw(Vec<u8>),
}

/// How a body goes on the wire when an HTTP client cannot send it.
#[derive(Clone, Debug)]
pub enum Wire {
    /// `Content-Length: declared`, then only `sent`, then the write half closed.
    Truncated { declared: usize, sent: Vec<u8> },
    /// `Transfer-Encoding: chunked` with a body of this many bytes in 8 KiB chunks.
    Chunked(usize),
}

/// One request of the table and the answer it must get.
#[derive(Clone, Debug)]
pub struct Row {
    /// The row's name: distinct in the table (conform's case is `input/<name>`).
    pub name: &'static str,
    pub server: Server,
    pub method: &'static str,
    pub path: String,
    /// The `Authorization` header exactly as sent, if any.
    pub authorization: Option<String>,
    pub body: Body,
    /// Set when the row goes on a raw connection ([`Row::raw_request`]).
    pub wire: Option<Wire>,
    pub content_type: Option<&'static str>,
    pub status: u16,
    pub code: &'static str,
}

/// A runner the fixture registered.
#[derive(Clone, Debug)]
pub struct Registered {
    pub id: String,
    pub token: String,
}

/// The state the table's rows name, built by whoever runs the table. Nothing in it may be
/// changed by a row: the rows that name it are refused.
#[derive(Clone, Debug)]
pub struct Fixture {
    pub operator: String,
    /// The project of `r1`, `r2` and every job below but `other_job`.
    pub project: String,
    /// A second project: runner `o1`, job `other_job`, `other_registration`'s project.
    pub other: String,
    pub r1: Registered,
    pub r2: Registered,
    pub o1: Registered,
    pub other_registration: String,
    /// What every id a row makes up starts with (conform keeps its ids apart with `in.`).
    pub fresh: String,
    /// `r1`'s attempt the reports name; its job exists.
    pub report: ClaimRef,
    /// An uncertain attempt (its lease lapsed, nothing reconciled).
    pub uncertain: ClaimRef,
    /// An attempt whose success was accepted.
    pub done: ClaimRef,
    /// A running attempt, when the fixture holds one (a row reconciles it).
    pub running: Option<ClaimRef>,
    /// A job of project `other`.
    pub other_job: String,
    /// A capability for `report` (valid or only capability-shaped).
    pub capability: Value,
}

impl Fixture {
    /// A fixture of names only, no system behind it: enough to list the table's rows.
    pub fn placeholder() -> Fixture {
        let runner = |id: &str| Registered { id: id.to_string(), token: format!("{id}-token") };
        let claim =
            |job: &str| ClaimRef { job: job.to_string(), attempt: format!("{job}-a1"), runner: "r1".into(), fence: 1 };
        Fixture {
            operator: "operator".into(),
            project: "p".into(),
            other: "o".into(),
            r1: runner("r1"),
            r2: runner("r2"),
            o1: runner("o1"),
            other_registration: "registration".into(),
            fresh: String::new(),
            report: claim("j1"),
            uncertain: claim("ju"),
            done: claim("jd"),
            running: Some(claim("j1")),
            other_job: "oj1".into(),
            capability: json!({}),
        }
    }
}

const JSON: Option<&str> = Some("application/json");

#[allow(clippy::too_many_arguments)]
fn control(
    name: &'static str,
    method: &'static str,
    path: impl Into<String>,
    authorization: Option<String>,
    body: Body,
    content_type: Option<&'static str>,
    status: u16,
    code: &'static str,
) -> Row {
    Row {
        name,
        server: Server::Control,
        method,
        path: path.into(),
        authorization,
        body,
        wire: None,
        content_type,
        status,
        code,
    }
}

fn target(
    name: &'static str,
    method: &'static str,
    path: impl Into<String>,
    body: Body,
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
        wire: None,
        content_type,
        status,
        code,
    }
}

fn wire(mut row: Row, wire: Wire) -> Row {
    row.wire = Some(wire);
    row
}

fn bearer(token: &str) -> Option<String> {
    Some(format!("Bearer {token}"))
}

fn raw(text: &str) -> Body {
    Body::Raw(text.as_bytes().to_vec())
}

/// `body` with `field` set to `value`.
fn with(mut body: Value, field: &str, value: Value) -> Value {
    body[field] = value;
    body
}

/// `body` without `field`.
fn without(mut body: Value, field: &str) -> Value {
    if let Some(object) = body.as_object_mut() {
        object.remove(field);
    }
    body
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

/// A capability's fields as a JSON array, in order.
fn capability_array(capability: &Value) -> Value {
    let fields = ["deployment_key", "job", "attempt", "runner", "fence", "expires_ms", "signature"];
    Value::Array(fields.iter().map(|field| capability[*field].clone()).collect())
}

/// The table: one request a line, kept unformatted so that it reads as a table. Every row
/// but `reconcile-running-attempt` (there when the fixture holds a running attempt).
#[rustfmt::skip]
pub fn rows(fx: &Fixture) -> Vec<Row> {
    let op = || bearer(&fx.operator);
    let r1 = || bearer(&fx.r1.token);
    let r2 = || bearer(&fx.r2.token);
    let o1 = || bearer(&fx.o1.token);
    let reg = || bearer(&fx.other_registration);
    let (r1_id, r2_id, o1_id) = (fx.r1.id.as_str(), fx.r2.id.as_str(), fx.o1.id.as_str());
    let (project, other, fresh) = (fx.project.as_str(), fx.other.as_str(), fx.fresh.as_str());
    let new = |id: &str| format!("{fresh}{id}");
    let heartbeat = claim_body(&fx.report);
    let result = with(claim_body(&fx.report), "outcome", json!("succeeded"));
    let job = json!({"project": project, "id": new("j9"), "deployment_key": new("k9"), "spec": {"steps": 1, "step_ms": 1}});
    let spec = |steps: Value, step_ms: Value| with(job.clone(), "spec", json!({"steps": steps, "step_ms": step_ms}));
    let (ju, done, known) = (&fx.uncertain, &fx.done, fx.report.job.as_str());
    let reconcile = |job: &str, attempt: &str, finding: &str| json!({"job": job, "attempt": attempt, "finding": finding});
    let step = json!({"capability": fx.capability, "step": 0, "steps": 3, "duration_ms": 0});
    let oversized = format!("{{\"id\": \"{}\"}}", "a".repeat(70 * 1024));
    let beyond_u64 = format!(r#"{{"job": "{}", "attempt": "{}", "runner": "{}", "fence": 18446744073709551616, "observed_ms": 0}}"#, fx.report.job, fx.report.attempt, fx.report.runner);
    let fence = fx.report.fence;
    let claim = json!({"runner": r1_id, "observed_ms": 0});
    use Body::{Empty, Json as J};
    let mut rows = vec![
        // Bodies that are not the JSON object the endpoint takes.
        control("malformed-json", "POST", "/v1/jobs", op(), raw("{project: in}"), JSON, 400, "malformed_json"),
        control("truncated-json", "POST", "/v1/jobs", op(), raw(r#"{"project": "in", "id": "in.j9", "spec": {"steps": 1,"#), JSON, 400, "malformed_json"),
        control("empty-body", "POST", "/v1/jobs", op(), Empty, JSON, 400, "malformed_json"),
        control("trailing-garbage", "POST", "/v1/projects", op(), raw(r#"{"id": "in.p9"} {"id": "in.p10"}"#), JSON, 400, "malformed_json"),
        control("invalid-utf8", "POST", "/v1/projects", op(), Body::Raw(b"{\"id\": \"p\xff\"}".to_vec()), JSON, 400, "malformed_json"),
        control("type-error-before-syntax-error", "POST", "/v1/jobs", op(), raw(r#"{"project": 5, "id": "in.j9""#), JSON, 400, "malformed_json"),
        control("number-with-plus-sign", "POST", "/v1/heartbeat", r1(), raw(&heartbeat.to_string().replace(&format!(":{fence}"), &format!(":+{fence}"))), JSON, 400, "malformed_json"),
        control("number-with-leading-zero", "POST", "/v1/heartbeat", r1(), raw(&heartbeat.to_string().replace(&format!(":{fence}"), &format!(":0{fence}"))), JSON, 400, "malformed_json"),
        control("array-for-project", "POST", "/v1/projects", op(), J(json!([new("p9")])), JSON, 400, "invalid_body"),
        control("array-for-claim", "POST", "/v1/claim", r1(), J(json!([r1_id, 0])), JSON, 400, "invalid_body"),
        control("array-for-heartbeat", "POST", "/v1/heartbeat", r1(), J(claim_array(&fx.report, &[])), JSON, 400, "invalid_body"),
        control("array-for-capability", "POST", "/v1/capability", r1(), J(claim_array(&fx.report, &[])), JSON, 400, "invalid_body"),
        control("array-for-result", "POST", "/v1/result", r1(), J(claim_array(&fx.report, &[json!("succeeded")])), JSON, 400, "invalid_body"),
        control("array-for-spec", "POST", "/v1/jobs", op(), J(with(job.clone(), "spec", json!([1, 1]))), JSON, 400, "invalid_body"),
        control("array-of-jobs", "POST", "/v1/jobs", op(), J(json!([job])), JSON, 400, "invalid_body"),
        control("string-for-object", "POST", "/v1/projects", op(), J(json!(new("p9"))), JSON, 400, "invalid_body"),
        control("number-for-object", "POST", "/v1/runners", op(), J(json!(7)), JSON, 400, "invalid_body"),
        control("unknown-field", "POST", "/v1/projects", op(), J(json!({"id": new("p9"), "colour": "red"})), JSON, 400, "invalid_body"),
        control("unknown-field-in-report", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "extra", json!(1))), JSON, 400, "invalid_body"),
        control("unknown-field-in-spec", "POST", "/v1/jobs", op(), J(with(job.clone(), "spec", json!({"steps": 1, "step_ms": 1, "retries": 2}))), JSON, 400, "invalid_body"),
        control("duplicate-field", "POST", "/v1/projects", op(), raw(r#"{"id": "in.p9", "id": "in.p10"}"#), JSON, 400, "invalid_body"),
        control("string-fence", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "fence", json!(fence.to_string()))), JSON, 400, "invalid_body"),
        control("negative-fence", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "fence", json!(-1))), JSON, 400, "invalid_body"),
        control("fractional-fence", "POST", "/v1/capability", r1(), J(with(heartbeat.clone(), "fence", json!(1.5))), JSON, 400, "invalid_body"),
        control("huge-fence", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "fence", json!(u64::MAX))), JSON, 400, "invalid_field"),
        control("huge-fence-on-result", "POST", "/v1/result", r1(), J(with(result.clone(), "fence", json!(1u64 << 63))), JSON, 400, "invalid_field"),
        control("huge-fence-on-capability", "POST", "/v1/capability", r1(), J(with(heartbeat.clone(), "fence", json!(u64::MAX))), JSON, 400, "invalid_field"),
        control("fence-beyond-u64", "POST", "/v1/heartbeat", r1(), raw(&beyond_u64), JSON, 400, "invalid_body"),
        control("observed-ms-beyond-i64", "POST", "/v1/claim", r1(), raw(&format!(r#"{{"runner": "{r1_id}", "observed_ms": 9223372036854775808}}"#)), JSON, 400, "invalid_body"),
        control("string-observed-ms", "POST", "/v1/claim", r1(), J(json!({"runner": r1_id, "observed_ms": "now"})), JSON, 400, "invalid_body"),
        control("float-steps", "POST", "/v1/jobs", op(), J(spec(json!(1.5), json!(1))), JSON, 400, "invalid_body"),
        control("negative-step-ms", "POST", "/v1/jobs", op(), J(spec(json!(1), json!(-5))), JSON, 400, "invalid_body"),
        control("null-runner", "POST", "/v1/claim", r1(), J(json!({"runner": null, "observed_ms": 0})), JSON, 400, "invalid_body"),
        control("missing-deployment-key", "POST", "/v1/jobs", op(), J(without(job.clone(), "deployment_key")), JSON, 400, "invalid_body"),
        control("missing-fence", "POST", "/v1/heartbeat", r1(), J(without(heartbeat.clone(), "fence")), JSON, 400, "invalid_body"),
        control("missing-observed-ms", "POST", "/v1/claim", r1(), J(json!({"runner": r1_id})), JSON, 400, "invalid_body"),
        control("missing-outcome", "POST", "/v1/result", r1(), J(without(result.clone(), "outcome")), JSON, 400, "invalid_body"),
        control("unknown-outcome", "POST", "/v1/result", r1(), J(with(result.clone(), "outcome", json!("maybe"))), JSON, 400, "invalid_body"),
        control("wrong-content-type", "POST", "/v1/projects", op(), J(json!({"id": new("p9")})), Some("text/plain"), 415, "unsupported_media_type"),
        control("form-content-type", "POST", "/v1/result", r1(), J(result.clone()), Some("application/x-www-form-urlencoded"), 415, "unsupported_media_type"),
        control("no-content-type", "POST", "/v1/claim", r1(), J(claim.clone()), None, 415, "unsupported_media_type"),
        control("json-suffix-content-type", "POST", "/v1/jobs", op(), J(job.clone()), Some("application/problem+json"), 415, "unsupported_media_type"),
        control("longer-subtype-content-type", "POST", "/v1/jobs", op(), J(job.clone()), Some("application/jsonp"), 415, "unsupported_media_type"),
        control("text-json-content-type", "POST", "/v1/claim", r1(), J(claim.clone()), Some("text/json"), 415, "unsupported_media_type"),
        control("oversize-body", "POST", "/v1/projects", op(), Body::Raw(oversized.clone().into_bytes()), JSON, 413, "body_too_large"),
        wire(control("oversize-chunked-body", "POST", "/v1/jobs", op(), Empty, JSON, 413, "body_too_large"), Wire::Chunked(70 * 1024)),
        wire(control("body-cut-short", "POST", "/v1/result", r1(), Empty, JSON, 413, "body_too_large"), Wire::Truncated { declared: 400, sent: br#"{"job": "in.j1", "attempt""#.to_vec() }),
        // Who is asking.
        control("missing-auth", "POST", "/v1/jobs", None, J(job.clone()), JSON, 401, "unauthorized"),
        control("missing-auth-on-jobs", "GET", "/v1/jobs", None, Empty, None, 401, "unauthorized"),
        control("missing-auth-on-job", "GET", format!("/v1/jobs/{known}"), None, Empty, None, 401, "unauthorized"),
        control("missing-auth-on-ledger", "GET", "/v1/ledger", None, Empty, None, 401, "unauthorized"),
        control("missing-auth-on-claim", "POST", "/v1/claim", None, J(claim.clone()), JSON, 401, "unauthorized"),
        control("basic-scheme", "POST", "/v1/jobs", Some(format!("Basic {}", fx.operator)), J(job.clone()), JSON, 401, "unauthorized"),
        control("empty-bearer", "POST", "/v1/jobs", Some("Bearer ".into()), J(job.clone()), JSON, 401, "unauthorized"),
        control("lower-case-bearer", "POST", "/v1/jobs", Some(format!("bearer {}", fx.operator)), J(job.clone()), JSON, 401, "unauthorized"),
        control("two-spaces-after-bearer", "POST", "/v1/jobs", Some(format!("Bearer  {}", fx.operator)), J(job.clone()), JSON, 401, "unauthorized"),
        control("tab-after-bearer", "POST", "/v1/claim", Some(format!("Bearer\t{}", fx.r1.token)), J(claim.clone()), JSON, 401, "unauthorized"),
        control("wrong-token", "POST", "/v1/jobs", bearer("not-a-token"), J(job.clone()), JSON, 401, "unauthorized"),
        control("wrong-token-on-heartbeat", "POST", "/v1/heartbeat", bearer(&"0".repeat(48)), J(heartbeat.clone()), JSON, 401, "unauthorized"),
        control("runner-submits", "POST", "/v1/jobs", r1(), J(job.clone()), JSON, 403, "forbidden"),
        control("runner-creates-project", "POST", "/v1/projects", r1(), J(json!({"id": new("p9")})), JSON, 403, "forbidden"),
        control("runner-registers", "POST", "/v1/runners", r1(), J(json!({"project": project, "id": new("r9")})), JSON, 403, "forbidden"),
        control("runner-lists-jobs", "GET", "/v1/jobs", r1(), Empty, None, 403, "forbidden"),
        control("runner-reads-job", "GET", format!("/v1/jobs/{known}"), r1(), Empty, None, 403, "forbidden"),
        control("runner-reads-ledger", "GET", "/v1/ledger", r1(), Empty, None, 403, "forbidden"),
        control("runner-reconciles", "POST", "/v1/reconcile", r1(), J(reconcile(&ju.job, &ju.attempt, "stopped")), JSON, 403, "forbidden"),
        control("registration-submits", "POST", "/v1/jobs", reg(), J(job.clone()), JSON, 403, "forbidden"),
        control("registration-into-other-project", "POST", "/v1/runners", reg(), J(json!({"project": project, "id": new("r9")})), JSON, 403, "forbidden"),
        control("registration-claims", "POST", "/v1/claim", reg(), J(json!({"runner": o1_id, "observed_ms": 0})), JSON, 403, "forbidden"),
        control("operator-claims", "POST", "/v1/claim", op(), J(claim.clone()), JSON, 403, "forbidden"),
        control("operator-heartbeats", "POST", "/v1/heartbeat", op(), J(heartbeat.clone()), JSON, 403, "forbidden"),
        control("operator-redeems", "POST", "/v1/capability", op(), J(heartbeat.clone()), JSON, 403, "forbidden"),
        control("operator-reports", "POST", "/v1/result", op(), J(result.clone()), JSON, 403, "forbidden"),
        control("claim-as-other-runner", "POST", "/v1/claim", r1(), J(json!({"runner": r2_id, "observed_ms": 0})), JSON, 403, "runner_mismatch"),
        control("heartbeat-as-other-runner", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "runner", json!(r2_id))), JSON, 403, "runner_mismatch"),
        control("result-as-other-runner", "POST", "/v1/result", r2(), J(result.clone()), JSON, 403, "runner_mismatch"),
        control("other-project-heartbeat", "POST", "/v1/heartbeat", o1(), J(with(heartbeat.clone(), "runner", json!(o1_id))), JSON, 404, "unknown_job"),
        control("other-project-capability", "POST", "/v1/capability", o1(), J(with(heartbeat.clone(), "runner", json!(o1_id))), JSON, 404, "unknown_job"),
        control("other-project-result", "POST", "/v1/result", o1(), J(with(result.clone(), "runner", json!(o1_id))), JSON, 404, "unknown_job"),
        control("heartbeat-unknown-job", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "job", json!(new("nope")))), JSON, 404, "unknown_job"),
        control("result-bad-job-id", "POST", "/v1/result", r1(), J(with(result.clone(), "job", json!("no such job/..%"))), JSON, 404, "unknown_job"),
        // Two rules broken at once: the first check in the documented order answers.
        control("ledger-query-before-token", "GET", "/v1/ledger?after=abc", None, Empty, None, 400, "invalid_query"),
        control("job-path-before-token", "GET", "/v1/jobs/%FF", None, Empty, None, 400, "invalid_path"),
        control("wrong-token-before-bad-body", "POST", "/v1/jobs", bearer("not-a-token"), raw("{"), JSON, 401, "unauthorized"),
        control("wrong-token-before-content-type", "POST", "/v1/heartbeat", bearer("not-a-token"), J(heartbeat.clone()), Some("text/plain"), 401, "unauthorized"),
        control("content-type-before-bad-body", "POST", "/v1/heartbeat", r1(), raw("{"), Some("text/plain"), 415, "unsupported_media_type"),
        control("content-type-before-size", "POST", "/v1/projects", op(), Body::Raw(oversized.clone().into_bytes()), Some("text/plain"), 415, "unsupported_media_type"),
        control("size-before-bad-body", "POST", "/v1/heartbeat", r1(), Body::Raw(format!("{{{oversized}").into_bytes()), JSON, 413, "body_too_large"),
        control("bad-body-before-token-kind", "POST", "/v1/jobs", r1(), raw("{"), JSON, 400, "malformed_json"),
        control("runner-id-before-token-kind", "POST", "/v1/runners", r1(), J(json!({"project": project, "id": new("r 9")})), JSON, 400, "invalid_field"),
        control("token-kind-before-fence-domain", "POST", "/v1/capability", op(), J(with(heartbeat.clone(), "fence", json!(u64::MAX))), JSON, 403, "forbidden"),
        control("runner-before-fence-domain", "POST", "/v1/heartbeat", r1(), J(with(with(heartbeat.clone(), "runner", json!(r2_id)), "fence", json!(u64::MAX))), JSON, 403, "runner_mismatch"),
        control("fence-domain-before-job", "POST", "/v1/result", r1(), J(with(with(result.clone(), "job", json!(new("nope"))), "fence", json!(u64::MAX))), JSON, 400, "invalid_field"),
        control("runner-before-job", "POST", "/v1/heartbeat", o1(), J(heartbeat.clone()), JSON, 403, "runner_mismatch"),
        // Registration and submission.
        control("runner-unknown-project", "POST", "/v1/runners", op(), J(json!({"project": new("nope"), "id": new("r9")})), JSON, 404, "unknown_project"),
        control("operator-registers-without-project", "POST", "/v1/runners", op(), J(json!({"id": new("r9")})), JSON, 400, "missing_field"),
        control("duplicate-project", "POST", "/v1/projects", op(), J(json!({"id": other})), JSON, 409, "exists"),
        control("duplicate-runner", "POST", "/v1/runners", op(), J(json!({"project": project, "id": r1_id})), JSON, 409, "exists"),
        control("runner-id-of-other-project", "POST", "/v1/runners", op(), J(json!({"project": project, "id": o1_id})), JSON, 409, "exists"),
        control("duplicate-job", "POST", "/v1/jobs", op(), J(with(job.clone(), "id", json!(known))), JSON, 409, "exists"),
        control("job-id-of-other-project", "POST", "/v1/jobs", op(), J(with(job.clone(), "id", json!(fx.other_job))), JSON, 409, "exists"),
        control("job-unknown-project", "POST", "/v1/jobs", op(), J(with(job.clone(), "project", json!(new("nope")))), JSON, 404, "unknown_project"),
        control("empty-project-id", "POST", "/v1/projects", op(), J(json!({"id": ""})), JSON, 400, "invalid_field"),
        control("long-project-id", "POST", "/v1/projects", op(), J(json!({"id": "p".repeat(129)})), JSON, 400, "invalid_field"),
        control("runner-id-with-space", "POST", "/v1/runners", op(), J(json!({"project": project, "id": new("r 9")})), JSON, 400, "invalid_field"),
        control("job-id-with-slash", "POST", "/v1/jobs", op(), J(with(job.clone(), "id", json!(new("j/9")))), JSON, 400, "invalid_field"),
        control("empty-job-id", "POST", "/v1/jobs", op(), J(with(job.clone(), "id", json!(""))), JSON, 400, "invalid_field"),
        control("non-ascii-key", "POST", "/v1/jobs", op(), J(with(job.clone(), "deployment_key", json!(new("kä")))), JSON, 400, "invalid_field"),
        control("zero-steps", "POST", "/v1/jobs", op(), J(spec(json!(0), json!(1))), JSON, 400, "invalid_field"),
        control("too-many-steps", "POST", "/v1/jobs", op(), J(spec(json!(1001), json!(1))), JSON, 400, "invalid_field"),
        control("too-long-step", "POST", "/v1/jobs", op(), J(spec(json!(1), json!(600_001))), JSON, 400, "invalid_field"),
        // Reconcile.
        control("reconcile-unknown-job", "POST", "/v1/reconcile", op(), J(reconcile(&new("nope"), &ju.attempt, "stopped")), JSON, 404, "unknown_job"),
        control("reconcile-unknown-attempt", "POST", "/v1/reconcile", op(), J(reconcile(&ju.job, &format!("{}-a9", ju.job), "stopped")), JSON, 404, "unknown_attempt"),
        control("reconcile-other-jobs-attempt", "POST", "/v1/reconcile", op(), J(reconcile(&done.job, &ju.attempt, "stopped")), JSON, 404, "unknown_attempt"),
        control("reconcile-committed-attempt", "POST", "/v1/reconcile", op(), J(with(reconcile(&done.job, &done.attempt, "completed"), "outcome", json!("failed"))), JSON, 409, "not_uncertain"),
        control("reconcile-completed-without-outcome", "POST", "/v1/reconcile", op(), J(reconcile(&ju.job, &ju.attempt, "completed")), JSON, 400, "missing_field"),
        control("reconcile-stopped-with-outcome", "POST", "/v1/reconcile", op(), J(with(reconcile(&ju.job, &ju.attempt, "stopped"), "outcome", json!("failed"))), JSON, 400, "invalid_field"),
        control("reconcile-still-running-with-outcome", "POST", "/v1/reconcile", op(), J(with(reconcile(&ju.job, &ju.attempt, "still-running"), "outcome", json!("succeeded"))), JSON, 400, "invalid_field"),
        control("reconcile-unknown-finding", "POST", "/v1/reconcile", op(), J(reconcile(&ju.job, &ju.attempt, "vanished")), JSON, 400, "invalid_body"),
        // Routes, methods, paths and queries.
        control("unknown-job", "GET", format!("/v1/jobs/{}", new("nope")), op(), Empty, None, 404, "unknown_job"),
        control("job-path-not-utf8", "GET", "/v1/jobs/%FF", op(), Empty, None, 400, "invalid_path"),
        control("unknown-route", "GET", "/v1/nope", op(), Empty, None, 404, "no_route"),
        control("unknown-version", "POST", "/v2/jobs", op(), J(job.clone()), JSON, 404, "no_route"),
        control("path-below-job", "GET", format!("/v1/jobs/{known}/attempts"), op(), Empty, None, 404, "no_route"),
        control("delete-jobs", "DELETE", "/v1/jobs", op(), Empty, None, 405, "method_not_allowed"),
        control("get-claim", "GET", "/v1/claim", r1(), Empty, None, 405, "method_not_allowed"),
        control("put-job", "PUT", format!("/v1/jobs/{known}"), op(), J(job.clone()), JSON, 405, "method_not_allowed"),
        control("post-health", "POST", "/v1/health", None, J(json!({})), JSON, 405, "method_not_allowed"),
        control("ledger-after-not-number", "GET", "/v1/ledger?after=abc", op(), Empty, None, 400, "invalid_query"),
        control("ledger-negative-limit", "GET", "/v1/ledger?limit=-1", op(), Empty, None, 400, "invalid_query"),
        control("ledger-empty-limit", "GET", "/v1/ledger?limit=", op(), Empty, None, 400, "invalid_query"),
        control("ledger-limit-beyond-u64", "GET", "/v1/ledger?limit=18446744073709551616", op(), Empty, None, 400, "invalid_query"),
        control("ledger-limit-plus-sign", "GET", "/v1/ledger?limit=%2B1", op(), Empty, None, 400, "invalid_query"),
        control("ledger-after-plus-sign", "GET", "/v1/ledger?after=%2B1", op(), Empty, None, 400, "invalid_query"),
        control("ledger-after-beyond-u64", "GET", "/v1/ledger?after=18446744073709551616", op(), Empty, None, 400, "invalid_query"),
        control("ledger-after-twice", "GET", "/v1/ledger?after=1&after=2", op(), Empty, None, 400, "invalid_query"),
        control("ledger-unknown-parameter", "GET", format!("/v1/ledger?job={known}"), op(), Empty, None, 400, "invalid_query"),
        // The target.
        target("target-malformed-json", "POST", "/v1/steps", raw(r#"{"capability": "#), JSON, 400, "malformed_json"),
        target("target-step-equal-to-steps", "POST", "/v1/steps", J(with(step.clone(), "step", json!(3))), JSON, 400, "invalid_field"),
        target("target-step-beyond-steps", "POST", "/v1/steps", J(with(step.clone(), "step", json!(7))), JSON, 400, "invalid_field"),
        target("target-zero-steps", "POST", "/v1/steps", J(with(with(step.clone(), "steps", json!(0)), "step", json!(0))), JSON, 400, "invalid_field"),
        target("target-step-too-long", "POST", "/v1/steps", J(with(step.clone(), "duration_ms", json!(600_001))), JSON, 400, "invalid_field"),
        target("target-missing-capability", "POST", "/v1/steps", J(without(step.clone(), "capability")), JSON, 400, "invalid_body"),
        target("target-unknown-capability-field", "POST", "/v1/steps", J(with(step.clone(), "capability", with(fx.capability.clone(), "scope", json!("all")))), JSON, 400, "invalid_body"),
        target("target-negative-fence", "POST", "/v1/steps", J(with(step.clone(), "capability", with(fx.capability.clone(), "fence", json!(-1)))), JSON, 400, "invalid_body"),
        target("target-fence-beyond-i64", "POST", "/v1/steps", J(with(step.clone(), "capability", with(fx.capability.clone(), "fence", json!(1u64 << 63)))), JSON, 400, "invalid_field"),
        target("target-array-for-object", "POST", "/v1/steps", J(json!([fx.capability, 0, 3, 0])), JSON, 400, "invalid_body"),
        target("target-array-for-capability", "POST", "/v1/steps", J(with(step.clone(), "capability", capability_array(&fx.capability))), JSON, 400, "invalid_body"),
        target("target-wrong-content-type", "POST", "/v1/steps", J(step.clone()), Some("text/plain"), 415, "unsupported_media_type"),
        target("target-oversize-body", "POST", "/v1/steps", Body::Raw(oversized.into_bytes()), JSON, 413, "body_too_large"),
        target("target-unknown-route", "GET", "/v1/nope", Empty, None, 404, "no_route"),
        target("target-put-steps", "PUT", "/v1/steps", J(step.clone()), JSON, 405, "method_not_allowed"),
        target("target-unknown-deployment", "GET", format!("/v1/deployments/{}", new("nope")), Empty, None, 404, "unknown_deployment"),
        target("target-deployment-path-not-utf8", "GET", "/v1/deployments/%FF", Empty, None, 400, "invalid_path"),
        target("target-steps-after-not-number", "GET", "/v1/steps?after=abc", Empty, None, 400, "invalid_query"),
        target("target-steps-after-plus-sign", "GET", "/v1/steps?after=%2B1", Empty, None, 400, "invalid_query"),
        target("target-steps-unknown-parameter", "GET", "/v1/steps?foo=1", Empty, None, 400, "invalid_query"),
        target("target-steps-negative-limit", "GET", "/v1/steps?limit=-3", Empty, None, 400, "invalid_query"),
    ];
    if let Some(running) = &fx.running {
        rows.push(control("reconcile-running-attempt", "POST", "/v1/reconcile", op(), J(reconcile(&running.job, &running.attempt, "stopped")), JSON, 409, "not_uncertain"));
    }
    rows
}

/// What is wrong with an answer to a request that must be refused with `status` and `code`:
/// nothing, or one line per problem. The contract's error answer is never a 5xx, is JSON,
/// and its body is exactly `{"error": a sentence, "code", "status"}` with `status` the HTTP
/// status; a 405 carries `Allow`.
pub fn error_problems(status: u16, code: &str, answer: &Answered) -> Vec<String> {
    let mut problems = Vec::new();
    if answer.status >= 500 {
        problems.push(format!("server error {} (a request a client can build is never a 5xx)", answer.status));
    } else if answer.status != status {
        problems.push(format!("status {}, not {status}", answer.status));
    }
    if !answer.content_type.starts_with("application/json") {
        problems.push(format!("content type `{}`, not application/json", answer.content_type));
    }
    let Some(body) = answer.json() else {
        problems.push(format!("body is not JSON: {:?}", answer.text()));
        return problems;
    };
    let keys: Vec<&String> = body.as_object().map(|object| object.keys().collect()).unwrap_or_default();
    if keys.len() != 3 || body["error"].as_str().is_none_or(|error| error.trim().is_empty()) {
        problems.push(format!("body is not {{\"error\": a sentence, \"code\", \"status\"}}: {body}"));
    }
    if body["code"] != code {
        problems.push(format!("code {}, not \"{code}\"", body["code"]));
    }
    if body["status"] != answer.status {
        problems.push(format!("body status {} differs from the HTTP status {}", body["status"], answer.status));
    }
    if answer.status == 405 && answer.allow.as_deref().is_none_or(str::is_empty) {
        problems.push("a 405 without an `Allow` header".to_string());
    }
    problems
}

/// An HTTP answer as the judging needs it.
#[derive(Clone, Debug, Default)]
pub struct Answered {
    pub status: u16,
    pub content_type: String,
    pub allow: Option<String>,
    pub bytes: Vec<u8>,
}

impl Answered {
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.bytes).ok()
    }

    /// The body as text, its first 300 characters.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).chars().take(300).collect()
    }
}

impl Row {
    /// The request bytes of a row with a [`Wire`] for `host` (`HOST:PORT`), and whether the
    /// write half is closed after them. None for a row an HTTP client sends.
    pub fn raw_request(&self, host: &str) -> Option<(Vec<u8>, bool)> {
        let wire = self.wire.as_ref()?;
        let mut head = format!("{} {} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n", self.method, self.path);
        if let Some(authorization) = &self.authorization {
            head.push_str(&format!("Authorization: {authorization}\r\n"));
        }
        if let Some(content_type) = self.content_type {
            head.push_str(&format!("Content-Type: {content_type}\r\n"));
        }
        Some(match wire {
            Wire::Truncated { declared, sent } => {
                head.push_str(&format!("Content-Length: {declared}\r\n\r\n"));
                let mut bytes = head.into_bytes();
                bytes.extend_from_slice(sent);
                (bytes, true)
            }
            Wire::Chunked(size) => {
                head.push_str("Transfer-Encoding: chunked\r\n\r\n");
                let mut bytes = head.into_bytes();
                let chunk = vec![b' '; 8 * 1024];
                let mut left = *size;
                bytes.extend_from_slice(b"1\r\n{\r\n");
                while left > 0 {
                    let take = left.min(chunk.len());
                    bytes.extend_from_slice(format!("{take:x}\r\n").as_bytes());
                    bytes.extend_from_slice(&chunk[..take]);
                    bytes.extend_from_slice(b"\r\n");
                    left -= take;
                }
                bytes.extend_from_slice(b"1\r\n}\r\n0\r\n\r\n");
                (bytes, false)
            }
        })
    }
}

/// Why a raw exchange has no answer to judge.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The connection could not be made, written or read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The host resolves to no address.
    #[error("{0} names no address")]
    NoAddress(String),
    /// What was read is not an HTTP/1.1 answer.
    #[error("{0}")]
    Answer(&'static str),
}

/// Writes `bytes` on a fresh TCP connection to `host` (`HOST:PORT`), closing the write half
/// when `half_close`, and reads the whole answer; every step within `timeout`. Blocking.
pub fn exchange(host: &str, bytes: &[u8], half_close: bool, timeout: Duration) -> Result<Answered, ExchangeError> {
    let address = std::net::ToSocketAddrs::to_socket_addrs(host)?
        .next()
        .ok_or_else(|| ExchangeError::NoAddress(host.to_string()))?;
    let mut stream = std::net::TcpStream::connect_timeout(&address, timeout)?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(bytes)?;
    if half_close {
        stream.shutdown(std::net::Shutdown::Write)?;
    }
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    parse_answer(&answer)
}

/// An HTTP/1.1 answer: status line, headers, body (by length or chunked).
fn parse_answer(bytes: &[u8]) -> Result<Answered, ExchangeError> {
    let end = bytes
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .ok_or(ExchangeError::Answer("no complete answer head"))?;
    let head = String::from_utf8_lossy(&bytes[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or(ExchangeError::Answer("no status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let header = |name: &str| headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone());
    let mut body = bytes[end + 4..].to_vec();
    if header("transfer-encoding").is_some_and(|value| value.contains("chunked")) {
        body = dechunk(&body);
    }
    Ok(Answered {
        status,
        content_type: header("content-type").unwrap_or_default(),
        allow: header("allow"),
        bytes: body,
    })
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = rest.windows(2).position(|window| window == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..line_end]).trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < line_end + 2 + size {
            break;
        }
        out.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
        rest = &rest[(line_end + 4 + size).min(rest.len())..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_distinct_names_and_a_row_on_every_endpoint() {
        let table = rows(&Fixture::placeholder());
        assert!(table.len() >= 150, "{} rows", table.len());
        let names: std::collections::BTreeSet<&str> = table.iter().map(|row| row.name).collect();
        assert_eq!(names.len(), table.len(), "row names are distinct");
        let endpoints: std::collections::BTreeSet<String> = table
            .iter()
            .map(|row| format!("{:?} {}", row.server, row.path.split(['?']).next().unwrap_or("")))
            .collect();
        for endpoint in [
            "Control /v1/projects",
            "Control /v1/runners",
            "Control /v1/jobs",
            "Control /v1/claim",
            "Control /v1/heartbeat",
            "Control /v1/capability",
            "Control /v1/result",
            "Control /v1/reconcile",
            "Control /v1/ledger",
            "Control /v1/health",
            "Target /v1/steps",
        ] {
            assert!(endpoints.contains(endpoint), "no row for {endpoint}: {endpoints:?}");
        }
    }

    #[test]
    fn a_fixture_without_a_running_attempt_has_every_row_but_its_reconcile() {
        let full = rows(&Fixture::placeholder());
        let fixture = Fixture { running: None, ..Fixture::placeholder() };
        let names: Vec<&str> = rows(&fixture).iter().map(|row| row.name).collect();
        assert_eq!(names.len(), full.len() - 1);
        assert!(!names.contains(&"reconcile-running-attempt"));
    }

    #[test]
    fn an_error_answer_is_judged_on_status_type_body_and_allow() {
        let answer = |status: u16, body: &str, allow: Option<&str>| Answered {
            status,
            content_type: "application/json".into(),
            allow: allow.map(str::to_string),
            bytes: body.as_bytes().to_vec(),
        };
        let good = r#"{"error": "no", "code": "no_route", "status": 404}"#;
        assert!(error_problems(404, "no_route", &answer(404, good, None)).is_empty());
        assert_eq!(
            error_problems(404, "no_route", &answer(500, good, None)).len(),
            2,
            "a 5xx, and a body status that differs"
        );
        assert_eq!(error_problems(404, "unknown_job", &answer(404, good, None)).len(), 1);
        let extra = r#"{"error": "no", "code": "no_route", "status": 404, "more": 1}"#;
        assert_eq!(error_problems(404, "no_route", &answer(404, extra, None)).len(), 1);
        let not_allowed = r#"{"error": "no", "code": "method_not_allowed", "status": 405}"#;
        assert_eq!(error_problems(405, "method_not_allowed", &answer(405, not_allowed, None)).len(), 1);
        assert!(error_problems(405, "method_not_allowed", &answer(405, not_allowed, Some("GET"))).is_empty());
    }

    #[test]
    fn a_chunked_answer_is_read_whole() {
        let bytes = b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n5\r\n\": 1}\r\n0\r\n\r\n";
        let answer = parse_answer(bytes).unwrap();
        assert_eq!(
            (answer.status, answer.content_type.as_str(), answer.bytes.as_slice()),
            (413, "application/json", &b"{\"a\": 1}"[..])
        );
    }
}
