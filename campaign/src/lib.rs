//! Campaigns: many runs, each a `fencelab run` or `fencelab scenario run` child process —
//! the bug × fault matrix, suites and their shards, replays, shrinking a run to a scenario,
//! trends over nights and the difference of two runs. Planning is pure; running is child
//! processes, read back through the run folder's typed files.

pub mod diff;
pub mod error;
pub mod matrix;
pub mod replay;
pub mod runs;
pub mod shrink;
pub mod suite;
pub mod trends;

pub use error::CampaignError;
