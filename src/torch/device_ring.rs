//! The device ring of a CUDA streaming loader: its batches' device buffers, allocated once with
//! their tensor views made once, filled by one copy on the ring's own stream.
//!
//! - **Off the default stream.** The consumer (`handover.rs`) issues a batch's host-to-device
//!   copy (and the compact batch's expansion, `expand.cu`) on a non-blocking stream of the
//!   ring's, then records an event that the default stream waits on. Per batch that is a
//!   handful of CUDA runtime calls and no libtorch operation: the old path's allocation, ~20
//!   views and the expansion's ~20 more cost about 100 µs a batch on an H200, as much as the
//!   gather itself.
//! - **A held batch is never overwritten.** A buffer takes a new batch only when nothing outside
//!   the ring refers to it: every tensor handed out has the reference counts it had when the ring
//!   made it (its own handle count, and its storage's count of tensors, so that a view the user
//!   made of a batch counts too; `use_count.cc`). Otherwise another buffer of the ring is used,
//!   or a new one made (at most [`MAX_SLOTS`]; beyond, a held one is left to its holder and
//!   replaced). Before a copy overwrites a buffer the ring's stream waits for what the
//!   default stream had queued, so kernels still reading the buffer's last batch finish first.
//! - **The CPU stand-in.** On the CPU ([`super::TorchLoaderOptions::with_ring_on_cpu`], for tests
//!   on machines without a GPU) the same ring runs with plain host buffers, a synchronous copy
//!   and the expansion's C++ copy.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tch::{Device, Tensor};

use super::TensorBatch;
use super::compact::Fused;
use super::events::{CopyDone, CopyStream};
use super::kernel::{ExpandArgs, Kernel};
use super::layout::{Layout, Slot};
use crate::error::{Error, Result};

/// How many batches went through a ring (the streaming loader's, or the resident mode's output
/// ring), and how many buffers were allocated because every one was still held.
#[derive(Default)]
pub(crate) struct RingCounts {
    pub(crate) batches: AtomicU64,
    pub(crate) replaced: AtomicU64,
}

/// A loader's device rings ([`super::TorchLoader::device_ring`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceRingStats {
    /// Batches copied into a ring's buffers.
    pub batches: u64,
    /// Buffers allocated in place of one the user still held, past the ring's size.
    pub replaced: u64,
}

impl RingCounts {
    pub(crate) fn stats(&self) -> DeviceRingStats {
        DeviceRingStats {
            batches: self.batches.load(Relaxed),
            replaced: self.replaced.load(Relaxed),
        }
    }
}

/// Buffers of one ring at most; past it a held buffer is replaced, not added to.
pub(crate) const MAX_SLOTS: usize = 8;

/// The event after a batch's copy into its device buffer (None on the CPU stand-in). Its last
/// holder waits for it when dropped, before the buffer's memory can be given back.
pub(crate) struct Ready(Option<CopyDone>);

impl Ready {
    /// Makes the default stream wait for the batch's copy; false if the runtime refused (the
    /// caller then synchronizes the device).
    pub(crate) fn wait_on_default(&self) -> bool {
        self.0.as_ref().is_none_or(CopyDone::wait_on_default)
    }
}

impl std::fmt::Debug for Ready {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ready")
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        // A buffer freed while a copy into it runs would be reused under it: wait.
        if let Some(done) = &self.0 {
            done.wait();
        }
    }
}

// SAFETY: `Ready` is only read through `&self` by CUDA calls that may come from any
// thread (stream waits on an event); the event is recorded only by the ring that owns the
// slot, and only when no batch of that slot is held elsewhere.
unsafe impl Sync for Ready {}

/// One buffer of the ring: the device copy of a packed slot, the batch's views of it (and of the
/// expansion's output), made once.
struct DeviceSlot {
    /// Dropped first (see [`Ready`]).
    ready: Arc<Ready>,
    /// Recorded on the default stream before each copy into the buffer, for the ring's stream
    /// to wait on (None on the CPU stand-in).
    free: Option<CopyDone>,
    /// What is handed out (shallow clones of it).
    batch: TensorBatch,
    /// The compact batch's expansion (its arguments and output), made once.
    fused: Option<Fused>,
    /// The packed slot's device copy (`slot.packed` is the buffer the copy fills).
    slot: Slot,
    /// The reference counts of `batch` while only the ring holds it.
    counts: Held,
}

