//! Bad input against every endpoint: the contract's table (`protocol::bad_input`) of
//! malformed, unauthorised, out-of-domain and unknown-id requests, each answered with its
//! documented 4xx and the error body `{"error", "code", "status"}`. After every row every
//! read endpoint (the jobs, each job, the ledger, the target's steps) is read again and
//! compared with the state before the table, and the server must still answer health: an
//! error changes nothing and is never a 5xx.
//!
//! The table runs alone, before any other case, on a settled fixture: no lease is running,
//! so nothing but a wrongly taken request could change what the reads show.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use history::Decision;
use protocol::bad_input::{error_problems, exchange, rows, Answered, Body, Fixture, Registered, Row, Server};
use protocol::*;
use serde_json::{json, Value};

use super::case::{CaseResult, Finding, Status};
use super::session::{now_ms, tries, Request, Runner, Session, Try, REQUEST_MAX};
use system::Feature;

/// The fixture's projects: `in` (runners `in.r1`, `in.r2`) and `in.other` (`in.other.r1`).
const PROJECT: &str = "in";
const OTHER: &str = "in.other";
/// The most a row (its request, the health check and the reads after it) may take.
const ROW_MAX: Duration = Duration::from_secs(20);

/// The optional part of the contract a row's endpoint is.
fn needs(row: &Row) -> Option<Feature> {
    match row.server {
        Server::Target => Some(Feature::Target),
        Server::Control if row.path.starts_with("/v1/ledger") => Some(Feature::Ledger),
        Server::Control if row.path.starts_with("/v1/reconcile") => Some(Feature::Reconcile),
        Server::Control if row.path.starts_with("/v1/capability") => Some(Feature::Capabilities),
        Server::Control => None,
    }
}

/// The rows of the bad-input table: each one case. Conform's fixture holds no running
/// attempt (nothing may lapse while the table runs), so the table is every row but the one
/// that reconciles a running attempt.
pub fn row_count() -> usize {
    rows(&Fixture { running: None, ..Fixture::placeholder() }).len()
}

fn registered(runner: &Runner) -> Registered {
    Registered { id: runner.id.clone(), token: runner.token.clone() }
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
        project: PROJECT.into(),
        other: OTHER.into(),
        r1: registered(&r1),
        r2: registered(&team.runners[1]),
        o1: registered(&other.runners[0]),
        other_registration: other.registration_token,
        fresh: format!("{PROJECT}."),
        report: lapsed,
        uncertain,
        done,
        running: None,
        other_job: "in.other.oj1".into(),
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

/// Sends one row as the table says: on a raw connection when it carries a wire, else as an
/// ordinary request.
async fn send_row(s: &Session, row: &Row, base: &str) -> Result<Answered, String> {
    if row.path.starts_with("/v1/reconcile") {
        if let Body::Json(body) = &row.body {
            s.decided(body["job"].as_str().unwrap_or_default(), body["attempt"].as_str().unwrap_or_default(), None);
        }
    }
    let host = base.trim_start_matches("http://").to_string();
    if let Some((bytes, half_close)) = row.raw_request(&host) {
        let exchanged = tokio::task::spawn_blocking(move || exchange(&host, &bytes, half_close, REQUEST_MAX));
        return exchanged.await.map_err(|error| error.to_string())?.map_err(|error| error.to_string());
    }
    let request = Request {
        method: row.method,
        url: format!("{base}{}", row.path),
        authorization: row.authorization.clone(),
        content_type: row.content_type,
        body: row.body.clone(),
    };
    s.send_once(&request).await.map_err(|error| error.to_string())
}

/// Sends one row and judges it: its answer, the server's health, the reads after it.
async fn judge_row(s: &Session, row: &Row, base: &str, baseline: &mut Snapshot) -> (Status, String) {
    let mut problems = match send_row(s, row, base).await {
        Ok(answer) => error_problems(row.status, row.code, &answer),
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
        let missing = needs(&row).filter(|feature| !s.provides.has(*feature));
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
