//! The async client the harness uses to drive proxies, over Toxiproxy's REST
//! API only, so the same code drives the embedded server and a real Toxiproxy.
//!
//! It is a typed client over reqwest 0.12 rather than a wrapper of the
//! `toxiproxy_rust` crate, which cannot serve here: it has no reset_peer toxic,
//! no way to name a toxic or remove a single one, panics when a toxic cannot be
//! created, reports HTTP error statuses as success, and pulls a second HTTP
//! stack (reqwest 0.11 with OpenSSL). See `docs/toxiproxy.md`.

use crate::error::ClientError;
use crate::toxic::Toxic;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// Bound on every request, connect included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// The proxy field of fencelab's half-close option (the server's name for it).
const HALF_CLOSE_FIELD: &str = "fencelab_half_close";

/// A proxy as the server reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyInfo {
    pub name: String,
    /// The listen address; once enabled, the bound one (port 0 resolved).
    pub listen: String,
    pub upstream: String,
    pub enabled: bool,
    /// Toxics of known types, in the server's order.
    pub toxics: Vec<Toxic>,
    /// fencelab's half-close option (field `fencelab_half_close`): a plain EOF
    /// is forwarded as a FIN and the other direction stays open. Only the
    /// embedded server has it; a real Toxiproxy always reports false.
    pub half_close: bool,
}

impl ProxyInfo {
    /// The listen address as a socket address (fails for unresolved host names).
    pub fn listen_addr(&self) -> Result<SocketAddr, ClientError> {
        self.listen.parse().map_err(|_| ClientError::Decode(format!("listen address {:?}", self.listen)))
    }

    fn from_json(value: &Value) -> Result<ProxyInfo, ClientError> {
        let text = |field: &str| {
            value
                .get(field)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| ClientError::Decode(format!("proxy without {field}: {value}")))
        };
        let toxics = value
            .get("toxics")
            .and_then(Value::as_array)
            .map(|list| list.iter().filter_map(|t| Toxic::from_create_json(t).ok()).collect())
            .unwrap_or_default();
        Ok(ProxyInfo {
            name: text("name")?,
            listen: text("listen")?,
            upstream: text("upstream")?,
            enabled: value.get("enabled").and_then(Value::as_bool).unwrap_or(false),
            toxics,
            half_close: value.get(HALF_CLOSE_FIELD).and_then(Value::as_bool).unwrap_or(false),
        })
    }
}