unsafe extern "C" {
    /// `use_count.cc`: a tensor's handle count, and its storage's count of tensors in `storage`.
    #[cfg(not(trajstore_no_use_count))]
    fn trajstore_use_counts(tensor: *const std::ffi::c_void, storage: *mut i64) -> i64;
}

/// The reference counts of `t` ([`DeviceSlot::counts`]); None where they cannot be read.
fn counts(t: &Tensor) -> Option<(i64, i64)> {
    #[cfg(not(trajstore_no_use_count))]
    {
        let mut storage = 0i64;
        // SAFETY: `as_ptr` is the live `at::Tensor*` of `t` (torch-sys's C_tensor), which the
        // C++ only reads; `storage` is a valid out-pointer.
        let uses = unsafe { trajstore_use_counts(t.as_ptr().cast(), &mut storage) };
        Some((uses, storage))
    }
    #[cfg(trajstore_no_use_count)]
    {
        let _ = t;
        None
    }
}

/// The reference counts of every tensor of a batch while only its ring holds it.
pub(crate) struct Held(Vec<(i64, i64)>);

impl Held {
    /// The counts of `b` now (made by a ring, held by nothing else).
    pub(crate) fn of(b: &TensorBatch) -> Self {
        Self(
            b.tensors()
                .map(|(_, t)| counts(t))
                .collect::<Option<_>>()
                .unwrap_or_default(),
        )
    }

    /// Whether something besides the ring refers to `b`'s tensors (a batch handed out and not
    /// dropped, a tensor or view taken from one); true where the counts cannot be read.
    pub(crate) fn by_others(&self, b: &TensorBatch) -> bool {
        let mut n = 0;
        let differs = b.tensors().any(|(_, t)| {
            n += 1;
            self.0.get(n - 1).is_none_or(|c| counts(t) != Some(*c))
        });
        differs || n != self.0.len()
    }
}

/// The index of a slot of `slots` that `held` says nothing outside the ring holds: the next in
/// turn from `next`, another free one, a new one (`make`) up to [`MAX_SLOTS`], or past it a new
/// one in place of a held one (counted in `counts`).
pub(crate) fn pick<T>(
    slots: &mut Vec<T>,
    next: &mut usize,
    held: impl Fn(&T) -> bool,
    make: impl FnOnce() -> Result<T>,
    counts: &RingCounts,
) -> Result<usize> {
    counts.batches.fetch_add(1, Relaxed);
    let n = slots.len();
    if let Some(i) = (0..n).map(|k| (*next + k) % n).find(|&i| !held(&slots[i])) {
        *next = (i + 1) % n;
        return Ok(i);
    }
    let slot = make()?;
    if n < MAX_SLOTS {
        slots.push(slot);
        *next = 0;
        return Ok(n);
    }
    // Every slot is held: leave this one to its holder.
    counts.replaced.fetch_add(1, Relaxed);
    let i = *next;
    slots[i] = slot;
    *next = (i + 1) % n;
    Ok(i)
}

impl DeviceSlot {
    fn new(layout: &Layout, device: Device, cuda: Option<usize>, fuse: bool) -> Result<Self> {
        let slot = Slot::alloc_packed_on(layout, device)?;
        let (batch, fused) = if layout.compact {
            let f = Fused::new(layout, &slot.columns, &slot.flags, &slot.meta)?
                .filter(|_| fuse)
                .ok_or_else(|| {
                    Error::invalid_argument(
                        "the batch derives more columns than the fused expansion takes; turn the \
                         device ring off (with_device_ring(false))",
                    )
                })?;
            let b = f.batch.try_map(|t| Ok(t.shallow_clone()))?;
            (b, Some(f))
        } else {
            (slot.view(layout)?, None)
        };
        let mut batch = batch;
        batch.flag_base = None;
        batch.meta_base = None;
        batch.base_columns = Vec::new();
        let event = || {
            cuda.map(|n| CopyDone::new(n).ok_or_else(no_runtime))
                .transpose()
        };
        Ok(Self {
            ready: Arc::new(Ready(event()?)),
            free: event()?,
            counts: Held::of(&batch),
            batch,
            fused,
            slot,
        })
    }

    /// Whether something outside the ring refers to this buffer's tensors.
    fn held(&self) -> bool {
        Arc::strong_count(&self.ready) > 1 || self.counts.by_others(&self.batch)
    }

    fn buffer(&self) -> &Tensor {
        &self.slot.packed.as_ref().expect("a packed slot").0
    }

