//! The streaming torch loader: workers gather into host tensors (pinned staging slots on CUDA),
//! transfer them without blocking, and hand over device batches in order.

use std::sync::{Arc, Mutex};

use tch::{Device, Kind, Tensor};

use super::resident::Resident;
use arrow::datatypes::DataType;

use super::{FloatCast, TensorBatch, check_device, storage_kind, widen};
use crate::error::{Error, Result};
use crate::gather::{GatherInto, Gatherer};
use crate::loader::{Lane, LoaderOptions, Pipeline, Planner, loader_end};
use crate::sample::{Sampler, SliceRef};

/// A user transform, run by the workers on each host batch before its transfer to the device.
/// It may change tensors in place or replace them ([`TensorBatch::insert`]); on CUDA, whatever it
/// returns is pinned again before the copy, so pinned transfers survive every transform.
pub type Transform = Arc<dyn Fn(&mut TensorBatch) -> Result<()> + Send + Sync>;

/// Options of a [`TorchLoader`].
#[derive(Clone)]
#[non_exhaustive]
pub struct TorchLoaderOptions {
    /// Target device. Default CPU.
    pub device: Device,
    /// Workers, queue depth, rank/world size, number of batches, read-ahead.
    pub loader: LoaderOptions,
    /// Pinned staging slots per worker on CUDA (a slot is reused only after its copy finished).
    /// Default 4.
    pub staging_slots: usize,
    /// Floating-point cast applied on the device.
    pub cast: FloatCast,
    /// On a CPU target, hand out pinned host tensors (for training code that does its own
    /// transfers). Needs CUDA. Default off: a CPU run makes no CUDA call.
    pub pin_output: bool,
    /// GPU-resident mode: upload the gathered columns once if they fit this many bytes of device
    /// memory, and sample on the device. Default off (streaming).
    pub resident_budget: Option<u64>,
    /// Transform run on each host batch before the transfer.
    pub transform: Option<Transform>,
}

impl std::fmt::Debug for TorchLoaderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchLoaderOptions")
            .field("device", &self.device)
            .field("loader", &self.loader)
            .field("staging_slots", &self.staging_slots)
            .field("cast", &self.cast)
            .field("pin_output", &self.pin_output)
            .field("resident_budget", &self.resident_budget)
            .field("transform", &self.transform.is_some())
            .finish()
    }
}

impl TorchLoaderOptions {
    /// Streaming to `device` with default loader options.
    pub fn new(device: Device) -> Self {
        Self {
            device,
            loader: LoaderOptions::default(),
            staging_slots: 4,
            cast: FloatCast::None,
            pin_output: false,
            resident_budget: None,
            transform: None,
        }
    }
    /// Sets workers, queue depth, sharding and batch count.
    pub fn with_loader(mut self, loader: LoaderOptions) -> Self {
        self.loader = loader;
        self
    }
    /// Sets the pinned staging slots per worker (at least 2).
    pub fn with_staging_slots(mut self, n: usize) -> Self {
        self.staging_slots = n.max(2);
        self
    }
    /// Casts floating columns on the device.
    pub fn with_cast(mut self, cast: FloatCast) -> Self {
        self.cast = cast;
        self
    }
    /// Pinned host tensors on a CPU target.
    pub fn with_pinned_output(mut self, on: bool) -> Self {
        self.pin_output = on;
        self
    }
    /// GPU-resident mode within `budget` bytes of device memory.
    pub fn with_resident(mut self, budget: u64) -> Self {
        self.resident_budget = Some(budget);
        self
    }
    /// A transform run on each host batch before its transfer.
    pub fn with_transform(
        mut self,
        f: impl Fn(&mut TensorBatch) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.transform = Some(Arc::new(f));
        self
    }
}

