//! The proxy collection behind the REST API: Toxiproxy's proxy and toxic
//! semantics (create, populate, update, enable/disable, toxics, reset) and the
//! lifecycle of each proxy's listener and connections.
//!
//! All changes go through one async mutex so that every request sees a
//! consistent collection and a listener is bound or closed before the answer
//! is sent. Each running proxy has one accept task that owns its connections,
//! so stopping it closes the listener and every connection, and waits for both.
//!
//! Listen addresses are compared as Toxiproxy 2.12 compares them: two texts
//! are the same address when they resolve to a common socket address, so
//! `localhost:P` is the proxy bound to `127.0.0.1:P`.

use crate::error::ApiError;
use crate::link::{run_connection, ConnCtx, Installed, ToxicSet};
use crate::toxic::{Stream, Toxic, ToxicKind};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch, Mutex};
use tokio::task::{JoinHandle, JoinSet};

/// Listen address used when a request gives none.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:0";
/// Longest wait for a proxy's accept task to close its connections.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for resolving a listen address.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The JSON field of fencelab's per-proxy half-close option (not Toxiproxy's).
pub(crate) const HALF_CLOSE_FIELD: &str = "fencelab_half_close";

/// A running proxy's accept task and the way to stop it.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// One proxy and its toxics.
struct ProxyEntry {
    name: String,
    /// The address reported: as requested until the proxy first runs, then the
    /// bound one (so a re-enabled proxy gets its port back), as in Toxiproxy.
    listen: String,
    upstream: String,
    enabled: bool,
    /// fencelab's half-close option, read by each new connection.
    half_close: Arc<AtomicBool>,
    toxics: Vec<Arc<Installed>>,
    toxics_tx: watch::Sender<Arc<ToxicSet>>,
    running: Option<Running>,
    conn_counter: Arc<AtomicU64>,
    /// Bytes read from either side over every connection (fencelab's own).
    traffic: Arc<AtomicU64>,
}

/// Validated fields of a proxy create or populate entry.
pub(crate) struct ProxyInput {
    pub name: String,
    pub listen: String,
    pub upstream: String,
    pub enabled: bool,
    pub half_close: bool,
}

/// The fields a proxy update may change; `None` keeps the current value.
#[derive(Debug, Default)]
pub(crate) struct ProxyChange {
    pub listen: Option<String>,
    pub upstream: Option<String>,
    pub enabled: Option<bool>,
    pub half_close: Option<bool>,
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
            listen: input.listen,
            upstream: input.upstream,
            enabled: input.enabled,
            half_close: Arc::new(AtomicBool::new(input.half_close)),
            toxics: Vec::new(),
            toxics_tx,
            running: None,
            conn_counter: Arc::new(AtomicU64::new(0)),
            traffic: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Toxiproxy's proxy shape; the half-close field appears only when set, so
    /// a proxy without it looks exactly like a Toxiproxy one.
    fn to_json(&self) -> Value {
        let mut body = json!({
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": self.toxics_json(),
        });
        if self.half_close.load(Ordering::Relaxed) {
            body[HALF_CLOSE_FIELD] = Value::Bool(true);
        }
        body
    }

