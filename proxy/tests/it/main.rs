//! Integration tests of the proxy crate, in one binary: the REST API against
//! Toxiproxy's semantics (`api`), toxics over real TCP (`toxics`), and the
//! clients driving the embedded server (`client`). Every test runs under a
//! timeout so a regression fails instead of hanging.

mod api;
mod client;
mod support;
mod toxics;
