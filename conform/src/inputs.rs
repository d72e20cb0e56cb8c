//! Bad input against every endpoint: a table of malformed, unauthorised, out-of-domain and
//! unknown-id requests, each answered with its documented 4xx and the error body
//! `{"error", "code", "status"}`. After every row every read endpoint (the jobs, each job,
//! the ledger, the target's steps) is read again and compared with the state before the
//! table, and the server must still answer health: an error changes nothing and is never a
//! 5xx. Most rows go through reqwest; a body cut short and an oversized chunked body are
//! written on a raw TCP connection.
//!
//! The table runs alone, before any other case, on a settled fixture: no lease is running,
//! so nothing but a wrongly taken request could change what the reads show.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use history::Decision;
use protocol::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::case::{CaseResult, Finding, Status};
use super::session::{now_ms, tries, Answer, Payload, Request, Runner, Session, Try, REQUEST_MAX};
use system::Feature;

/// The fixture's projects: `in` (runners `in.r1`, `in.r2`) and `in.other` (`in.other.r1`).
const PROJECT: &str = "in";
const OTHER: &str = "in.other";
const JSON: Option<&str> = Some("application/json");
/// The most a row (its request, the health check and the reads after it) may take.
const ROW_MAX: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    Control,
    Target,
}

/// How a body goes on the wire when reqwest cannot send it.
enum Wire {
    /// `Content-Length: declared`, then only `sent`, then the write half closed.
    Truncated { declared: usize, sent: Vec<u8> },
    /// `Transfer-Encoding: chunked` with a body of this many bytes in 8 KiB chunks.
    Chunked(usize),
}

/// One request of the table and the answer it must get.
struct Row {
    name: &'static str,
    server: Server,
    method: &'static str,
    path: String,
    authorization: Option<String>,
    body: Payload,
    wire: Option<Wire>,
    content_type: Option<&'static str>,
    status: u16,
    code: &'static str,
}

