//! Progress of long operations (ingest, push, pull), reported to whoever asked for it.
//!
//! The library draws nothing: an operation calls the [`Progress`] its options carry, and the
//! caller decides what to show. The `trajstore` binary draws terminal bars with it; a notebook
//! could feed tqdm; a service could export metrics. With no receiver set, reporting costs nothing.

use std::sync::Arc;

/// What an operation counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unit {
    /// Transitions (rows).
    Rows,
    /// Bytes transferred.
    Bytes,
}

/// Receives the progress of a long operation. Methods are called from worker threads, so an
/// implementation must be cheap and thread-safe; `advance` may be called very often.
pub trait Progress: Send + Sync {
    /// Operation `what` ("ingest", "push", "pull") starts, counting in `unit`; `total` is how many
    /// units it expects when that is known in advance (a stream has no total).
    fn start(&self, what: &str, unit: Unit, total: Option<u64>);
    /// `n` more units are done.
    fn advance(&self, n: u64);
    /// The operation ended: `ok` is false when it failed.
    fn finish(&self, ok: bool);
}

/// The progress receiver an options struct carries: none by default, shared (cheap to clone)
/// when set.
#[derive(Clone, Default)]
pub struct ProgressSink(Option<Arc<dyn Progress>>);

impl ProgressSink {
    /// Reports to `progress`.
    pub fn new(progress: impl Progress + 'static) -> Self {
        Self(Some(Arc::new(progress)))
    }

    /// Reports to a receiver already shared.
    pub fn shared(progress: Arc<dyn Progress>) -> Self {
        Self(Some(progress))
    }

    /// Whether a receiver is set.
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    pub(crate) fn start(&self, what: &str, unit: Unit, total: Option<u64>) {
        if let Some(p) = &self.0 {
            p.start(what, unit, total);
        }
    }

    pub(crate) fn advance(&self, n: u64) {
        if let Some(p) = &self.0 {
            p.advance(n);
        }
    }

    pub(crate) fn finish(&self, ok: bool) {
        if let Some(p) = &self.0 {
            p.finish(ok);
        }
    }
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_set() {
            "ProgressSink(set)"
        } else {
            "ProgressSink(none)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Progress for Arc<Log> {
        fn start(&self, what: &str, unit: Unit, total: Option<u64>) {
            self.0
                .lock()
                .unwrap()
                .push(format!("start {what} {unit:?} {total:?}"));
        }
        fn advance(&self, n: u64) {
            self.0.lock().unwrap().push(format!("+{n}"));
        }
        fn finish(&self, ok: bool) {
            self.0.lock().unwrap().push(format!("finish {ok}"));
        }
    }

    #[test]
    fn a_sink_forwards_to_its_receiver_and_an_empty_one_does_nothing() {
        let log = Arc::new(Log::default());
        let sink = ProgressSink::new(log.clone());
        let copy = sink.clone();
        sink.start("push", Unit::Bytes, Some(10));
        copy.advance(4);
        copy.advance(6);
        sink.finish(true);
        assert_eq!(
            *log.0.lock().unwrap(),
            ["start push Bytes Some(10)", "+4", "+6", "finish true"]
        );
        let none = ProgressSink::default();
        assert!(!none.is_set());
        none.start("ingest", Unit::Rows, None);
        none.advance(1);
        none.finish(false);
        assert_eq!(format!("{none:?}"), "ProgressSink(none)");
    }
}