    fn toxics_json(&self) -> Vec<Value> {
        self.toxics.iter().map(|t| t.to_json()).collect()
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
        let listener = bind(&self.listen).await?;
        if let Ok(addr) = listener.local_addr() {
            self.listen = addr.to_string();
        }
        let (stop, stop_rx) = oneshot::channel();
        let ctx = ConnCtx {
            seed,
            proxy: Arc::from(self.name.as_str()),
            conn_index: 0,
            traffic: self.traffic.clone(),
            upstream: Arc::from(self.upstream.as_str()),
            toxics: self.toxics_tx.subscribe(),
            half_close: false,
            first_read: None,
        };
        let counter = self.conn_counter.clone();
        let task = tokio::spawn(accept_loop(listener, stop_rx, ctx, counter, self.half_close.clone()));
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

/// Resolves `host:port` (bounded); empty when it does not resolve.
async fn resolve(addr: &str) -> Vec<SocketAddr> {
    match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(addr)).await {
        Ok(Ok(addrs)) => addrs.collect(),
        _ => Vec::new(),
    }
}

/// Toxiproxy 2.12's listen comparison: the same text, or two addresses that
/// resolve to a common socket address (`localhost:P` and `127.0.0.1:P`).
async fn same_address(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let (ra, rb) = (resolve(a).await, resolve(b).await);
    ra.iter().any(|x| rb.contains(x))
}

/// Binds a listen address as Go's `net.Listen("tcp", …)` does (the first IPv4
/// address of a name), with Toxiproxy's error texts, e.g. `listen tcp
/// 127.0.0.1:3310: bind: address already in use`.
async fn bind(listen: &str) -> Result<TcpListener, ApiError> {
    let resolved = match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(listen)).await {
        Ok(Ok(addrs)) => addrs.collect::<Vec<_>>(),
        Ok(Err(e)) => return Err(ApiError::new(500, format!("listen tcp: address {listen}: {}", os_text(&e)))),
        Err(_) => return Err(ApiError::new(500, format!("listen tcp: address {listen}: lookup timed out"))),
    };
    let Some(addr) = resolved.iter().find(|a| a.is_ipv4()).or(resolved.first()).copied() else {
        return Err(ApiError::new(500, format!("listen tcp: address {listen}: no address")));
    };
    TcpListener::bind(addr).await.map_err(|e| ApiError::new(500, format!("listen tcp {addr}: bind: {}", os_text(&e))))
}