    fn args(&self) -> Option<&ExpandArgs> {
        self.fused.as_ref().map(|f| &f.args)
    }
}

fn no_runtime() -> Error {
    Error::Torch(tch::TchError::Torch(
        "the device ring needs the CUDA runtime's events and streams, which libtorch_cuda did not \
         load"
            .into(),
    ))
}

/// A streaming loader's device ring.
pub(crate) struct DeviceRing {
    slots: Vec<DeviceSlot>,
    next: usize,
    device: Device,
    /// The CUDA device and the ring's stream (None: the CPU stand-in). Dropped after the
    /// slots: a copy in flight completes before the stream goes.
    stream: Option<(usize, CopyStream)>,
    /// The expansion of a compact layout.
    kernel: Option<Arc<Kernel>>,
    /// Batches, and buffers allocated because every one was held (the loader's).
    counts: Arc<RingCounts>,
}

impl DeviceRing {
    /// Whether batches of `layout` can go through a ring: reference counts are available, no
    /// column is widened or decoded after the copy, and a compact layout has the fused kernel.
    pub(crate) fn fits(layout: &Layout, kernel: Option<&Kernel>) -> bool {
        !(cfg!(trajstore_no_use_count)
            || layout.widens()
            || layout.decodes()
            || (layout.compact && kernel.is_none()))
    }

    /// A ring on `device` (a CUDA device, or the CPU stand-in), or None where it cannot run
    /// (see [`DeviceRing::fits`]; or no CUDA stream).
    pub(crate) fn new(
        layout: &Layout,
        device: Device,
        kernel: Option<Arc<Kernel>>,
        counts: Arc<RingCounts>,
    ) -> Option<Self> {
        if !Self::fits(layout, kernel.as_deref()) {
            return None;
        }
        let stream = match device {
            Device::Cuda(n) => Some((n, CopyStream::new(n)?)),
            Device::Cpu => None,
            _ => return None,
        };
        Some(Self {
            slots: Vec::new(),
            next: 0,
            device,
            stream,
            kernel,
            counts,
        })
    }

    /// The index of a buffer nothing outside the ring holds ([`pick`]).
    fn free_slot(&mut self, layout: &Layout) -> Result<usize> {
        let cuda = self.stream.as_ref().map(|(n, _)| *n);
        let (device, fuse) = (self.device, self.kernel.is_some());
        pick(
            &mut self.slots,
            &mut self.next,
            DeviceSlot::held,
            || DeviceSlot::new(layout, device, cuda, fuse),
            &self.counts,
        )
    }

    /// Copies the packed host slot `host` into a free buffer, expands it there if compact, and
    /// returns the batch (views of the buffer, with the event to wait on). On CUDA, `host_done`
    /// is recorded after the copy (the host slot may be refilled once it completes); where it
    /// cannot be (or there is none), the stream is synchronized before this returns.
    pub(crate) fn produce(
        &mut self,
        host: &Slot,
        layout: &Layout,
        host_done: Option<&CopyDone>,
    ) -> Result<TensorBatch> {
        let i = self.free_slot(layout)?;
        let d = &self.slots[i];
        let (src, _) = host
            .packed
            .as_ref()
            .ok_or_else(|| Error::invalid_argument("the device ring copies packed slots"))?;
        let bytes = src.numel().min(d.buffer().numel());
        match &self.stream {
            Some((index, stream)) => {
                // What the default stream queued so far (kernels still reading this buffer's
                // last batch) finishes before the copy overwrites it.
                let free = d.free.as_ref().expect("CUDA slots have events");
                if !(free.record() && stream.wait(free)) {
                    tch::Cuda::synchronize(*index as i64);
                }
                // SAFETY: `src` is the pinned host slot (the caller does not refill it before
                // `host_done` completes) and the destination the slot's device buffer of at
                // least `bytes` bytes, which the ring keeps (and `Ready` waits for on drop).
                let ok =
                    unsafe { stream.copy_to_device(d.buffer().data_ptr(), src.data_ptr(), bytes) };
                if !ok {
                    return Err(Error::Torch(tch::TchError::Torch(format!(
                        "cudaMemcpyAsync of a batch ({bytes} bytes) to {:?} failed",
                        self.device
                    ))));
                }
                if let (Some(args), Some(k)) = (d.args(), &self.kernel) {
                    // SAFETY: the arguments address the slot's device tensors (made once by
                    // `Fused::new`, kept by the slot); the launch is on the stream the copy
                    // that fills them went on.
                    unsafe { k.expand(args, stream.raw())? };
                }
                let ready = d.ready.0.as_ref().expect("CUDA slots have events");
                if !ready.record_on(stream) {
                    stream.synchronize();
                }
                if !host_done.is_some_and(|e| e.record_on(stream)) {
                    stream.synchronize();
                }
            }
            None => {
                d.buffer()
                    .f_narrow(0, 0, bytes as i64)?
                    .f_copy_(&src.f_narrow(0, 0, bytes as i64)?)?;
                if let (Some(args), Some(k)) = (d.args(), &self.kernel) {
                    // SAFETY: host addresses of the slot's tensors, on this thread.
                    unsafe { k.expand(args, std::ptr::null_mut())? };
                }
            }
        }
        let mut out = d.batch.try_map(|t| Ok(t.shallow_clone()))?;
        out.ready = Some(d.ready.clone());
        Ok(out)
    }