/// Yields [`TensorBatch`]es on the target device in a fixed order: batch `k` of rank `r` is the
/// sampler's batch `k * world_size + r`, whatever the number of workers, and equal (bit for bit,
/// before any cast) to what [`Gatherer::gather`] makes of that plan.
///
/// - **CUDA**: each worker owns a ring of pinned staging slots allocated once; it gathers a batch
///   straight into a slot (no intermediate buffer), applies the transform, and issues a
///   non-blocking host-to-device copy. A slot is reused only after a device synchronisation that
///   follows its copy. Copies go on the current (default) stream, so kernels the training loop
///   queues after receiving a batch see its data.
/// - **CPU**: workers gather straight into the batch's tensors (no extra copy); no CUDA function
///   is called. [`TorchLoader::recycle`] hands tensors back for reuse.
/// - **Resident** ([`TorchLoaderOptions::with_resident`]): the columns are uploaded once and
///   every batch is gathered on the device with `index_select` from indices computed on the host.
///
/// Dropping the loader stops and joins its workers.
pub struct TorchLoader {
    inner: Inner,
    device: Device,
}

enum Inner {
    Streaming {
        pipeline: Pipeline<Result<TensorBatch>>,
        pool: Arc<Mutex<Vec<TensorBatch>>>,
    },
    Resident(Box<Resident>),
}

impl std::fmt::Debug for TorchLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchLoader")
            .field("device", &self.device)
            .field(
                "mode",
                &match self.inner {
                    Inner::Streaming { .. } => "streaming",
                    Inner::Resident(_) => "resident",
                },
            )
            .finish()
    }
}

/// Shapes and kinds of one batch's host tensors.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) b: usize,
    pub(crate) l: usize,
    /// Per column: name, storage kind, full shape `[B, L, ...]`.
    pub(crate) columns: Vec<(String, Kind, Vec<i64>)>,
    /// Per column: its Arrow element type.
    pub(crate) types: Vec<DataType>,
}

impl Layout {
    pub(crate) fn new(gatherer: &Gatherer, b: usize, l: usize) -> Result<Self> {
        let columns = gatherer
            .columns()
            .map(|(name, dt, shape)| {
                let mut full = vec![b as i64, l as i64];
                full.extend(shape.iter().map(|&d| d as i64));
                Ok((name.to_string(), storage_kind(dt)?, full))
            })
            .collect::<Result<_>>()?;
        let types = gatherer.columns().map(|(_, dt, _)| dt.clone()).collect();
        Ok(Self {
            b,
            l,
            columns,
            types,
        })
    }

    /// Whether some column is widened after the gather (unsigned 16/32-bit integers).
    fn widens(&self) -> bool {
        self.types
            .iter()
            .any(|t| matches!(t, DataType::UInt16 | DataType::UInt32))
    }
}

/// Host tensors one batch is gathered into: one per column, a `[6, B, L]` flag tensor and a
/// `[2, B]` metadata tensor, all contiguous.
struct Slot {
    columns: Vec<Tensor>,
    flags: Tensor,
    meta: Tensor,
}

impl Slot {
    fn alloc(layout: &Layout, pin: Option<Device>) -> Result<Self> {
        let (b, l) = (layout.b as i64, layout.l as i64);
        let make = |shape: &[i64], kind: Kind| -> Result<Tensor> {
            let t = Tensor::f_empty(shape, (kind, Device::Cpu))?;
            Ok(match pin {
                Some(d) => t.f_pin_memory(d)?,
                None => t,
            })
        };
        Ok(Slot {
            columns: layout
                .columns
                .iter()
                .map(|(_, k, shape)| make(shape, *k))
                .collect::<Result<_>>()?,
            flags: make(&[6, b, l], Kind::Bool)?,
            meta: make(&[2, b], Kind::Int64)?,
        })
    }

