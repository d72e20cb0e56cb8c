//! The verdict side: [`check`] a run folder's history with every checker and write its
//! results; [`audit`] a live control plane's ledger, once or following it; assemble an
//! incident's records into a folder [`check`] reads ([`evidence`]). It reads what a run or
//! a production system recorded; it starts nothing and injects nothing.

pub mod audit;
pub mod check;
pub mod evidence;
