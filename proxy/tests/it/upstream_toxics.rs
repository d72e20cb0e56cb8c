//! Conformance with Toxiproxy's toxic tests (`toxics/*_test.go`): each test is
//! named after the upstream test it mirrors and checks the same case over real
//! loopback TCP through the embedded server. Stub-level cases (a toxic's pipe
//! fed chunk by chunk) become byte counts on the wire. Timings keep wide
//! margins: a lower bound just under the expected delay and an upper bound
//! well over it, so a loaded machine cannot make them flaky.

use crate::support::*;
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Slack over an expected delay before a timing test fails.
const SLACK: Duration = Duration::from_millis(1500);

/// A server and a proxy "test" to an accepting upstream.
async fn setup() -> (proxy::ServerHandle, SocketAddr, tokio::sync::mpsc::UnboundedReceiver<TcpStream>) {
    let s = server().await;
    let (up, accepted) = accepting_upstream().await;
    let listen = make_proxy(&s.url(), "test", up).await;
    (s, listen, accepted)
}

async fn toxic(base: &str, body: serde_json::Value) {
    add_toxic(base, "test", &body.to_string()).await;
}

async fn remove(base: &str, name: &str) {
    let (status, v) = call(base, "DELETE", &format!("/proxies/test/toxics/{name}"), None).await;
    assert_eq!(status, 204, "{v}");
}

fn within(took: Duration, expected: Duration) {
    let low = expected.saturating_sub(expected / 20 + Duration::from_millis(10));
    assert!(took >= low && took < expected + SLACK, "took {took:?}, expected about {expected:?}");
}

/// One echo exchange: client → server and back, as `AssertEchoResponse`.
async fn echo(client: &mut TcpStream, server: &mut TcpStream) {
    let msg = b"hello world\n";
    client.write_all(msg).await.unwrap();
    assert_eq!(read_n(server, msg.len()).await, msg);
    server.write_all(msg).await.unwrap();
    assert_eq!(read_n(client, msg.len()).await, msg);
}

/// Sends a 32 KiB line up and echoes it back; answers (up, round trip) times.
async fn latency_round(client: &mut TcpStream, server: &mut TcpStream) -> (Duration, Duration) {
    let msg = format!("hello world {}\n", "a".repeat(32 * 1024)).into_bytes();
    let start = Instant::now();
    client.write_all(&msg).await.unwrap();
    assert_eq!(read_n(server, msg.len()).await, msg);
    let up = start.elapsed();
    server.write_all(&msg).await.unwrap();
    assert_eq!(read_n(client, msg.len()).await, msg);
    (up, start.elapsed())
}

/// `DoLatencyTest`: two rounds with the given upstream/downstream latencies.
async fn latency_test(up_ms: Option<u64>, down_ms: Option<u64>) {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        if let Some(ms) = up_ms {
            toxic(&s.url(), json!({"name": "latency_up", "type": "latency", "stream": "upstream", "attributes": {"latency": ms}})).await;
        }
        if let Some(ms) = down_ms {
            toxic(&s.url(), json!({"name": "latency_down", "type": "latency", "stream": "downstream", "attributes": {"latency": ms}}))
                .await;
        }
        let (mut client, mut server) = established(listen, &mut accepted).await;
        let (up, down) = (Duration::from_millis(up_ms.unwrap_or(0)), Duration::from_millis(down_ms.unwrap_or(0)));
        for _ in 0..2 {
            let (took_up, round) = latency_round(&mut client, &mut server).await;
            within(took_up, up);
            within(round, up + down);
        }
        s.shutdown().await;
    })
    .await;
}

/// Mirrors latency_test.go TestUpstreamLatency.
#[tokio::test]
async fn upstream_latency() {
    latency_test(Some(100), None).await;
}

/// Mirrors latency_test.go TestDownstreamLatency.
#[tokio::test]
async fn downstream_latency() {
    latency_test(None, Some(100)).await;
}

/// Mirrors latency_test.go TestFullstreamLatencyEven.
#[tokio::test]
async fn fullstream_latency_even() {
    latency_test(Some(100), Some(100)).await;
}

/// Mirrors latency_test.go TestFullstreamLatencyBiasUp.
#[tokio::test]
async fn fullstream_latency_bias_up() {
    latency_test(Some(1000), Some(100)).await;
}

/// Mirrors latency_test.go TestFullstreamLatencyBiasDown.
#[tokio::test]
async fn fullstream_latency_bias_down() {
    latency_test(Some(100), Some(1000)).await;
}

