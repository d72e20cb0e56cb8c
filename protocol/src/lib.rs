//! The system contract as code: every wire body of the control plane, the runner and the
//! target ([`wire`]), how a server reads a request body ([`body`]), a typed async client for them ([`client`]), the one clock every
//! process of a run stamps its log with ([`clock`]), and the bad input every server must refuse ([`bad_input`]). The harness knows any system under
//! test only through this crate; the lab is one implementation of it.
//!
//! ```
//! use protocol::{ClaimRef, HeartbeatRequest};
//! let body = r#"{"job":"j1","attempt":"j1-a1","runner":"r1","fence":7,"observed_ms":0}"#;
//! let request: HeartbeatRequest = serde_json::from_str(body).unwrap();
//! assert_eq!(request.claim, ClaimRef { job: "j1".into(), attempt: "j1-a1".into(), runner: "r1".into(), fence: 7 });
//! // Unknown fields are refused, so a typo is an error rather than a silently ignored field.
//! assert!(serde_json::from_str::<HeartbeatRequest>(&body.replace("fence", "fense")).is_err());
//! ```

pub mod bad_input;
pub mod body;
pub mod client;
pub mod clock;
pub mod wire;

pub use client::{Client, ClientError};
pub use clock::monotonic_ns;
pub use wire::*;
