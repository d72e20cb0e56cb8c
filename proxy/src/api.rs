//! Toxiproxy's REST API over the registry: routes, request decoding and
//! Toxiproxy-shaped answers (status codes, `{"error", "status"}` bodies, the
//! plain-text 403 for browsers and 404 for unknown routes, the `/version`
//! body, an `X-Toxiproxy-Request-Id` header). Bodies are decoded by hand rather
//! than with axum's `Json` extractor so that any content type is accepted
//! (curl's default included) and every rejection carries a message that names
//! the offending field.

use crate::error::ApiError;
use crate::registry::{ProxyChange, ProxyInput, Registry, DEFAULT_LISTEN, HALF_CLOSE_FIELD};
use crate::toxic::CreateHead;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The Toxiproxy API version this server speaks, with our own version appended.
pub const VERSION: &str = concat!("2.12.0-fencelab.", env!("CARGO_PKG_VERSION"));

type Shared = State<Arc<Registry>>;
type ApiResult = Result<Response, ApiError>;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.to_json())).into_response()
    }
}

/// The API router over a registry.
pub(crate) fn router(registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/version", get(version))
        .route("/reset", post(reset))
        .route("/populate", post(populate))
        .route("/proxies", get(list_proxies).post(create_proxy))
        .route("/proxies/{proxy}", get(show_proxy).post(update_proxy).patch(update_proxy).delete(delete_proxy))
        .route("/proxies/{proxy}/toxics", get(list_toxics).post(create_toxic))
        .route("/proxies/{proxy}/fencelab_traffic", get(show_traffic))
        .route(
            "/proxies/{proxy}/toxics/{toxic}",
            get(show_toxic).post(update_toxic).patch(update_toxic).delete(delete_toxic),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(stop_browsers))
        .layer(middleware::from_fn(request_id))
        .with_state(registry)
}

/// Toxiproxy names every answer with an `X-Toxiproxy-Request-Id` header.
async fn request_id(request: Request, next: Next) -> Response {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut response = next.run(request).await;
    if let Ok(value) = header::HeaderValue::from_str(&format!("fencelab-{id}")) {
        response.headers_mut().insert("x-toxiproxy-request-id", value);
    }
    response
}

/// A plain-text answer, as Go's `http.Error` writes one.
fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

/// Toxiproxy refuses browsers so that a web page cannot drive it (CSRF).
async fn stop_browsers(request: Request, next: Next) -> Response {
    let is_browser = request
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ua| ua.starts_with("Mozilla/"));
    if is_browser {
        return plain(StatusCode::FORBIDDEN, "User agent not allowed\n");
    }
    next.run(request).await
}

/// Toxiproxy's router answers unknown routes with Go's plain-text 404.
async fn not_found() -> Response {
    plain(StatusCode::NOT_FOUND, "404 page not found\n")
}

/// Toxiproxy's router answers a known route with a wrong method 405 with an
/// empty body; ours says what went wrong.
async fn method_not_allowed() -> Response {
    plain(StatusCode::METHOD_NOT_ALLOWED, "405 method not allowed\n")
}

/// Toxiproxy's exact body: `{"version": "…"}` and a newline.
async fn version() -> Response {
    let body = format!("{{\"version\": \"{VERSION}\"}}\n");
    ([(header::CONTENT_TYPE, "application/json;charset=utf-8")], body).into_response()
}

/// Decodes a JSON body; Toxiproxy's "bad request body" on failure.
fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("bad request body: {e}")))
}

/// Reads an optional string field, rejecting other types.
fn opt_string(obj: &Value, field: &str) -> Result<Option<String>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(format!("bad request body: {field} must be a string"))),
    }
}

fn opt_bool(obj: &Value, field: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_request(format!("bad request body: {field} must be a boolean"))),
    }
}

/// Validates one proxy object of a create or populate request.
fn proxy_input(obj: &Value, at: &str) -> Result<ProxyInput, ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(format!("bad request body: proxy{at} must be a JSON object")));
    }
    let required = |field: &str| -> Result<String, ApiError> {
        match opt_string(obj, field)? {
            Some(s) if !s.is_empty() => Ok(s),
            _ => Err(ApiError::bad_request(format!("missing required field: {field}{at}"))),
        }
    };
    let name = required("name")?;
    let upstream = required("upstream")?;
    let listen = opt_string(obj, "listen")?.filter(|l| !l.is_empty()).unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let enabled = opt_bool(obj, "enabled")?.unwrap_or(true);
    let half_close = opt_bool(obj, HALF_CLOSE_FIELD)?.unwrap_or(false);
    Ok(ProxyInput { name, listen, upstream, enabled, half_close })
}

