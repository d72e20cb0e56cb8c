//! Processes on this host, for every crate that starts them — the lab's own servers, the
//! harness's systems under test, the tests: children in their own process group that die
//! with their parent and announce their address ([`launch`]), a throwaway PostgreSQL
//! cluster ([`pg`]), and the termination signals a server or the harness stops on.
//!
//! It knows nothing of fencelab's contract, the lab or the harness: the lab (a system under
//! test) and the harness both depend on it, and on nothing of each other's for it.

pub mod launch;
pub mod pg;

/// Resolves on SIGTERM or SIGINT, its handlers installed when it is first polled.
pub async fn termination() {
    installed_termination().await
}

/// Resolves on SIGTERM or SIGINT, its handlers installed now (inside a runtime): a server
/// takes it before it announces its address, so that a SIGTERM sent once it answers is
/// always its own to handle (polled later, a loaded machine let one kill a target outright).
pub fn installed_termination() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
    let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT handler installs");
    async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    }
}