    /// Takes the tensors of a recycled batch back if they still have the layout's shapes and
    /// kinds (a transform may have replaced them).
    fn reclaim(batch: TensorBatch, layout: &Layout) -> Option<Self> {
        let ok = |t: &Tensor, kind: Kind, shape: &[i64]| {
            t.device() == Device::Cpu && t.kind() == kind && t.size() == shape && t.is_contiguous()
        };
        if batch.base_columns.len() != layout.columns.len() {
            return None;
        }
        let mut columns = Vec::with_capacity(layout.columns.len());
        for (t, (_, kind, shape)) in batch.base_columns.into_iter().zip(&layout.columns) {
            if !ok(&t, *kind, shape) {
                return None;
            }
            columns.push(t);
        }
        Some(Slot {
            columns,
            flags: batch.flag_base?,
            meta: batch.meta_base?,
        })
    }

    /// Gathers `plan` into the slot.
    fn fill(&mut self, gatherer: &Gatherer, plan: &[SliceRef], layout: &Layout) -> Result<()> {
        let (b, l) = (layout.b, layout.l);
        // SAFETY: every tensor of the slot is a contiguous CPU tensor this worker owns and that no
        // other thread reads or writes while it is filled (a slot is filled only when none of its
        // copies is pending and it was not handed out); the byte lengths are the tensors' own.
        let bytes = |t: &Tensor| unsafe {
            std::slice::from_raw_parts_mut(
                t.data_ptr() as *mut u8,
                t.numel() * t.kind().elt_size_in_bytes(),
            )
        };
        let columns = self.columns.iter().map(bytes).collect();
        let mut planes = bytes(&self.flags).chunks_exact_mut(b * l);
        let flags = std::array::from_fn(|_| planes.next().expect("a [6, B, L] flag tensor"));
        let meta = bytes(&self.meta);
        // SAFETY: the metadata tensor is Int64 [2, B]: 16 * B bytes, 8-byte aligned.
        let meta: &mut [i64] =
            unsafe { std::slice::from_raw_parts_mut(meta.as_mut_ptr() as *mut i64, 2 * b) };
        let (ids, starts) = meta.split_at_mut(b);
        // SAFETY: u64 and i64 have the same size and alignment; ids are below 2^63.
        let ids: &mut [u64] =
            unsafe { std::slice::from_raw_parts_mut(ids.as_mut_ptr() as *mut u64, b) };
        // Plans shorter than B (the end of an epoch with drop_last off) leave trailing slices as
        // padding.
        let n = plan.len().min(b);
        let dest = GatherInto {
            columns,
            flags,
            episode_id: ids,
            start_step: starts,
        };
        gatherer.gather_into(&plan[..n], l, dest)?;
        if n < b {
            self.pad_tail(n)?;
        }
        Ok(())
    }

    /// Zeroes slices `n..` (a short last batch of an epoch).
    fn pad_tail(&mut self, n: usize) -> Result<()> {
        for t in &mut self.columns {
            let b = t.size()[0];
            let _ = t.f_narrow(0, n as i64, b - n as i64)?.f_zero_()?;
        }
        let b = self.flags.size()[1];
        let _ = self.flags.f_narrow(1, n as i64, b - n as i64)?.f_zero_()?;
        let _ = self.meta.f_narrow(1, n as i64, b - n as i64)?.f_fill_(-1)?;
        Ok(())
    }

    /// A batch of views of the slot's tensors (sharing their memory).
    fn view(&self, layout: &Layout) -> Result<TensorBatch> {
        let flag = |i: i64| self.flags.f_select(0, i);
        Ok(TensorBatch {
            columns: layout
                .columns
                .iter()
                .zip(&layout.types)
                .zip(&self.columns)
                .map(|(((n, _, _), dt), t)| Ok((n.clone(), widen(t.shallow_clone(), dt)?)))
                .collect::<Result<_>>()?,
            mask: flag(0)?,
            is_first: flag(1)?,
            is_last: flag(2)?,
            terminated: flag(3)?,
            truncated: flag(4)?,
            slice_end: flag(5)?,
            episode_id: self.meta.f_select(0, 0)?,
            start_step: self.meta.f_select(0, 1)?,
            flag_base: Some(self.flags.shallow_clone()),
            meta_base: Some(self.meta.shallow_clone()),
            base_columns: self.columns.iter().map(Tensor::shallow_clone).collect(),
        })
    }
}

