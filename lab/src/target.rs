//! The deployment target: deployments by key, each with a revision and the highest fence
//! seen, and a step log that is the ground truth of physical side effects.
//!
//! Modes: `fenced` refuses a step whose fence is below the highest seen for its key
//! (compare-and-set generation) and checks the capability; `idempotent` applies each step
//! of a deployment identity once and checks the capability but not fences; `unfenced`
//! accepts everything, like a generic shell deployment.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::bugs::{Bug, Bugs};
use crate::capability;
use crate::web::{read_json, ApiError};
use history::Reason;
use protocol::{StepRecord, StepRequest, StepResponse};

/// The target's mode: the vocabulary's word, which the harness writes and reads too.
pub use history::TargetMode as Mode;

/// Longest a step may run on the target (10 minutes).
pub const STEP_DURATION_MS_MAX: u64 = 600_000;
/// Most step records kept in memory for reads; the log file keeps all.
pub const STEP_LOG_ENTRIES_MAX: usize = 1_000_000;

#[derive(Clone, Debug, Default, Serialize)]
pub struct Deployment {
    pub key: String,
    pub revision: u64,
    pub highest_fence: u64,
    #[serde(skip)]
    applied: HashSet<(String, u32)>,
    /// The highest fence each runner applied: what `target-fences-per-runner` compares with.
    #[serde(skip)]
    highest_by_runner: BTreeMap<String, u64>,
}

pub struct Target {
    mode: Mode,
    bugs: Bugs,
    secret: Vec<u8>,
    state: Mutex<TargetState>,
}

struct TargetState {
    deployments: BTreeMap<String, Deployment>,
    log: Vec<StepRecord>,
    log_file: Option<std::fs::File>,
}

/// The decision on one step, before it is written down.
struct Judgement {
    applied: bool,
    reason: Option<Reason>,
}

impl Target {
    pub fn new(mode: Mode, bugs: Bugs, secret: &[u8], log_file: Option<std::fs::File>) -> Target {
        let state = TargetState { deployments: BTreeMap::new(), log: Vec::new(), log_file };
        Target { mode, bugs, secret: secret.to_vec(), state: Mutex::new(state) }
    }

    fn judge(&self, request: &StepRequest, deployment: &Deployment, now_ms: i64) -> Judgement {
        let capability = &request.capability;
        let refuse = |reason| Judgement { applied: false, reason: Some(reason) };
        if self.mode == Mode::Unfenced {
            return Judgement { applied: true, reason: None };
        }
        if !capability::verify(&self.secret, capability) {
            return refuse(Reason::BadSignature);
        }
        let expired = match self.bugs.has(Bug::TargetExpiryInWholeSeconds) {
            // Planted: both instants cut to their second; a capability lives to its second's end.
            true => capability.expires_ms.div_euclid(1_000) < now_ms.div_euclid(1_000),
            false => capability.expires_ms <= now_ms,
        };
        if expired {
            return refuse(Reason::Expired);
        }
        if self.mode == Mode::Idempotent {
            let identity = (capability.job.clone(), request.step);
            return if deployment.applied.contains(&identity) {
                refuse(Reason::Duplicate)
            } else {
                Judgement { applied: true, reason: None }
            };
        }
        let highest = match self.bugs.has(Bug::TargetFencesPerRunner) {
            true => deployment.highest_by_runner.get(&capability.runner).copied().unwrap_or(0),
            false => deployment.highest_fence,
        };
        if capability.fence < highest && !self.bugs.has(Bug::TargetIgnoresFence) {
            return refuse(Reason::StaleFence);
        }
        if capability.fence == deployment.highest_fence && self.bugs.has(Bug::TargetRefusesCurrentFence) {
            return refuse(Reason::StaleFence);
        }
        Judgement { applied: true, reason: None }
    }

