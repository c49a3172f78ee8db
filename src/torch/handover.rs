//! Gathered batches handed from the workers to the consumer, which issues their copies: the
//! workers only gather (into pinned host slots shared through [`HostSlots`]); the thread that
//! calls [`super::TorchLoader::next_batch`] copies each slot into the device ring on the
//! loader's own stream ([`Issuer`]) and gives the slot back with an event after its copy.
//!
//! Measured on an H200 with 16 cores (BENCHMARKS.md): a worker's CUDA calls for one batch (the
//! ring's copy, expansion and events) took 17 µs alone and 91 µs with 4 workers issuing at once,
//! as long again as the gather; issued by one thread they stay near the first figure, and the
//! workers do nothing but gather. It is the Python loader's arrangement (`_cuda.py`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tch::Device;

use super::compact;
use super::device_ring::{DeviceRing, RingCounts};
use super::events::CopyDone;
use super::kernel::Kernel;
use super::layout::{Layout, Slot};
use super::times::WorkerTimes;
use super::{FloatCast, TensorBatch};
use crate::error::{Error, Result};

/// What a streaming worker hands over: a batch, or a host slot for the consumer to copy.
pub(crate) enum Produced {
    Batch(TensorBatch),
    Staged(Staged),
}

/// A gathered host slot on its way to the consumer, with the event its copy is recorded on.
pub(crate) struct Staged {
    slot: Option<(Slot, Option<CopyDone>)>,
    home: Arc<HostSlots>,
}

impl Drop for Staged {
    fn drop(&mut self) {
        // Not issued (a loader dropped with batches queued): no copy reads it.
        if let Some((slot, done)) = self.slot.take() {
            self.home.give(slot, done);
        }
    }
}

/// The pinned host slots of a loader's workers: free ones (each with the event after its last
/// copy), and how many exist, up to a cap that covers every batch in flight.
pub(crate) struct HostSlots {
    free: Mutex<Vec<(Slot, Option<CopyDone>)>>,
    returned: Condvar,
    made: AtomicUsize,
    cap: usize,
    closed: AtomicBool,
    /// Workers waiting for a slot, changed and read under `free`'s lock: a slot given back
    /// notifies only when one waits (no system call a batch on the consumer's thread otherwise).
    waiting: AtomicUsize,
}

impl HostSlots {
    /// Slots for `workers` workers, `prefetch` queued batches and `per_worker` more each.
    pub(crate) fn new(workers: usize, prefetch: usize, per_worker: usize) -> Arc<Self> {
        Arc::new(Self {
            free: Mutex::new(Vec::new()),
            returned: Condvar::new(),
            made: AtomicUsize::new(0),
            cap: workers * per_worker.max(2) + prefetch + 2,
            closed: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
        })
    }

    /// A slot to gather into: a free one whose copy has finished, a new one (below the cap), or
    /// a free one once its copy finishes; waits for the consumer to give one back where all are
    /// in flight. An error once the loader is closing.
    pub(crate) fn take(
        self: &Arc<Self>,
        layout: &Layout,
        pin: Option<Device>,
    ) -> Result<(Slot, Option<CopyDone>)> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.closed.load(Relaxed) {
                return Err(Error::invalid_argument("the loader is closing"));
            }
            let done = |d: &Option<CopyDone>| d.as_ref().is_none_or(CopyDone::finished);
            if let Some(i) = free.iter().position(|(_, d)| done(d)) {
                return Ok(free.swap_remove(i));
            }
            if self.made.load(Relaxed) < self.cap {
                self.made.fetch_add(1, Relaxed);
                drop(free);
                let slot = Slot::alloc_packed(layout, pin)?;
                let event = match pin {
                    Some(Device::Cuda(n)) => CopyDone::new(n),
                    _ => None,
                };
                return Ok((slot, event));
            }
            if !free.is_empty() {
                // One given back early: its copy is among the first to finish.
                let (slot, d) = free.remove(0);
                drop(free);
                if !d.as_ref().is_some_and(CopyDone::wait)
                    && let Some(Device::Cuda(n)) = pin
                {
                    tch::Cuda::synchronize(n as i64);
                }
                return Ok((slot, d));
            }
            self.waiting.fetch_add(1, Relaxed);
            free = self
                .returned
                .wait_timeout(free, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
            self.waiting.fetch_sub(1, Relaxed);
        }
    }

    fn give(&self, slot: Slot, done: Option<CopyDone>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.push((slot, done));
        let waiting = self.waiting.load(Relaxed) > 0;
        drop(free);
        if waiting {
            self.returned.notify_one();
        }
    }

    /// Wakes and stops workers waiting for a slot (the loader is being dropped).
    pub(crate) fn close(&self) {
        self.closed.store(true, Relaxed);
        self.returned.notify_all();
    }

    /// `slot` gathered, for the consumer.
    pub(crate) fn staged(self: &Arc<Self>, slot: Slot, done: Option<CopyDone>) -> Staged {
        Staged {
            slot: Some((slot, done)),
            home: self.clone(),
        }
    }
}

