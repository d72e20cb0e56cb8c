//! Conformance with Toxiproxy's `proxy_test.go`, `link_test.go` and
//! `proxy_collection_test.go`: the cases observable through the REST API and
//! the wire, each named after the upstream test it mirrors. (Cases about Go
//! internals, such as stub buffer sizes, have nothing to observe here; see
//! docs/toxiproxy.md.)

use crate::support::*;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A proxy "test" to an upstream that reads everything until EOF and hands
/// it over (`WithTCPServer`); answers the server, the proxy address and the
/// receiver of what the upstream read.
async fn tcp_proxy() -> (proxy::ServerHandle, std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let s = server().await;
    let (up, mut accepted) = accepting_upstream().await;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(mut sock) = accepted.recv().await {
            let (data, _) = read_to_end(&mut sock).await;
            let _ = tx.send(data);
        }
    });
    let listen = make_proxy(&s.url(), "test", up).await;
    (s, listen, rx)
}

async fn send_and_close(listen: std::net::SocketAddr, parts: &[&[u8]]) {
    let mut conn = step("connect", TcpStream::connect(listen)).await.unwrap();
    for part in parts {
        conn.write_all(part).await.unwrap();
    }
    drop(conn);
}

/// Mirrors proxy_test.go TestProxySimpleMessage.
#[tokio::test]
async fn proxy_simple_message() {
    bounded(async {
        let (s, listen, mut got) = tcp_proxy().await;
        send_and_close(listen, &[b"hello world"]).await;
        assert_eq!(step("upstream read", got.recv()).await.unwrap(), b"hello world");
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_test.go TestProxyToDownUpstream: the client's connection is
/// closed when the upstream is down.
#[tokio::test]
async fn proxy_to_down_upstream() {
    bounded(async {
        let s = server().await;
        let down = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let listen = make_proxy(&s.url(), "test", down).await;
        let mut conn = step("connect", TcpStream::connect(listen)).await.unwrap();
        let mut buf = [0u8; 1];
        let n = step("closed", conn.read(&mut buf)).await.unwrap_or(0);
        assert_eq!(n, 0);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_test.go TestProxyBigMessage (64 KiB).
#[tokio::test]
async fn proxy_big_message() {
    bounded(async {
        let (s, listen, mut got) = tcp_proxy().await;
        let msg: Vec<u8> = "00".repeat(32 * 1024).into_bytes();
        send_and_close(listen, &[&msg]).await;
        assert!(step("upstream read", got.recv()).await.unwrap() == msg);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_test.go TestProxyTwoPartMessage.
#[tokio::test]
async fn proxy_two_part_message() {
    bounded(async {
        let (s, listen, mut got) = tcp_proxy().await;
        send_and_close(listen, &[b"hello world", b"hello world"]).await;
        assert_eq!(step("upstream read", got.recv()).await.unwrap(), b"hello worldhello world");
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_test.go TestClosingProxyMultipleTimes: disabling a disabled
/// proxy is fine.
#[tokio::test]
async fn closing_proxy_multiple_times() {
    bounded(async {
        let (s, listen, _got) = tcp_proxy().await;
        for _ in 0..3 {
            assert_eq!(call(&s.url(), "POST", "/proxies/test", Some(r#"{"enabled":false}"#)).await.0, 200);
        }
        assert!(!accepts(listen).await);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_test.go TestStartTwoProxiesOnSameAddress.
#[tokio::test]
async fn start_two_proxies_on_same_address() {
    bounded(async {
        let (s, listen, _got) = tcp_proxy().await;
        let body = format!(r#"{{"name":"proxy_2","listen":"{listen}","upstream":"localhost:3306"}}"#);
        let (status, v) = call(&s.url(), "POST", "/proxies", Some(&body)).await;
        assert_eq!(status, 500, "{v}");
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_test.go TestStopProxyBeforeStarting: stop, start, start
/// again (already started), stop.
#[tokio::test]
async fn stop_proxy_before_starting() {
    bounded(async {
        let s = server().await;
        let listen = format!("127.0.0.1:{}", free_port());
        let body = format!(r#"{{"name":"test","listen":"{listen}","upstream":"127.0.0.1:9","enabled":false}}"#);
        assert_eq!(call(&s.url(), "POST", "/proxies", Some(&body)).await.0, 201);
        assert!(!up(&listen).await);
        for (enabled, expect_up) in [(false, false), (true, true), (true, true), (false, false)] {
            let body = format!(r#"{{"enabled":{enabled}}}"#);
            assert_eq!(call(&s.url(), "POST", "/proxies/test", Some(&body)).await.0, 200);
            assert_eq!(up(&listen).await, expect_up, "enabled {enabled}");
        }
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_test.go TestProxyUpdate: a new listen address moves the
/// proxy; the same one keeps it; disabling stops it.
#[tokio::test]
async fn proxy_update() {
    bounded(async {
        let (s, before, _got) = tcp_proxy().await;
        let (status, v) = call(&s.url(), "POST", "/proxies/test", Some(r#"{"listen":"localhost:0"}"#)).await;
        assert_eq!(status, 200, "{v}");
        let after = v["listen"].as_str().unwrap().to_string();
        assert!(after != before.to_string() && after != "localhost:0", "{after}");
        assert!(up(&after).await);
        let body = format!(r#"{{"listen":"{after}"}}"#);
        assert_eq!(call(&s.url(), "POST", "/proxies/test", Some(&body)).await.1["listen"], json!(after));
        assert!(up(&after).await);
        call(&s.url(), "POST", "/proxies/test", Some(r#"{"enabled":false}"#)).await;
        assert!(!up(&after).await);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_test.go TestRestartFailedToStartProxy.
#[tokio::test]
async fn restart_failed_to_start_proxy() {
    bounded(async {
        let (s, taken, _got) = tcp_proxy().await;
        let body = format!(r#"{{"name":"second","listen":"{taken}","upstream":"127.0.0.1:9","enabled":false}}"#);
        assert_eq!(call(&s.url(), "POST", "/proxies", Some(&body)).await.0, 201);
        assert_eq!(call(&s.url(), "POST", "/proxies/second", Some(r#"{"enabled":true}"#)).await.0, 500);
        call(&s.url(), "POST", "/proxies/test", Some(r#"{"enabled":false}"#)).await;
        let (status, v) = call(&s.url(), "POST", "/proxies/second", Some(r#"{"enabled":true}"#)).await;
        assert_eq!((status, v["enabled"].clone()), (200, json!(true)), "{v}");
        assert!(accepts(taken).await);
        call(&s.url(), "POST", "/proxies/second", Some(r#"{"enabled":false}"#)).await;
        assert!(!accepts(taken).await);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors link_test.go TestNoDataDropped: a latency toxic added and removed
/// over and over loses and reorders nothing of 65535 counters.
#[tokio::test]
async fn no_data_dropped() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "test", up).await;
        let (client, mut server) = established(listen, &mut accepted).await;
        let url = s.url();
        let churn = tokio::spawn(async move {
            loop {
                add_toxic(&url, "test", r#"{"type":"latency","stream":"upstream","attributes":{"latency":100}}"#).await;
                call(&url, "DELETE", "/proxies/test/toxics/latency_upstream", None).await;
            }
        });
        let writer = tokio::spawn(async move {
            let mut client = client;
            for i in 0..65535u16 {
                client.write_all(&i.to_be_bytes()).await.unwrap();
            }
            client
        });
        let got = read_n(&mut server, 2 * 65535).await;
        churn.abort();
        for (i, pair) in got.chunks(2).enumerate() {
            assert_eq!(u16::from_be_bytes([pair[0], pair[1]]) as usize, i, "counter out of order");
        }
        drop(writer.await.unwrap());
        s.shutdown().await;
    })
    .await;
}

/// Mirrors link_test.go TestToxicity: a timeout toxic of toxicity 0 lets data
/// through; updated to toxicity 1 and 100 ms it closes the connection.
#[tokio::test]
async fn toxicity() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "test", up).await;
        add_toxic(&s.url(), "test", r#"{"name":"timeout1","type":"timeout","toxicity":0}"#).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        server.write_all(&[42]).await.unwrap();
        assert_eq!(read_n(&mut client, 1).await, [42]);
        let path = "/proxies/test/toxics/timeout1";
        call(&s.url(), "POST", path, Some(r#"{"toxicity":1,"attributes":{"timeout":100}}"#)).await;
        let start = Instant::now();
        let _ = server.write_all(&[42]).await;
        let (data, _) = step("closed by the timeout", read_to_end(&mut client)).await;
        assert!(data.is_empty(), "{data:?}");
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        s.shutdown().await;
    })
    .await;
}

/// Mirrors link_test.go TestResetToxicZeroToxicity: reset_peer of toxicity 0
/// passes data.
#[tokio::test]
async fn reset_toxic_zero_toxicity() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "test", up).await;
        add_toxic(&s.url(), "test", r#"{"name":"reset1","type":"reset_peer","toxicity":0}"#).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        server.write_all(&[99]).await.unwrap();
        assert_eq!(read_n(&mut client, 1).await, [99]);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors link_test.go TestRemoveToxicWithBrokenConnection: removing
/// bandwidth-0 toxics from both streams of a busy connection answers promptly.
#[tokio::test]
async fn remove_toxic_with_broken_connection() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "test", up).await;
        let (client, server) = established(listen, &mut accepted).await;
        add_toxic(&s.url(), "test", r#"{"name":"down","type":"bandwidth","attributes":{"rate":0}}"#).await;
        add_toxic(&s.url(), "test", r#"{"name":"up","type":"bandwidth","stream":"upstream","attributes":{"rate":0}}"#)
            .await;
        let writer = tokio::spawn(async move {
            let mut client = client;
            while client.write_all(&42u16.to_be_bytes()).await.is_ok() {}
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(server);
        let start = Instant::now();
        for name in ["down", "up"] {
            assert_eq!(call(&s.url(), "DELETE", &format!("/proxies/test/toxics/{name}"), None).await.0, 204);
        }
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        writer.abort();
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_collection_test.go TestAddProxyToCollection.
#[tokio::test]
async fn add_proxy_to_collection() {
    bounded(async {
        let s = server().await;
        assert_eq!(call(&s.url(), "GET", "/proxies/test", None).await.0, 404);
        make_proxy(&s.url(), "test", echo_upstream().await).await;
        assert_eq!(call(&s.url(), "GET", "/proxies/test", None).await.0, 200);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_collection_test.go TestAddTwoProxiesToCollection.
#[tokio::test]
async fn add_two_proxies_to_collection() {
    bounded(async {
        let s = server().await;
        make_proxy(&s.url(), "test", echo_upstream().await).await;
        let body = r#"{"name":"test","listen":"127.0.0.1:0","upstream":"localhost:20000"}"#;
        assert_eq!(call(&s.url(), "POST", "/proxies", Some(body)).await.0, 409);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_collection_test.go TestListProxies.
#[tokio::test]
async fn list_proxies() {
    bounded(async {
        let s = server().await;
        make_proxy(&s.url(), "test", echo_upstream().await).await;
        assert!(call(&s.url(), "GET", "/proxies", None).await.1.get("test").is_some());
        s.shutdown().await;
    })
    .await;
}

/// Mirrors proxy_collection_test.go TestAddAndRemoveProxyFromCollection.
#[tokio::test]
async fn add_and_remove_proxy_from_collection() {
    bounded(async {
        let (s, listen, mut got) = tcp_proxy().await;
        send_and_close(listen, &[b"go away"]).await;
        assert_eq!(step("upstream read", got.recv()).await.unwrap(), b"go away");
        assert_eq!(call(&s.url(), "DELETE", "/proxies/test", None).await.0, 204);
        assert_eq!(call(&s.url(), "GET", "/proxies/test", None).await.0, 404);
        s.shutdown().await;
    })
    .await;
}