    /// Judges, applies and records one step atomically; returns its record. A refused step
    /// changes no deployment: a key that only refused steps named stays unknown.
    pub fn step(&self, request: &StepRequest, now_ms: i64, mono_ns: u64) -> StepRecord {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let capability = &request.capability;
        let key = capability.deployment_key.clone();
        let unknown = Deployment { key: key.clone(), ..Deployment::default() };
        let before = state.deployments.get(&key).unwrap_or(&unknown);
        let judgement = self.judge(request, before, now_ms);
        let (highest_fence_before, mut revision) = (before.highest_fence, before.revision);
        if judgement.applied {
            let deployment = state.deployments.entry(key.clone()).or_insert(unknown);
            deployment.revision += 1;
            deployment.highest_fence = deployment.highest_fence.max(capability.fence);
            let own = deployment.highest_by_runner.entry(capability.runner.clone()).or_default();
            *own = (*own).max(capability.fence);
            deployment.applied.insert((capability.job.clone(), request.step));
            revision = deployment.revision;
        }
        let record = StepRecord {
            seq: state.log.len() as u64,
            deployment_key: key,
            job: capability.job.clone(),
            attempt: capability.attempt.clone(),
            runner: capability.runner.clone(),
            fence: capability.fence,
            step: request.step,
            steps: request.steps,
            applied: judgement.applied,
            reason: judgement.reason,
            revision,
            highest_fence_before,
            received_ms: now_ms,
            mono_ns,
        };
        state.record(&record);
        record
    }

    pub fn steps_after(&self, after: u64, limit: usize) -> Vec<StepRecord> {
        let state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.log.iter().skip(usize::try_from(after).unwrap_or(usize::MAX)).take(limit).cloned().collect()
    }

    pub fn deployment(&self, key: &str) -> Option<Deployment> {
        let state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.deployments.get(key).cloned()
    }
}

impl TargetState {
    fn record(&mut self, record: &StepRecord) {
        if let Some(file) = &mut self.log_file {
            let line = serde_json::to_string(record).expect("a step record serialises");
            if let Err(error) = writeln!(file, "{line}").and_then(|_| file.flush()) {
                eprintln!("target: cannot write the step log: {error}");
            }
        }
        if self.log.len() < STEP_LOG_ENTRIES_MAX {
            self.log.push(record.clone());
        }
    }
}

type Shared = Arc<Target>;

pub fn router(target: Shared) -> Router {
    Router::new()
        .route("/v1/health", get(|| async { Json(serde_json::json!({"status": "ok"})) }))
        .route("/v1/steps", post(step).get(steps))
        .route("/v1/deployments/{key}", get(deployment))
        .fallback(crate::web::no_route)
        .method_not_allowed_fallback(crate::web::wrong_method)
        .with_state(target)
}

async fn step(State(target): State<Shared>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let request: StepRequest = read_json(&headers, body).await?;
    if request.steps == 0 || request.step >= request.steps || request.duration_ms > STEP_DURATION_MS_MAX {
        return Err(ApiError::new(
            400,
            "invalid_field",
            format!("need `step` < `steps` and `duration_ms` at most {STEP_DURATION_MS_MAX}"),
        ));
    }
    if request.capability.fence > i64::MAX as u64 {
        return Err(ApiError::new(400, "invalid_field", format!("`capability.fence` must be at most {}", i64::MAX)));
    }
    let now = crate::control::Now::read();
    let record = target.step(&request, now.ms, now.mono_ns);
    if !record.applied {
        return Ok((StatusCode::CONFLICT, Json(StepResponse { record })).into_response());
    }
    tokio::time::sleep(Duration::from_millis(request.duration_ms)).await;
    Ok((StatusCode::OK, Json(StepResponse { record })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepsQuery {
    #[serde(default, deserialize_with = "crate::web::decimal")]
    after: u64,
    #[serde(default = "default_limit", deserialize_with = "crate::web::decimal")]
    limit: u64,
}

fn default_limit() -> u64 {
    10_000
}

async fn steps(
    State(target): State<Shared>,
    query: Result<Query<StepsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<StepRecord>>, ApiError> {
    let Query(query) = query.map_err(|error| ApiError::new(400, "invalid_query", error.body_text()))?;
    Ok(Json(target.steps_after(query.after, query.limit.clamp(1, 100_000) as usize)))
}

async fn deployment(
    State(target): State<Shared>,
    key: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<Deployment>, ApiError> {
    let Path(key) = key.map_err(|error| ApiError::new(400, "invalid_path", error.body_text()))?;
    target
        .deployment(&key)
        .map(Json)
        .ok_or_else(|| ApiError::new(404, "unknown_deployment", format!("no step has touched `{key}`")))
}
