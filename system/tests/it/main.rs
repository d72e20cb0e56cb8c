//! The `system` crate's integration tests: what it does to the host, on the host.

mod packets;
