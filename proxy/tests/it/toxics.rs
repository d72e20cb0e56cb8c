//! Toxics over real loopback TCP: each toxic's observable effect, measured
//! with generous tolerances, and the clean path's integrity.

use crate::support::*;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn connect(addr: std::net::SocketAddr) -> TcpStream {
    let sock = step("connect", TcpStream::connect(addr)).await.unwrap();
    sock.set_nodelay(true).unwrap();
    sock
}

/// Median of a few round trips.
async fn median_rtt(sock: &mut TcpStream, samples: usize) -> Duration {
    let mut v = Vec::with_capacity(samples);
    for i in 0..samples {
        v.push(round_trip(sock, format!("ping {i}").as_bytes()).await);
    }
    v.sort();
    v[samples / 2]
}

#[tokio::test]
async fn clean_proxy_loses_duplicates_and_reorders_nothing() {
    bounded(async {
        let s = server().await;
        let listen = make_proxy(&s.url(), "clean", echo_upstream().await).await;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let payload: Vec<u8> = (0..8 * 1024 * 1024).map(|_| rng.gen()).collect();
        let sock = connect(listen).await;
        let (mut rd, mut wr) = sock.into_split();
        let sent = payload.clone();
        let writer = tokio::spawn(async move {
            for piece in sent.chunks(10_007) {
                wr.write_all(piece).await.unwrap();
            }
            wr
        });
        // Read every echoed byte before closing: a close ends the whole connection.
        let mut back = vec![0u8; payload.len()];
        step("echo all", rd.read_exact(&mut back)).await.unwrap();
        drop(writer.await.unwrap());
        assert!(back == payload, "payload corrupted through the proxy");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn latency_delays_each_round_trip() {
    bounded(async {
        let s = server().await;
        let listen = make_proxy(&s.url(), "lat", echo_upstream().await).await;
        let mut sock = connect(listen).await;
        let base = median_rtt(&mut sock, 5).await;
        assert!(base < Duration::from_millis(50), "clean rtt {base:?}");
        // Added to a live connection: toxics reach existing connections.
        add_toxic(&s.url(), "lat", r#"{"type":"latency","attributes":{"latency":100,"jitter":10}}"#).await;
        add_toxic(&s.url(), "lat", r#"{"type":"latency","stream":"upstream","attributes":{"latency":50}}"#).await;
        let slow = median_rtt(&mut sock, 5).await;
        assert!(slow >= Duration::from_millis(140), "rtt {slow:?}");
        assert!(slow < Duration::from_millis(400), "rtt {slow:?}");
        call(&s.url(), "DELETE", "/proxies/lat/toxics/latency_downstream", None).await;
        call(&s.url(), "DELETE", "/proxies/lat/toxics/latency_upstream", None).await;
        let again = median_rtt(&mut sock, 5).await;
        assert!(again < Duration::from_millis(50), "rtt after removal {again:?}");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn latency_does_not_accumulate_over_a_stream() {
    bounded(async {
        let s = server().await;
        let payload = vec![5u8; 2 * 1024 * 1024];
        let up = sending_upstream(payload.clone()).await;
        let listen = make_proxy(&s.url(), "stream", up).await;
        add_toxic(&s.url(), "stream", r#"{"type":"latency","attributes":{"latency":100}}"#).await;
        let mut sock = connect(listen).await;
        let start = Instant::now();
        let (data, err) = step("read stream", read_to_end(&mut sock)).await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(data, payload);
        let took = start.elapsed();
        // Every chunk is delayed 100ms from its arrival, not 100ms after the previous one.
        assert!(took >= Duration::from_millis(90) && took < Duration::from_secs(3), "{took:?}");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn removing_a_latency_toxic_releases_what_it_holds_at_once() {
    bounded(async {
        let s = server().await;
        let (upstream, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "held", upstream).await;
        let hour = r#"{"type":"latency","stream":"upstream","attributes":{"latency":3600000}}"#;
        add_toxic(&s.url(), "held", hour).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        client.write_all(b"held back").await.unwrap();
        silent_for(&mut server, Duration::from_millis(300)).await;
        // The sender goes away while its bytes are held: they still arrive, and only then the FIN.
        drop(client);
        silent_for(&mut server, Duration::from_millis(200)).await;
        call(&s.url(), "DELETE", "/proxies/held/toxics/latency_upstream", None).await;
        let (data, err) = step("released on removal", read_to_end(&mut server)).await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(data, b"held back");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_latency_toxic_keeps_holding_while_other_toxics_change() {
    bounded(async {
        let s = server().await;
        let (upstream, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "kept", upstream).await;
        let hour = r#"{"type":"latency","stream":"upstream","attributes":{"latency":3600000}}"#;
        add_toxic(&s.url(), "kept", hour).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        client.write_all(b"still held").await.unwrap();
        silent_for(&mut server, Duration::from_millis(200)).await;
        add_toxic(&s.url(), "kept", r#"{"type":"latency","stream":"downstream","attributes":{"latency":5}}"#).await;
        silent_for(&mut server, Duration::from_millis(300)).await;
        // Updating the holding toxic releases what it holds, as removing it does.
        let path = "/proxies/kept/toxics/latency_upstream";
        call(&s.url(), "POST", path, Some(r#"{"attributes":{"latency":1}}"#)).await;
        assert_eq!(read_n(&mut server, 10).await, b"still held");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn toxicity_zero_never_applies() {
    bounded(async {
        let s = server().await;
        let listen = make_proxy(&s.url(), "tox0", echo_upstream().await).await;
        add_toxic(&s.url(), "tox0", r#"{"type":"latency","toxicity":0,"attributes":{"latency":500}}"#).await;
        let mut sock = connect(listen).await;
        let rtt = median_rtt(&mut sock, 3).await;
        assert!(rtt < Duration::from_millis(200), "{rtt:?}");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn timeout_zero_blackholes_and_holds_the_connection_until_removed() {
    bounded(async {
        let s = server().await;
        let listen = make_proxy(&s.url(), "hole", echo_upstream().await).await;
        add_toxic(&s.url(), "hole", r#"{"type":"timeout","stream":"upstream","attributes":{"timeout":0}}"#).await;
        let mut sock = connect(listen).await;
        sock.write_all(b"anyone there?").await.unwrap();
        let mut buf = [0u8; 64];
        let waited = tokio::time::timeout(Duration::from_millis(700), sock.read(&mut buf)).await;
        assert!(waited.is_err(), "expected silence, got {waited:?}");
        // Removing it closes the connection (Toxiproxy's cleanup); the dropped bytes stay lost.
        call(&s.url(), "DELETE", "/proxies/hole/toxics/timeout_upstream", None).await;
        let (data, _) = step("closed on removal", read_to_end(&mut sock)).await;
        assert!(data.is_empty(), "{data:?}");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn timeout_closes_after_its_delay() {
    bounded(async {
        let s = server().await;
        let listen = make_proxy(&s.url(), "to", echo_upstream().await).await;
        let mut sock = connect(listen).await;
        round_trip(&mut sock, b"before").await;
        let start = Instant::now();
        add_toxic(&s.url(), "to", r#"{"type":"timeout","attributes":{"timeout":300}}"#).await;
        sock.write_all(b"dropped").await.unwrap();
        let (data, _) = step("closed by timeout", read_to_end(&mut sock)).await;
        let took = start.elapsed();
        assert!(data.is_empty(), "data passed a timeout toxic: {data:?}");
        assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "{took:?}");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn reset_peer_resets_the_connection() {
    bounded(async {
        let s = server().await;
        let listen = make_proxy(&s.url(), "rst", echo_upstream().await).await;
        add_toxic(&s.url(), "rst", r#"{"type":"reset_peer","stream":"upstream","attributes":{"timeout":200}}"#).await;
        let mut sock = connect(listen).await;
        let start = Instant::now();
        sock.write_all(b"trigger").await.unwrap();
        let (data, err) = step("reset", read_to_end(&mut sock)).await;
        let took = start.elapsed();
        assert!(data.is_empty(), "{data:?}");
        let kind = err.expect("a reset, not a clean close").kind();
        assert_eq!(kind, std::io::ErrorKind::ConnectionReset);
        assert!(took >= Duration::from_millis(150) && took < Duration::from_secs(3), "{took:?}");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn disabling_closes_connections_and_refuses_new_ones() {
    bounded(async {
        let s = server().await;
        let listen = make_proxy(&s.url(), "off", echo_upstream().await).await;
        let mut sock = connect(listen).await;
        round_trip(&mut sock, b"up").await;
        call(&s.url(), "POST", "/proxies/off", Some(r#"{"enabled":false}"#)).await;
        let (data, _) = step("closed on disable", read_to_end(&mut sock)).await;
        assert!(data.is_empty());
        assert!(!accepts(listen).await);
        call(&s.url(), "POST", "/proxies/off", Some(r#"{"enabled":true}"#)).await;
        let mut sock = connect(listen).await;
        round_trip(&mut sock, b"again").await;
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn limit_data_closes_after_n_bytes() {
    bounded(async {
        let s = server().await;
        let payload: Vec<u8> = (0..50_000u32).map(|i| i as u8).collect();
        let listen = make_proxy(&s.url(), "lim", sending_upstream(payload.clone()).await).await;
        add_toxic(&s.url(), "lim", r#"{"type":"limit_data","attributes":{"bytes":1000}}"#).await;
        let mut sock = connect(listen).await;
        let (data, _) = step("limited read", read_to_end(&mut sock)).await;
        assert_eq!(data.len(), 1000);
        assert_eq!(&data[..], &payload[..1000]);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn bandwidth_is_near_its_rate() {
    bounded(async {
        let s = server().await;
        let payload = vec![1u8; 200_000];
        let listen = make_proxy(&s.url(), "bw", sending_upstream(payload.clone()).await).await;
        add_toxic(&s.url(), "bw", r#"{"type":"bandwidth","attributes":{"rate":200}}"#).await;
        let mut sock = connect(listen).await;
        let start = Instant::now();
        let (data, err) = step("throttled read", read_to_end(&mut sock)).await;
        let took = start.elapsed();
        assert!(err.is_none());
        assert_eq!(data.len(), payload.len());
        // 200 KB at 200 KB/s: about one second.
        assert!(took >= Duration::from_millis(800) && took < Duration::from_millis(2500), "{took:?}");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn slicer_splits_writes_into_small_slices() {
    bounded(async {
        let s = server().await;
        let payload: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let listen = make_proxy(&s.url(), "sl", sending_upstream(payload.clone()).await).await;
        let toxic = r#"{"type":"slicer","attributes":{"average_size":10,"size_variation":5,"delay":2000}}"#;
        add_toxic(&s.url(), "sl", toxic).await;
        let mut sock = connect(listen).await;
        let mut reads = 0;
        let mut data = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = step("slice", sock.read(&mut buf)).await.unwrap();
            if n == 0 {
                break;
            }
            reads += 1;
            data.extend_from_slice(&buf[..n]);
        }
        assert_eq!(data, payload);
        assert!(reads >= 20, "only {reads} reads for 1000 bytes in ~10-byte slices");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn slow_close_delays_the_fin() {
    bounded(async {
        let s = server().await;
        let listen = make_proxy(&s.url(), "sc", sending_upstream(b"bye".to_vec()).await).await;
        add_toxic(&s.url(), "sc", r#"{"type":"slow_close","attributes":{"delay":400}}"#).await;
        let mut sock = connect(listen).await;
        let start = Instant::now();
        let (data, _) = step("slow close", read_to_end(&mut sock)).await;
        let took = start.elapsed();
        assert_eq!(data, b"bye");
        assert!(took >= Duration::from_millis(350) && took < Duration::from_secs(3), "{took:?}");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn noop_passes_data() {
    bounded(async {
        let s = server().await;
        let listen = make_proxy(&s.url(), "nop", echo_upstream().await).await;
        add_toxic(&s.url(), "nop", r#"{"type":"noop","stream":"upstream"}"#).await;
        add_toxic(&s.url(), "nop", r#"{"type":"noop"}"#).await;
        let mut sock = connect(listen).await;
        for i in 0..50 {
            round_trip(&mut sock, format!("message {i}").as_bytes()).await;
        }
        s.shutdown().await;
    })
    .await;
}

/// A PostgreSQL simple-query message: `Q`, its length, the text and its NUL.
fn simple_query(text: &str) -> Vec<u8> {
    let mut message = vec![b'Q'];
    message.extend_from_slice(&(text.len() as u32 + 5).to_be_bytes());
    message.extend_from_slice(text.as_bytes());
    message.push(0);
    message
}

/// `commit_cut`: the data up to and including a PostgreSQL `COMMIT` query message that ends
/// a transaction which wrote reaches the server, nothing after it does, and the server's
/// answer never reaches the client; a transaction that only read commits untouched.
#[tokio::test]
async fn commit_cut_passes_the_commit_and_loses_its_answer() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        let toxic = add_toxic(&s.url(), "p", r#"{"type":"commit_cut","stream":"upstream"}"#).await;
        assert_eq!(toxic["attributes"], serde_json::json!({"distinct": 0}));
        assert_eq!(toxic["fencelab_cuts"], 0, "a new toxic has cut nothing: {toxic}");
        let api = proxy::Client::new(&s.url()).unwrap();
        let (mut client, mut server) = established(listen, &mut accepted).await;
        let commit = simple_query("COMMIT");
        assert_eq!(commit, b"Q\0\0\0\x0bCOMMIT\0");
        // A statement that only names COMMIT passes whole, and so does a transaction that
        // only read (a column named `updated_at` is no write).
        let mut read_only = simple_query("SELECT 'COMMIT'");
        read_only.extend(simple_query("SELECT updated_at FROM t"));
        read_only.extend(&commit);
        client.write_all(&read_only).await.unwrap();
        assert_eq!(read_n(&mut server, read_only.len()).await, read_only);
        assert_eq!(api.commit_cuts("p", "commit_cut_upstream").await.unwrap(), 0, "no write committed yet");
        let write = simple_query("update t set a = 1");
        client.write_all(&write).await.unwrap();
        assert_eq!(read_n(&mut server, write.len()).await, write);
        let mut sent = commit.to_vec();
        sent.extend_from_slice(&simple_query("ROLLBACK"));
        client.write_all(&sent).await.unwrap();
        let (got, _) = step("the server side ends after COMMIT", read_to_end(&mut server)).await;
        assert_eq!(got, commit, "the write's COMMIT reached the server, the ROLLBACK after it did not");
        let _ = server.write_all(b"C\0\0\0\x0bCOMMIT\0Z\0\0\0\x05I").await;
        let (answer, _) = step("the client side ends", read_to_end(&mut client)).await;
        assert!(answer.is_empty(), "the answer to COMMIT was lost: {answer:?}");
        assert_eq!(api.commit_cuts("p", "commit_cut_upstream").await.unwrap(), 1, "one connection cut");
        s.shutdown().await;
    })
    .await;
}

/// A PostgreSQL message: its type, its length (counting itself) and its body.
fn pg_message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut message = vec![kind];
    message.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    message.extend_from_slice(body);
    message
}

/// What a PostgreSQL client sends first: its startup message (protocol 3.0).
fn pg_startup() -> Vec<u8> {
    let mut startup = 17u32.to_be_bytes().to_vec();
    startup.extend_from_slice(&196_608u32.to_be_bytes());
    startup.extend_from_slice(b"user\0pg\0\0");
    startup
}

/// A Bind of prepared statement `name` (no parameters) and its Execute.
fn pg_bind(name: &[u8]) -> Vec<u8> {
    let mut body = b"\0".to_vec();
    body.extend_from_slice(name);
    body.extend_from_slice(b"\0\0\0\0\0\0\0");
    let mut sent = pg_message(b'B', &body);
    sent.extend(pg_message(b'E', b"\0\0\0\0\0"));
    sent
}

/// `commit_cut` on a pool's long-lived connection: the statements the client prepared
/// before the toxic was added were read as they passed, so a transaction that only binds a
/// prepared read commits untouched, and one that binds a prepared write is cut.
#[tokio::test]
async fn commit_cut_knows_the_statements_prepared_before_it() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        let api = proxy::Client::new(&s.url()).unwrap();
        let (mut client, mut server) = established(listen, &mut accepted).await;
        // The startup message (protocol 3.0), then two statements prepared, on the clean path.
        let mut opening = pg_startup();
        opening.extend(pg_message(b'P', b"s1\0SELECT id FROM jobs FOR UPDATE\0\0\0"));
        opening.extend(pg_message(b'P', b"s2\0UPDATE jobs SET state = $1\0\0\0"));
        opening.extend(pg_message(b'S', b""));
        client.write_all(&opening).await.unwrap();
        assert_eq!(read_n(&mut server, opening.len()).await, opening);
        add_toxic(&s.url(), "p", r#"{"type":"commit_cut","stream":"upstream"}"#).await;
        let bound = |name: &[u8]| {
            let mut sent = simple_query("BEGIN");
            sent.extend(pg_bind(name));
            sent.extend(simple_query("COMMIT"));
            sent
        };
        let read = bound(b"s1");
        client.write_all(&read).await.unwrap();
        assert_eq!(read_n(&mut server, read.len()).await, read, "a bound read's transaction passes whole");
        assert_eq!(api.commit_cuts("p", "commit_cut_upstream").await.unwrap(), 0, "nothing cut");
        let mut write = bound(b"s2");
        let whole = write.len();
        write.extend(simple_query("ROLLBACK"));
        client.write_all(&write).await.unwrap();
        let (got, _) = step("the server side ends after COMMIT", read_to_end(&mut server)).await;
        assert_eq!(got, write[..whole], "the bound write's COMMIT reached the server, nothing after it");
        assert_eq!(api.commit_cuts("p", "commit_cut_upstream").await.unwrap(), 1, "one connection cut");
        s.shutdown().await;
    })
    .await;
}

/// `commit_cut` with `distinct`: the first COMMIT of each kind of transaction (the
/// statements it ran, by their text) is cut, over every connection; the same statements
/// prepared under another name on another connection, or on another proxy whose toxic has
/// the same name, are the same kind, and pass. An attribute other than 0 or 1 is refused.
#[tokio::test]
async fn a_distinct_commit_cut_takes_each_kind_of_transaction_once() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        let api = proxy::Client::new(&s.url()).unwrap();
        let (status, refused) =
            call(&s.url(), "POST", "/proxies/p/toxics", Some(r#"{"type":"commit_cut","attributes":{"distinct":2}}"#))
                .await;
        assert_eq!(status, 400, "{refused}");
        let toxic =
            add_toxic(&s.url(), "p", r#"{"type":"commit_cut","stream":"upstream","attributes":{"distinct":1}}"#).await;
        assert_eq!(toxic["attributes"], serde_json::json!({"distinct": 1}));
        // A second proxy with a toxic of the same name shares the kinds cut.
        let (up_q, mut accepted_q) = accepting_upstream().await;
        let listen_q = make_proxy(&s.url(), "q", up_q).await;
        add_toxic(&s.url(), "q", r#"{"type":"commit_cut","stream":"upstream","attributes":{"distinct":1}}"#).await;
        // Each connection prepares the same write under a name of its own, then commits it.
        for (name, cut, on_q) in [(&b"s2"[..], true, false), (&b"s9"[..], false, false), (&b"s4"[..], false, true)] {
            let (mut client, mut server) = match on_q {
                true => established(listen_q, &mut accepted_q).await,
                false => established(listen, &mut accepted).await,
            };
            let mut opening = pg_startup();
            let mut parse = name.to_vec();
            parse.extend_from_slice(b"\0UPDATE jobs SET state = $1\0\0\0");
            opening.extend(pg_message(b'P', &parse));
            opening.extend(pg_bind(name));
            opening.extend(simple_query("COMMIT"));
            let whole = opening.len();
            opening.extend(simple_query("SELECT 1"));
            client.write_all(&opening).await.unwrap();
            if cut {
                let (got, _) = step("the server side ends after COMMIT", read_to_end(&mut server)).await;
                assert_eq!(got, opening[..whole], "the first of its kind is cut after its COMMIT");
            } else {
                assert_eq!(read_n(&mut server, opening.len()).await, opening, "the second of its kind passes whole");
            }
        }
        assert_eq!(api.commit_cuts("p", "commit_cut_upstream").await.unwrap(), 1, "one connection cut");
        assert_eq!(api.commit_cuts("q", "commit_cut_upstream").await.unwrap(), 0, "none on the other proxy");
        s.shutdown().await;
    })
    .await;
}

/// fencelab's traffic count (`GET /proxies/{name}/fencelab_traffic`): the bytes read from
/// either side, on the clean path and through toxics alike.
#[tokio::test]
async fn a_proxy_counts_the_bytes_it_passes_both_ways() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        let api = proxy::Client::new(&s.url()).unwrap();
        assert_eq!(api.traffic_bytes("p").await.unwrap(), 0, "nothing passed yet");
        let (mut client, mut server) = established(listen, &mut accepted).await;
        client.write_all(b"0123456789").await.unwrap();
        assert_eq!(read_n(&mut server, 10).await, b"0123456789");
        server.write_all(b"abcde").await.unwrap();
        assert_eq!(read_n(&mut client, 5).await, b"abcde");
        assert_eq!(api.traffic_bytes("p").await.unwrap(), 15, "10 up and 5 down");
        add_toxic(&s.url(), "p", r#"{"type":"latency","stream":"upstream","attributes":{"latency":1}}"#).await;
        client.write_all(b"through").await.unwrap();
        assert_eq!(read_n(&mut server, 7).await, b"through");
        assert_eq!(api.traffic_bytes("p").await.unwrap(), 22, "through a toxic too");
        assert!(api.traffic_bytes("absent").await.is_err(), "an unknown proxy is 404");
        s.shutdown().await;
    })
    .await;
}

/// Waits (bounded) until `sock` reads an error of kind `ConnectionReset`: its peer sent an RST.
async fn reset_seen(sock: &mut TcpStream, what: &str) {
    let (_, error) = step(what, read_to_end(sock)).await;
    let kind = error.as_ref().map(std::io::Error::kind);
    assert_eq!(kind, Some(std::io::ErrorKind::ConnectionReset), "{what}: {error:?}");
}

/// Waits (bounded) until `sock` reads a plain end (FIN), with nothing before it.
async fn closed_quietly(sock: &mut TcpStream, what: &str) {
    let (got, error) = step(what, read_to_end(sock)).await;
    assert!(got.is_empty() && error.is_none(), "{what}: {got:?} {error:?}");
}

/// The side a one-sided reset keeps: open, what it sends swallowed, nothing sent to it.
async fn kept_silent(sock: &mut TcpStream) {
    sock.write_all(b"are you there?").await.unwrap();
    silent_for(sock, Duration::from_millis(300)).await;
}

/// `reset_upstream` (fencelab's own): an open connection's server side gets an RST at once,
/// its client side stays open and silent until the toxic is removed, then closes; a
/// connection made meanwhile passes normally.
#[tokio::test]
async fn reset_upstream_resets_the_server_side_and_keeps_the_client_silent_until_removed() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        let api = proxy::Client::new(&s.url()).unwrap();
        let (mut client, mut server) = established(listen, &mut accepted).await;
        client.write_all(b"hello").await.unwrap();
        assert_eq!(read_n(&mut server, 5).await, b"hello");
        let toxic = add_toxic(&s.url(), "p", r#"{"type":"reset_upstream","name":"half"}"#).await;
        assert_eq!(toxic["type"], "reset_upstream");
        reset_seen(&mut server, "the server's side is reset").await;
        kept_silent(&mut client).await;
        assert_eq!(api.resets("p", "half").await.unwrap(), 1, "one connection reset");
        let (mut fresh, mut fresh_server) = established(listen, &mut accepted).await;
        fresh.write_all(b"new").await.unwrap();
        assert_eq!(read_n(&mut fresh_server, 3).await, b"new", "a new connection passes");
        fresh_server.write_all(b"ok").await.unwrap();
        assert_eq!(read_n(&mut fresh, 2).await, b"ok");
        assert_eq!(api.resets("p", "half").await.unwrap(), 1, "the new connection was not reset");
        api.remove_toxic("p", "half").await.unwrap();
        closed_quietly(&mut client, "the silent side is closed when the toxic goes").await;
        s.shutdown().await;
    })
    .await;
}

/// `reset_downstream`: the client's side reset, the server's kept open and silent until the
/// toxic is removed.
#[tokio::test]
async fn reset_downstream_resets_the_client_side_and_keeps_the_server_silent_until_removed() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        let api = proxy::Client::new(&s.url()).unwrap();
        let (mut client, mut server) = established(listen, &mut accepted).await;
        add_toxic(&s.url(), "p", r#"{"type":"reset_downstream","stream":"upstream"}"#).await;
        reset_seen(&mut client, "the client's side is reset").await;
        kept_silent(&mut server).await;
        assert_eq!(api.resets("p", "reset_downstream_upstream").await.unwrap(), 1);
        api.remove_toxic("p", "reset_downstream_upstream").await.unwrap();
        closed_quietly(&mut server, "the silent side is closed when the toxic goes").await;
        s.shutdown().await;
    })
    .await;
}

/// With no connection open when it is added, a one-sided reset takes the first connection
/// accepted after it, once the client's first bytes reached the server (a client that opens
/// a connection per request is caught mid-request), and no other.
#[tokio::test]
async fn a_one_sided_reset_with_nothing_open_takes_the_next_connection_after_its_first_bytes() {
    bounded(async {
        let s = server().await;
        let (up, mut accepted) = accepting_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        let api = proxy::Client::new(&s.url()).unwrap();
        add_toxic(&s.url(), "p", r#"{"type":"reset_upstream","name":"half"}"#).await;
        let (mut client, mut server) = established(listen, &mut accepted).await;
        assert_eq!(api.resets("p", "half").await.unwrap(), 0, "nothing read from it yet");
        client.write_all(b"request").await.unwrap();
        assert_eq!(read_n(&mut server, 7).await, b"request", "the request reaches the server");
        reset_seen(&mut server, "then the server's side is reset").await;
        kept_silent(&mut client).await;
        let (mut next, mut next_server) = established(listen, &mut accepted).await;
        next.write_all(b"again").await.unwrap();
        assert_eq!(read_n(&mut next_server, 5).await, b"again");
        next_server.write_all(b"ok").await.unwrap();
        assert_eq!(read_n(&mut next, 2).await, b"ok", "the connection after it passes");
        assert_eq!(api.resets("p", "half").await.unwrap(), 1);
        s.shutdown().await;
    })
    .await;
}