    /// Buffers in the ring.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}

impl Drop for DeviceRing {
    fn drop(&mut self) {
        if let Some((_, s)) = &self.stream {
            // The buffers go back to the allocator below: nothing may still be writing them.
            s.synchronize();
        }
        self.slots.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    #[cfg(not(trajstore_no_use_count))]
    fn use_counts_see_clones_and_views() {
        let t = Tensor::zeros([4, 4], (Kind::Float, Device::Cpu));
        assert_eq!(counts(&t).unwrap(), (1, 1));
        let c = t.shallow_clone();
        assert_eq!(counts(&t).unwrap(), (2, 1));
        drop(c);
        // A view shares the storage (and, as autograd's view of a base, may hold the base).
        let v = t.narrow(0, 1, 2);
        let (uses, storage) = counts(&t).unwrap();
        assert!(uses >= 1 && storage == 2, "{uses} {storage}");
        assert_eq!(counts(&v).unwrap().1, 2);
        drop(v);
        assert_eq!(counts(&t).unwrap(), (1, 1));
        assert_eq!(counts(&Tensor::new()).unwrap().0, 0);
    }

    #[test]
    fn a_held_buffer_is_never_overwritten_and_a_free_one_is_reused() {
        let layout = Layout::of_columns(
            [(
                "observation",
                &arrow::datatypes::DataType::Float32,
                &[3usize][..],
            )]
            .into_iter(),
            2,
            4,
        )
        .unwrap();
        let counts = Arc::new(RingCounts::default());
        let ring = DeviceRing::new(&layout, Device::Cpu, None, counts.clone());
        assert_eq!(ring.is_some(), !cfg!(trajstore_no_use_count));
        let Some(mut ring) = ring else { return };
        let host = Slot::alloc_packed(&layout, None).unwrap();
        // A shallow clone of the slot's column (the same memory) to fill.
        let mut column = host.columns[0].shallow_clone();
        let mut fill = |v: f64| {
            let _ = column.f_fill_(v).unwrap();
        };
        fill(1.0);
        let a = ring.produce(&host, &layout, None).unwrap();
        let keep = a.columns[0].1.narrow(0, 0, 1);
        drop(a);
        // `keep`, a view of the first batch, still holds its buffer.
        fill(2.0);
        let b = ring.produce(&host, &layout, None).unwrap();
        assert_eq!(ring.len(), 2);
        assert_eq!(keep.double_value(&[0, 0, 0]), 1.0);
        assert_eq!(b.columns[0].1.double_value(&[1, 3, 2]), 2.0);
        drop((b, keep));
        // Both free again: no new buffer.
        for v in 3..10 {
            fill(v as f64);
            let c = ring.produce(&host, &layout, None).unwrap();
            assert_eq!(c.columns[0].1.double_value(&[0, 0, 0]), v as f64);
        }
        assert_eq!(ring.len(), 2);
        // Hold more than the ring's cap: every held batch keeps its values.
        let mut held = Vec::new();
        for v in 0..(MAX_SLOTS + 3) {
            fill(v as f64);
            held.push(ring.produce(&host, &layout, None).unwrap());
        }
        assert_eq!(ring.len(), MAX_SLOTS);
        assert_eq!(counts.replaced.load(Relaxed), 3);
        for (v, b) in held.iter().enumerate() {
            assert_eq!(b.columns[0].1.double_value(&[1, 2, 1]), v as f64);
        }
    }
}
