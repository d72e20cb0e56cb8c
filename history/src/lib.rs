//! The history of a fencelab run: one event model and its JSONL format.
//!
//! Every source of a run (client, operator, nemesis, each runner, the control plane's
//! ledger, the target's step log) records [`Event`]s. Events are flat so that a checker
//! can read any of them with the same few fields: the claim they concern (job, attempt,
//! runner, fence), the decision that was taken, and two separate clocks — the server's
//! receipt time and the runner's observation time — which are never merged.
//!
//! A history is written one JSON object per line and flushed per event, so a killed
//! writer leaves a readable prefix. It is validated when written and when read.
//!
//! ```
//! use history::{Event, EventType, Op, Process};
//! let mut writer = history::Writer::new(Vec::new());
//! writer.append(Event::new(0, Process::CLIENT, EventType::Invoke, Op::Submit).with_job("j1")).unwrap();
//! let bytes = writer.into_inner();
//! let events = history::read(&bytes[..]).unwrap();
//! assert_eq!(events[0].job.as_deref(), Some("j1"));
//! // A word the vocabulary does not hold is an error that names the line.
//! let dialect = br#"{"index":0,"time_ns":0,"process":"client","type":"ok","f":"submit-v2"}"#;
//! assert!(history::read(&dialect[..]).unwrap_err().to_string().starts_with("history line 1:"));
//! ```

mod config;
mod event;
mod exit;
mod io;
mod quick;
mod vocab;

pub use config::{Config, SystemConfig};
pub use event::{Decision, Event, EventType};
pub use exit::Exit;
pub use io::{is_blank, log_line, parse_line, read, Error, LineError, Order, Reader, Writer};
pub use vocab::{ClosedBy, Op, OutcomeWord, Process, Reason, RecordedAs, Role, Source, TargetMode, WordError};

mod sources;
pub use sources::{cut, declared, sources_event, sources_of};