/// Mirrors latency_test.go TestZeroLatency.
#[tokio::test]
async fn zero_latency() {
    latency_test(Some(0), Some(0)).await;
}

/// Mirrors latency_test.go TestLatencyToxicCloseRace: adding a toxic,
/// connecting, writing, closing and removing it, over and over, never wedges
/// the proxy (200 rounds instead of 1000, to keep the suite short).
#[tokio::test]
async fn latency_toxic_close_race() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        tokio::spawn(async move { while accepted.recv().await.is_some() {} });
        for _ in 0..200 {
            toxic(&s.url(), json!({"type": "latency", "stream": "upstream", "attributes": {"latency": 10}})).await;
            let mut conn = step("connect", TcpStream::connect(listen)).await.unwrap();
            let _ = conn.write_all(b"hello").await;
            drop(conn);
            remove(&s.url(), "latency_upstream").await;
        }
        s.shutdown().await;
    })
    .await;
}

/// Mirrors latency_test.go TestTwoLatencyToxics: two latency toxics on one
/// stream add up.
#[tokio::test]
async fn two_latency_toxics() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        for i in 0..2 {
            toxic(&s.url(), json!({"name": format!("latency_{i}"), "type": "latency", "stream": "upstream", "attributes": {"latency": 500}}))
                .await;
        }
        let (mut client, mut server) = established(listen, &mut accepted).await;
        let (took_up, _) = latency_round(&mut client, &mut server).await;
        within(took_up, Duration::from_millis(1000));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors latency_test.go TestLatencyToxicBandwidth: latency delays data but
/// does not throttle a busy stream.
#[tokio::test]
async fn latency_toxic_bandwidth() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        let (mut client, server) = established(listen, &mut accepted).await;
        let payload = "hello world ".repeat(1000).into_bytes();
        let writer = tokio::spawn(async move {
            let mut server = server;
            while server.write_all(&payload).await.is_ok() {}
        });
        toxic(&s.url(), json!({"type": "latency", "attributes": {"latency": 100}})).await;
        let mut buf = vec![0u8; 12_000];
        let start = Instant::now();
        let mut count = 0;
        for _ in 0..100 {
            step("read", client.read_exact(&mut buf)).await.unwrap();
            count += buf.len();
        }
        // 1.2 MB: at 100 MB/s (upstream's bound) 12 ms; allow the first 100 ms delay and more.
        let took = start.elapsed();
        assert!(took < Duration::from_millis(100) + SLACK, "{count} bytes took {took:?}");
        drop(client);
        writer.abort();
        s.shutdown().await;
    })
    .await;
}

/// `WithEstablishedProxy`: a connection that passed data both ways.
async fn established_both_ways() -> (proxy::ServerHandle, TcpStream, TcpStream) {
    let (s, listen, mut accepted) = setup().await;
    let (mut client, mut server) = established(listen, &mut accepted).await;
    client.write_all(b"foobar").await.unwrap();
    assert_eq!(read_n(&mut server, 6).await, b"foobar");
    server.write_all(b"foobar").await.unwrap();
    assert_eq!(read_n(&mut client, 6).await, b"foobar");
    (s, client, server)
}

