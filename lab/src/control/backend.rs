//! The store a control plane runs on, chosen at start: the embedded SQLite file (the
//! default) or a PostgreSQL schema. Each transaction goes to the one store unchanged.

use super::postgres::Postgres;
use super::sqlite::Sqlite;
use super::store::{Store, StoreError, Tx};

pub enum Backend {
    Sqlite(Sqlite),
    Postgres(Box<Postgres>),
}

impl Store for Backend {
    fn transact<T, E: From<StoreError>>(&self, work: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E> {
        match self {
            Backend::Sqlite(store) => store.transact(work),
            Backend::Postgres(store) => store.transact(work),
        }
    }

    fn dry_run<T, E: From<StoreError>>(&self, work: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E> {
        match self {
            Backend::Sqlite(store) => store.dry_run(work),
            Backend::Postgres(store) => store.dry_run(work),
        }
    }

    fn transact_unlocked<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce(&mut dyn Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        match self {
            Backend::Sqlite(store) => store.transact_unlocked(work),
            Backend::Postgres(store) => store.transact_unlocked(work),
        }
    }
}

impl From<Sqlite> for Backend {
    fn from(store: Sqlite) -> Backend {
        Backend::Sqlite(store)
    }
}

impl From<Postgres> for Backend {
    fn from(store: Postgres) -> Backend {
        Backend::Postgres(Box::new(store))
    }
}
