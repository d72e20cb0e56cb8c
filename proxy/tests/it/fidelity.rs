//! The differences issue 15 measured between the embedded server and
//! Toxiproxy 2.12, one test each (named after the item), plus the ending of a
//! connection (whole by default, fencelab's half-close option) and the
//! client's API for that option.

use crate::support::*;
use proxy::{Client, ClientError};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Item 1: `"attributes": null` or none creates a toxic with zero attributes;
/// a `timeout` toxic created so holds data (timeout 0).
#[tokio::test]
async fn item1_null_or_missing_attributes_are_zero_attributes() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        let t =
            add_toxic(&s.url(), "p", r#"{"name":"hole","type":"timeout","stream":"upstream","attributes":null}"#).await;
        assert_eq!(t["attributes"], json!({"timeout": 0}));
        let t = add_toxic(&s.url(), "p", r#"{"type":"latency"}"#).await;
        assert_eq!(t["attributes"], json!({"latency": 0, "jitter": 0}));
        let (mut client, mut server) = established(listen, &mut accepted).await;
        client.write_all(b"dropped").await.unwrap();
        silent_for(&mut server, Duration::from_millis(500)).await;
        s.shutdown().await;
    })
    .await;
}

/// Item 2: 60 bytes through a `limit_data` of 100 … update to 100 … only 40
/// more pass, then the connection closes.
#[tokio::test]
async fn item2_limit_data_keeps_its_count_across_updates() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        add_toxic(&s.url(), "p", r#"{"type":"limit_data","stream":"upstream","attributes":{"bytes":100}}"#).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        client.write_all(&[7u8; 60]).await.unwrap();
        assert_eq!(read_n(&mut server, 60).await.len(), 60);
        let path = "/proxies/p/toxics/limit_data_upstream";
        assert_eq!(call(&s.url(), "PATCH", path, Some(r#"{"attributes":{"bytes":100}}"#)).await.0, 200);
        client.write_all(&[8u8; 60]).await.unwrap();
        let (rest, _) = step("closed at the limit", read_to_end(&mut server)).await;
        assert_eq!(rest, [8u8; 40]);
        s.shutdown().await;
    })
    .await;
}

/// Item 3: two latency toxics of 200 ms on one stream give about 400 ms.
#[tokio::test]
async fn item3_latency_toxics_on_one_stream_add_up() {
    bounded(async {
        let s = server().await;
        let listen = make_proxy(&s.url(), "p", echo_upstream().await).await;
        for name in ["a", "b"] {
            let body = format!(r#"{{"name":"{name}","type":"latency","attributes":{{"latency":200}}}}"#);
            add_toxic(&s.url(), "p", &body).await;
        }
        let mut sock = step("connect", tokio::net::TcpStream::connect(listen)).await.unwrap();
        let rtt = round_trip(&mut sock, b"ping").await;
        assert!(rtt >= Duration::from_millis(380) && rtt < Duration::from_secs(2), "{rtt:?}");
        s.shutdown().await;
    })
    .await;
}

/// Item 4: removing a `timeout` toxic (timeout 0) closes both sides.
#[tokio::test]
async fn item4_removing_a_timeout_toxic_closes_both_sides() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        add_toxic(&s.url(), "p", r#"{"type":"timeout","attributes":{"timeout":0}}"#).await;
        server.write_all(b"held").await.unwrap();
        silent_for(&mut client, Duration::from_millis(300)).await;
        call(&s.url(), "DELETE", "/proxies/p/toxics/timeout_downstream", None).await;
        let (to_client, _) = step("client side closed", read_to_end(&mut client)).await;
        let (to_server, _) = step("server side closed", read_to_end(&mut server)).await;
        assert!(to_client.is_empty() && to_server.is_empty());
        s.shutdown().await;
    })
    .await;
}

/// Item 5: a `timeout` toxic closes at once when its source ends (EOF), not
/// when its timer runs out.
#[tokio::test]
async fn item5_timeout_toxic_closes_at_once_on_source_eof() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        add_toxic(&s.url(), "p", r#"{"type":"timeout","stream":"upstream","attributes":{"timeout":10000}}"#).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        let start = Instant::now();
        client.shutdown().await.unwrap();
        let (_, _) = step("client closed", read_to_end(&mut client)).await;
        let (_, _) = step("server closed", read_to_end(&mut server)).await;
        assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
        s.shutdown().await;
    })
    .await;
}