/// An I/O error as Go prints it: the system's text, lower case, without
/// Rust's "(os error N)".
fn os_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match text.find(" (os error") {
        Some(at) => &text[..at],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Accepts connections until told to stop, then closes all of them.
async fn accept_loop(
    listener: TcpListener,
    mut stop: oneshot::Receiver<()>,
    ctx: ConnCtx,
    counter: Arc<AtomicU64>,
    half_close: Arc<AtomicBool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => {
                    let mut conn_ctx = ctx.clone();
                    conn_ctx.conn_index = counter.fetch_add(1, Ordering::Relaxed);
                    conn_ctx.half_close = half_close.load(Ordering::Relaxed);
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

    /// POST /populate: inputs are already validated. Keeps an existing proxy
    /// with the same listen address (compared resolved) and upstream, with its
    /// toxics, connections and settings (as Toxiproxy, it ignores `enabled`
    /// then); replaces the others. On a bind failure it answers the error
    /// together with the proxies handled so far.
    pub(crate) async fn populate(&self, inputs: Vec<ProxyInput>) -> (Vec<Value>, Option<ApiError>) {
        let mut proxies = self.proxies.lock().await;
        let mut done = Vec::with_capacity(inputs.len());
        for input in inputs {
            if let Some(existing) = proxies.get(&input.name) {
                if input.upstream == existing.upstream && same_address(&input.listen, &existing.listen).await {
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

    /// POST/PATCH /proxies/{name}: unspecified fields keep their values; a
    /// listen address that resolves to the current one changes nothing; the
    /// half-close option applies to connections accepted from now on.
    pub(crate) async fn update(&self, name: &str, change: ProxyChange) -> Result<Value, ApiError> {
        let ProxyChange { listen, upstream, enabled, half_close } = change;
        let mut proxies = self.proxies.lock().await;
        let entry = proxies.get_mut(name).ok_or_else(ApiError::proxy_not_found)?;
        let old = (entry.listen.clone(), entry.upstream.clone(), entry.enabled);
        let listen = match listen {
            Some(l) if !same_address(&l, &entry.listen).await => Some(l),
            _ => None,
        };
        let upstream = upstream.filter(|u| *u != entry.upstream);
        if let Some(half_close) = half_close {
            entry.half_close.store(half_close, Ordering::Relaxed);
        }
        let enabled = enabled.unwrap_or(entry.enabled);
        if listen.is_some() || upstream.is_some() || !enabled {
            entry.stop().await;
        }
        if let Some(l) = listen {
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

    /// 409 when the proxy has a toxic named `name` (on either stream).
    pub(crate) async fn toxic_name_free(&self, proxy: &str, name: &str) -> Result<(), ApiError> {
        let proxies = self.proxies.lock().await;
        let entry = proxies.get(proxy).ok_or_else(ApiError::proxy_not_found)?;
        if entry.toxics.iter().any(|t| t.toxic.name == name) {
            return Err(ApiError::new(409, "toxic already exists"));
        }
        Ok(())
    }

    /// POST /proxies/{name}/toxics: names are unique across both streams.
    /// A `distinct` `commit_cut` toxic shares the kinds of transaction it has cut with every
    /// such toxic of the same name on the server's other proxies (a fault that cuts every
    /// replica's link takes each kind once over all of them).
    pub(crate) async fn add_toxic(&self, proxy: &str, toxic: Toxic) -> Result<Value, ApiError> {
        let mut proxies = self.proxies.lock().await;
        let distinct = |t: &Toxic| matches!(t.kind, ToxicKind::CommitCut { distinct: true });
        let shared = distinct(&toxic).then(|| {
            proxies.values().flat_map(|entry| &entry.toxics).find(|t| distinct(&t.toxic) && t.toxic.name == toxic.name)
        });
        let shapes = shared.flatten().map(|t| t.shapes.clone()).unwrap_or_default();
        let entry = proxies.get_mut(proxy).ok_or_else(ApiError::proxy_not_found)?;
        if entry.toxics.iter().any(|t| t.toxic.name == toxic.name) {
            return Err(ApiError::new(409, "toxic already exists"));
        }
        let id = self.uid();
        let installed = Arc::new(Installed { id, version: id, toxic, cuts: Arc::default(), shapes });
        let body = installed.to_json();
        entry.toxics.push(installed);
        entry.publish();
        Ok(body)
    }

    /// GET /proxies/{name}/fencelab_traffic (fencelab's own): the bytes the proxy has read
    /// from either side, over every connection since it was created.
    pub(crate) async fn traffic(&self, proxy: &str) -> Result<Value, ApiError> {
        let proxies = self.proxies.lock().await;
        let entry = proxies.get(proxy).ok_or_else(ApiError::proxy_not_found)?;
        Ok(json!({ "name": entry.name, "bytes": entry.traffic.load(Ordering::Relaxed) }))
    }

    /// GET /proxies/{name}/toxics/{toxic}.
    pub(crate) async fn get_toxic(&self, proxy: &str, name: &str) -> Result<Value, ApiError> {
        let proxies = self.proxies.lock().await;
        let entry = proxies.get(proxy).ok_or_else(ApiError::proxy_not_found)?;
        let idx = entry.find_toxic(name)?;
        Ok(entry.toxics[idx].to_json())
    }

    /// POST/PATCH /proxies/{name}/toxics/{toxic}: merges attributes and toxicity.
    pub(crate) async fn update_toxic(&self, proxy: &str, name: &str, body: &Value) -> Result<Value, ApiError> {
        let mut proxies = self.proxies.lock().await;
        let entry = proxies.get_mut(proxy).ok_or_else(ApiError::proxy_not_found)?;
        let idx = entry.find_toxic(name)?;
        let toxic = entry.toxics[idx].toxic.merged_with(body).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let (id, version, cuts) = (entry.toxics[idx].id, self.uid(), entry.toxics[idx].cuts.clone());
        let shapes = entry.toxics[idx].shapes.clone();
        let installed = Arc::new(Installed { id, version, toxic, cuts, shapes });
        let out = installed.to_json();
        entry.toxics[idx] = installed;
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
