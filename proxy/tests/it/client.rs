//! Clients driving the embedded server: fencelab's own typed client (what the
//! harness uses) and the `toxiproxy_rust` crate (users' existing clients must
//! work unchanged; it is blocking, so it runs off the async runtime).

use crate::support::*;
use proxy::{Client, ClientError, ProxyInfo, Stream, Toxic, ToxicKind};
use std::time::Duration;
use tokio::net::TcpStream;

/// A server, an echo upstream, a client and a proxy "db" on port 0.
async fn setup() -> (proxy::ServerHandle, std::net::SocketAddr, Client, std::net::SocketAddr) {
    let s = server().await;
    let up = echo_upstream().await;
    let c = Client::new(&s.url()).unwrap();
    let p = c.create_proxy("db", "127.0.0.1:0", &up.to_string()).await.unwrap();
    let addr = p.listen_addr().unwrap();
    assert_ne!(addr.port(), 0);
    (s, up, c, addr)
}

#[tokio::test]
async fn typed_client_manages_toxics() {
    bounded(async {
        let (s, _up, c, addr) = setup().await;
        assert_eq!(c.version().await.unwrap(), proxy::VERSION);
        let mut sock = step("connect", TcpStream::connect(addr)).await.unwrap();
        round_trip(&mut sock, b"hello").await;
        let lag = Toxic::new(ToxicKind::Latency { latency_ms: 100, jitter_ms: 0 }).on(Stream::Upstream);
        let stored = c.add_toxic("db", &lag).await.unwrap();
        assert_eq!(stored, lag);
        assert_eq!(stored.name, "latency_upstream");
        assert!(round_trip(&mut sock, b"slow").await >= Duration::from_millis(90));
        let faster = Toxic { kind: ToxicKind::Latency { latency_ms: 1, jitter_ms: 0 }, ..lag.clone() };
        c.update_toxic("db", &faster).await.unwrap();
        assert_eq!(c.toxics("db").await.unwrap(), vec![faster]);
        c.remove_toxic("db", "latency_upstream").await.unwrap();
        assert!(c.toxics("db").await.unwrap().is_empty());
        let all = [
            ToxicKind::Noop,
            ToxicKind::Bandwidth { rate_kbps: 10 },
            ToxicKind::SlowClose { delay_ms: 1 },
            ToxicKind::Timeout { timeout_ms: 0 },
            ToxicKind::ResetPeer { timeout_ms: 5 },
            ToxicKind::Slicer { average_size_bytes: 8, size_variation_bytes: 2, delay_us: 10 },
            ToxicKind::LimitData { bytes: 100 },
        ];
        for kind in all {
            let t = Toxic::new(kind).with_toxicity(0.5);
            assert_eq!(c.add_toxic("db", &t).await.unwrap(), t);
        }
        assert_eq!(c.toxics("db").await.unwrap().len(), 7);
        let err = c.remove_toxic("db", "none").await.unwrap_err();
        assert!(matches!(err, ClientError::Api { status: 404, .. }), "{err}");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn typed_client_manages_proxies() {
    bounded(async {
        let (s, up, c, addr) = setup().await;
        c.add_toxic("db", &Toxic::new(ToxicKind::Noop)).await.unwrap();
        let off = c.set_enabled("db", false).await.unwrap();
        assert!(!off.enabled);
        assert!(!accepts(addr).await);
        c.reset().await.unwrap();
        let p = c.proxy("db").await.unwrap();
        assert!(p.enabled && p.toxics.is_empty());
        assert_eq!(p.listen_addr().unwrap(), addr, "re-enabled on the same port");
        assert!(accepts(addr).await);
        let err = c.create_proxy("db", "127.0.0.1:0", "127.0.0.1:1").await.unwrap_err();
        assert!(matches!(err, ClientError::Api { status: 409, .. }), "{err}");
        let other = echo_upstream().await;
        let moved = c.set_upstream("db", &other.to_string()).await.unwrap();
        assert_eq!(moved.upstream, other.to_string());
        let two = ProxyInfo {
            name: "two".into(),
            listen: "127.0.0.1:0".into(),
            upstream: up.to_string(),
            enabled: true,
            toxics: vec![],
            half_close: false,
        };
        let populated = c.populate(&[two]).await.unwrap();
        assert_eq!(populated[0].name, "two");
        assert_eq!(c.proxies().await.unwrap().len(), 2);
        c.delete_proxy("db").await.unwrap();
        assert!(!accepts(addr).await);
        assert_eq!(c.proxies().await.unwrap().len(), 1);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn typed_client_reports_transport_errors() {
    bounded(async {
        let s = server().await;
        let url = s.url();
        s.shutdown().await;
        let c = Client::new(&url).unwrap();
        let err = step("refused", c.proxies()).await.unwrap_err();
        assert!(matches!(err, ClientError::Http(_)), "{err}");
    })
    .await;
}

#[tokio::test]
async fn toxiproxy_rust_drives_the_embedded_server() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        let api = s.addr();
        let upstream = up.to_string();
        // The crate is blocking: every call runs on the blocking pool.
        let listen = step("populate", tokio::task::spawn_blocking(move || populate_with_rust_client(api, upstream)))
            .await
            .unwrap();
        let addr: std::net::SocketAddr = listen.parse().unwrap();
        let mut sock = step("connect", TcpStream::connect(addr)).await.unwrap();
        let rtt = round_trip(&mut sock, b"via toxiproxy_rust").await;
        assert!(rtt >= Duration::from_millis(90), "{rtt:?}");

        step(
            "disable",
            tokio::task::spawn_blocking(move || {
                let c = toxiproxy_rust::client::Client::new(api);
                let p = c.find_and_reset_proxy("rs").expect("reset proxy");
                assert!(p.toxics().unwrap().is_empty());
                p.disable().expect("disable");
            }),
        )
        .await
        .unwrap();
        assert!(!accepts(addr).await);
        step(
            "reset",
            tokio::task::spawn_blocking(move || {
                let c = toxiproxy_rust::client::Client::new(api);
                c.reset().expect("reset");
                c.find_proxy("rs").unwrap().delete().expect("delete");
                assert!(c.all().unwrap().is_empty());
            }),
        )
        .await
        .unwrap();
        assert!(!accepts(addr).await);
        s.shutdown().await;
    })
    .await;
}

/// Populates proxy "rs" with `toxiproxy_rust` and adds 100 ms of downstream
/// latency; answers the proxy's bound listen address. Blocking.
fn populate_with_rust_client(api: std::net::SocketAddr, upstream: String) -> String {
    let c = toxiproxy_rust::client::Client::new(api);
    assert!(c.is_running());
    let pack = toxiproxy_rust::proxy::ProxyPack::new("rs".into(), "127.0.0.1:0".into(), upstream);
    let proxies = c.populate(vec![pack]).expect("populate");
    assert_eq!(proxies.len(), 1);
    let p = c.find_proxy("rs").expect("find");
    p.with_latency("downstream".into(), 100, 0, 1.0);
    assert_eq!(p.toxics().expect("toxics").len(), 1);
    assert!(c.version().expect("version").contains(proxy::VERSION));
    assert!(c.all().expect("all").contains_key("rs"));
    p.proxy_pack.listen.clone()
}