/// Mirrors timeout_test.go TestTimeoutToxicDoesNotCauseHang: removing a
/// latency toxic in front of a timeout toxic answers promptly.
#[tokio::test]
async fn timeout_toxic_does_not_cause_hang() {
    bounded(async {
        let (s, mut client, _server) = established_both_ways().await;
        toxic(
            &s.url(),
            json!({"name": "might_block", "type": "latency", "stream": "upstream", "attributes": {"latency": 10}}),
        )
        .await;
        toxic(
            &s.url(),
            json!({"name": "timeout", "type": "timeout", "stream": "upstream", "attributes": {"timeout": 0}}),
        )
        .await;
        for _ in 0..5 {
            client.write_all(b"hello").await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let start = Instant::now();
        remove(&s.url(), "might_block").await;
        assert!(start.elapsed() < Duration::from_secs(1), "removal took {:?}", start.elapsed());
        s.shutdown().await;
    })
    .await;
}

/// Mirrors timeout_test.go TestTimeoutToxicClosesConnectionOnRemove: both
/// sides see EOF.
#[tokio::test]
async fn timeout_toxic_closes_connection_on_remove() {
    bounded(async {
        let (s, mut client, mut server) = established_both_ways().await;
        toxic(
            &s.url(),
            json!({"name": "to_delete", "type": "timeout", "stream": "upstream", "attributes": {"timeout": 0}}),
        )
        .await;
        remove(&s.url(), "to_delete").await;
        let mut buf = [0u8; 1];
        assert_eq!(step("client EOF", client.read(&mut buf)).await.unwrap(), 0);
        assert_eq!(step("server EOF", server.read(&mut buf)).await.unwrap(), 0);
        s.shutdown().await;
    })
    .await;
}

/// A limit_data toxic of `limit` bytes upstream; the client writes `sends` one
/// after the other (each delivered before the next); answers what the server
/// got and whether the connection then closed.
async fn limit_data(limit: u64, sends: &[usize]) -> (Vec<u8>, bool) {
    let (s, listen, mut accepted) = setup().await;
    toxic(&s.url(), json!({"type": "limit_data", "stream": "upstream", "attributes": {"bytes": limit}})).await;
    let (mut client, mut server) = established(listen, &mut accepted).await;
    let mut got = Vec::new();
    let mut sent = 0usize;
    for (i, &n) in sends.iter().enumerate() {
        let data: Vec<u8> = (0..n).map(|b| (sent + b) as u8 ^ i as u8).collect();
        client.write_all(&data).await.unwrap();
        sent += n;
        let expect = (sent as u64).min(limit) as usize;
        while got.len() < expect {
            let mut buf = [0u8; 4096];
            let n = step("limited read", server.read(&mut buf)).await.unwrap();
            assert!(n > 0, "closed after {} of {expect} bytes", got.len());
            got.extend_from_slice(&buf[..n]);
        }
    }
    let mut buf = [0u8; 1];
    let closed = matches!(tokio::time::timeout(Duration::from_millis(500), server.read(&mut buf)).await, Ok(Ok(0)));
    s.shutdown().await;
    (got, closed)
}

/// Mirrors limit_data_test.go TestLimitDataToxicMayBeRestarted: an update
/// keeps the count (90 through, update, then 10 of the next 20, then close).
#[tokio::test]
async fn limit_data_toxic_may_be_restarted() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        toxic(&s.url(), json!({"type": "limit_data", "stream": "upstream", "attributes": {"bytes": 100}})).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        client.write_all(&[1u8; 90]).await.unwrap();
        assert_eq!(read_n(&mut server, 90).await, [1u8; 90]);
        let (status, _) =
            call(&s.url(), "POST", "/proxies/test/toxics/limit_data_upstream", Some(r#"{"attributes":{"bytes":100}}"#))
                .await;
        assert_eq!(status, 200);
        client.write_all(&[2u8; 20]).await.unwrap();
        let (rest, _) = step("rest", read_to_end(&mut server)).await;
        assert_eq!(rest, [2u8; 10]);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors limit_data_test.go TestLimitDataToxicMayBeInterrupted: updating
/// before any data breaks nothing.
#[tokio::test]
async fn limit_data_toxic_may_be_interrupted() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        toxic(&s.url(), json!({"type": "limit_data", "stream": "upstream", "attributes": {"bytes": 100}})).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        call(&s.url(), "POST", "/proxies/test/toxics/limit_data_upstream", Some(r#"{"attributes":{"bytes":100}}"#))
            .await;
        client.write_all(b"after").await.unwrap();
        assert_eq!(read_n(&mut server, 5).await, b"after");
        s.shutdown().await;
    })
    .await;
}

/// Mirrors limit_data_test.go TestLimitDataToxicNilShouldClosePipe: EOF
/// under the limit ends the connection.
#[tokio::test]
async fn limit_data_toxic_nil_should_close_pipe() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        toxic(&s.url(), json!({"type": "limit_data", "stream": "upstream", "attributes": {"bytes": 100}})).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        client.shutdown().await.unwrap();
        let (data, _) = step("server sees the end", read_to_end(&mut server)).await;
        assert!(data.is_empty());
        s.shutdown().await;
    })
    .await;
}

/// Mirrors limit_data_test.go TestLimitDataToxicChunkSmallerThanLimit.
#[tokio::test]
async fn limit_data_toxic_chunk_smaller_than_limit() {
    bounded(async {
        let (got, closed) = limit_data(100, &[50]).await;
        assert_eq!((got.len(), closed), (50, false));
    })
    .await;
}