/// Client of a Toxiproxy (or fencelab's) REST API.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// A client for `http://HOST:PORT` (a trailing slash is accepted).
    pub fn new(base_url: &str) -> Result<Client, ClientError> {
        let base = base_url.trim_end_matches('/');
        let host = base.strip_prefix("http://").ok_or_else(|| ClientError::BadUrl(base_url.to_string()))?;
        if host.is_empty() || host.contains('/') || !host.contains(':') {
            return Err(ClientError::BadUrl(base_url.to_string()));
        }
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .no_proxy()
            .user_agent(concat!("fencelab-proxy/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Client { base: base.to_string(), http })
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// Sends a request; answers the JSON body (Null when empty) or the API error.
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value, ClientError> {
        let mut request = self.http.request(method, format!("{}{}", self.base, path));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status();
        let bytes = response.bytes().await?;
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).or_else(|_| {
            // Old Toxiproxy answers /version in plain text.
            Ok(Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        })
    }

    /// The server's version string.
    pub async fn version(&self) -> Result<String, ClientError> {
        let body = self.call(Method::GET, "/version", None).await?;
        match body {
            Value::String(s) => Ok(s),
            other => other
                .get("version")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| ClientError::Decode(other.to_string())),
        }
    }

    /// All proxies by name.
    pub async fn proxies(&self) -> Result<BTreeMap<String, ProxyInfo>, ClientError> {
        let body = self.call(Method::GET, "/proxies", None).await?;
        let map = body.as_object().ok_or_else(|| ClientError::Decode(body.to_string()))?;
        map.iter().map(|(name, p)| Ok((name.clone(), ProxyInfo::from_json(p)?))).collect()
    }

    /// One proxy.
    pub async fn proxy(&self, name: &str) -> Result<ProxyInfo, ClientError> {
        let body = self.call(Method::GET, &proxy_path(name), None).await?;
        ProxyInfo::from_json(&body)
    }

    /// Creates an enabled proxy; `listen` may use port 0, the answer has the bound port.
    pub async fn create_proxy(&self, name: &str, listen: &str, upstream: &str) -> Result<ProxyInfo, ClientError> {
        let body = json!({"name": name, "listen": listen, "upstream": upstream, "enabled": true});
        let body = self.call(Method::POST, "/proxies", Some(body)).await?;
        ProxyInfo::from_json(&body)
    }

    /// Creates an enabled proxy with fencelab's half-close option: when one side
    /// ends its sending (EOF), the proxy forwards the FIN and keeps the other
    /// direction open, so an answer sent after the client's half-close still
    /// reaches it. Toxiproxy has no such option and closes the whole
    /// connection; against a server that does not report the option back (a
    /// real Toxiproxy), the proxy just created is deleted again and the answer
    /// is [`ClientError::Unsupported`].
    pub async fn create_proxy_half_close(
        &self,
        name: &str,
        listen: &str,
        upstream: &str,
    ) -> Result<ProxyInfo, ClientError> {
        let body =
            json!({"name": name, "listen": listen, "upstream": upstream, "enabled": true, HALF_CLOSE_FIELD: true});
        let body = self.call(Method::POST, "/proxies", Some(body)).await?;
        let created = ProxyInfo::from_json(&body)?;
        if !created.half_close {
            let _ = self.delete_proxy(name).await;
            return Err(ClientError::Unsupported(format!(
                "the server at {} has no half-close option (a real Toxiproxy closes the whole connection)",
                self.base
            )));
        }
        Ok(created)
    }

    /// Sets fencelab's half-close option of a proxy for the connections it
    /// accepts from now on; [`ClientError::Unsupported`] when the server does
    /// not report the option back as set (a real Toxiproxy ignores the field).
    pub async fn set_half_close(&self, name: &str, half_close: bool) -> Result<ProxyInfo, ClientError> {
        let body = json!({ HALF_CLOSE_FIELD: half_close });
        let body = self.call(Method::POST, &proxy_path(name), Some(body)).await?;
        let info = ProxyInfo::from_json(&body)?;
        if info.half_close != half_close {
            return Err(ClientError::Unsupported(format!("the server at {} has no half-close option", self.base)));
        }
        Ok(info)
    }

    /// Creates or replaces proxies in one request (their toxics are ignored;
    /// the half-close option is sent only where set).
    pub async fn populate(&self, proxies: &[ProxyInfo]) -> Result<Vec<ProxyInfo>, ClientError> {
        let list: Vec<Value> = proxies
            .iter()
            .map(|p| {
                let mut entry =
                    json!({"name": p.name, "listen": p.listen, "upstream": p.upstream, "enabled": p.enabled});
                if p.half_close {
                    entry[HALF_CLOSE_FIELD] = Value::Bool(true);
                }
                entry
            })
            .collect();
        let body = self.call(Method::POST, "/populate", Some(Value::Array(list))).await?;
        let created =
            body.get("proxies").and_then(Value::as_array).ok_or_else(|| ClientError::Decode(body.to_string()))?;
        created.iter().map(ProxyInfo::from_json).collect()
    }

    /// Enables or disables a proxy; disabling closes its connections and listener.
    pub async fn set_enabled(&self, name: &str, enabled: bool) -> Result<ProxyInfo, ClientError> {
        let body = json!({ "enabled": enabled });
        let body = self.call(Method::POST, &proxy_path(name), Some(body)).await?;
        ProxyInfo::from_json(&body)
    }

    /// Changes a proxy's upstream (Toxiproxy restarts the proxy).
    pub async fn set_upstream(&self, name: &str, upstream: &str) -> Result<ProxyInfo, ClientError> {
        let body = json!({ "upstream": upstream });
        let body = self.call(Method::POST, &proxy_path(name), Some(body)).await?;
        ProxyInfo::from_json(&body)
    }

    /// Deletes a proxy.
    pub async fn delete_proxy(&self, name: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &proxy_path(name), None).await.map(drop)
    }

    /// A proxy's toxics (of known types).
    pub async fn toxics(&self, proxy: &str) -> Result<Vec<Toxic>, ClientError> {
        let body = self.call(Method::GET, &format!("{}/toxics", proxy_path(proxy)), None).await?;
        let list = body.as_array().ok_or_else(|| ClientError::Decode(body.to_string()))?;
        list.iter().map(decode_toxic).collect()
    }

    /// Adds a toxic; answers it as the server stored it.
    pub async fn add_toxic(&self, proxy: &str, toxic: &Toxic) -> Result<Toxic, ClientError> {
        let path = format!("{}/toxics", proxy_path(proxy));
        let body = self.call(Method::POST, &path, Some(toxic.to_json())).await?;
        decode_toxic(&body)
    }

    /// Replaces the attributes and toxicity of the toxic named `toxic.name`.
    pub async fn update_toxic(&self, proxy: &str, toxic: &Toxic) -> Result<Toxic, ClientError> {
        let path = toxic_path(proxy, &toxic.name);
        let body = json!({"attributes": toxic.kind.attributes_json(), "toxicity": toxic.toxicity});
        let body = self.call(Method::POST, &path, Some(body)).await?;
        decode_toxic(&body)
    }

    /// Removes one toxic.
    pub async fn remove_toxic(&self, proxy: &str, name: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &toxic_path(proxy, name), None).await.map(drop)
    }

    /// How many connections the `commit_cut` toxic `name` on `proxy` has cut so far
    /// (fencelab's `fencelab_cuts` field; a server without it answers a decode error).
    pub async fn commit_cuts(&self, proxy: &str, name: &str) -> Result<u64, ClientError> {
        let body = self.call(Method::GET, &toxic_path(proxy, name), None).await?;
        body[crate::link::CUTS_FIELD].as_u64().ok_or_else(|| ClientError::Decode(body.to_string()))
    }

    /// How many connections the one-sided reset `name` (`reset_upstream`,
    /// `reset_downstream`) on `proxy` has reset so far (fencelab's `fencelab_resets` field;
    /// a real Toxiproxy has no such toxic, and answers 404 or a decode error).
    pub async fn resets(&self, proxy: &str, name: &str) -> Result<u64, ClientError> {
        let body = self.call(Method::GET, &toxic_path(proxy, name), None).await?;
        body[crate::link::RESETS_FIELD].as_u64().ok_or_else(|| ClientError::Decode(body.to_string()))
    }

    /// The bytes proxy `name` has read from either side since it was created (fencelab's
    /// `GET /proxies/{name}/fencelab_traffic`; a real Toxiproxy answers 404).
    pub async fn traffic_bytes(&self, name: &str) -> Result<u64, ClientError> {
        let body = self.call(Method::GET, &format!("{}/fencelab_traffic", proxy_path(name)), None).await?;
        body["bytes"].as_u64().ok_or_else(|| ClientError::Decode(body.to_string()))
    }

    /// Enables every proxy and removes every toxic.
    pub async fn reset(&self) -> Result<(), ClientError> {
        self.call(Method::POST, "/reset", None).await.map(drop)
    }
}

