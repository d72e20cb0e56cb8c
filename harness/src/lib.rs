//! The `fencelab` command line, and only that: the clap types, one tokio runtime per
//! command, and the one error enum mapped to the one exit table. The work lives in the
//! libraries it calls: `system` (starting any system), `engine` (runs and scenarios),
//! `conform` (the conformance suite), `campaign` (matrix, suites, replay, shrink, diff).

pub mod args;
pub mod cli;
pub mod error;
pub mod exit;