/// Item 6: updating `listen` to `localhost:P` for a proxy bound to
/// `127.0.0.1:P` keeps it running, with its toxics and connections.
#[tokio::test]
async fn item6_update_with_an_equivalent_listen_keeps_the_proxy() {
    bounded(async {
        let s = server().await;
        let listen = make_proxy(&s.url(), "p", echo_upstream().await).await;
        add_toxic(&s.url(), "p", r#"{"type":"noop"}"#).await;
        let mut sock = step("connect", tokio::net::TcpStream::connect(listen)).await.unwrap();
        round_trip(&mut sock, b"before").await;
        let body = format!(r#"{{"listen":"localhost:{}"}}"#, listen.port());
        let (status, v) = call(&s.url(), "POST", "/proxies/p", Some(&body)).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!((v["listen"].clone(), v["toxics"].as_array().unwrap().len()), (json!(listen.to_string()), 1));
        round_trip(&mut sock, b"still connected").await;
        s.shutdown().await;
    })
    .await;
}

/// Item 7: `populate` with `localhost:P` for a proxy on `127.0.0.1:P` keeps
/// the proxy, its toxics and its live connections.
#[tokio::test]
async fn item7_populate_with_an_equivalent_listen_keeps_the_proxy() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        add_toxic(&s.url(), "p", r#"{"type":"noop"}"#).await;
        let mut sock = step("connect", tokio::net::TcpStream::connect(listen)).await.unwrap();
        round_trip(&mut sock, b"before").await;
        let body = format!(r#"[{{"name":"p","listen":"localhost:{}","upstream":"{up}"}}]"#, listen.port());
        let (status, v) = call(&s.url(), "POST", "/populate", Some(&body)).await;
        assert_eq!(status, 201, "{v}");
        assert_eq!(v["proxies"][0]["toxics"].as_array().unwrap().len(), 1);
        round_trip(&mut sock, b"still connected").await;
        s.shutdown().await;
    })
    .await;
}

/// Item 8: an unknown toxic type answers Toxiproxy's exact message.
#[tokio::test]
async fn item8_unknown_toxic_type_message_is_exact() {
    bounded(async {
        let s = server().await;
        make_proxy(&s.url(), "p", echo_upstream().await).await;
        let (status, v) = call(&s.url(), "POST", "/proxies/p/toxics", Some(r#"{"type":"earthquake"}"#)).await;
        assert_eq!((status, v), (400, json!({"error": "invalid toxic type", "status": 400})));
        s.shutdown().await;
    })
    .await;
}

/// Toxiproxy's `bandwidth` with rate 0 holds data (it is not unlimited); the
/// data passes once the toxic is removed.
#[tokio::test]
async fn bandwidth_rate_zero_holds_data_until_removed() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        add_toxic(&s.url(), "p", r#"{"type":"bandwidth","stream":"upstream","attributes":{"rate":0}}"#).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        client.write_all(b"held back").await.unwrap();
        silent_for(&mut server, Duration::from_millis(500)).await;
        call(&s.url(), "DELETE", "/proxies/p/toxics/bandwidth_upstream", None).await;
        assert_eq!(read_n(&mut server, 9).await, b"held back");
        s.shutdown().await;
    })
    .await;
}

/// Toxiproxy closes the whole connection when one side ends: what the client
/// sent before its FIN reaches the server (a late request is still
/// delivered), then both sides are closed and a later answer is lost.
#[tokio::test]
async fn by_default_a_half_close_closes_the_whole_connection() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        client.write_all(b"late report").await.unwrap();
        client.shutdown().await.unwrap();
        let (request, _) = step("request then EOF", read_to_end(&mut server)).await;
        assert_eq!(request, b"late report");
        let _ = server.write_all(b"answer").await;
        let (answer, _) = step("client closed", read_to_end(&mut client)).await;
        assert!(answer.is_empty(), "answer after the client's FIN got through: {answer:?}");
        s.shutdown().await;
    })
    .await;
}

