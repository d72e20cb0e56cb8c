//! The control plane's HTTP API (see `docs/protocol.md`). Handlers parse, authenticate,
//! hand the work to [`Rules`] on a blocking thread, and map the answer to a status.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::backend::Backend;
use super::rules::{Now, RuleError, Rules};
use super::store::{Principal, StoreError};
use crate::bugs::Bug;
use crate::web::{bearer, read_json, ApiError};
use protocol::*;

pub struct App {
    pub rules: Rules<Backend>,
    /// Under `ack-before-commit`: how long an acknowledged result waits before it commits.
    pub ack_commit_delay: Duration,
}

type Shared = Arc<App>;

impl From<RuleError> for ApiError {
    fn from(error: RuleError) -> ApiError {
        match error {
            RuleError::Refused { status, code, message } => ApiError::new(status, code, message),
            RuleError::Store(error) => {
                eprintln!("control-plane: store error: {error}");
                match error {
                    StoreError::CommitUnknown(_) => ApiError::new(
                        503,
                        "outcome_unknown",
                        "the database did not answer the commit: the request may or may not have taken effect",
                    ),
                    error if error.is_unavailable() => ApiError::new(
                        503,
                        "unavailable",
                        "the database could not be used; the request did not take effect",
                    ),
                    _ => ApiError::new(500, "internal", "the control plane could not complete the request"),
                }
            }
        }
    }
}

/// Runs rule work on a blocking thread (both stores are synchronous).
async fn blocking<T: Send + 'static>(
    app: &Shared,
    work: impl FnOnce(&Rules<Backend>) -> Result<T, RuleError> + Send + 'static,
) -> Result<T, ApiError> {
    let app = app.clone();
    let joined = tokio::task::spawn_blocking(move || work(&app.rules)).await;
    joined
        .map_err(|_| ApiError::new(500, "internal", "the control plane could not complete the request"))?
        .map_err(ApiError::from)
}

async fn principal(app: &Shared, headers: &HeaderMap) -> Result<Principal, ApiError> {
    let token = bearer(headers)?.to_string();
    blocking(app, move |rules| rules.principal(&token)).await
}

/// Authenticates, then parses the body: both before the rule's transaction starts.
async fn authed<T: serde::de::DeserializeOwned>(
    app: &Shared,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Principal, T), ApiError> {
    let principal = principal(app, headers).await?;
    let request = read_json(headers, body).await?;
    Ok((principal, request))
}

/// The runner a runner-only call acts as: the token's own. Under the planted
/// `trust-named-runner` a runner token acts for whichever runner the body names, so one
/// runner can report for another's claim.
fn acting_as(app: &Shared, principal: Principal, named: &str) -> Principal {
    match principal {
        Principal::Runner { project, .. } if app.rules.bugs.has(Bug::TrustNamedRunner) => {
            Principal::Runner { id: named.to_string(), project }
        }
        principal => principal,
    }
}

fn verdict_response(verdict: Ruling) -> Response {
    let status = match verdict.decision {
        history::Decision::Accepted | history::Decision::Duplicate => StatusCode::OK,
        history::Decision::Rejected | history::Decision::Conflict => StatusCode::CONFLICT,
    };
    (status, Json(verdict)).into_response()
}

pub fn router(app: Shared) -> Router {
    Router::new()
        .route("/v1/health", get(|| async { Json(serde_json::json!({"status": "ok"})) }))
        .route("/v1/projects", post(create_project))
        .route("/v1/runners", post(register_runner))
        .route("/v1/jobs", post(submit).get(jobs))
        .route("/v1/jobs/{id}", get(job))
        .route("/v1/claim", post(claim))
        .route("/v1/heartbeat", post(heartbeat))
        .route("/v1/capability", post(capability))
        .route("/v1/result", post(result))
        .route("/v1/reconcile", post(reconcile))
        .route("/v1/ledger", get(ledger))
        .fallback(crate::web::no_route)
        .method_not_allowed_fallback(crate::web::wrong_method)
        .with_state(app)
}

