//! The streaming mode: workers gather into host slots (pinned on CUDA) and copy batches to the
//! device without blocking.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tch::Device;

use super::compact;
use super::events::CopyDone;
use super::frame_decode::{DeviceDecode, Twin, WorkerDecode};
use super::kernel::Kernel;
use super::layout::{Layout, Slot};
use super::options::Transform;
use super::{FloatCast, TensorBatch};
use crate::error::{Error, Result};
use crate::gather::Gatherer;
use crate::index::SliceRef;

/// Where the streaming workers' time goes, summed over every worker and batch: waiting for a
/// staging slot's copy, gathering into it, and everything after (on CUDA: the copy's issue, the
/// device allocation, views, the expansion or decode, the event; on the CPU: expansion, decode,
/// transform, cast). `bench --device` reports the means per batch.
#[derive(Default)]
pub(crate) struct WorkerTimes {
    batches: AtomicU64,
    wait_ns: AtomicU64,
    gather_ns: AtomicU64,
    device_ns: AtomicU64,
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
}

impl WorkerTimes {
    fn add(&self, wait: Instant, gather: Instant, device: Instant, end: Instant) {
        let ns = |a: Instant, b: Instant| b.duration_since(a).as_nanos() as u64;
        self.wait_ns.fetch_add(ns(wait, gather), Relaxed);
        self.gather_ns.fetch_add(ns(gather, device), Relaxed);
        self.device_ns.fetch_add(ns(device, end), Relaxed);
        self.batches.fetch_add(1, Relaxed);
    }

    pub(crate) fn total(&self) -> WorkerTimesTotal {
        WorkerTimesTotal {
            batches: self.batches.load(Relaxed),
            wait_ns: self.wait_ns.load(Relaxed),
            gather_ns: self.gather_ns.load(Relaxed),
            device_ns: self.device_ns.load(Relaxed),
        }
    }
}

pub(crate) struct StreamWorker {
    /// Where this worker's time goes (shared by the loader's workers).
    pub(crate) times: Arc<WorkerTimes>,
    pub(crate) layout: Layout,
    pub(crate) device: Device,
    /// The device whose pinned memory staging uses (None: pageable host memory).
    pub(crate) pin: Option<Device>,
    pub(crate) cast: FloatCast,
    pub(crate) transform: Option<Transform>,
    pub(crate) pool: Arc<Mutex<Vec<TensorBatch>>>,
    /// The ring of pinned staging slots (CUDA).
    pub(crate) slots: Vec<Slot>,
    pub(crate) max_slots: usize,
    pub(crate) next_slot: usize,
    /// Per slot: a copy out of it may still be running.
    pub(crate) pending: Vec<bool>,
    /// Per slot: the event recorded after its copies (None: synchronize the device instead).
    pub(crate) done: Vec<Option<CopyDone>>,
    /// Frames decoded on the device: the loader's twins and this worker's side.
    pub(crate) decode: Option<(Arc<DeviceDecode>, WorkerDecode)>,
    /// The compact batch's fused expansion on the target's side (None: tensor operations).
    pub(crate) expand: Option<Arc<Kernel>>,
}

impl StreamWorker {
    /// [`StreamWorker::produce`] from a local feed's gatherer: with the device decode, its twin
    /// gathers (tables of stored frames) and the frames are decoded where the batch lands.
    pub(crate) fn produce_feed(
        &mut self,
        gatherer: &Arc<Gatherer>,
        plan: &[SliceRef],
    ) -> Result<TensorBatch> {
        let Some((shared, dec)) = &mut self.decode else {
            return self.produce(gatherer, plan);
        };
        let twin = dec.twin(shared, gatherer)?;
        self.produce_with(&twin.stored, plan, Some(&twin))
    }

    /// Gathers `plan` (made by a loader's worker, or a stream's for its window) with
    /// `gatherer` into a batch on the target device.
    pub(crate) fn produce(
        &mut self,
        gatherer: &Gatherer,
        plan: &[SliceRef],
    ) -> Result<TensorBatch> {
        self.produce_with(gatherer, plan, None)
    }

    fn produce_with(
        &mut self,
        gatherer: &Gatherer,
        plan: &[SliceRef],
        twin: Option<&Twin>,
    ) -> Result<TensorBatch> {
        let n = plan.len();
        if n > self.layout.b {
            return Err(Error::argument(
                "sampler",
                format!(
                    "the sampler planned {n} slices for a batch of {}",
                    self.layout.b
                ),
            ));
        }
        match self.device {
            Device::Cuda(index) => self.produce_cuda(index, gatherer, plan, twin),
            _ => self.produce_host(gatherer, plan, twin),
        }
    }

    /// Gathers `plan` into `slot`; where its arena of stored frames was too small, into a new
    /// slot (`alloc`) with a larger one, which the layout keeps for the next slots.
    fn fill(
        &mut self,
        slot: &mut Slot,
        gatherer: &Gatherer,
        plan: &[SliceRef],
        alloc: fn(&Layout, Option<Device>) -> Result<Slot>,
    ) -> Result<()> {
        if slot
            .arena
            .as_ref()
            .is_some_and(|a| a.numel() < self.layout.arena)
        {
            *slot = alloc(&self.layout, self.pin)?;
        }
        while !slot.fill(gatherer, plan, &self.layout)? {
            self.layout.arena = slot.arena_used + slot.arena_used / 4;
            *slot = alloc(&self.layout, self.pin)?;
        }
        Ok(())
    }

