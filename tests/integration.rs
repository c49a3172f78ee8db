//! The integration tests, one binary organised like `src/`: a folder per module of the library
//! (`tests/<module>/`), with shared builders of test data in `tests/common/`. Run one module with
//! `cargo test --test integration <module>::` (e.g. `loader::`, `store::golden::`).
//!
//! Separate binaries remain only where a feature or a process needs one: `crash` (feature
//! `fault-injection`: crash points in a child writer), `ballista` (feature `ballista`), `layers`
//! (reads the sources), and `torch`, `torch_cpu_only`, `torch_oom` (feature `torch`; the last two
//! need a process of their own).

mod common;

mod cli;
mod gather;
mod ingest;
mod loader;
#[cfg(feature = "remote")]
mod remote;
mod robustness;
mod sample;
#[cfg(feature = "sql")]
mod sql;
mod store;