/// Mirrors limit_data_test.go TestLimitDataToxicChunkLengthMatchesLimit.
#[tokio::test]
async fn limit_data_toxic_chunk_length_matches_limit() {
    bounded(async {
        let (got, closed) = limit_data(100, &[100]).await;
        assert_eq!((got.len(), closed), (100, true));
    })
    .await;
}

/// Mirrors limit_data_test.go TestLimitDataToxicChunkBiggerThanLimit.
#[tokio::test]
async fn limit_data_toxic_chunk_bigger_than_limit() {
    bounded(async {
        let (got, closed) = limit_data(100, &[150]).await;
        assert_eq!((got.len(), closed), (100, true));
        assert_eq!(got, (0..100).map(|b| b as u8).collect::<Vec<_>>());
    })
    .await;
}

/// Mirrors limit_data_test.go TestLimitDataToxicMultipleChunksMatchThanLimit.
#[tokio::test]
async fn limit_data_toxic_multiple_chunks_match_than_limit() {
    bounded(async {
        let (got, closed) = limit_data(100, &[25, 25, 25, 25]).await;
        assert_eq!((got.len(), closed), (100, true));
    })
    .await;
}

/// Mirrors limit_data_test.go TestLimitDataToxicSecondChunkWouldOverflowLimit.
#[tokio::test]
async fn limit_data_toxic_second_chunk_would_overflow_limit() {
    bounded(async {
        let (got, closed) = limit_data(100, &[90, 20]).await;
        assert_eq!((got.len(), closed), (100, true));
    })
    .await;
}

/// Mirrors limit_data_test.go TestLimitDataToxicLimitIsSetToZero.
#[tokio::test]
async fn limit_data_toxic_limit_is_set_to_zero() {
    bounded(async {
        let (got, closed) = limit_data(0, &[100]).await;
        assert_eq!((got.len(), closed), (0, true));
    })
    .await;
}

/// Mirrors bandwidth_test.go TestBandwidthToxic: 480 KB at 1000 KB/s.
#[tokio::test]
async fn bandwidth_toxic() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        let (client, mut server) = established(listen, &mut accepted).await;
        toxic(&s.url(), json!({"type": "bandwidth", "stream": "upstream", "attributes": {"rate": 1000}})).await;
        let payload = "hello world ".repeat(40_000).into_bytes();
        let sent = payload.clone();
        let writer = tokio::spawn(async move {
            let mut client = client;
            client.write_all(&sent).await.unwrap();
            client
        });
        let start = Instant::now();
        let got = read_n(&mut server, payload.len()).await;
        within(start.elapsed(), Duration::from_millis(480));
        assert!(got == payload);
        drop(writer.await.unwrap());
        s.shutdown().await;
    })
    .await;
}

/// `resetTCPHelper`: the client writes, then its read fails with a reset and
/// the next read sees the end; answers how long the reset took.
async fn reset_tcp(stream: &str, timeout_ms: u64) -> Duration {
    let (s, listen, mut accepted) = setup().await;
    toxic(
        &s.url(),
        json!({"name": "resettcp", "type": "reset_peer", "stream": stream, "attributes": {"timeout": timeout_ms}}),
    )
    .await;
    tokio::spawn(async move {
        if let Some(mut server) = accepted.recv().await {
            let mut buf = [0u8; 64];
            if matches!(server.read(&mut buf).await, Ok(n) if n > 0) {
                let _ = server.write_all(b"reset toxic payload\n").await;
            }
            let _ = server.read(&mut buf).await;
        }
    });
    let start = Instant::now();
    let mut client = step("connect", TcpStream::connect(listen)).await.unwrap();
    client.write_all(b"reset toxic payload\n").await.unwrap();
    let mut buf = [0u8; 1000];
    let first = step("reset", client.read(&mut buf)).await;
    let took = start.elapsed();
    assert_eq!(first.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset));
    assert_eq!(step("after reset", client.read(&mut buf)).await.unwrap(), 0);
    s.shutdown().await;
    took
}

/// Mirrors reset_peer_test.go TestResetToxicNoTimeout.
#[tokio::test]
async fn reset_toxic_no_timeout() {
    bounded(async {
        let took = reset_tcp("upstream", 0).await;
        assert!(took < SLACK, "{took:?}");
    })
    .await;
}

/// Mirrors reset_peer_test.go TestResetToxicWithTimeout.
#[tokio::test]
async fn reset_toxic_with_timeout() {
    bounded(async {
        within(reset_tcp("upstream", 100).await, Duration::from_millis(100));
    })
    .await;
}

