//! The proxy collection behind the REST API: Toxiproxy's proxy and toxic
//! semantics (create, populate, update, enable/disable, toxics, reset) and the
//! lifecycle of each proxy's listener and connections.
//!
//! All changes go through one async mutex so that every request sees a
//! consistent collection and a listener is bound or closed before the answer
//! is sent. Each running proxy has one accept task that owns its connections,
//! so stopping it closes the listener and every connection, and waits for both.

use crate::error::ApiError;
use crate::link::{run_connection, ConnCtx, Installed, ToxicSet};
use crate::toxic::{Stream, Toxic};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch, Mutex};
use tokio::task::{JoinHandle, JoinSet};

/// Listen address used when a request gives none.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:0";
/// Longest wait for a proxy's accept task to close its connections.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A running proxy's accept task and the way to stop it.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// One proxy and its toxics.
struct ProxyEntry {
    name: String,
    /// The listen address as last requested (may be `host:0`).
    listen_requested: String,
    /// The address reported: the bound one once the proxy has run.
    listen: String,
    upstream: String,
    enabled: bool,
    toxics: Vec<Arc<Installed>>,
    toxics_tx: watch::Sender<Arc<ToxicSet>>,
    running: Option<Running>,
    conn_counter: Arc<AtomicU64>,
}

/// Validated fields of a proxy create or populate entry.
pub(crate) struct ProxyInput {
    pub name: String,
    pub listen: String,
    pub upstream: String,
    pub enabled: bool,
}

/// The collection of proxies, shared by the API handlers.
pub(crate) struct Registry {
    seed: u64,
    next_uid: AtomicU64,
    proxies: Mutex<BTreeMap<String, ProxyEntry>>,
}

impl ProxyEntry {
    fn new(input: ProxyInput) -> Self {
        let (toxics_tx, _) = watch::channel(Arc::new(ToxicSet::default()));
        ProxyEntry {
            name: input.name,
            listen_requested: input.listen.clone(),
            listen: input.listen,
            upstream: input.upstream,
            enabled: input.enabled,
            toxics: Vec::new(),
            toxics_tx,
            running: None,
            conn_counter: Arc::new(AtomicU64::new(0)),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": self.toxics_json(),
        })
    }

    fn toxics_json(&self) -> Vec<Value> {
        self.toxics.iter().map(|t| t.toxic.to_json()).collect()
    }

    fn find_toxic(&self, name: &str) -> Result<usize, ApiError> {
        self.toxics.iter().position(|t| t.toxic.name == name).ok_or_else(ApiError::toxic_not_found)
    }

    /// Tells live connections about the current toxics.
    fn publish(&self) {
        let mut set = ToxicSet::default();
        for t in &self.toxics {
            match t.toxic.stream {
                Stream::Upstream => set.upstream.push(t.clone()),
                Stream::Downstream => set.downstream.push(t.clone()),
            }
        }
        self.toxics_tx.send_replace(Arc::new(set));
    }

    /// Binds the listener and starts accepting; reports the bound address.
    async fn start(&mut self, seed: u64) -> Result<(), ApiError> {
        if self.running.is_some() {
            return Ok(());
        }
        let listener = TcpListener::bind(self.listen.as_str())
            .await
            .map_err(|e| ApiError::new(500, format!("listen {}: {e}", self.listen)))?;
        if let Ok(addr) = listener.local_addr() {
            self.listen = addr.to_string();
        }
        let (stop, stop_rx) = oneshot::channel();
        let ctx = ConnCtx {
            seed,
            proxy: Arc::from(self.name.as_str()),
            conn_index: 0,
            upstream: Arc::from(self.upstream.as_str()),
            toxics: self.toxics_tx.subscribe(),
        };
        let counter = self.conn_counter.clone();
        let task = tokio::spawn(accept_loop(listener, stop_rx, ctx, counter));
        self.running = Some(Running { stop, task });
        Ok(())
    }

    /// Closes the listener and every connection, and waits until they are gone.
    async fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = running.stop.send(());
            let abort = running.task.abort_handle();
            if tokio::time::timeout(STOP_TIMEOUT, running.task).await.is_err() {
                abort.abort();
            }
        }
    }
}

