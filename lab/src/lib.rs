//! The lab: fencelab's own system under test. A control plane that fences attempts and
//! preserves uncertainty, a runner that fences itself, and a deployment target that can
//! fence its side effects — each a real process talking HTTP/JSON over TCP — plus planted
//! bugs that each remove one protection, so that fencelab's checkers can be shown to fail.
//!
//! ```
//! use lab::bugs::Bug;
//! assert_eq!("accept-stale-result".parse::<Bug>().unwrap(), Bug::AcceptStaleResult);
//! ```

pub mod bugs;
pub mod capability;
pub mod cli;

pub mod control;
pub mod demo;
pub mod ingress;

pub mod runner;
pub mod stepper;
pub mod target;
pub mod web;
