//! The run folder and the run's configuration. [`folder::RunFolder`] alone creates, writes
//! and reads a run folder's files, each through the type that holds it;
//! [`config::RunConfig`] is the run's validated configuration, and its one writer of the
//! `fencelab run` command line.

pub mod config;
pub mod folder;
