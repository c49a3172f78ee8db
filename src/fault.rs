//! Crash points for crash-consistency tests.
//!
//! When the environment variable `TRAJSTORE_CRASH_AT` names a point, the process aborts there (as
//! a power cut or `kill -9` would). The variable is read once; with it unset, a point costs one
//! load of a cached value.

use std::sync::OnceLock;

/// Aborts the process if `TRAJSTORE_CRASH_AT` equals `name`.
pub(crate) fn point(name: &str) {
    static TARGET: OnceLock<Option<String>> = OnceLock::new();
    let target = TARGET.get_or_init(|| std::env::var("TRAJSTORE_CRASH_AT").ok());
    if target.as_deref() == Some(name) {
        eprintln!("trajstore: simulated crash at `{name}`");
        std::process::abort();
    }
}
