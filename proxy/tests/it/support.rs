//! Shared helpers: a server per test, loopback upstreams (echo, scripted),
//! raw HTTP calls, and bounded waits.

use proxy::ServerHandle;
use serde_json::Value;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Upper bound of any single test.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound of a single wait inside a test.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs a test body under [`TEST_TIMEOUT`].
pub async fn bounded<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(TEST_TIMEOUT, body).await.expect("test exceeded its time bound");
}

/// Awaits `f` for at most [`STEP_TIMEOUT`].
pub async fn step<T, F: Future<Output = T>>(what: &str, f: F) -> T {
    tokio::time::timeout(STEP_TIMEOUT, f).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}

pub async fn server() -> ServerHandle {
    proxy::start("127.0.0.1:0".parse().unwrap(), 7).await.expect("server starts")
}

/// An upstream that echoes every byte back on every connection.
pub async fn echo_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut rd, mut wr) = sock.split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
            });
        }
    });
    addr
}

/// An upstream that, on each connection, writes `payload` and then closes.
pub async fn sending_upstream(payload: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let payload = payload.clone();
            tokio::spawn(async move {
                let _ = sock.write_all(&payload).await;
                let _ = sock.shutdown().await;
                // Keep reading so the close is a clean FIN, not a reset.
                let mut sink = [0u8; 1024];
                while let Ok(n) = sock.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// A raw request; answers the status and the JSON body (Null when empty).
pub async fn call(base: &str, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let raw = call_raw(base, method, path, body, "fencelab-tests").await;
    let value = if raw.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&raw.body).unwrap_or_else(|_| panic!("non-JSON body: {:?}", raw.body))
    };
    (raw.status, value)
}

/// An answer as it came: status, content type, request-id header and body text.
pub struct RawAnswer {
    pub status: u16,
    pub content_type: String,
    pub request_id: Option<String>,
    pub body: String,
}

/// A raw request with a chosen User-Agent; answers the body as text.
pub async fn call_raw(base: &str, method: &str, path: &str, body: Option<&str>, user_agent: &str) -> RawAnswer {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = http.request(method, format!("{base}{path}")).header("user-agent", user_agent);
    if let Some(body) = body {
        req = req.body(body.to_string());
    }
    let resp = step("http call", req.send()).await.expect("request sent");
    let status = resp.status().as_u16();
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let content_type = header("content-type").unwrap_or_default();
    let request_id = header("x-toxiproxy-request-id");
    let body = step("http body", resp.text()).await.unwrap();
    RawAnswer { status, content_type, request_id, body }
}

/// Creates a proxy on port 0 through the raw API; answers its bound address.
pub async fn make_proxy(base: &str, name: &str, upstream: SocketAddr) -> SocketAddr {
    let body = format!(r#"{{"name":"{name}","listen":"127.0.0.1:0","upstream":"{upstream}"}}"#);
    let (status, v) = call(base, "POST", "/proxies", Some(&body)).await;
    assert_eq!(status, 201, "{v}");
    v["listen"].as_str().unwrap().parse().unwrap()
}

/// Adds a toxic through the raw API and asserts success.
pub async fn add_toxic(base: &str, proxy: &str, toxic_json: &str) -> Value {
    let (status, v) = call(base, "POST", &format!("/proxies/{proxy}/toxics"), Some(toxic_json)).await;
    assert_eq!(status, 200, "{v}");
    v
}

/// True when a TCP connect to `addr` succeeds.
pub async fn accepts(addr: SocketAddr) -> bool {
    matches!(tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await, Ok(Ok(_)))
}

/// Reads until EOF or error; answers the bytes read and whether it ended in an error.
pub async fn read_to_end(sock: &mut TcpStream) -> (Vec<u8>, Option<std::io::Error>) {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match sock.read(&mut buf).await {
            Ok(0) => return (out, None),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => return (out, Some(e)),
        }
    }
}

/// One request/response round trip of `msg` over an echo path.
pub async fn round_trip(sock: &mut TcpStream, msg: &[u8]) -> Duration {
    let start = std::time::Instant::now();
    sock.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    step("echo reply", sock.read_exact(&mut back)).await.unwrap();
    assert_eq!(back, msg);
    start.elapsed()
}

/// A loopback port that was free a moment ago (bound, read, released), for
/// the upstream tests that name their listen address, e.g. `localhost:P`.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// True when a TCP connect to `addr` (a name or an IP address) succeeds.
pub async fn up(addr: &str) -> bool {
    matches!(tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await, Ok(Ok(_)))
}

/// An upstream that hands every accepted connection to the test.
pub async fn accepting_upstream() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let _ = sock.set_nodelay(true);
            if tx.send(sock).is_err() {
                return;
            }
        }
    });
    (addr, rx)
}

/// A client connection through `listen` and the upstream's side of it.
pub async fn established(
    listen: SocketAddr,
    accepted: &mut tokio::sync::mpsc::UnboundedReceiver<TcpStream>,
) -> (TcpStream, TcpStream) {
    let client = step("connect", TcpStream::connect(listen)).await.unwrap();
    client.set_nodelay(true).unwrap();
    let server = step("upstream accept", accepted.recv()).await.expect("upstream accepted");
    (client, server)
}

/// Reads exactly `n` bytes, bounded.
pub async fn read_n(sock: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    step("read exact", sock.read_exact(&mut buf)).await.unwrap();
    buf
}

/// Asserts nothing arrives on `sock` within `window` (the connection stays open).
pub async fn silent_for(sock: &mut TcpStream, window: Duration) {
    let mut buf = [0u8; 1];
    let got = tokio::time::timeout(window, sock.read(&mut buf)).await;
    assert!(got.is_err(), "expected silence, got {got:?}");
}

/// Go client's `CreateProxy`/`Save` body for a new proxy.
pub fn go_proxy(name: &str, listen: &str, upstream: &str, enabled: bool) -> String {
    serde_json::json!({"name": name, "listen": listen, "upstream": upstream, "enabled": enabled, "toxics": null})
        .to_string()
}

/// Go client's `AddToxic` body: the stream is left out when empty, nil
/// attributes are `null`, and a toxicity of -1 is sent as 1.
pub fn go_toxic(name: &str, type_name: &str, stream: &str, toxicity: f32, attributes: Value) -> String {
    let toxicity = if toxicity == -1.0 { 1.0 } else { toxicity };
    let mut body = serde_json::json!({"name": name, "type": type_name, "toxicity": toxicity, "attributes": attributes});
    if !stream.is_empty() {
        body["stream"] = Value::from(stream);
    }
    body.to_string()
}

/// POSTs a Go-client-shaped toxic; answers status and body.
pub async fn go_add_toxic(base: &str, proxy: &str, body: &str) -> (u16, Value) {
    call(base, "POST", &format!("/proxies/{proxy}/toxics"), Some(body)).await
}

/// Finds a toxic by name in a toxics array.
pub fn toxic_named<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_array().unwrap().iter().find(|t| t["name"] == name)
}
