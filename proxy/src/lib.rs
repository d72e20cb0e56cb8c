//! fencelab's fault proxy: a Toxiproxy-compatible server (REST API and toxic
//! engine) that every run embeds, and the client the harness uses to drive it
//! or a real Toxiproxy.
//!
//! Real Toxiproxy is a Go program that many CI machines cannot install, so the
//! server lives here; the client speaks only Toxiproxy's REST API so the same
//! code drives either. See `docs/toxiproxy.md` for what is supported and why.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use proxy::{Client, Stream, Toxic, ToxicKind};
//! let server = proxy::start("127.0.0.1:0".parse()?, 42).await?;
//! let client = Client::new(&server.url())?;
//! let p = client.create_proxy("db", "127.0.0.1:0", "127.0.0.1:5432").await?;
//! let addr = p.listen_addr()?; // connect here instead of the database
//! let lag = ToxicKind::Latency { latency_ms: 50, jitter_ms: 5 };
//! client.add_toxic("db", &Toxic::new(lag).on(Stream::Upstream)).await?;
//! client.reset().await?;
//! server.shutdown().await;
//! # let _ = addr; Ok(()) }
//! ```

mod api;
mod client;
mod error;
mod link;
mod registry;
mod server;
mod toxic;

pub use api::VERSION;
pub use client::{Client, ProxyInfo};
pub use error::{ApiError, ClientError, Error};
pub use server::{serve_forever, start, ServerHandle};
pub use toxic::{Stream, Toxic, ToxicInputError, ToxicKind};
