//! The engine: one driver for chaos runs and scenarios (start the system and its proxies,
//! chaos or scripted steps, heal, settle, collect, check), the recorder that keeps the one
//! history, and `fencelab import`, which writes a scenario from an incident's records. It
//! knows a run; how a system is started and acted on is the `system` crate's, the run
//! folder and the run's configuration are `runfolder`'s, and the verdict is `verdict`'s.

pub mod error;
pub mod import;
pub mod run;
pub mod scenario;