impl TorchLoader {
    /// Starts a loader of `gatherer`'s columns over the plans of `sampler`. Checks the device
    /// first (a CUDA device on a machine without one is an error); on CPU no CUDA function is
    /// called. In resident mode this uploads the columns (O(dataset) once).
    pub fn new(
        sampler: Arc<dyn Sampler>,
        gatherer: Arc<Gatherer>,
        opts: TorchLoaderOptions,
    ) -> Result<Self> {
        let device = opts.device;
        check_device(device)?;
        if opts.pin_output && device == Device::Cpu {
            // Pinning needs CUDA: say so clearly instead of failing inside libtorch.
            check_device(Device::Cuda(0)).map_err(|_| {
                Error::InvalidArgument(
                    "pinned output needs CUDA, and libtorch sees no CUDA device".into(),
                )
            })?;
        }
        let end = loader_end(sampler.as_ref(), &opts.loader)?;
        let layout = Layout::new(
            &gatherer,
            sampler.num_slices(),
            sampler.slice_len() as usize,
        )?;
        if let Some(budget) = opts.resident_budget {
            let resident = Resident::new(sampler, &gatherer, layout, &opts, end, budget)?;
            return Ok(Self {
                inner: Inner::Resident(Box::new(resident)),
                device,
            });
        }
        let pool: Arc<Mutex<Vec<TensorBatch>>> = Arc::new(Mutex::new(Vec::new()));
        let lo = &opts.loader;
        let pipeline = Pipeline::start(lo.workers, lo.prefetch, end, "torch-loader", |lane| {
            let mut worker = StreamWorker {
                gatherer: gatherer.clone(),
                layout: layout.clone(),
                device,
                pin: match device {
                    Device::Cuda(_) => Some(device),
                    _ if opts.pin_output => Some(Device::Cuda(0)),
                    _ => None,
                },
                cast: opts.cast,
                transform: opts.transform.clone(),
                pool: pool.clone(),
                planner: Planner::new(sampler.clone(), lo),
                slots: Vec::new(),
                max_slots: opts.staging_slots.max(2),
                next_slot: 0,
                pending: Vec::new(),
            };
            move |k: u64| worker.produce(k, lane)
        })?;
        Ok(Self {
            inner: Inner::Streaming { pipeline, pool },
            device,
        })
    }

    /// The next batch on the target device, blocking until it is ready; `None` at the end of
    /// the stream. An error (a failed allocation or copy in libtorch) is returned at the batch it
    /// happened in.
    pub fn next_batch(&mut self) -> Option<Result<TensorBatch>> {
        match &mut self.inner {
            Inner::Streaming { pipeline, .. } => pipeline.next_item(),
            Inner::Resident(r) => r.next_batch(),
        }
    }

    /// The number of the batch [`TorchLoader::next_batch`] returns next.
    pub fn position(&self) -> u64 {
        match &self.inner {
            Inner::Streaming { pipeline, .. } => pipeline.position(),
            Inner::Resident(r) => r.position(),
        }
    }

    /// The target device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether this loader samples from device-resident columns.
    pub fn is_resident(&self) -> bool {
        matches!(self.inner, Inner::Resident(_))
    }

    /// Hands a consumed CPU batch back so that a worker gathers into its tensors again instead of
    /// allocating new ones. Only recycle a batch none of whose tensors (or views of them) you
    /// still use: they will be overwritten. Batches on a CUDA device are simply dropped (their
    /// memory goes back to libtorch's caching allocator).
    pub fn recycle(&self, batch: TensorBatch) {
        if let Inner::Streaming { pool, .. } = &self.inner
            && batch.device() == Device::Cpu
            && batch.flag_base.is_some()
        {
            let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < 16 {
                pool.push(batch);
            }
        }
    }
}

impl Iterator for TorchLoader {
    type Item = Result<TensorBatch>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch()
    }
}