/// Accepts connections until told to stop, then closes all of them.
async fn accept_loop(listener: TcpListener, mut stop: oneshot::Receiver<()>, ctx: ConnCtx, counter: Arc<AtomicU64>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => {
                    let mut conn_ctx = ctx.clone();
                    conn_ctx.conn_index = counter.fetch_add(1, Ordering::Relaxed);
                    conns.spawn(run_connection(socket, conn_ctx));
                }
                // Out of descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
}

impl Registry {
    pub(crate) fn new(seed: u64) -> Self {
        Registry { seed, next_uid: AtomicU64::new(1), proxies: Mutex::new(BTreeMap::new()) }
    }

    fn uid(&self) -> u64 {
        self.next_uid.fetch_add(1, Ordering::Relaxed)
    }

    /// GET /proxies: name → proxy with toxics.
    pub(crate) async fn list(&self) -> Value {
        let proxies = self.proxies.lock().await;
        let map: Map<String, Value> = proxies.iter().map(|(name, p)| (name.clone(), p.to_json())).collect();
        Value::Object(map)
    }

    /// POST /proxies.
    pub(crate) async fn create(&self, input: ProxyInput) -> Result<Value, ApiError> {
        let mut proxies = self.proxies.lock().await;
        if proxies.contains_key(&input.name) {
            return Err(ApiError::new(409, "proxy already exists"));
        }
        let mut entry = ProxyEntry::new(input);
        if entry.enabled {
            entry.start(self.seed).await?;
        }
        let body = entry.to_json();
        proxies.insert(entry.name.clone(), entry);
        Ok(body)
    }

    /// POST /populate: inputs are already validated. Keeps identical existing
    /// proxies (and their toxics), replaces the others. On a bind failure it
    /// answers the error together with the proxies handled so far.
    pub(crate) async fn populate(&self, inputs: Vec<ProxyInput>) -> (Vec<Value>, Option<ApiError>) {
        let mut proxies = self.proxies.lock().await;
        let mut done = Vec::with_capacity(inputs.len());
        for input in inputs {
            if let Some(existing) = proxies.get(&input.name) {
                let same_listen = input.listen == existing.listen || input.listen == existing.listen_requested;
                if same_listen && input.upstream == existing.upstream {
                    done.push(existing.to_json());
                    continue;
                }
            }
            if let Some(mut old) = proxies.remove(&input.name) {
                old.stop().await;
            }
            let mut entry = ProxyEntry::new(input);
            if entry.enabled {
                if let Err(e) = entry.start(self.seed).await {
                    return (done, Some(e));
                }
            }
            done.push(entry.to_json());
            proxies.insert(entry.name.clone(), entry);
        }
        (done, None)
    }

    /// GET /proxies/{name}.
    pub(crate) async fn get(&self, name: &str) -> Result<Value, ApiError> {
        let proxies = self.proxies.lock().await;
        let entry = proxies.get(name).ok_or_else(ApiError::proxy_not_found)?;
        Ok(entry.to_json())
    }

    /// POST/PATCH /proxies/{name}: unspecified fields keep their values.
    pub(crate) async fn update(
        &self,
        name: &str,
        listen: Option<String>,
        upstream: Option<String>,
        enabled: Option<bool>,
    ) -> Result<Value, ApiError> {
        let mut proxies = self.proxies.lock().await;
        let entry = proxies.get_mut(name).ok_or_else(ApiError::proxy_not_found)?;
        let old = (entry.listen.clone(), entry.upstream.clone(), entry.enabled);
        let listen = listen.filter(|l| *l != entry.listen && *l != entry.listen_requested);
        let upstream = upstream.filter(|u| *u != entry.upstream);
        let enabled = enabled.unwrap_or(entry.enabled);
        if listen.is_some() || upstream.is_some() || !enabled {
            entry.stop().await;
        }
        if let Some(l) = listen {
            entry.listen_requested = l.clone();
            entry.listen = l;
        }
        if let Some(u) = upstream {
            entry.upstream = u;
        }
        entry.enabled = enabled;
        if enabled {
            if let Err(e) = entry.start(self.seed).await {
                (entry.listen, entry.upstream, entry.enabled) = old;
                if entry.enabled {
                    let _ = entry.start(self.seed).await;
                }
                return Err(e);
            }
        }
        Ok(entry.to_json())
    }

