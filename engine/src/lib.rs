//! The engine: one driver for chaos runs and scenarios (start the system and its proxies,
//! chaos or scripted steps, heal, settle, collect, check), the recorder that keeps the one
//! history, and the run folder written and read back through typed files. It knows a run;
//! how a system is started and acted on is the `system` crate's.

pub mod audit;
pub mod check;
pub mod evidence;
pub mod folder;
pub mod import;
pub mod run;
pub mod scenario;
