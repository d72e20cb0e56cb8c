//! Benchmark: a proxied connection with no toxics against a direct loopback
//! connection. Measures request/response round trips (p50, p99) and bulk
//! one-way throughput, and prints a table. Run in release:
//! `cargo bench -p proxy --bench proxy`. With `FENCELAB_BENCH_SMOKE=1` (CI: `cargo test
//! --benches`) it sends a hundredth of the round trips and 16 MiB once: it checks the
//! bench runs, not speed.
//!
//! Targets from the issue: proxied p50 round trip at most 2x direct; proxied
//! bulk throughput at least 1 GB/s.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const RTT_WARMUP: usize = 2_000;
const RTT_SAMPLES: usize = 20_000;
const RTT_MESSAGE_BYTES: usize = 64;
const BULK_BYTES: u64 = 2 * 1024 * 1024 * 1024;
const BULK_WRITE_BYTES: usize = 256 * 1024;
const BULK_RUNS: usize = 3;

/// Smoke mode (`FENCELAB_BENCH_SMOKE`): a hundredth of the round trips, 16 MiB once.
fn smoke() -> bool {
    std::env::var_os("FENCELAB_BENCH_SMOKE").is_some()
}

/// Round trips: (warm-up, samples).
fn rtt_counts() -> (usize, usize) {
    if smoke() {
        (RTT_WARMUP / 100, RTT_SAMPLES / 100)
    } else {
        (RTT_WARMUP, RTT_SAMPLES)
    }
}

/// Bytes of one bulk run, and how many runs.
fn bulk_size() -> (u64, usize) {
    if smoke() {
        (16 * 1024 * 1024, 1)
    } else {
        (BULK_BYTES, BULK_RUNS)
    }
}
const BOUND: Duration = Duration::from_secs(120);

/// Echoes every byte back, one task per connection.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            sock.set_nodelay(true).unwrap();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if sock.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Reads until [`BULK_BYTES`] arrived, then answers one byte so the sender knows all
/// arrived. It counts rather than waiting for the sender's FIN: the proxy, as Toxiproxy
/// does, closes both directions when the client closes its side, so an answer after a
/// half-close would never get back.
async fn sink_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut received = 0u64;
                while let Ok(n) = sock.read(&mut buf).await {
                    received += n as u64;
                    if received >= bulk_size().0 {
                        let _ = sock.write_all(b"k").await;
                        return;
                    }
                    if n == 0 {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Round-trip times in microseconds: (p50, p99).
async fn rtt(addr: SocketAddr) -> (f64, f64) {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    sock.set_nodelay(true).unwrap();
    let msg = vec![42u8; RTT_MESSAGE_BYTES];
    let mut back = vec![0u8; RTT_MESSAGE_BYTES];
    let (warmup, count) = rtt_counts();
    let mut samples = Vec::with_capacity(count);
    for i in 0..warmup + count {
        let start = Instant::now();
        sock.write_all(&msg).await.unwrap();
        sock.read_exact(&mut back).await.unwrap();
        if i >= warmup {
            samples.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
    (pct(0.50), pct(0.99))
}

/// One-way bulk throughput in GB/s (median of runs).
async fn bulk(addr: SocketAddr) -> f64 {
    let (bytes, runs) = bulk_size();
    let mut rates = Vec::with_capacity(runs);
    let chunk = vec![7u8; BULK_WRITE_BYTES];
    for _ in 0..runs {
        let mut sock = TcpStream::connect(addr).await.unwrap();
        let start = Instant::now();
        let mut sent = 0u64;
        while sent < bytes {
            sock.write_all(&chunk).await.unwrap();
            sent += chunk.len() as u64;
        }
        let mut ack = [0u8; 1];
        sock.read_exact(&mut ack).await.unwrap();
        rates.push(sent as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    rates[rates.len() / 2]
}

async fn run() {
    let server = proxy::start("127.0.0.1:0".parse().unwrap(), 1).await.unwrap();
    let client = proxy::Client::new(&server.url()).unwrap();
    let echo = echo_server().await;
    let sink = sink_server().await;
    let echo_proxy = client.create_proxy("echo", "127.0.0.1:0", &echo.to_string()).await.unwrap();
    let sink_proxy = client.create_proxy("sink", "127.0.0.1:0", &sink.to_string()).await.unwrap();
    let (echo_via, sink_via) = (echo_proxy.listen_addr().unwrap(), sink_proxy.listen_addr().unwrap());

    let (d50, d99) = rtt(echo).await;
    let (p50, p99) = rtt(echo_via).await;
    let d_bulk = bulk(sink).await;
    let p_bulk = bulk(sink_via).await;

    println!("{:<10} {:>14} {:>14} {:>14}", "path", "rtt p50 (us)", "rtt p99 (us)", "bulk (GB/s)");
    println!("{:<10} {:>14.1} {:>14.1} {:>14.2}", "direct", d50, d99, d_bulk);
    println!("{:<10} {:>14.1} {:>14.1} {:>14.2}", "proxied", p50, p99, p_bulk);
    println!(
        "ratio p50 proxied/direct = {:.2} (target <= 2.0); proxied bulk = {:.2} GB/s (target >= 1.0)",
        p50 / d50,
        p_bulk
    );
    server.shutdown().await;
}

fn main() {
    // `cargo test --benches` passes --bench-less flags; only run when benchmarking.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        tokio::time::timeout(BOUND, run()).await.expect("benchmark exceeded its bound");
    });
}
