//! Integration tests of the proxy crate, in one binary: the REST API against
//! Toxiproxy's semantics (`api`), toxics over real TCP (`toxics`), the clients
//! driving the embedded server (`client`), and the conformance suite that ports
//! the cases of Toxiproxy's own tests (`upstream_api`, `upstream_toxics`,
//! `upstream_proxy`), each named after the upstream test it mirrors. Every test
//! runs under a timeout so a regression fails instead of hanging.

mod api;
mod chaostoolkit;
mod client;
mod fidelity;
mod support;
mod toxics;
mod upstream_api;
mod upstream_proxy;
mod upstream_toxics;
