//! Decoding of foreign bytes that may panic (arrow-ipc, parquet and hdf5-reader panic on some
//! malformed input), run so that a panic becomes an error without the panic hook's
//! `thread '…' panicked at …` lines on stderr. A leaf, like `fault`: any decoder may use it.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

thread_local! {
    /// How many [`quietly`] calls the current thread is inside.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

static HOOK: Once = Once::new();

/// Installs, once per process, a panic hook that says nothing while the panicking thread is
/// inside [`quietly`] and otherwise hands the panic to the hook that was there before (the
/// default one prints the message and backtrace note as usual). A hook installed later by the
/// program replaces this one: its panics are then reported as it chooses.
fn install() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if DEPTH.try_with(Cell::get).unwrap_or(0) == 0 {
                previous(info);
            }
        }));
    });
}

/// Resets the depth on the way out, whether `f` returned or unwound.
struct Leave;

impl Drop for Leave {
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Runs `f`, catching a panic (as [`std::panic::catch_unwind`] does) without printing it:
/// the caller turns it into an error that names the file. Only panics on this thread are
/// silenced; a panic on another thread `f` starts is reported as usual.
pub(crate) fn quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    install();
    DEPTH.with(|d| d.set(d.get() + 1));
    let _leave = Leave;
    catch_unwind(AssertUnwindSafe(f))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_caught_panic_is_an_error_and_the_depth_is_restored() {
        assert_eq!(super::quietly(|| 7).unwrap(), 7);
        let r = super::quietly(|| -> u8 { panic!("bad bytes") });
        let msg = r.unwrap_err();
        assert_eq!(msg.downcast_ref::<&str>(), Some(&"bad bytes"));
        // Nested calls, and the depth back at zero afterwards.
        let inner = super::quietly(|| super::quietly(|| -> u8 { panic!("inner") }).is_err());
        assert_eq!(inner.ok(), Some(true));
        assert_eq!(super::DEPTH.with(std::cell::Cell::get), 0);
    }
}
