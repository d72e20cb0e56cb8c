//! The lab's integration tests: the rules at the store level with a controlled clock, the
//! planted bugs, and the lab as real processes over loopback HTTP — on SQLite and on
//! PostgreSQL.

mod bad_input;
mod bugs;
mod postgres;
mod processes;
mod rules;
mod world;