    /// DELETE /proxies/{name}.
    pub(crate) async fn delete(&self, name: &str) -> Result<(), ApiError> {
        let mut proxies = self.proxies.lock().await;
        let mut entry = proxies.remove(name).ok_or_else(ApiError::proxy_not_found)?;
        entry.stop().await;
        Ok(())
    }

    /// GET /proxies/{name}/toxics.
    pub(crate) async fn toxics(&self, proxy: &str) -> Result<Value, ApiError> {
        let proxies = self.proxies.lock().await;
        let entry = proxies.get(proxy).ok_or_else(ApiError::proxy_not_found)?;
        Ok(Value::Array(entry.toxics_json()))
    }

    /// POST /proxies/{name}/toxics: names are unique across both streams.
    pub(crate) async fn add_toxic(&self, proxy: &str, toxic: Toxic) -> Result<Value, ApiError> {
        let mut proxies = self.proxies.lock().await;
        let entry = proxies.get_mut(proxy).ok_or_else(ApiError::proxy_not_found)?;
        if entry.toxics.iter().any(|t| t.toxic.name == toxic.name) {
            return Err(ApiError::new(409, "toxic already exists"));
        }
        let body = toxic.to_json();
        let uid = self.uid();
        entry.toxics.push(Arc::new(Installed { uid, toxic }));
        entry.publish();
        Ok(body)
    }

    /// GET /proxies/{name}/toxics/{toxic}.
    pub(crate) async fn get_toxic(&self, proxy: &str, name: &str) -> Result<Value, ApiError> {
        let proxies = self.proxies.lock().await;
        let entry = proxies.get(proxy).ok_or_else(ApiError::proxy_not_found)?;
        let idx = entry.find_toxic(name)?;
        Ok(entry.toxics[idx].toxic.to_json())
    }

    /// POST/PATCH /proxies/{name}/toxics/{toxic}: merges attributes and toxicity.
    pub(crate) async fn update_toxic(&self, proxy: &str, name: &str, body: &Value) -> Result<Value, ApiError> {
        let mut proxies = self.proxies.lock().await;
        let entry = proxies.get_mut(proxy).ok_or_else(ApiError::proxy_not_found)?;
        let idx = entry.find_toxic(name)?;
        let toxic = entry.toxics[idx].toxic.merged_with(body).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let out = toxic.to_json();
        let uid = self.uid();
        entry.toxics[idx] = Arc::new(Installed { uid, toxic });
        entry.publish();
        Ok(out)
    }

    /// DELETE /proxies/{name}/toxics/{toxic}.
    pub(crate) async fn remove_toxic(&self, proxy: &str, name: &str) -> Result<(), ApiError> {
        let mut proxies = self.proxies.lock().await;
        let entry = proxies.get_mut(proxy).ok_or_else(ApiError::proxy_not_found)?;
        let idx = entry.find_toxic(name)?;
        entry.toxics.remove(idx);
        entry.publish();
        Ok(())
    }

    /// POST /reset: enables every proxy and removes every toxic.
    pub(crate) async fn reset(&self) -> Result<(), ApiError> {
        let mut proxies = self.proxies.lock().await;
        let mut first_error = None;
        for entry in proxies.values_mut() {
            entry.toxics.clear();
            entry.publish();
            entry.enabled = true;
            if let Err(e) = entry.start(self.seed).await {
                entry.enabled = false;
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Stops every proxy (server shutdown).
    pub(crate) async fn stop_all(&self) {
        let mut proxies = self.proxies.lock().await;
        for entry in proxies.values_mut() {
            entry.stop().await;
        }
        proxies.clear();
    }
}
