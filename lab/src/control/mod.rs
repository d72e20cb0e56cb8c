//! The control plane: rules over a store, served over HTTP.

pub mod backend;
pub mod http;
pub mod postgres;
pub mod rules;
pub mod sqlite;
pub mod store;

pub use backend::Backend;
pub use postgres::{PgOptions, Postgres};
pub use rules::{Now, Policy, RuleError, Rules};
pub use sqlite::Sqlite;