fn decode_toxic(value: &Value) -> Result<Toxic, ClientError> {
    Toxic::from_create_json(value).map_err(|e| ClientError::Decode(format!("{e}: {value}")))
}

/// Percent-encodes a path segment (proxy and toxic names are free text).
fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn proxy_path(name: &str) -> String {
    format!("/proxies/{}", segment(name))
}

fn toxic_path(proxy: &str, toxic: &str) -> String {
    format!("{}/toxics/{}", proxy_path(proxy), segment(toxic))
}

/// Builds the error of a failed answer; Toxiproxy's body names it in `error`
/// (older servers: `title`).
fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let message = parsed
        .as_ref()
        .and_then(|v| v.get("error").or_else(|| v.get("title")))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
    ClientError::Api { status: status.as_u16(), message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_http_host_port() {
        assert!(Client::new("http://127.0.0.1:8474").is_ok());
        assert!(Client::new("http://127.0.0.1:8474/").is_ok());
        assert!(Client::new("127.0.0.1:8474").is_err());
        assert!(Client::new("https://x:1").is_err());
        assert!(Client::new("http://host").is_err());
    }

    #[test]
    fn encodes_names_in_paths() {
        assert_eq!(toxic_path("a b", "l/1"), "/proxies/a%20b/toxics/l%2F1");
    }

    #[test]
    fn error_message_from_either_shape() {
        let e = api_error(StatusCode::CONFLICT, br#"{"error":"proxy already exists","status":409}"#);
        assert!(e.to_string().contains("proxy already exists"));
        let e = api_error(StatusCode::NOT_FOUND, br#"{"title":"proxy not found","status":404}"#);
        assert!(e.to_string().contains("proxy not found"));
    }
}
