//! HTTP plumbing shared by the control plane and the target: JSON bodies read with a size
//! bound and clear errors, JSON error responses, bearer tokens, and serving with a clean stop.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;

use crate::ingress::{Ingress, HEADERS_MAX, HEAD_BYTES_MAX, REFUSED_MALFORMED, REFUSED_TOO_LARGE};
use protocol::body::BodyError;
use protocol::ErrorBody;

/// Largest request body either server reads (64 KiB).
pub const BODY_LIMIT_BYTES: usize = 64 * 1024;

/// An error answered as `{"error", "code", "status"}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody { error: self.message, code: self.code.to_string(), status: self.status };
        (status, Json(body)).into_response()
    }
}

/// Whether a `Content-Type` value names JSON: the media type `application/json`, its type
/// and subtype in any case (they are case-insensitive), with or without parameters, which
/// are ignored (a body is always read as UTF-8). Another subtype or a suffix
/// (`application/problem+json`, `application/jsonp`) is not JSON here.
pub fn names_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default();
    essence.trim().eq_ignore_ascii_case("application/json")
}

/// A query parameter that is a decimal integer: digits only (no sign, no space), at most
/// `u64::MAX`. (`str::parse` would also take a leading `+`.)
pub fn decimal<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let text = <std::borrow::Cow<str> as serde::Deserialize>::deserialize(deserializer)?;
    let digits = !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    let number = digits.then(|| text.parse::<u64>().ok()).flatten();
    number.ok_or_else(|| serde::de::Error::custom(format!("`{text}` is not a decimal integer up to {}", u64::MAX)))
}

/// Reads a JSON body of at most [`BODY_LIMIT_BYTES`] into `T`, naming what was wrong.
pub async fn read_json<T: DeserializeOwned>(headers: &HeaderMap, body: Body) -> Result<T, ApiError> {
    let json =
        headers.get(axum::http::header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).is_some_and(names_json);
    if !json {
        return Err(ApiError::new(415, "unsupported_media_type", "send the body as `Content-Type: application/json`"));
    }
    let bytes = axum::body::to_bytes(body, BODY_LIMIT_BYTES).await.map_err(|_| {
        ApiError::new(413, "body_too_large", format!("the body exceeds {BODY_LIMIT_BYTES} bytes or could not be read"))
    })?;
    protocol::body::parse(&bytes).map_err(|error| {
        let code = match error {
            BodyError::Malformed(_) => "malformed_json",
            BodyError::Invalid(_) => "invalid_body",
        };
        ApiError::new(400, code, error.to_string())
    })
}

/// The bearer token of a request, or a 401. The header is matched exactly as
/// `Bearer <token>`: the scheme in that case, one space, and the token as it is (no other
/// spelling of the scheme and no whitespace around the token is taken for it).
pub fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .filter(|token| !token.is_empty())
        .ok_or_else(|| ApiError::new(401, "unauthorized", "send `Authorization: Bearer <token>`"))
}

/// The fallback of both servers: no such route, or a request [`crate::ingress`] refused.
pub async fn no_route(uri: axum::http::Uri) -> ApiError {
    match uri.path() {
        REFUSED_MALFORMED => ApiError::new(400, "malformed_request", "the request is not an HTTP/1.1 request"),
        REFUSED_TOO_LARGE => ApiError::new(
            431,
            "headers_too_large",
            format!("the request head exceeds {HEAD_BYTES_MAX} bytes or {HEADERS_MAX} header fields"),
        ),
        _ => ApiError::new(404, "no_route", "no such endpoint; see docs/protocol.md"),
    }
}

pub async fn wrong_method() -> ApiError {
    ApiError::new(405, "method_not_allowed", "this endpoint does not take that method; see docs/protocol.md")
}

/// Serves `router` on `listener` until `stop` resolves. Incoming bytes go through
/// [`Ingress`], so that every request, however malformed, gets the JSON error body.
///
/// HTTP/1 half-closes are honoured: a request whose client already shut its write side (or
/// gave up and closed) is still handled. A request that the network delivered late, after
/// its sender stopped waiting, is exactly what a fencing lab must receive and judge.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let service = hyper_util::service::TowerToHyperService::new(router);
    tokio::pin!(stop);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(_) => {
                    // Out of descriptors or a connection reset before accept: pause, go on.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = &mut stop => return Ok(()),
        };
        let service = service.clone();
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(Ingress::new(stream));
            let connection = hyper::server::conn::http1::Builder::new().half_close(true).serve_connection(io, service);
            let _ = connection.await;
        });
    }
}
