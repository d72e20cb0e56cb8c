//! Starting and stopping the embedded Toxiproxy-compatible server: binds the
//! REST API, serves it on the current tokio runtime, and on shutdown stops the
//! API and every proxy so that nothing is left listening or connected.

use crate::api::router;
use crate::error::Error;
use crate::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Longest wait for in-flight API requests at shutdown.
const API_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A running server. Dropping it without [`ServerHandle::shutdown`] leaves the
/// tasks running until the runtime ends.
pub struct ServerHandle {
    addr: SocketAddr,
    registry: Arc<Registry>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), Error>>,
}

impl ServerHandle {
    /// The bound address of the REST API.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL of the REST API, e.g. `http://127.0.0.1:8474`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the API and every proxy, closing all listeners and connections.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let abort = self.task.abort_handle();
        if tokio::time::timeout(API_DRAIN_TIMEOUT, &mut self.task).await.is_err() {
            abort.abort();
            let _ = (&mut self.task).await;
        }
        self.registry.stop_all().await;
    }

    /// Waits until the API server stops on its own (it only does on error).
    pub async fn wait(&mut self) -> Result<(), Error> {
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => Err(Error::Serve(std::io::Error::other(e.to_string()))),
        }
    }
}

/// Binds the REST API on `listen` (port 0 picks a free port; see
/// [`ServerHandle::addr`]) and serves it. `seed` drives every random choice.
pub async fn start(listen: SocketAddr, seed: u64) -> Result<ServerHandle, Error> {
    let listener =
        TcpListener::bind(listen).await.map_err(|source| Error::Bind { addr: listen.to_string(), source })?;
    let addr = listener.local_addr().map_err(Error::Serve)?;
    let registry = Arc::new(Registry::new(seed));
    let app = router(registry.clone());
    let (stop, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop_rx.await;
            })
            .await
            .map_err(Error::Serve)
    });
    Ok(ServerHandle { addr, registry, stop: Some(stop), task })
}

/// Runs the server until Ctrl-C, then shuts it down (the standalone
/// `fencelab toxiproxy` command).
pub async fn serve_forever(listen: SocketAddr, seed: u64) -> Result<(), Error> {
    let mut handle = start(listen, seed).await?;
    // Listen for SIGINT before saying where the API is, so a SIGINT sent as soon as the
    // address is known stops the server instead of killing it.
    let mut interrupt =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).map_err(Error::Serve)?;
    eprintln!("toxiproxy-compatible API listening on {}", handle.url());
    let result = tokio::select! {
        r = handle.wait() => r,
        _ = interrupt.recv() => Ok(()),
    };
    handle.shutdown().await;
    result
}
