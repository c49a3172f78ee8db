//! Crash and pause points for crash-consistency and concurrency tests, compiled in only with the
//! `fault-injection` feature (which `scripts/test.sh` turns on): in every other build, release
//! binaries included, a point is an empty inline function and no environment variable is read.
//!
//! With the feature, when the environment variable `TRAJSTORE_CRASH_AT` names a point (`name`, or
//! `name@N` for its `N`-th arrival), the process aborts there (as a power cut or `kill -9`
//! would). The variable is read once.

#[cfg(feature = "fault-injection")]
use std::sync::OnceLock;

/// Without `fault-injection`: nothing.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn point(_name: &str) {}

/// Without `fault-injection`: nothing.
#[cfg(all(feature = "remote", not(feature = "fault-injection")))]
#[inline(always)]
pub(crate) fn pause(_name: &str) {}

/// Aborts the process if `TRAJSTORE_CRASH_AT` equals `name`, or is `name@N` and this is the
/// `N`-th arrival at `name` (counted from 1) in this process.
#[cfg(feature = "fault-injection")]
pub(crate) fn point(name: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static ARRIVALS: AtomicU64 = AtomicU64::new(0);
    let target = TARGET.get_or_init(|| {
        let v = std::env::var("TRAJSTORE_CRASH_AT").ok()?;
        Some(match v.split_once('@') {
            Some((n, k)) => (n.to_string(), k.parse().unwrap_or(1)),
            None => (v, 1),
        })
    });
    let Some((at, nth)) = target else { return };
    if at == name && ARRIVALS.fetch_add(1, Ordering::SeqCst) + 1 == *nth {
        eprintln!("trajstore: simulated crash at `{name}`");
        std::process::abort();
    }
}

/// Holds the process at `name` while the file named by `TRAJSTORE_PAUSE_FILE` exists, if
/// `TRAJSTORE_PAUSE_AT` equals `name`: tests of concurrent writers use it to let another writer
/// run at exactly this point. `<file>.reached` is created on arrival. With the variables unset, a
/// point costs one load of a cached value.
#[cfg(all(feature = "remote", feature = "fault-injection"))]
pub(crate) fn pause(name: &str) {
    static TARGET: OnceLock<Option<(String, std::path::PathBuf)>> = OnceLock::new();
    let target = TARGET.get_or_init(|| {
        let at = std::env::var("TRAJSTORE_PAUSE_AT").ok()?;
        let file = std::env::var_os("TRAJSTORE_PAUSE_FILE")?;
        Some((at, file.into()))
    });
    let Some((at, file)) = target else { return };
    if at != name {
        return;
    }
    let mut reached = file.clone().into_os_string();
    reached.push(".reached");
    let _ = std::fs::write(&reached, name);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while file.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