struct StreamWorker {
    gatherer: Arc<Gatherer>,
    layout: Layout,
    device: Device,
    /// The device whose pinned memory staging uses (None: pageable host memory).
    pin: Option<Device>,
    cast: FloatCast,
    transform: Option<Transform>,
    pool: Arc<Mutex<Vec<TensorBatch>>>,
    planner: Planner,
    /// The ring of pinned staging slots (CUDA).
    slots: Vec<Slot>,
    max_slots: usize,
    next_slot: usize,
    /// Per slot: a copy out of it may still be running.
    pending: Vec<bool>,
}

impl StreamWorker {
    fn produce(&mut self, k: u64, lane: Lane) -> Result<TensorBatch> {
        self.planner.plan(k, lane, &self.gatherer);
        let n = self.planner.current().len();
        if n > self.layout.b {
            return Err(Error::InvalidArgument(format!(
                "the sampler planned {n} slices for a batch of {}",
                self.layout.b
            )));
        }
        match self.device {
            Device::Cuda(index) => self.produce_cuda(index),
            _ => self.produce_host(),
        }
    }

    /// CPU target: gather into the batch's own tensors (recycled or new).
    fn produce_host(&mut self) -> Result<TensorBatch> {
        let recycled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut slot = match recycled.and_then(|b| Slot::reclaim(b, &self.layout)) {
            Some(s) => s,
            None => Slot::alloc(&self.layout, self.pin)?,
        };
        slot.fill(&self.gatherer, self.planner.current(), &self.layout)?;
        let mut batch = slot.view(&self.layout)?;
        if let Some(f) = &self.transform {
            f(&mut batch)?;
        }
        if let Some(d) = self.pin
            && (self.transform.is_some() || self.layout.widens())
        {
            batch = repin(batch, d)?;
        }
        if self.cast != FloatCast::None {
            let cast = self.cast;
            batch = batch.try_map(|t| Ok(t.f_to_kind(cast.apply(t.kind()))?))?;
        }
        Ok(batch)
    }

    /// CUDA target: gather into the next pinned slot, transform, copy without blocking.
    fn produce_cuda(&mut self, index: usize) -> Result<TensorBatch> {
        let i = self.next_slot;
        self.next_slot = (i + 1) % self.max_slots;
        if i == self.slots.len() {
            self.slots.push(Slot::alloc(&self.layout, self.pin)?);
            self.pending.push(false);
        }
        if self.pending[i] {
            // The copy out of this slot was issued a ring ago: wait for it (and everything queued
            // before it) before overwriting the slot.
            tch::Cuda::synchronize(index as i64);
            self.pending.iter_mut().for_each(|p| *p = false);
        }
        let slot = &mut self.slots[i];
        slot.fill(&self.gatherer, self.planner.current(), &self.layout)?;
        let mut host = slot.view(&self.layout)?;
        if let Some(f) = &self.transform {
            f(&mut host)?;
        }
        if self.transform.is_some() || self.layout.widens() {
            host = repin(host, self.device)?;
        }
        let (device, cast) = (self.device, self.cast);
        let out = host.try_map(|t| {
            let d = t.f_to_device_(device, t.kind(), true, false)?;
            let k = cast.apply(t.kind());
            Ok(if k == t.kind() { d } else { d.f_to_kind(k)? })
        })?;
        self.pending[i] = true;
        Ok(out)
    }
}

/// Pins every tensor of `batch` that is not pinned (a transform's new tensors) so that the
/// transfer stays a pinned, non-blocking one. Tensors already pinned are kept as they are.
fn repin(batch: TensorBatch, device: Device) -> Result<TensorBatch> {
    batch.try_map(|t| {
        if t.device() != Device::Cpu {
            return Err(Error::InvalidArgument(format!(
                "the transform returned a tensor on {:?}; transforms run on host batches",
                t.device()
            )));
        }
        Ok(if t.is_pinned(device) {
            t.shallow_clone()
        } else {
            t.f_pin_memory(device)?
        })
    })
}