async fn create_project(State(app): State<Shared>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (principal, request): (_, CreateProject) = authed(&app, &headers, body).await?;
    let created = blocking(&app, move |rules| rules.create_project(&principal, &request)).await?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

async fn register_runner(State(app): State<Shared>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (principal, request): (_, RegisterRunner) = authed(&app, &headers, body).await?;
    let registered = blocking(&app, move |rules| rules.register_runner(&principal, &request)).await?;
    Ok((StatusCode::CREATED, Json(registered)).into_response())
}

async fn submit(State(app): State<Shared>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (principal, request): (_, SubmitJob) = authed(&app, &headers, body).await?;
    let now = Now::read();
    let submitted = blocking(&app, move |rules| rules.submit(&principal, &request, now)).await?;
    Ok((StatusCode::CREATED, Json(submitted)).into_response())
}

async fn jobs(State(app): State<Shared>, headers: HeaderMap) -> Result<Json<Vec<JobView>>, ApiError> {
    let principal = principal(&app, &headers).await?;
    Ok(Json(blocking(&app, move |rules| rules.jobs(&principal)).await?))
}

async fn job(
    State(app): State<Shared>,
    headers: HeaderMap,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<JobView>, ApiError> {
    let Path(id) = id.map_err(|error| ApiError::new(400, "invalid_path", error.body_text()))?;
    let principal = principal(&app, &headers).await?;
    Ok(Json(blocking(&app, move |rules| rules.job_view(&principal, &id)).await?))
}

async fn claim(State(app): State<Shared>, headers: HeaderMap, body: Body) -> Result<Json<ClaimResponse>, ApiError> {
    let (principal, request): (_, ClaimRequest) = authed(&app, &headers, body).await?;
    let principal = acting_as(&app, principal, &request.runner);
    let now = Now::read();
    Ok(Json(blocking(&app, move |rules| rules.claim(&principal, &request, now)).await?))
}

async fn heartbeat(State(app): State<Shared>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (principal, request): (_, HeartbeatRequest) = authed(&app, &headers, body).await?;
    let principal = acting_as(&app, principal, &request.claim.runner);
    let now = Now::read();
    Ok(verdict_response(blocking(&app, move |rules| rules.heartbeat(&principal, &request, now)).await?))
}

async fn capability(State(app): State<Shared>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (principal, request): (_, CapabilityRequest) = authed(&app, &headers, body).await?;
    let principal = acting_as(&app, principal, &request.claim.runner);
    let now = Now::read();
    Ok(verdict_response(blocking(&app, move |rules| rules.capability(&principal, &request, now)).await?))
}

async fn result(State(app): State<Shared>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (principal, request): (_, ResultRequest) = authed(&app, &headers, body).await?;
    let principal = acting_as(&app, principal, &request.claim.runner);
    let now = Now::read();
    if !app.rules.bugs.has(Bug::AckBeforeCommit) {
        return Ok(verdict_response(blocking(&app, move |rules| rules.result(&principal, &request, now)).await?));
    }
    let (decide, later) = ((principal.clone(), request.clone()), app.clone());
    let verdict = blocking(&app, move |rules| rules.result_uncommitted(&decide.0, &decide.1, now)).await?;
    tokio::spawn(async move {
        tokio::time::sleep(later.ack_commit_delay).await;
        let _ = blocking(&later, move |rules| rules.result(&principal, &request, now)).await;
    });
    Ok(verdict_response(verdict))
}

async fn reconcile(State(app): State<Shared>, headers: HeaderMap, body: Body) -> Result<Json<JobView>, ApiError> {
    let (principal, request): (_, ReconcileRequest) = authed(&app, &headers, body).await?;
    let now = Now::read();
    Ok(Json(blocking(&app, move |rules| rules.reconcile(&principal, &request, now)).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LedgerQuery {
    #[serde(default, deserialize_with = "crate::web::decimal")]
    after: u64,
    #[serde(default = "default_limit", deserialize_with = "crate::web::decimal")]
    limit: u64,
}

fn default_limit() -> u64 {
    1_000
}

async fn ledger(
    State(app): State<Shared>,
    headers: HeaderMap,
    query: Result<Query<LedgerQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<LedgerEntry>>, ApiError> {
    let Query(query) = query.map_err(|error| ApiError::new(400, "invalid_query", error.body_text()))?;
    let principal = principal(&app, &headers).await?;
    let limit = u32::try_from(query.limit).unwrap_or(u32::MAX);
    Ok(Json(blocking(&app, move |rules| rules.ledger(&principal, query.after, limit)).await?))
}

/// Expires lapsed leases every `sweep` so that reads see uncertainty without waiting for a request.
pub async fn sweep(app: Shared, sweep: Duration) {
    let mut ticker = tokio::time::interval(sweep);
    loop {
        ticker.tick().await;
        let _ = blocking(&app, |rules| rules.expire(Now::read())).await;
    }
}
