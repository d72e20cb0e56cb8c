//! A typed async client for the control plane and the target, used by the runner, the
//! harness, the demo and the tests. A transport failure (no answer) is kept apart from a
//! definite answer: only the latter may be read as a decision.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::wire::*;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer: the outcome is unknown.
    #[error("no answer from {url}: {message}")]
    Transport { url: String, message: String },
    /// An answer that is an error (`{"error", "code", "status"}`).
    #[error("{} {}: {}", .0.status, .0.code, .0.error)]
    Refused(ErrorBody),
    /// An answer that is neither the expected body nor an error body.
    #[error("unexpected answer {status} from {url}: {body}")]
    Unexpected { url: String, status: u16, body: String },
}

impl ClientError {
    pub fn is_transport(&self) -> bool {
        matches!(self, ClientError::Transport { .. })
    }

    /// No answer, or an answer that the outcome is unknown (503: the server could not tell
    /// whether the request took effect, e.g. its database did not answer a COMMIT). Either
    /// way the request may or may not have taken effect; repeating it is how to learn.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            ClientError::Transport { .. } => true,
            ClientError::Refused(body) => body.status == 503,
            ClientError::Unexpected { status, .. } => *status == 503,
        }
    }
}

#[derive(Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Client {
    /// A client for `base` (`http://host:port`) with a per-request timeout.
    pub fn new(base: &str, token: Option<&str>, timeout: Duration) -> Client {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .expect("a plain HTTP client builds");
        Client { base: base.trim_end_matches('/').to_string(), token: token.map(str::to_string), http }
    }

    pub fn with_token(&self, token: &str) -> Client {
        Client { token: Some(token.to_string()), ..self.clone() }
    }

    /// The same client (token, timeouts) for another server.
    pub fn at(&self, base: &str) -> Client {
        Client { base: base.trim_end_matches('/').to_string(), ..self.clone() }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Sends a request and returns the status and the raw JSON of any answer.
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<(u16, serde_json::Value), ClientError> {
        let url = format!("{}{}", self.base, path);
        let mut request = self.http.request(method, &url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let transport = |error: reqwest::Error| ClientError::Transport { url: url.clone(), message: causes(&error) };
        let response = request.send().await.map_err(transport)?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(transport)?;
        let value = serde_json::from_slice(&bytes).map_err(|_| ClientError::Unexpected {
            url: url.clone(),
            status,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })?;
        Ok((status, value))
    }

    /// Expects a 2xx answer of type `T` (or, for `also_ok` statuses, also a `T`).
    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
        also_ok: &[u16],
    ) -> Result<T, ClientError> {
        let (status, value) = self.raw(method, path, body).await?;
        let expected = (200..300).contains(&status) || also_ok.contains(&status);
        if expected {
            if let Ok(parsed) = serde_json::from_value(value.clone()) {
                return Ok(parsed);
            }
        }
        match serde_json::from_value::<ErrorBody>(value.clone()) {
            Ok(error) => Err(ClientError::Refused(error)),
            Err(_) => {
                Err(ClientError::Unexpected { url: format!("{}{}", self.base, path), status, body: value.to_string() })
            }
        }
    }

    pub async fn health(&self) -> Result<serde_json::Value, ClientError> {
        self.call(reqwest::Method::GET, "/v1/health", None::<&()>, &[]).await
    }

    pub async fn create_project(&self, id: &str) -> Result<ProjectCreated, ClientError> {
        self.call(reqwest::Method::POST, "/v1/projects", Some(&CreateProject { id: id.to_string() }), &[]).await
    }

    pub async fn register_runner(&self, request: &RegisterRunner) -> Result<RunnerRegistered, ClientError> {
        self.call(reqwest::Method::POST, "/v1/runners", Some(request), &[]).await
    }

    pub async fn submit(&self, request: &SubmitJob) -> Result<JobSubmitted, ClientError> {
        self.call(reqwest::Method::POST, "/v1/jobs", Some(request), &[]).await
    }

    pub async fn claim(&self, request: &ClaimRequest) -> Result<ClaimResponse, ClientError> {
        self.call(reqwest::Method::POST, "/v1/claim", Some(request), &[]).await
    }

    /// Heartbeat, capability and result answer a [`Ruling`] with 200 or 409.
    pub async fn heartbeat(&self, request: &HeartbeatRequest) -> Result<Ruling, ClientError> {
        self.call(reqwest::Method::POST, "/v1/heartbeat", Some(request), &[409]).await
    }

    pub async fn capability(&self, request: &CapabilityRequest) -> Result<Ruling, ClientError> {
        self.call(reqwest::Method::POST, "/v1/capability", Some(request), &[409]).await
    }

    pub async fn result(&self, request: &ResultRequest) -> Result<Ruling, ClientError> {
        self.call(reqwest::Method::POST, "/v1/result", Some(request), &[409]).await
    }

    pub async fn reconcile(&self, request: &ReconcileRequest) -> Result<JobView, ClientError> {
        self.call(reqwest::Method::POST, "/v1/reconcile", Some(request), &[]).await
    }

    pub async fn job(&self, id: &str) -> Result<JobView, ClientError> {
        self.call(reqwest::Method::GET, &format!("/v1/jobs/{id}"), None::<&()>, &[]).await
    }

    pub async fn jobs(&self) -> Result<Vec<JobView>, ClientError> {
        self.call(reqwest::Method::GET, "/v1/jobs", None::<&()>, &[]).await
    }

    /// The whole ledger, page by page (bounded by `entries_max`).
    pub async fn ledger(&self, entries_max: usize) -> Result<Vec<LedgerEntry>, ClientError> {
        let mut all: Vec<LedgerEntry> = Vec::new();
        while all.len() < entries_max {
            let after = all.last().map_or(0, |entry| entry.seq);
            let page: Vec<LedgerEntry> = self
                .call(reqwest::Method::GET, &format!("/v1/ledger?after={after}&limit=5000"), None::<&()>, &[])
                .await?;
            if page.is_empty() {
                break;
            }
            all.extend(page);
        }
        Ok(all)
    }

    /// One page of the ledger: the entries after `seq = after`, at most `limit`.
    pub async fn ledger_page(&self, after: u64, limit: u64) -> Result<Vec<LedgerEntry>, ClientError> {
        self.call(reqwest::Method::GET, &format!("/v1/ledger?after={after}&limit={limit}"), None::<&()>, &[]).await
    }

    /// A target step: 200 applied, 409 refused; both carry the record.
    pub async fn step(&self, request: &StepRequest) -> Result<StepResponse, ClientError> {
        self.call(reqwest::Method::POST, "/v1/steps", Some(request), &[409]).await
    }

    /// The target's whole step log (bounded by `entries_max`).
    pub async fn steps(&self, entries_max: usize) -> Result<Vec<StepRecord>, ClientError> {
        let mut all: Vec<StepRecord> = Vec::new();
        while all.len() < entries_max {
            let page = self.steps_after(all.len()).await?;
            if page.is_empty() {
                break;
            }
            all.extend(page);
        }
        Ok(all)
    }

    /// One page of the target's step log: the records after the first `after`.
    pub async fn steps_after(&self, after: usize) -> Result<Vec<StepRecord>, ClientError> {
        self.call(reqwest::Method::GET, &format!("/v1/steps?after={after}&limit=10000"), None::<&()>, &[]).await
    }
}

/// An error and every cause beneath it, joined: reqwest's own text ("error sending request
/// for url …") says neither a timeout nor a reset, which its sources do.
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transport failure says why there was no answer: a refused connection and a server
    /// that never answers read differently.
    #[tokio::test]
    async fn a_transport_failure_names_its_cause() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let refused = Client::new(&format!("http://{addr}"), None, Duration::from_secs(2)).health().await.unwrap_err();
        assert!(refused.is_transport() && refused.to_string().to_lowercase().contains("refused"), "{refused}");
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let client = Client::new(&format!("http://{addr}"), None, Duration::from_millis(300));
        let timed_out = client.health().await.unwrap_err();
        assert!(timed_out.is_transport() && timed_out.to_string().contains("timed out"), "{timed_out}");
        drop(silent);
    }
}