/// With fencelab's half-close option the FIN is forwarded and the other
/// direction stays open: the answer sent after the client's FIN arrives.
#[tokio::test]
async fn half_close_option_forwards_the_fin_and_keeps_the_answer() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let body = format!(r#"{{"name":"p","listen":"127.0.0.1:0","upstream":"{up}","fencelab_half_close":true}}"#);
        let (status, v) = call(&s.url(), "POST", "/proxies", Some(&body)).await;
        assert_eq!((status, v["fencelab_half_close"].clone()), (201, json!(true)), "{v}");
        let listen = v["listen"].as_str().unwrap().parse().unwrap();
        let (mut client, mut server) = established(listen, &mut accepted).await;
        client.write_all(b"late report").await.unwrap();
        client.shutdown().await.unwrap();
        let (request, _) = step("request then EOF", read_to_end(&mut server)).await;
        assert_eq!(request, b"late report");
        tokio::time::sleep(Duration::from_millis(100)).await;
        server.write_all(b"answer").await.unwrap();
        server.shutdown().await.unwrap();
        let (answer, _) = step("answer then EOF", read_to_end(&mut client)).await;
        assert_eq!(answer, b"answer");
        // Off again (an update): new connections close whole.
        let (_, v) = call(&s.url(), "PATCH", "/proxies/p", Some(r#"{"fencelab_half_close":false}"#)).await;
        assert!(v.get("fencelab_half_close").is_none(), "{v}");
        let (status, v) = call(&s.url(), "POST", "/proxies/p", Some(r#"{"fencelab_half_close":"yes"}"#)).await;
        assert_eq!(status, 400, "{v}");
        assert!(v["error"].as_str().unwrap().contains("fencelab_half_close"), "{v}");
        s.shutdown().await;
    })
    .await;
}

/// The typed client's half-close API against the embedded server.
#[tokio::test]
async fn client_creates_and_changes_half_close_proxies() {
    bounded(async {
        let s = server().await;
        let c = Client::new(&s.url()).unwrap();
        let p = c.create_proxy_half_close("h", "127.0.0.1:0", "127.0.0.1:9").await.unwrap();
        assert!(p.half_close);
        assert!(!c.set_half_close("h", false).await.unwrap().half_close);
        assert!(!c.proxy("h").await.unwrap().half_close);
        assert!(c.set_half_close("h", true).await.unwrap().half_close);
        let plain = c.create_proxy("plain", "127.0.0.1:0", "127.0.0.1:9").await.unwrap();
        assert!(!plain.half_close);
        s.shutdown().await;
    })
    .await;
}

/// Against a server that does not report the option back (as a real
/// Toxiproxy ignores the field), the client answers `Unsupported` and deletes
/// the proxy it just created.
#[tokio::test]
async fn client_reports_half_close_unsupported_by_a_plain_toxiproxy() {
    bounded(async {
        use axum::routing::{delete, post};
        let deleted = Arc::new(AtomicUsize::new(0));
        let counter = deleted.clone();
        let app = axum::Router::new()
            .route(
                "/proxies",
                post(|| async {
                    let body =
                        json!({"name":"h","listen":"127.0.0.1:1","upstream":"127.0.0.1:9","enabled":true,"toxics":[]});
                    (axum::http::StatusCode::CREATED, axum::Json(body))
                }),
            )
            .route(
                "/proxies/{name}",
                delete(move || {
                    counter.fetch_add(1, Ordering::SeqCst);
                    async { axum::http::StatusCode::NO_CONTENT }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let plain = tokio::spawn(async move { axum::serve(listener, app).await });
        let c = Client::new(&format!("http://{addr}")).unwrap();
        let err = c.create_proxy_half_close("h", "127.0.0.1:0", "127.0.0.1:9").await.unwrap_err();
        assert!(matches!(err, ClientError::Unsupported(_)), "{err}");
        assert_eq!(deleted.load(Ordering::SeqCst), 1, "the proxy without the option was not deleted");
        plain.abort();
    })
    .await;
}