/// Mirrors reset_peer_test.go TestResetToxicWithTimeoutDownstream.
#[tokio::test]
async fn reset_toxic_with_timeout_downstream() {
    bounded(async {
        within(reset_tcp("downstream", 100).await, Duration::from_millis(100));
    })
    .await;
}

/// Mirrors slicer_test.go TestSlicerToxic: 480 KB sliced around 1 KiB arrive
/// whole and in order.
#[tokio::test]
async fn slicer_toxic() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        toxic(
            &s.url(),
            json!({"type": "slicer", "stream": "upstream", "attributes": {"average_size": 1024, "size_variation": 512, "delay": 10}}),
        )
        .await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        let payload = "hello world ".repeat(40_000).into_bytes();
        client.write_all(&payload).await.unwrap();
        let got = read_n(&mut server, payload.len()).await;
        assert!(got == payload, "sliced data differs");
        s.shutdown().await;
    })
    .await;
}

/// Mirrors slicer_termination_test.go TestSlicerReassemblesForAnyAttributes
/// (the non-negative attribute pairs; negative ones are refused here, see
/// docs/toxiproxy.md).
#[tokio::test]
async fn slicer_reassembles_for_any_attributes() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        for (i, (average, variation)) in
            [(0, 0), (0, 5), (1, 0), (2, 1), (5, 10), (10, 10), (64, 8), (1024, 512)].into_iter().enumerate()
        {
            let name = format!("slicer_{i}");
            let attributes = json!({"average_size": average, "size_variation": variation});
            toxic(&s.url(), json!({"name": name, "type": "slicer", "stream": "upstream", "attributes": attributes}))
                .await;
            for size in [1usize, 2, 21, 64, 1000, 4096] {
                let payload: Vec<u8> = (0..size).map(|b| (b % 251) as u8).collect();
                client.write_all(&payload).await.unwrap();
                assert_eq!(
                    read_n(&mut server, size).await,
                    payload,
                    "average {average} variation {variation} size {size}"
                );
            }
            remove(&s.url(), &name).await;
        }
        s.shutdown().await;
    })
    .await;
}

/// Mirrors toxic_test.go TestPersistentConnections: toxics come and go on a
/// live connection (reset included) and it keeps working.
#[tokio::test]
async fn persistent_connections() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        toxic(&s.url(), json!({"name": "noop_up", "type": "noop", "stream": "upstream"})).await;
        toxic(&s.url(), json!({"name": "noop_down", "type": "noop", "stream": "downstream"})).await;
        echo(&mut client, &mut server).await;
        assert_eq!(call(&s.url(), "POST", "/reset", None).await.0, 204);
        echo(&mut client, &mut server).await;
        assert_eq!(call(&s.url(), "POST", "/reset", None).await.0, 204);
        echo(&mut client, &mut server).await;
        s.shutdown().await;
    })
    .await;
}

/// Mirrors toxic_test.go TestToxicAddRemove: toxics added and removed all the
/// while 100 exchanges run lose and reorder nothing.
#[tokio::test]
async fn toxic_add_remove() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        let url = s.url();
        let churn = tokio::spawn(async move {
            loop {
                add_toxic(&url, "test", r#"{"name":"noop_up","type":"noop","stream":"upstream"}"#).await;
                call(&url, "DELETE", "/proxies/test/toxics/noop_down", None).await;
                call(&url, "DELETE", "/proxies/test/toxics/noop_up", None).await;
                add_toxic(&url, "test", r#"{"name":"noop_down","type":"noop","stream":"downstream"}"#).await;
            }
        });
        for _ in 0..100 {
            echo(&mut client, &mut server).await;
        }
        churn.abort();
        s.shutdown().await;
    })
    .await;
}

/// Mirrors toxic_test.go TestProxyLatency: a clean proxy adds little per hop
/// (upstream bounds 300 µs on its machines; here 5 ms on a shared 2-core box).
#[tokio::test]
async fn proxy_latency() {
    bounded(async {
        let (s, listen, mut accepted) = setup().await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        let start = Instant::now();
        for _ in 0..100 {
            echo(&mut client, &mut server).await;
        }
        let per_hop = start.elapsed() / 200;
        assert!(per_hop < Duration::from_millis(5), "average proxy latency {per_hop:?}");
        s.shutdown().await;
    })
    .await;
}
