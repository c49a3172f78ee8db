//! The streaming mode: workers gather into host slots (pinned on CUDA) and hand them to the
//! consumer's device ring (`handover.rs`), or, where the ring cannot take the batch, copy it to
//! the device themselves without blocking.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tch::Device;

use super::compact;
use super::events::CopyDone;
use super::frame_decode::{DeviceDecode, Twin, WorkerDecode};
use super::handover::{HostSlots, Produced};
use super::kernel::Kernel;
use super::layout::{Layout, Slot};
use super::options::Transform;
use super::times::WorkerTimes;
use super::{FloatCast, TensorBatch};
use crate::error::{Error, Result};
use crate::gather::Gatherer;
use crate::index::SliceRef;

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
    /// The loader's shared host slots where batches go through the consumer's device ring
    /// (`handover.rs`): the worker gathers into one and hands it over.
    pub(crate) staged: Option<Arc<HostSlots>>,
}

impl StreamWorker {
    /// [`StreamWorker::produce`] from a local feed's gatherer: with the device decode, its twin
    /// gathers (tables of stored frames) and the frames are decoded where the batch lands.
    pub(crate) fn produce_feed(
        &mut self,
        gatherer: &Arc<Gatherer>,
        plan: &[SliceRef],
    ) -> Result<Produced> {
        let Some((shared, dec)) = &mut self.decode else {
            return self.produce(gatherer, plan);
        };
        let twin = dec.twin(shared, gatherer)?;
        self.produce_with(&twin.stored, plan, Some(&twin))
            .map(Produced::Batch)
    }

    /// Gathers `plan` (made by a loader's worker, or a stream's for its window) with
    /// `gatherer` into a batch on the target device.
    pub(crate) fn produce(&mut self, gatherer: &Gatherer, plan: &[SliceRef]) -> Result<Produced> {
        if self.staged.is_some() {
            return self.produce_staged(gatherer, plan);
        }
        self.produce_with(gatherer, plan, None).map(Produced::Batch)
    }

    fn produce_with(
        &mut self,
        gatherer: &Gatherer,
        plan: &[SliceRef],
        twin: Option<&Twin>,
    ) -> Result<TensorBatch> {
        check_plan(plan, &self.layout)?;
        match self.device {
            Device::Cuda(index) => self.produce_cuda(index, gatherer, plan, twin),
            _ => self.produce_host(gatherer, plan, twin),
        }
    }

    /// Gathers `plan` into one of the loader's shared host slots and hands it over: the
    /// consumer copies it into its device ring (`handover.rs`).
    fn produce_staged(&mut self, gatherer: &Gatherer, plan: &[SliceRef]) -> Result<Produced> {
        check_plan(plan, &self.layout)?;
        let host = self.staged.clone().expect("produce checked it");
        let start = Instant::now();
        let (mut slot, done) = host.take(&self.layout, self.pin)?;
        let gathering = Instant::now();
        let filled = self.fill(&mut slot, gatherer, plan, Slot::alloc_packed);
        let staged = host.staged(slot, done);
        filled?;
        let now = Instant::now();
        self.times.add(start, gathering, now, now);
        Ok(Produced::Staged(staged))
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

/// A plan of at most B slices.
fn check_plan(plan: &[SliceRef], layout: &Layout) -> Result<()> {
    let n = plan.len();
    if n > layout.b {
        return Err(Error::argument(
            "sampler",
            format!("the sampler planned {n} slices for a batch of {}", layout.b),
        ));
    }
    Ok(())
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
