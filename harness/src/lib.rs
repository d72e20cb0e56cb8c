//! The harness: fencelab's command line, and the glue that starts and drives the lab and
//! the fault proxy. The work itself lives in the libraries it calls (`lab`, `proxy`).

pub mod check;
pub mod cli;
pub mod conform;
pub mod diff;
pub mod exit;
pub mod image;
pub mod matrix;
pub mod replay;
pub mod run;
pub mod runs;
pub mod scenario;
pub mod shrink;
pub mod suite;
pub mod system;
pub mod trends;