    /// CPU target: gather into the batch's own tensors (recycled or new).
    fn produce_host(
        &mut self,
        gatherer: &Gatherer,
        plan: &[SliceRef],
        twin: Option<&Twin>,
    ) -> Result<TensorBatch> {
        let start = Instant::now();
        let recycled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut slot = match recycled.and_then(|b| Slot::reclaim(b, &self.layout)) {
            Some(s) => s,
            None => Slot::alloc(&self.layout, self.pin)?,
        };
        let gathering = Instant::now();
        self.fill(&mut slot, gatherer, plan, Slot::alloc)?;
        let gathered = Instant::now();
        if let (Some(twin), Some((shared, dec))) = (twin, self.decode.as_mut()) {
            shared.shipped(slot.copy_bytes());
            slot = dec.decode(twin, &slot, &self.layout)?;
        }
        let mut batch = compact::batch(&slot, &self.layout, self.expand.as_deref())?;
        if let Some(f) = &self.transform {
            f(&mut batch)?;
        }
        if let Some(d) = self.pin
            && (self.transform.is_some() || self.layout.widens() || self.layout.compact)
        {
            batch = repin(batch, d)?;
        }
        if self.cast != FloatCast::None {
            let cast = self.cast;
            batch = batch.try_map(|t| Ok(t.f_to_kind(cast.apply(t.kind()))?))?;
        }
        self.times.add(start, gathering, gathered, Instant::now());
        Ok(batch)
    }

    /// CUDA target: gather into the next pinned slot, transform, copy without blocking.
    fn produce_cuda(
        &mut self,
        index: usize,
        gatherer: &Gatherer,
        plan: &[SliceRef],
        twin: Option<&Twin>,
    ) -> Result<TensorBatch> {
        let start = Instant::now();
        let i = self.next_slot;
        self.next_slot = (i + 1) % self.max_slots;
        if i == self.slots.len() {
            self.slots.push(Slot::alloc_packed(&self.layout, self.pin)?);
            self.pending.push(false);
            self.done.push(CopyDone::new(index));
        }
        if self.pending[i] {
            // The copies out of this slot were issued a ring ago: wait for them before
            // overwriting the slot. With an event, for those copies (and what the stream held
            // before them) only; without, for the whole device.
            if self.done[i].as_ref().is_some_and(CopyDone::wait) {
                self.pending[i] = false;
            } else {
                tch::Cuda::synchronize(index as i64);
                self.pending.iter_mut().for_each(|p| *p = false);
            }
        }
        let gathering = Instant::now();
        let mut slot = std::mem::replace(&mut self.slots[i], Slot::empty());
        let filled = self.fill(&mut slot, gatherer, plan, Slot::alloc_packed);
        self.slots[i] = slot;
        filled?;
        let gathered = Instant::now();
        let slot = &self.slots[i];
        // Without a transform or a widened column (a compact slot widens on the device), the
        // whole slot in one copy (one allocation on the device), handed out as views of it or
        // expanded from it there. Frames decoded on the device need that copy.
        let on = if self.transform.is_none()
            && (self.layout.compact || !self.layout.widens() || self.layout.decodes())
        {
            slot.to_device(self.device)?
        } else {
            None
        };
        let on = match (on, twin, self.decode.as_mut()) {
            (Some(on), Some(twin), Some((shared, dec))) => {
                shared.shipped(slot.copy_bytes());
                Some(dec.decode(twin, &on, &self.layout)?)
            }
            (on, _, _) => on,
        };
        let mut out = match on {
            Some(on) => compact::batch(&on, &self.layout, self.expand.as_deref())?,
            None => self.copy_each(i)?,
        };
        if self.cast != FloatCast::None {
            let cast = self.cast;
            out = out.try_map(|t| Ok(t.f_to_kind(cast.apply(t.kind()))?))?;
        }
        if !self.done[i].as_ref().is_some_and(CopyDone::record) {
            // Not recorded: the next wait on this slot synchronizes the device.
            self.done[i] = None;
        }
        self.pending[i] = true;
        self.times.add(start, gathering, gathered, Instant::now());
        Ok(out)
    }

    /// Transforms slot `i`'s batch on the host (re-pinning what the transform made) and copies
    /// it to the device tensor by tensor.
    fn copy_each(&mut self, i: usize) -> Result<TensorBatch> {
        let slot = &self.slots[i];
        // Not compact here (a transform turns it off; a compact slot is copied whole).
        let mut host = compact::batch(slot, &self.layout, None)?;
        if let Some(f) = &self.transform {
            f(&mut host)?;
        }
        if self.transform.is_some() || self.layout.widens() {
            host = repin(host, self.device)?;
        }
        let device = self.device;
        host.try_map(|t| Ok(t.f_to_device_(device, t.kind(), true, false)?))
    }
}

/// Pins every tensor of `batch` that is not pinned (a transform's new tensors) so that the
/// transfer stays a pinned, non-blocking one. Tensors already pinned are kept as they are.
pub(crate) fn repin(batch: TensorBatch, device: Device) -> Result<TensorBatch> {
    batch.try_map(|t| {
        if t.device() != Device::Cpu {
            return Err(Error::argument(
                "transform",
                format!(
                    "the transform returned a tensor on {:?}; transforms run on host batches",
                    t.device()
                ),
            ));
        }
        Ok(if super::is_pinned(t, device) {
            t.shallow_clone()
        } else {
            super::pin(t, device)?
        })
    })
}