impl Row {
    /// The optional part of the contract the row's endpoint is.
    fn needs(&self) -> Option<Feature> {
        match self.server {
            Server::Target => Some(Feature::Target),
            Server::Control if self.path.starts_with("/v1/ledger") => Some(Feature::Ledger),
            Server::Control if self.path.starts_with("/v1/reconcile") => Some(Feature::Reconcile),
            Server::Control if self.path.starts_with("/v1/capability") => Some(Feature::Capabilities),
            Server::Control => None,
        }
    }
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

fn raw(text: &str) -> Payload {
    Payload::Raw(text.as_bytes().to_vec())
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

/// What the table needs of the state built before it.
struct Fixture {
    operator: String,
    r1: Runner,
    r2: Runner,
    o1: Runner,
    other_registration: String,
    /// `in.j1-a1` of `in.r1`, its lease lapsed.
    lapsed: ClaimRef,
    /// `in.ju-a1`, uncertain.
    uncertain: ClaimRef,
    /// A job whose attempt committed a success.
    done: ClaimRef,
    /// A capability-shaped body for `lapsed` (its signature is not the control plane's).
    capability: Value,
}

fn claim_body(claim: &ClaimRef) -> Value {
    json!({"job": claim.job, "attempt": claim.attempt, "runner": claim.runner, "fence": claim.fence, "observed_ms": 0})
}

impl Fixture {
    /// A fixture of names only, no system behind it: enough to count the table's rows.
    fn placeholder() -> Fixture {
        let runner = |id: &str| Runner {
            id: id.to_string(),
            project: PROJECT.to_string(),
            token: format!("{id}-token"),
            client: Client::new("http://127.0.0.1:9", None, std::time::Duration::from_secs(1)),
        };
        let claim = |job: &str| ClaimRef {
            job: job.to_string(),
            attempt: format!("{job}-a1"),
            runner: "in.r1".to_string(),
            fence: 1,
        };
        Fixture {
            operator: "operator".into(),
            r1: runner("in.r1"),
            r2: runner("in.r2"),
            o1: runner("in.o1"),
            other_registration: "registration".into(),
            lapsed: claim("in.j1"),
            uncertain: claim("in.ju"),
            done: claim("in.jd"),
            capability: json!({}),
        }
    }
}

/// The rows of the bad-input table: each one case.
pub fn row_count() -> usize {
    rows(&Fixture::placeholder()).len()
}

/// The table: one request a line, kept unformatted so that it reads as a table.
#[rustfmt::skip]
fn rows(fx: &Fixture) -> Vec<Row> {
    let op = || bearer(&fx.operator);
    let r1 = || bearer(&fx.r1.token);
    let r2 = || bearer(&fx.r2.token);
    let o1 = || bearer(&fx.o1.token);
    let reg = || bearer(&fx.other_registration);
    let (r1_id, r2_id, o1_id) = (fx.r1.id.as_str(), fx.r2.id.as_str(), fx.o1.id.as_str());
    let heartbeat = claim_body(&fx.lapsed);
    let result = with(claim_body(&fx.lapsed), "outcome", json!("succeeded"));
    let job = json!({"project": PROJECT, "id": "in.j9", "deployment_key": "in.k9", "spec": {"steps": 1, "step_ms": 1}});
    let spec = |steps: Value, step_ms: Value| with(job.clone(), "spec", json!({"steps": steps, "step_ms": step_ms}));
    let ju = &fx.uncertain;
    let reconcile = |job: &str, attempt: &str, finding: &str| json!({"job": job, "attempt": attempt, "finding": finding});
    let step = json!({"capability": fx.capability, "step": 0, "steps": 3, "duration_ms": 0});
    let oversized = format!("{{\"id\": \"{}\"}}", "a".repeat(70 * 1024));
    let beyond_u64 = format!(r#"{{"job": "{}", "attempt": "{}", "runner": "{}", "fence": 18446744073709551616, "observed_ms": 0}}"#, fx.lapsed.job, fx.lapsed.attempt, fx.lapsed.runner);
    use Payload::{Empty, Json as J};
    vec![
        // Bodies that are not the JSON object the endpoint takes.
        control("malformed-json", "POST", "/v1/jobs", op(), raw("{project: in}"), JSON, 400, "malformed_json"),
        control("truncated-json", "POST", "/v1/jobs", op(), raw(r#"{"project": "in", "id": "in.j9", "spec": {"steps": 1,"#), JSON, 400, "malformed_json"),
        control("empty-body", "POST", "/v1/jobs", op(), Empty, JSON, 400, "malformed_json"),
        control("trailing-garbage", "POST", "/v1/projects", op(), raw(r#"{"id": "in.p9"} {"id": "in.p10"}"#), JSON, 400, "malformed_json"),
        control("invalid-utf8", "POST", "/v1/projects", op(), Payload::Raw(b"{\"id\": \"p\xff\"}".to_vec()), JSON, 400, "malformed_json"),
        control("array-for-project", "POST", "/v1/projects", op(), J(json!(["in.p9"])), JSON, 400, "invalid_body"),
        control("array-for-claim", "POST", "/v1/claim", r1(), J(json!([r1_id, 0])), JSON, 400, "invalid_body"),
        control("array-of-jobs", "POST", "/v1/jobs", op(), J(json!([job])), JSON, 400, "invalid_body"),
        control("string-for-object", "POST", "/v1/projects", op(), J(json!("in.p9")), JSON, 400, "invalid_body"),
        control("number-for-object", "POST", "/v1/runners", op(), J(json!(7)), JSON, 400, "invalid_body"),
        control("unknown-field", "POST", "/v1/projects", op(), J(json!({"id": "in.p9", "colour": "red"})), JSON, 400, "invalid_body"),
        control("unknown-field-in-report", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "extra", json!(1))), JSON, 400, "invalid_body"),
        control("unknown-field-in-spec", "POST", "/v1/jobs", op(), J(with(job.clone(), "spec", json!({"steps": 1, "step_ms": 1, "retries": 2}))), JSON, 400, "invalid_body"),
        control("duplicate-field", "POST", "/v1/projects", op(), raw(r#"{"id": "in.p9", "id": "in.p10"}"#), JSON, 400, "invalid_body"),
        control("string-fence", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "fence", json!(fx.lapsed.fence.to_string()))), JSON, 400, "invalid_body"),
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
        control("wrong-content-type", "POST", "/v1/projects", op(), J(json!({"id": "in.p9"})), Some("text/plain"), 415, "unsupported_media_type"),
        control("form-content-type", "POST", "/v1/result", r1(), J(result.clone()), Some("application/x-www-form-urlencoded"), 415, "unsupported_media_type"),
        control("no-content-type", "POST", "/v1/claim", r1(), J(json!({"runner": r1_id, "observed_ms": 0})), None, 415, "unsupported_media_type"),
        control("oversize-body", "POST", "/v1/projects", op(), Payload::Raw(oversized.clone().into_bytes()), JSON, 413, "body_too_large"),
        wire(control("oversize-chunked-body", "POST", "/v1/jobs", op(), Empty, JSON, 413, "body_too_large"), Wire::Chunked(70 * 1024)),
        wire(control("body-cut-short", "POST", "/v1/result", r1(), Empty, JSON, 413, "body_too_large"), Wire::Truncated { declared: 400, sent: br#"{"job": "in.j1", "attempt""#.to_vec() }),
        // Who is asking.
        control("missing-auth", "POST", "/v1/jobs", None, J(job.clone()), JSON, 401, "unauthorized"),
        control("missing-auth-on-jobs", "GET", "/v1/jobs", None, Empty, None, 401, "unauthorized"),
        control("missing-auth-on-job", "GET", format!("/v1/jobs/{}", fx.lapsed.job), None, Empty, None, 401, "unauthorized"),
        control("missing-auth-on-ledger", "GET", "/v1/ledger", None, Empty, None, 401, "unauthorized"),
        control("missing-auth-on-claim", "POST", "/v1/claim", None, J(json!({"runner": r1_id, "observed_ms": 0})), JSON, 401, "unauthorized"),
        control("basic-scheme", "POST", "/v1/jobs", Some(format!("Basic {}", fx.operator)), J(job.clone()), JSON, 401, "unauthorized"),
        control("empty-bearer", "POST", "/v1/jobs", Some("Bearer ".into()), J(job.clone()), JSON, 401, "unauthorized"),
        control("wrong-token", "POST", "/v1/jobs", bearer("not-a-token"), J(job.clone()), JSON, 401, "unauthorized"),
        control("wrong-token-on-heartbeat", "POST", "/v1/heartbeat", bearer(&"0".repeat(48)), J(heartbeat.clone()), JSON, 401, "unauthorized"),
        control("bad-body-before-token-kind", "POST", "/v1/jobs", r1(), raw("{"), JSON, 400, "malformed_json"),
        control("runner-id-before-token-kind", "POST", "/v1/runners", r1(), J(json!({"project": PROJECT, "id": "in r9"})), JSON, 400, "invalid_field"),
        control("content-type-before-size", "POST", "/v1/projects", op(), Payload::Raw(oversized.clone().into_bytes()), Some("text/plain"), 415, "unsupported_media_type"),
        control("ledger-query-before-token", "GET", "/v1/ledger?after=abc", None, Empty, None, 400, "invalid_query"),
        control("job-path-before-token", "GET", "/v1/jobs/%FF", None, Empty, None, 400, "invalid_path"),
        control("wrong-token-before-bad-body", "POST", "/v1/jobs", bearer("not-a-token"), raw("{"), JSON, 401, "unauthorized"),
        control("runner-submits", "POST", "/v1/jobs", r1(), J(job.clone()), JSON, 403, "forbidden"),
        control("runner-creates-project", "POST", "/v1/projects", r1(), J(json!({"id": "in.p9"})), JSON, 403, "forbidden"),
        control("runner-registers", "POST", "/v1/runners", r1(), J(json!({"project": PROJECT, "id": "in.r9"})), JSON, 403, "forbidden"),
        control("runner-lists-jobs", "GET", "/v1/jobs", r1(), Empty, None, 403, "forbidden"),
        control("runner-reads-job", "GET", format!("/v1/jobs/{}", fx.lapsed.job), r1(), Empty, None, 403, "forbidden"),
        control("runner-reads-ledger", "GET", "/v1/ledger", r1(), Empty, None, 403, "forbidden"),
        control("runner-reconciles", "POST", "/v1/reconcile", r1(), J(reconcile(&ju.job, &ju.attempt, "stopped")), JSON, 403, "forbidden"),
        control("registration-submits", "POST", "/v1/jobs", reg(), J(job.clone()), JSON, 403, "forbidden"),
        control("registration-into-other-project", "POST", "/v1/runners", reg(), J(json!({"project": PROJECT, "id": "in.r9"})), JSON, 403, "forbidden"),
        control("registration-claims", "POST", "/v1/claim", reg(), J(json!({"runner": o1_id, "observed_ms": 0})), JSON, 403, "forbidden"),
        control("operator-claims", "POST", "/v1/claim", op(), J(json!({"runner": r1_id, "observed_ms": 0})), JSON, 403, "forbidden"),
        control("operator-heartbeats", "POST", "/v1/heartbeat", op(), J(heartbeat.clone()), JSON, 403, "forbidden"),
        control("operator-redeems", "POST", "/v1/capability", op(), J(heartbeat.clone()), JSON, 403, "forbidden"),
        control("operator-reports", "POST", "/v1/result", op(), J(result.clone()), JSON, 403, "forbidden"),
        control("claim-as-other-runner", "POST", "/v1/claim", r1(), J(json!({"runner": r2_id, "observed_ms": 0})), JSON, 403, "runner_mismatch"),
        control("heartbeat-as-other-runner", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "runner", json!(r2_id))), JSON, 403, "runner_mismatch"),
        control("result-as-other-runner", "POST", "/v1/result", r2(), J(result.clone()), JSON, 403, "runner_mismatch"),
        control("other-project-heartbeat", "POST", "/v1/heartbeat", o1(), J(with(heartbeat.clone(), "runner", json!(o1_id))), JSON, 404, "unknown_job"),
        control("other-project-capability", "POST", "/v1/capability", o1(), J(with(heartbeat.clone(), "runner", json!(o1_id))), JSON, 404, "unknown_job"),
        control("other-project-result", "POST", "/v1/result", o1(), J(with(result.clone(), "runner", json!(o1_id))), JSON, 404, "unknown_job"),
        control("heartbeat-unknown-job", "POST", "/v1/heartbeat", r1(), J(with(heartbeat.clone(), "job", json!("in.nope"))), JSON, 404, "unknown_job"),
        control("result-bad-job-id", "POST", "/v1/result", r1(), J(with(result.clone(), "job", json!("no such job/..%"))), JSON, 404, "unknown_job"),
        // Registration and submission.
        control("runner-unknown-project", "POST", "/v1/runners", op(), J(json!({"project": "in.nope", "id": "in.r9"})), JSON, 404, "unknown_project"),
        control("operator-registers-without-project", "POST", "/v1/runners", op(), J(json!({"id": "in.r9"})), JSON, 400, "missing_field"),
        control("duplicate-project", "POST", "/v1/projects", op(), J(json!({"id": OTHER})), JSON, 409, "exists"),
        control("duplicate-runner", "POST", "/v1/runners", op(), J(json!({"project": PROJECT, "id": r1_id})), JSON, 409, "exists"),
        control("runner-id-of-other-project", "POST", "/v1/runners", op(), J(json!({"project": PROJECT, "id": o1_id})), JSON, 409, "exists"),
        control("duplicate-job", "POST", "/v1/jobs", op(), J(with(job.clone(), "id", json!(fx.lapsed.job))), JSON, 409, "exists"),
        control("job-id-of-other-project", "POST", "/v1/jobs", op(), J(with(job.clone(), "id", json!("in.other.oj1"))), JSON, 409, "exists"),
        control("job-unknown-project", "POST", "/v1/jobs", op(), J(with(job.clone(), "project", json!("in.nope"))), JSON, 404, "unknown_project"),
        control("empty-project-id", "POST", "/v1/projects", op(), J(json!({"id": ""})), JSON, 400, "invalid_field"),
        control("long-project-id", "POST", "/v1/projects", op(), J(json!({"id": "p".repeat(129)})), JSON, 400, "invalid_field"),
        control("runner-id-with-space", "POST", "/v1/runners", op(), J(json!({"project": PROJECT, "id": "in r9"})), JSON, 400, "invalid_field"),
        control("job-id-with-slash", "POST", "/v1/jobs", op(), J(with(job.clone(), "id", json!("in/j9"))), JSON, 400, "invalid_field"),
        control("empty-job-id", "POST", "/v1/jobs", op(), J(with(job.clone(), "id", json!(""))), JSON, 400, "invalid_field"),
        control("non-ascii-key", "POST", "/v1/jobs", op(), J(with(job.clone(), "deployment_key", json!("in.kä"))), JSON, 400, "invalid_field"),
        control("zero-steps", "POST", "/v1/jobs", op(), J(spec(json!(0), json!(1))), JSON, 400, "invalid_field"),
        control("too-many-steps", "POST", "/v1/jobs", op(), J(spec(json!(1001), json!(1))), JSON, 400, "invalid_field"),
        control("too-long-step", "POST", "/v1/jobs", op(), J(spec(json!(1), json!(600_001))), JSON, 400, "invalid_field"),
        // Reconcile.
        control("reconcile-unknown-job", "POST", "/v1/reconcile", op(), J(reconcile("in.nope", &ju.attempt, "stopped")), JSON, 404, "unknown_job"),
        control("reconcile-unknown-attempt", "POST", "/v1/reconcile", op(), J(reconcile(&ju.job, &format!("{}-a9", ju.job), "stopped")), JSON, 404, "unknown_attempt"),
        control("reconcile-other-jobs-attempt", "POST", "/v1/reconcile", op(), J(reconcile(&fx.done.job, &ju.attempt, "stopped")), JSON, 404, "unknown_attempt"),
        control("reconcile-committed-attempt", "POST", "/v1/reconcile", op(), J(with(reconcile(&fx.done.job, &fx.done.attempt, "completed"), "outcome", json!("failed"))), JSON, 409, "not_uncertain"),
        control("reconcile-completed-without-outcome", "POST", "/v1/reconcile", op(), J(reconcile(&ju.job, &ju.attempt, "completed")), JSON, 400, "missing_field"),
        control("reconcile-stopped-with-outcome", "POST", "/v1/reconcile", op(), J(with(reconcile(&ju.job, &ju.attempt, "stopped"), "outcome", json!("failed"))), JSON, 400, "invalid_field"),
        control("reconcile-still-running-with-outcome", "POST", "/v1/reconcile", op(), J(with(reconcile(&ju.job, &ju.attempt, "still-running"), "outcome", json!("succeeded"))), JSON, 400, "invalid_field"),
        control("reconcile-unknown-finding", "POST", "/v1/reconcile", op(), J(reconcile(&ju.job, &ju.attempt, "vanished")), JSON, 400, "invalid_body"),
        // Routes, methods, paths and queries.
        control("unknown-job", "GET", "/v1/jobs/in.nope", op(), Empty, None, 404, "unknown_job"),
        control("job-path-not-utf8", "GET", "/v1/jobs/%FF", op(), Empty, None, 400, "invalid_path"),
        control("unknown-route", "GET", "/v1/nope", op(), Empty, None, 404, "no_route"),
        control("unknown-version", "POST", "/v2/jobs", op(), J(job.clone()), JSON, 404, "no_route"),
        control("path-below-job", "GET", format!("/v1/jobs/{}/attempts", fx.lapsed.job), op(), Empty, None, 404, "no_route"),
        control("delete-jobs", "DELETE", "/v1/jobs", op(), Empty, None, 405, "method_not_allowed"),
        control("get-claim", "GET", "/v1/claim", r1(), Empty, None, 405, "method_not_allowed"),
        control("put-job", "PUT", format!("/v1/jobs/{}", fx.lapsed.job), op(), J(job.clone()), JSON, 405, "method_not_allowed"),
        control("post-health", "POST", "/v1/health", None, J(json!({})), JSON, 405, "method_not_allowed"),
        control("ledger-after-not-number", "GET", "/v1/ledger?after=abc", op(), Empty, None, 400, "invalid_query"),
        control("ledger-negative-limit", "GET", "/v1/ledger?limit=-1", op(), Empty, None, 400, "invalid_query"),
        control("ledger-limit-beyond-u64", "GET", "/v1/ledger?limit=18446744073709551616", op(), Empty, None, 400, "invalid_query"),
        control("ledger-limit-plus-sign", "GET", "/v1/ledger?limit=%2B1", op(), Empty, None, 400, "invalid_query"),
        control("ledger-after-beyond-u64", "GET", "/v1/ledger?after=18446744073709551616", op(), Empty, None, 400, "invalid_query"),
        control("ledger-unknown-parameter", "GET", "/v1/ledger?job=in.j1", op(), Empty, None, 400, "invalid_query"),
        // The target.
        target("target-malformed-json", "POST", "/v1/steps", raw(r#"{"capability": "#), JSON, 400, "malformed_json"),
        target("target-step-equal-to-steps", "POST", "/v1/steps", J(with(step.clone(), "step", json!(3))), JSON, 400, "invalid_field"),
        target("target-step-beyond-steps", "POST", "/v1/steps", J(with(step.clone(), "step", json!(7))), JSON, 400, "invalid_field"),
        target("target-zero-steps", "POST", "/v1/steps", J(with(with(step.clone(), "steps", json!(0)), "step", json!(0))), JSON, 400, "invalid_field"),
        target("target-step-too-long", "POST", "/v1/steps", J(with(step.clone(), "duration_ms", json!(600_001))), JSON, 400, "invalid_field"),
        target("target-missing-capability", "POST", "/v1/steps", J(without(step.clone(), "capability")), JSON, 400, "invalid_body"),
        target("target-unknown-capability-field", "POST", "/v1/steps", J(with(step.clone(), "capability", with(fx.capability.clone(), "scope", json!("all")))), JSON, 400, "invalid_body"),
        target("target-negative-fence", "POST", "/v1/steps", J(with(step.clone(), "capability", with(fx.capability.clone(), "fence", json!(-1)))), JSON, 400, "invalid_body"),
        target("target-array-for-object", "POST", "/v1/steps", J(json!([fx.capability, 0, 3, 0])), JSON, 400, "invalid_body"),
        target("target-wrong-content-type", "POST", "/v1/steps", J(step.clone()), Some("text/plain"), 415, "unsupported_media_type"),
        target("target-oversize-body", "POST", "/v1/steps", Payload::Raw(oversized.into_bytes()), JSON, 413, "body_too_large"),
        target("target-unknown-route", "GET", "/v1/nope", Empty, None, 404, "no_route"),
        target("target-put-steps", "PUT", "/v1/steps", J(step.clone()), JSON, 405, "method_not_allowed"),
        target("target-unknown-deployment", "GET", "/v1/deployments/in.nope", Empty, None, 404, "unknown_deployment"),
        target("target-deployment-path-not-utf8", "GET", "/v1/deployments/%FF", Empty, None, 400, "invalid_path"),
        target("target-steps-after-not-number", "GET", "/v1/steps?after=abc", Empty, None, 400, "invalid_query"),
        target("target-steps-unknown-parameter", "GET", "/v1/steps?foo=1", Empty, None, 400, "invalid_query"),
        target("target-steps-negative-limit", "GET", "/v1/steps?limit=-3", Empty, None, 400, "invalid_query"),
    ]
}

/// Builds the fixture: project `in` with a lapsed attempt (`in.ju`), a committed success,
/// a second lapsed attempt with a capability-shaped body (`in.j1`) and a queued job
/// (`in.j2`); project `in.other` with a queued job. Waits until no lease runs.
async fn build(s: &Session) -> Result<Fixture, Finding> {
    let team = s.team_named(PROJECT, 2).await?;
    let other = s.team_named(OTHER, 1).await?;
    let r1 = team.runners[0].clone();
    s.submit(PROJECT, "in.ju", "in.ku", 3).await?;
    let uncertain = r1.claim_some().await?.claim;
    s.submit(PROJECT, "in.j1", "in.k1", 3).await?;
    let lapsed = r1.claim_some().await?.claim;
    let done = tries(|n| {
        let r1 = &r1;
        async move {
            let job = format!("in.jd{n}");
            s.submit(PROJECT, &job, &format!("in.kd{n}"), 3).await?;
            let claim = r1.claim_some().await?.claim;
            let ruling = r1.result(&claim, Outcome::Succeeded, now_ms()).await?;
            if ruling.decision == Decision::Accepted {
                Ok(Try::Done(claim))
            } else {
                Ok(Try::Late(format!("{}'s success was {:?}", claim.attempt, ruling.reason)))
            }
        }
    })
    .await?;
    for (claim, job) in [(&uncertain, "in.ju"), (&lapsed, "in.j1")] {
        if claim.job != job {
            return Err(Finding::Fail(format!("the fixture's claim was granted {} instead of {job}", claim.attempt)));
        }
    }
    s.submit(PROJECT, "in.j2", "in.k2", 3).await?;
    s.submit(OTHER, "in.other.oj1", "in.other.ko", 3).await?;
    for job in ["in.ju", "in.j1"] {
        s.wait_lapsed(job).await?;
    }
    s.wait(&done.job, "succeeded (its success was accepted)", |view| view.state == JobState::Succeeded).await?;
    let capability = json!({
        "deployment_key": "in.k1", "job": lapsed.job, "attempt": lapsed.attempt, "runner": lapsed.runner,
        "fence": lapsed.fence, "expires_ms": now_ms() + 60_000, "signature": "0".repeat(64),
    });
    Ok(Fixture {
        operator: s.operator_token.clone(),
        r2: team.runners[1].clone(),
        o1: other.runners[0].clone(),
        r1,
        other_registration: other.registration_token,
        lapsed,
        uncertain,
        done,
        capability,
    })
}

/// What every read endpoint shows.
#[derive(Clone, PartialEq)]
struct Snapshot {
    reads: BTreeMap<String, Value>,
}

async fn read(s: &Session, base: &str, path: &str) -> Result<Value, String> {
    let answer = s.get(base, path, Some(&s.operator_token)).await.map_err(|finding| finding.to_string())?;
    if answer.status != 200 {
        return Err(format!("GET {path} answered {}: {}", answer.status, answer.text()));
    }
    answer.json().ok_or_else(|| format!("GET {path}: not JSON"))
}

async fn snapshot(s: &Session) -> Result<Snapshot, String> {
    let mut reads = BTreeMap::new();
    let jobs = read(s, &s.control, "/v1/jobs").await?;
    for job in jobs.as_array().ok_or("GET /v1/jobs: not an array")? {
        let id = job["id"].as_str().ok_or("GET /v1/jobs: a job without an id")?;
        let path = format!("/v1/jobs/{id}");
        reads.insert(path.clone(), read(s, &s.control, &path).await?);
    }
    reads.insert("/v1/jobs".into(), jobs);
    if s.provides.ledger {
        reads.insert("/v1/ledger".into(), read(s, &s.control, "/v1/ledger?after=0&limit=10000").await?);
    }
    if let Some(target) = &s.target {
        reads.insert("target /v1/steps".into(), read(s, target, "/v1/steps?after=0&limit=100000").await?);
    }
    Ok(Snapshot { reads })
}

/// Gap between two reads that must agree for the system to count as quiet: longer than
/// a system's background turn (pg-boss's maintenance runs every second).
const QUIET_GAP: Duration = Duration::from_millis(1_500);
/// Longest wait for the system to be quiet before the bad-input table.
const QUIET_WAIT_MAX: Duration = Duration::from_secs(20);

/// The reads before the bad-input table, once two of them [`QUIET_GAP`] apart agree: a
/// change the system makes on its own (a lapsed lease recorded by a background turn after
/// the job's state already showed it) is not blamed on the first bad input. A system that
/// never goes quiet within [`QUIET_WAIT_MAX`] is read as it is then; the rows say what
/// changed.
async fn settled(s: &Session) -> Result<Snapshot, String> {
    let started = Instant::now();
    let mut last = snapshot(s).await?;
    while started.elapsed() < QUIET_WAIT_MAX {
        tokio::time::sleep(QUIET_GAP).await;
        let now = snapshot(s).await?;
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

/// The places where `after` differs from `before`.
fn changes(before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let mut changed = Vec::new();
    let places: std::collections::BTreeSet<&String> = before.reads.keys().chain(after.reads.keys()).collect();
    for place in places {
        let (old, new) =
            (before.reads.get(place).unwrap_or(&Value::Null), after.reads.get(place).unwrap_or(&Value::Null));
        if old != new {
            changed.push(place.clone());
        }
    }
    changed
}

/// Writes `bytes` on a fresh TCP connection to `base`, closing the write half when
/// `half_close`, and reads the whole answer.
async fn exchange(base: &str, bytes: &[u8], half_close: bool) -> Result<Answer, String> {
    let addr = base.trim_start_matches("http://");
    let talk = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.map_err(|error| error.to_string())?;
        stream.write_all(bytes).await.map_err(|error| error.to_string())?;
        if half_close {
            stream.shutdown().await.map_err(|error| error.to_string())?;
        }
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.map_err(|error| error.to_string())?;
        Ok::<_, String>(answer)
    };
    let answer = tokio::time::timeout(REQUEST_MAX, talk).await.map_err(|_| "no answer in time".to_string())??;
    parse_answer(&answer)
}

/// An HTTP/1.1 answer: status line, headers, body (by length or chunked).
fn parse_answer(bytes: &[u8]) -> Result<Answer, String> {
    let end = bytes.windows(4).position(|window| window == b"\r\n\r\n").ok_or("no complete answer head")?;
    let head = String::from_utf8_lossy(&bytes[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or("no status line")?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let header = |name: &str| headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone());
    let mut body = bytes[end + 4..].to_vec();
    if header("transfer-encoding").is_some_and(|value| value.contains("chunked")) {
        body = dechunk(&body);
    }
    Ok(Answer { status, content_type: header("content-type").unwrap_or_default(), allow: header("allow"), bytes: body })
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

/// The request bytes of a row sent on a raw connection.
fn wire_bytes(row: &Row, base: &str, wire: &Wire) -> (Vec<u8>, bool) {
    let host = base.trim_start_matches("http://");
    let mut head = format!("{} {} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n", row.method, row.path);
    if let Some(authorization) = &row.authorization {
        head.push_str(&format!("Authorization: {authorization}\r\n"));
    }
    if let Some(content_type) = row.content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    match wire {
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
    }
}

async fn send_row(s: &Session, row: &Row, base: &str) -> Result<Answer, String> {
    if row.path.starts_with("/v1/reconcile") {
        if let Payload::Json(body) = &row.body {
            s.decided(body["job"].as_str().unwrap_or_default(), body["attempt"].as_str().unwrap_or_default(), None);
        }
    }
    match &row.wire {
        Some(wire) => {
            let (bytes, half_close) = wire_bytes(row, base, wire);
            exchange(base, &bytes, half_close).await
        }
        None => {
            let body = match &row.body {
                Payload::Empty => Payload::Empty,
                Payload::Json(value) => Payload::Json(value.clone()),
                Payload::Raw(bytes) => Payload::Raw(bytes.clone()),
            };
            let request = Request {
                method: row.method,
                url: format!("{base}{}", row.path),
                authorization: row.authorization.clone(),
                content_type: row.content_type,
                body,
            };
            s.send_once(&request).await
        }
    }
}

/// Sends one row and judges it: its answer, the server's health, the reads after it.
async fn judge_row(s: &Session, row: &Row, base: &str, baseline: &mut Snapshot) -> (Status, String) {
    let mut problems = match send_row(s, row, base).await {
        Ok(answer) => answer.error_problems(row.status, row.code),
        Err(error) => vec![error],
    };
    match s.get(base, "/v1/health", None).await {
        Ok(answer) if answer.status == 200 => {}
        Ok(answer) => problems.push(format!("health then answered {}", answer.status)),
        Err(finding) => problems.push(format!("health then did not answer: {finding}")),
    }
    match snapshot(s).await {
        Ok(after) => {
            let changed = changes(baseline, &after);
            if !changed.is_empty() {
                problems.push(format!("it changed {}", changed.join(", ")));
                *baseline = after;
            }
        }
        Err(error) => problems.push(format!("the reads after it failed: {error}")),
    }
    let request = format!("{} {}", row.method, row.path);
    if problems.is_empty() {
        (Status::Pass, format!("{request} answered {} {}; nothing changed; health answers", row.status, row.code))
    } else {
        (Status::Fail, format!("{request}: {}", problems.join("; ")))
    }
}

/// Runs the table; one case per row (`input/<row>`).
pub async fn run(s: &Session) -> Vec<CaseResult> {
    let started = Instant::now();
    let fixture = match build(s).await {
        Ok(fixture) => fixture,
        Err(finding) => {
            let (status, evidence) = match finding {
                Finding::Fail(why) => (Status::Fail, format!("the bad-input fixture could not be built: {why}")),
                Finding::Skip(why) => (Status::Skip, format!("the bad-input fixture could not be built: {why}")),
            };
            return vec![CaseResult {
                name: "input/fixture".into(),
                status,
                evidence,
                duration_ms: started.elapsed().as_millis() as u64,
            }];
        }
    };
    let mut baseline = match settled(s).await {
        Ok(snapshot) => snapshot,
        Err(error) => {
            let evidence = format!("the reads before the bad-input table failed: {error}");
            return vec![CaseResult {
                name: "input/fixture".into(),
                status: Status::Fail,
                evidence,
                duration_ms: started.elapsed().as_millis() as u64,
            }];
        }
    };
    let mut results = Vec::new();
    for row in rows(&fixture) {
        let started = Instant::now();
        let name = format!("input/{}", row.name);
        let missing = row.needs().filter(|feature| !s.provides.has(*feature));
        let base = match row.server {
            Server::Control => Some(s.control.clone()),
            Server::Target => s.target.clone(),
        };
        let (status, evidence) = match (missing, base) {
            (Some(feature), _) => (Status::Skip, format!("the system file says `provides.{} = false`", feature.name())),
            (None, None) => (Status::Skip, "the system has no target".to_string()),
            (None, Some(base)) => match tokio::time::timeout(ROW_MAX, judge_row(s, &row, &base, &mut baseline)).await {
                Ok(judged) => judged,
                Err(_) => (
                    Status::Fail,
                    format!("{} {} and the reads after it took over {} s", row.method, row.path, ROW_MAX.as_secs()),
                ),
            },
        };
        results.push(CaseResult { name, status, evidence, duration_ms: started.elapsed().as_millis() as u64 });
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_at_least_forty_rows_with_distinct_names_on_every_endpoint() {
        let runner = |id: &str| Runner {
            id: id.into(),
            project: PROJECT.into(),
            token: String::new(),
            client: protocol::client::Client::new("http://127.0.0.1:9", None, REQUEST_MAX),
        };
        let claim = ClaimRef { job: "in.j1".into(), attempt: "in.j1-a1".into(), runner: "in.r1".into(), fence: 1 };
        let fixture = Fixture {
            operator: String::new(),
            r1: runner("in.r1"),
            r2: runner("in.r2"),
            o1: runner("in.other.r1"),
            other_registration: String::new(),
            lapsed: claim.clone(),
            uncertain: claim.clone(),
            done: claim,
            capability: json!({}),
        };
        let table = rows(&fixture);
        assert!(table.len() >= 40, "{} rows", table.len());
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
}
