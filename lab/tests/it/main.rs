//! The lab's integration tests: the rules at the store level with a controlled clock, the
//! planted bugs, the lab as real processes over loopback HTTP — on SQLite and on
//! PostgreSQL — and the runner against a scripted control plane.

mod bad_input;
mod bugs;
mod contract;
mod locking;
mod postgres;
mod processes;
mod rules;
mod runner;
mod world;
