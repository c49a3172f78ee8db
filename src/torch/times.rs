//! Where a torch loader's time goes, per batch: its workers' (waiting for a staging slot,
//! gathering or planning, handing over) and its consumer's (waiting for the workers, issuing),
//! summed over every batch for [`super::TorchLoader::worker_times`] and `bench --device`.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// Where the streaming workers' time goes, summed over every worker and batch: waiting for a
/// staging slot's copy, gathering into it, and everything after (through the device ring, the
/// hand-over only; on CUDA without it: the copy's issue, the device allocation, views, the
/// expansion or decode, the event; on the CPU: expansion, decode, transform, cast); and the
/// consumer's time issuing ring copies. `bench --device` reports the means per batch. In
/// resident mode the workers' "gather" is planning a batch's parameters, and the consumer issues
/// every batch (the parameters' copy, the kernel, the views).
#[derive(Default)]
pub(crate) struct WorkerTimes {
    batches: AtomicU64,
    wait_ns: AtomicU64,
    gather_ns: AtomicU64,
    device_ns: AtomicU64,
    issued: AtomicU64,
    issue_ns: AtomicU64,
    asked: AtomicU64,
    waited_ns: AtomicU64,
}

/// Where a streaming loader's workers spent their time ([`super::TorchLoader::worker_times`]):
/// batches and nanoseconds summed over every worker since the loader started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkerTimesTotal {
    /// Batches the workers produced.
    pub batches: u64,
    /// Waiting for a staging slot's earlier copy to finish.
    pub wait_ns: u64,
    /// Gathering into the slot.
    pub gather_ns: u64,
    /// What follows the gather until the batch is handed over.
    pub device_ns: u64,
    /// Batches whose copy the consumer issued into the device ring, in
    /// [`super::TorchLoader::next_batch`] (resident mode: every batch).
    pub issued: u64,
    /// The consumer's time issuing those copies (resident mode: the parameters' copy, the
    /// gather's launch, the views).
    pub issue_ns: u64,
    /// Batches the consumer asked the workers for in [`super::TorchLoader::next_batch`].
    pub asked: u64,
    /// The consumer's time waiting for them (nothing while the workers keep ahead).
    pub waited_ns: u64,
}

impl WorkerTimes {
    pub(crate) fn add(&self, wait: Instant, gather: Instant, device: Instant, end: Instant) {
        let ns = |a: Instant, b: Instant| b.duration_since(a).as_nanos() as u64;
        self.wait_ns.fetch_add(ns(wait, gather), Relaxed);
        self.gather_ns.fetch_add(ns(gather, device), Relaxed);
        self.device_ns.fetch_add(ns(device, end), Relaxed);
        self.batches.fetch_add(1, Relaxed);
    }

    /// The consumer issued one batch's copy, from `start` until now.
    pub(crate) fn issued(&self, start: Instant) {
        let ns = start.elapsed().as_nanos() as u64;
        self.issue_ns.fetch_add(ns, Relaxed);
        self.issued.fetch_add(1, Relaxed);
    }

    /// The consumer waited for the workers' next item from `start` until now, which it returns
    /// (where its issue of the item starts).
    pub(crate) fn waited(&self, start: Instant) -> Instant {
        let now = Instant::now();
        self.waited_ns
            .fetch_add(now.duration_since(start).as_nanos() as u64, Relaxed);
        self.asked.fetch_add(1, Relaxed);
        now
    }

    pub(crate) fn total(&self) -> WorkerTimesTotal {
        WorkerTimesTotal {
            batches: self.batches.load(Relaxed),
            wait_ns: self.wait_ns.load(Relaxed),
            gather_ns: self.gather_ns.load(Relaxed),
            device_ns: self.device_ns.load(Relaxed),
            issued: self.issued.load(Relaxed),
            issue_ns: self.issue_ns.load(Relaxed),
            asked: self.asked.load(Relaxed),
            waited_ns: self.waited_ns.load(Relaxed),
        }
    }
}
