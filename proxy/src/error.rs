//! Error types: `Error` for the library's own operations (starting the server),
//! `ApiError` for REST answers in Toxiproxy's `{"error": ..., "status": N}` shape,
//! and `ClientError` for the client's view of a failed request.

use std::io;

/// Failure of a server-side library operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The REST API could not bind its address.
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: io::Error },
    /// The REST API server stopped with an I/O error.
    #[error("api server failed: {0}")]
    Serve(#[source] io::Error),
}

/// A REST error with its HTTP status, rendered as Toxiproxy renders it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub(crate) fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into() }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, message)
    }

    pub(crate) fn proxy_not_found() -> Self {
        ApiError::new(404, "proxy not found")
    }

    pub(crate) fn toxic_not_found() -> Self {
        ApiError::new(404, "toxic not found")
    }

    /// Toxiproxy's body: `{"error": message, "status": code}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"error": self.message, "status": self.status})
    }
}

/// Failure seen by [`crate::Client`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The base URL is not `http://HOST:PORT`.
    #[error("invalid toxiproxy url {0:?}: expected http://HOST:PORT")]
    BadUrl(String),
    /// Transport failure (connect, timeout, body).
    #[error("toxiproxy request failed: {0}")]
    Http(#[from] reqwest::Error),
    /// The server answered with an error status.
    #[error("toxiproxy answered {status}: {message}")]
    Api { status: u16, message: String },
    /// The server's answer did not have the expected shape.
    #[error("unexpected toxiproxy answer: {0}")]
    Decode(String),
    /// The server lacks a fencelab-only option that was asked for.
    #[error("not supported by this toxiproxy: {0}")]
    Unsupported(String),
}
