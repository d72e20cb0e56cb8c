//! The control plane: rules over a store, served over HTTP.

pub mod http;
pub mod rules;
pub mod sqlite;
pub mod store;

pub use rules::{Now, Policy, RuleError, Rules};
pub use sqlite::Sqlite;