/// The consumer's side: the device ring (made on the first batch) and its stream.
pub(crate) struct Issuer {
    layout: Layout,
    device: Device,
    /// Floats cast on the default stream once the copy is waited for (new tensors).
    cast: FloatCast,
    kernel: Option<Arc<Kernel>>,
    ring: Option<DeviceRing>,
    tried: bool,
    counts: Arc<RingCounts>,
    times: Arc<WorkerTimes>,
}

impl Issuer {
    pub(crate) fn new(
        layout: &Layout,
        (device, cast): (Device, FloatCast),
        kernel: Option<Arc<Kernel>>,
        counts: Arc<RingCounts>,
        times: Arc<WorkerTimes>,
    ) -> Self {
        Self {
            layout: layout.clone(),
            device,
            cast,
            kernel,
            ring: None,
            tried: false,
            counts,
            times,
        }
    }

    /// The batch of a gathered slot: copied into the device ring on the ring's stream, the
    /// default stream made to wait for it ([`ready`]), its floats cast there if asked; where no
    /// ring could be made, copied into a new device buffer on the default stream. The slot goes
    /// back to the workers with an event after its copy.
    pub(crate) fn issue(&mut self, mut s: Staged) -> Result<TensorBatch> {
        let start = Instant::now();
        let (slot, done) = s.slot.take().expect("a staged slot is issued once");
        if !self.tried {
            self.tried = true;
            self.ring = DeviceRing::new(
                &self.layout,
                self.device,
                self.kernel.clone(),
                self.counts.clone(),
            );
        }
        let out = match self.ring.as_mut() {
            Some(ring) => ring.produce(&slot, &self.layout, done.as_ref()),
            None => fallback(
                &slot,
                &self.layout,
                self.device,
                self.kernel.as_deref(),
                &done,
            ),
        };
        s.home.give(slot, done);
        let cast = self.cast;
        let out = out.map(ready).and_then(|b| match cast {
            FloatCast::None => Ok(b),
            // Ordered after the copy on the default stream; the ring's next copy into these
            // buffers waits for what the default stream queued, these casts included. Tensors
            // the cast leaves as they are (integers, flags) are the ring's, and count as held.
            _ => b.try_map(|t| Ok(t.f_to_kind(cast.apply(t.kind()))?)),
        });
        self.times.issued(start);
        out
    }
}

/// A batch from a device ring, ready for the training thread: the default stream waits for its
/// copy (without blocking this thread); where the runtime refuses, the device is synchronized.
pub(crate) fn ready(mut batch: TensorBatch) -> TensorBatch {
    if let Some(r) = batch.ready.take() {
        if !r.wait_on_default()
            && let Device::Cuda(n) = batch.device()
        {
            tch::Cuda::synchronize(n as i64);
        }
        // The batch keeps the event, so that its memory is not reused under a running copy.
        batch.ready = Some(r);
    }
    batch
}

/// A slot's batch without the ring: one copy into a new device buffer and the batch's views
/// (or expansion) on the default stream, then `done` recorded there (else the device is
/// synchronized, so that the slot is free when it goes back).
fn fallback(
    slot: &Slot,
    layout: &Layout,
    device: Device,
    kernel: Option<&Kernel>,
    done: &Option<CopyDone>,
) -> Result<TensorBatch> {
    let on = slot
        .to_device(device)?
        .ok_or_else(|| Error::invalid_argument("staged slots are packed"))?;
    let batch = compact::batch(&on, layout, kernel)?;
    if !done.as_ref().is_some_and(CopyDone::record)
        && let Device::Cuda(n) = device
    {
        tch::Cuda::synchronize(n as i64);
    }
    Ok(batch)
}