fn ok_json(status: StatusCode, body: Value) -> ApiResult {
    Ok((status, Json(body)).into_response())
}

async fn list_proxies(State(reg): Shared) -> ApiResult {
    ok_json(StatusCode::OK, reg.list().await)
}

async fn create_proxy(State(reg): Shared, body: Bytes) -> ApiResult {
    let input = proxy_input(&parse_body(&body)?, "")?;
    ok_json(StatusCode::CREATED, reg.create(input).await?)
}

async fn populate(State(reg): Shared, body: Bytes) -> ApiResult {
    let body = parse_body(&body)?;
    let Value::Array(items) = body else {
        return Err(ApiError::bad_request("bad request body: expected a JSON array of proxies"));
    };
    let mut inputs = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        inputs.push(proxy_input(item, &format!(" at proxy {}", i + 1))?);
    }
    let (proxies, error) = reg.populate(inputs).await;
    match error {
        None => ok_json(StatusCode::CREATED, json!({ "proxies": proxies })),
        Some(e) => {
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = json!({"proxies": proxies, "error": e.message, "status": e.status});
            Ok((status, Json(body)).into_response())
        }
    }
}

async fn show_proxy(State(reg): Shared, Path(proxy): Path<String>) -> ApiResult {
    ok_json(StatusCode::OK, reg.get(&proxy).await?)
}

async fn update_proxy(State(reg): Shared, Path(proxy): Path<String>, body: Bytes) -> ApiResult {
    let body = parse_body(&body)?;
    if !body.is_object() {
        return Err(ApiError::bad_request("bad request body: expected a JSON object"));
    }
    let change = ProxyChange {
        listen: opt_string(&body, "listen")?.filter(|s| !s.is_empty()),
        upstream: opt_string(&body, "upstream")?.filter(|s| !s.is_empty()),
        enabled: opt_bool(&body, "enabled")?,
        half_close: opt_bool(&body, HALF_CLOSE_FIELD)?,
    };
    let updated = reg.update(&proxy, change).await?;
    ok_json(StatusCode::OK, updated)
}

async fn delete_proxy(State(reg): Shared, Path(proxy): Path<String>) -> ApiResult {
    reg.delete(&proxy).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn list_toxics(State(reg): Shared, Path(proxy): Path<String>) -> ApiResult {
    ok_json(StatusCode::OK, reg.toxics(&proxy).await?)
}

/// Toxiproxy's order of judgement: unknown proxy (404), body, stream, type
/// (400), name taken (409), then the attributes (400).
async fn create_toxic(State(reg): Shared, Path(proxy): Path<String>, body: Bytes) -> ApiResult {
    reg.get(&proxy).await?;
    let body = parse_body(&body)?;
    let bad = |e: crate::toxic::ToxicInputError| ApiError::bad_request(e.to_string());
    let head = CreateHead::parse(&body).map_err(bad)?;
    reg.toxic_name_free(&proxy, &head.name).await?;
    let toxic = head.with_attributes(&body).map_err(bad)?;
    ok_json(StatusCode::OK, reg.add_toxic(&proxy, toxic).await?)
}

async fn show_traffic(State(reg): Shared, Path(proxy): Path<String>) -> ApiResult {
    ok_json(StatusCode::OK, reg.traffic(&proxy).await?)
}

async fn show_toxic(State(reg): Shared, Path((proxy, toxic)): Path<(String, String)>) -> ApiResult {
    ok_json(StatusCode::OK, reg.get_toxic(&proxy, &toxic).await?)
}

async fn update_toxic(State(reg): Shared, Path((proxy, toxic)): Path<(String, String)>, body: Bytes) -> ApiResult {
    reg.get_toxic(&proxy, &toxic).await?;
    let body = parse_body(&body)?;
    ok_json(StatusCode::OK, reg.update_toxic(&proxy, &toxic, &body).await?)
}

async fn delete_toxic(State(reg): Shared, Path((proxy, toxic)): Path<(String, String)>) -> ApiResult {
    reg.remove_toxic(&proxy, &toxic).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn reset(State(reg): Shared) -> ApiResult {
    reg.reset().await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
