//! GPU-resident mode: the gathered columns are uploaded to the device once (chunked, through
//! pinned memory on CUDA) and every batch is gathered there from a few integers per slice that
//! the loader's workers compute ahead (pinned on CUDA). Per batch: one copy of those integers,
//! one allocation, and one fused kernel (`resident_gather.cu`, see [`super::kernel`]) that
//! writes every column and the six flag planes into one buffer, handed out as views. Invalid
//! positions read a row of zeros that every uploaded tensor starts with, so no column is masked
//! after its gather.
//!
//! Where the kernel cannot be loaded on a GPU (no NVRTC beside libtorch), or with
//! [`TorchLoaderOptions::resident_fused`] off, the same batch is gathered by libtorch operations instead:
//! one `index_select` per column and about a dozen small element-wise kernels
//! ([`Resident::gather_kind`] says which).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;
use tch::{Device, Kind, Tensor};

use super::device_ring::pick;
use super::events::CopyDone;
use super::kernel::{Kernel, Launch};
use super::layout::Layout;
use super::options::TorchLoaderOptions;
use super::resident_ring::{
    Fused, OutRing, OutSlot, P_EP_ID, P_FINAL, P_FIRST, P_HI, P_LAST_STEP, P_LO, P_ROW0, P_ROWS,
    P_SLICE_END, P_START, P_TERMINATED, P_TRUNCATED, fused_views, out_slot,
};
use super::times::WorkerTimes;
use super::{FloatCast, TensorBatch, storage_kind, widen};
use crate::error::{Error, Result};
use crate::format::col;
use crate::gather::{Gatherer, values_from_row0};
use crate::index::SliceRef;
use crate::loader::{Lane, Pipeline};
use crate::sample::Sampler;
use crate::store::Snapshot;

/// Host-to-device upload chunk.
const CHUNK_BYTES: usize = 64 << 20;

/// Device memory a resident upload of `gatherer`'s columns takes with `cast`: every requested
/// column over all transitions and one row of zeros, plus one final observation per episode
/// when `next_observation` is derived. What [`TorchLoaderOptions::with_resident`]'s budget is compared with.
pub fn resident_bytes(gatherer: &Gatherer, cast: FloatCast) -> Result<u64> {
    Ok(resident_uploads(gatherer, cast)?
        .iter()
        .map(|u| u.bytes)
        .sum())
}

/// One device tensor to upload.
struct Upload {
    /// The stored column it holds.
    source: String,
    /// Element kind on the device (after the cast).
    kind: Kind,
    /// Shape of one step.
    shape: Vec<i64>,
    /// Append one final observation per episode (for a derived `next_observation`).
    with_finals: bool,
    bytes: u64,
}

fn resident_uploads(gatherer: &Gatherer, cast: FloatCast) -> Result<Vec<Upload>> {
    let snap = gatherer.snapshot();
    let schema = snap.schema().arrow_schema().clone();
    let (n, e) = (snap.num_transitions(), snap.num_episodes());
    let mut uploads: Vec<Upload> = Vec::new();
    for (name, dt, shape) in gatherer.columns() {
        let derived = name == col::NEXT_OBSERVATION && schema.field_with_name(name).is_err();
        let source = if derived { col::OBSERVATION } else { name };
        let kind = cast.apply(storage_kind(dt)?);
        match uploads.iter_mut().find(|u| u.source == source) {
            Some(u) => u.with_finals |= derived,
            None => uploads.push(Upload {
                source: source.to_string(),
                kind,
                shape: shape.iter().map(|&d| d as i64).collect(),
                with_finals: derived,
                bytes: 0,
            }),
        }
    }
    for u in &mut uploads {
        let width: i64 = u.shape.iter().product::<i64>().max(1);
        let rows = 1 + n + if u.with_finals { e } else { 0 };
        u.bytes = rows * width as u64 * u.kind.elt_size_in_bytes() as u64;
    }
    Ok(uploads)
}

pub(crate) struct Resident {
    layout: Layout,
    device: Device,
    /// The loader's workers: each plans its batches and writes their per-slice parameters
    /// into a host tensor (pinned on CUDA), in batch order.
    params: Pipeline<Result<HostParams>>,
    /// Pinned parameter buffers whose copy to the device has been issued, each with its event.
    pool: ParamsPool,
    /// Per requested column: its device tensor, whether it is the derived next observation,
    /// and its Arrow element type.
    columns: Vec<(String, Tensor, bool, DataType)>,
    /// `[1, L]` step offsets on the device.
    offsets: Tensor,
    /// The fused gather, or why there is none.
    fused: std::result::Result<Fused, String>,
    /// Output buffers with their views made once (with the fused gather, without a widened
    /// column), reused when nothing outside the ring holds them (`device_ring.rs`); None: a
    /// new buffer and views a batch.
    ring: Option<OutRing>,
    /// The kernel reads each batch's parameters in the workers' pinned buffer instead of a copy
    /// on the device ([`TorchLoaderOptions::resident_mapped_params`]): through the ring only.
    mapped: bool,
    /// The workers' planning and the consumer's waiting and issuing, per batch.
    times: Arc<WorkerTimes>,
}

/// One batch's parameters on the host, and on CUDA the event that says when their copy to the
/// device is done, so that the buffer can be filled again.
struct HostParams {
    t: Tensor,
    done: Option<CopyDone>,
    /// Where the fused kernel reads `t` in place (its device mapping on CUDA), once asked.
    mapped: Option<u64>,
}

/// Pinned parameter buffers handed back after their copy was issued (CUDA). A worker takes one
/// whose copy has finished instead of pinning a new tensor each batch: `pin_memory` costs an
/// allocation and, with PyTorch 2.11, prints a deprecation warning on every call (tch passes the
/// device it no longer takes), two lines of stderr a batch.
type ParamsPool = Arc<Mutex<Vec<HostParams>>>;

/// Buffers the pool keeps at most (more are in flight only with a deep prefetch).
const POOL_MAX: usize = 64;

/// What a worker needs to plan a batch and write its parameters.
struct Planner {
    sampler: Arc<dyn Sampler>,
    snap: Snapshot,
    /// Per episode position: bit 0 terminated, bit 1 truncated.
    episode_flags: Vec<u8>,
    rank: u64,
    world: u64,
    per_epoch: Option<u64>,
    b: usize,
    l: usize,
    /// Where the parameters are pinned (None: pageable host memory, on CPU).
    pin: Option<Device>,
    pool: ParamsPool,
}

/// Every uploaded tensor's row 0 is zeros (what invalid positions read); the transitions
/// follow from row 1, then the final observations.
const ZERO_ROW: i64 = 0;

impl Resident {
    pub(crate) fn new(
        sampler: Arc<dyn Sampler>,
        gatherer: &Gatherer,
        layout: Layout,
        opts: &TorchLoaderOptions,
        run: &crate::loader::Run,
        budget: u64,
    ) -> Result<Self> {
        let ((rank, world), start, end) = (run.feed.rank_world(), run.start, run.end);
        if gatherer.has_frames() {
            return Err(Error::argument(
                "resident_budget",
                "resident mode uploads raw columns, and this gather decodes compressed frame \
                 columns: use the streaming mode (the workers decode frames into pinned memory)",
            ));
        }
        if gatherer.is_mixed() {
            return Err(Error::argument(
                "gatherer",
                "a mixed gatherer (Gatherer::mixed) is not made resident: the resident mode \
                 uploads one snapshot; use the streaming mode",
            ));
        }
        let snap = gatherer.snapshot().clone();
        if snap.num_transitions() == 0 {
            return Err(Error::argument(
                "gatherer",
                "the gatherer's snapshot has no transitions: there is nothing to make resident",
            ));
        }
        let uploads = resident_uploads(gatherer, opts.cast)?;
        let need: u64 = uploads.iter().map(|u| u.bytes).sum();
        if need > budget {
            return Err(Error::argument(
                "resident_budget",
                format!(
                    "resident mode needs {} of device memory for {} (with cast {:?}), more than the \
                 budget of {}; raise the budget, cast floats to bf16, request fewer columns, or \
                 stream instead",
                    crate::format::human_bytes(need),
                    uploads
                        .iter()
                        .map(|u| u.source.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    opts.cast,
                    crate::format::human_bytes(budget)
                ),
            ));
        }
        let device = opts.device;
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for u in &uploads {
            let t = upload(&snap, u, device).map_err(|e| match e {
                // Most often the device's memory is taken (by this process's other tensors or
                // another process): say so in one line, not libtorch's backtrace.
                Error::Torch(t) => Error::argument(
                    "resident_budget",
                    format!(
                        "resident mode could not upload {} ({}) to {device:?}: {}; free device \
                         memory, cast floats to bf16, request fewer columns, or stream instead",
                        u.source,
                        crate::format::human_bytes(u.bytes),
                        t.to_string()
                            .lines()
                            .next()
                            .unwrap_or("libtorch error")
                            .trim()
                    ),
                ),
                other => other,
            })?;
            tensors.push((u.source.clone(), t));
        }
        let schema = snap.schema().arrow_schema().clone();
        let columns: Vec<_> = gatherer
            .columns()
            .map(|(name, dt, _)| {
                let derived =
                    name == col::NEXT_OBSERVATION && schema.field_with_name(name).is_err();
                let source = if derived { col::OBSERVATION } else { name };
                let t = tensors
                    .iter()
                    .find(|(n, _)| n == source)
                    .map(|(_, t)| t.shallow_clone())
                    .expect("planned");
                (name.to_string(), t, derived, dt.clone())
            })
            .collect();
        let offsets = Tensor::f_arange(layout.l as i64, (Kind::Int64, device))?.f_view([1, -1])?;
        let fused = if !opts.resident_fused {
            Err("turned off (resident_fused)".to_string())
        } else {
            match Kernel::for_device(device) {
                Ok(k) => Ok(Fused::new(k, &columns, layout.b, layout.l, device)?),
                Err(e) => Err(e.to_string()),
            }
        };
        let pool: ParamsPool = Arc::new(Mutex::new(Vec::new()));
        let planner = Arc::new(Planner {
            pool: pool.clone(),
            per_epoch: sampler.batches_per_epoch(),
            sampler,
            episode_flags: gatherer.episode_flags().to_vec(),
            rank,
            world,
            b: layout.b,
            l: layout.l,
            pin: matches!(device, Device::Cuda(_)).then_some(device),
            snap: snap.clone(),
        });
        let lo = &opts.loader;
        // The workers run ahead of a GPU-bound consumer: in bursts, so that the training thread
        // wakes one once every few batches, with every buffer in flight kept by the pool.
        let bytes = (P_ROWS * layout.b * 8) as u64;
        let fits_pool = (POOL_MAX.saturating_sub(lo.prefetch + 2) / lo.workers.max(1)).max(1);
        let burst = crate::loader::feed_burst(&run.feed, start, bytes, (lo.workers, lo.prefetch))
            .min(fits_pool);
        let depth = (lo.workers, lo.prefetch, burst);
        let times = Arc::new(WorkerTimes::default());
        let params = Pipeline::start(depth, start, end, "resident", || {
            let (planner, times) = (planner.clone(), times.clone());
            let mut plan = Vec::new();
            move |k: u64, _: &mut Lane| {
                let t = Instant::now();
                let p = planner.params(k, &mut plan);
                let now = Instant::now();
                times.add(t, t, now, now);
                p
            }
        })?;
        let ring = (opts.device_ring
            && fused.is_ok()
            && !layout.widens()
            && !cfg!(trajstore_no_use_count))
        .then(OutRing::default);
        Ok(Self {
            layout,
            device,
            params,
            pool,
            columns,
            offsets,
            fused,
            ring,
            mapped: opts.resident_mapped_params,
            times,
        })
    }

    pub(crate) fn times(&self) -> super::WorkerTimesTotal {
        self.times.total()
    }

    /// The output ring's batches and buffers allocated in place of held ones (zero batches
    /// without a ring).
    pub(crate) fn ring_stats(&self) -> super::DeviceRingStats {
        self.ring
            .as_ref()
            .map(|r| r.counts.stats())
            .unwrap_or_default()
    }

    /// How batches are gathered: `fused` (one kernel a batch), or `unfused: ` and why.
    pub(crate) fn gather_kind(&self) -> String {
        match &self.fused {
            Ok(_) if self.mapped && self.ring.is_some() => {
                "fused, parameters read in place".to_string()
            }
            Ok(_) if self.mapped => "fused, parameters copied (read in place only through \
                                           the output ring: no widened column, the device ring on)"
                .to_string(),
            Ok(_) => "fused".to_string(),
            Err(why) => format!("unfused: {why}"),
        }
    }

    pub(crate) fn position(&self) -> u64 {
        self.params.position()
    }

    /// The fused kernel alone: µs a launch over `launches` launches of the last batch's
    /// parameters into an output buffer nothing outside the ring holds, back to back and timed
    /// to the device's end (what `bench --resident` reports beside the loader's rate, so that a
    /// run tells the kernel's time from the rest of a batch's). The same rows each launch: where
    /// they fit the cache they are read from it, so this is a lower bound on a batch of new rows.
    /// None without the output ring, with parameters read in place, before a batch, or while
    /// every buffer is held.
    pub(crate) fn time_kernel(&self, launches: u32) -> Option<Result<f64>> {
        let (Ok(fused), Some(ring), false) = (&self.fused, &self.ring, self.mapped) else {
            return None;
        };
        let slot = ring.slots.iter().find(|s| !s.held.by_others(&s.batch))?;
        if self.params.position() == 0 || launches == 0 {
            return None;
        }
        let sync = || {
            if let Device::Cuda(n) = self.device {
                tch::Cuda::synchronize(n as i64);
            }
        };
        Some((|| {
            sync();
            let t = Instant::now();
            for _ in 0..launches {
                // SAFETY: as in `ring_batch`: the slot's parameters (a batch's, copied before),
                // table and output, kept by the ring, on the default stream; nothing outside
                // the ring holds its views, and the next batch through it overwrites it whole.
                unsafe { fused.kernel.run(&slot.launch)? };
            }
            sync();
            Ok(t.elapsed().as_secs_f64() * 1e6 / launches as f64)
        })())
    }

    pub(crate) fn next_batch(&mut self) -> Option<Result<TensorBatch>> {
        let asked = Instant::now();
        let host = self.params.next_item();
        let issuing = self.times.waited(asked);
        let b = host?.and_then(|p| match self.ring.is_some() {
            true => self.ring_batch(p),
            false => self.batch(p),
        });
        self.times.issued(issuing);
        Some(b)
    }

    /// The batch of `host` through the output ring: its parameters copied into a free buffer's,
    /// one launch of the fused gather, the views made once handed out.
    fn ring_batch(&mut self, mut host: HostParams) -> Result<TensorBatch> {
        let Ok(fused) = &self.fused else {
            unreachable!("the ring is made with the fused gather")
        };
        let ring = self.ring.as_mut().expect("ring_batch runs with a ring");
        let (layout, columns, device) = (&self.layout, &self.columns, self.device);
        let i = pick(
            &mut ring.slots,
            &mut ring.next,
            |s: &OutSlot| s.held.by_others(&s.batch),
            || out_slot(fused, columns, layout, device),
            &ring.counts,
        )?;
        let slot = &mut ring.slots[i];
        if self.mapped {
            let params = match host.mapped {
                Some(a) => a,
                None => *host
                    .mapped
                    .insert(fused.kernel.mapped_address(host.t.data_ptr() as u64)?),
            };
            let launch = Launch {
                params,
                params_out: slot.params.data_ptr() as u64,
                ..slot.launch
            };
            // SAFETY: as below, with the parameters read from `host.t` (pinned `[P_ROWS, B]`
            // int64, at the device's mapping of it on CUDA), which goes back to the workers'
            // pool only with an event recorded after this launch (`give_back`), and copied by
            // the kernel into `slot.params` (the same shape on the device, kept by the ring).
            unsafe { fused.kernel.run(&launch)? };
            give_back(&self.pool, host, self.device);
            return slot.batch.try_map(|t| Ok(t.shallow_clone()));
        }
        let bytes = host.t.numel() * 8;
        let copied = match device {
            // SAFETY: `host.t` is the pinned `[P_ROWS, B]` int64 buffer, kept out of the pool
            // until an event after this copy completes (`give_back`); `slot.params` the same
            // shape on the device, kept by the ring; both on the default stream.
            Device::Cuda(n) => unsafe {
                super::events::copy_on_default(n, slot.params.data_ptr(), host.t.data_ptr(), bytes)
            },
            _ => false,
        };
        if !copied {
            slot.params.f_copy_(&host.t)?;
        }
        give_back(&self.pool, host, self.device);
        // SAFETY: as in `fused_batch`, with the slot's parameters, table and output (made once
        // by `out_slot`, kept by the ring) on the default stream, where the slot's last batch's
        // uses were queued before the caller dropped it.
        unsafe { fused.kernel.run(&slot.launch)? };
        slot.batch.try_map(|t| Ok(t.shallow_clone()))
    }

    /// The batch of the parameters `host` (`[P_ROWS, B]`), gathered on the device.
    fn batch(&self, host: HostParams) -> Result<TensorBatch> {
        let (b, l) = (self.layout.b as i64, self.layout.l as i64);
        // From pinned memory on CUDA, without waiting; on CPU the workers' tensor itself.
        let params = host.t.f_to_device_(self.device, Kind::Int64, true, false)?;
        give_back(&self.pool, host, self.device);
        if let Ok(fused) = &self.fused {
            return self.fused_batch(fused, params);
        }
        let row =
            |r: usize| -> Result<Tensor> { Ok(params.f_select(0, r as i64)?.f_view([-1, 1])?) };
        let pos = &self.offsets; // [1, L]
        // Invalid positions read the zero row each uploaded tensor ends with: no mask fill.
        let mask = pos
            .f_ge_tensor(&row(P_LO)?)?
            .f_logical_and(&pos.f_lt_tensor(&row(P_HI)?)?)?;
        let inner = row(P_ROW0)?.f_add(pos)?; // [B, L]
        let rows = inner.f_where_scalarother(&mask, ZERO_ROW)?.f_view([-1])?;
        let last_step = row(P_LAST_STEP)?;
        let mut next_rows: Option<Tensor> = None;
        let mut columns = Vec::with_capacity(self.columns.len());
        for (name, data, derived, dt) in &self.columns {
            let idx = if *derived {
                if next_rows.is_none() {
                    // o_{t+1}: the next row inside the episode, else the episode's final
                    // observation (after the N transitions).
                    let next = inner
                        .f_add_scalar(1)?
                        .f_where_self(&pos.f_lt_tensor(&last_step)?, &row(P_FINAL)?)?
                        .f_where_scalarother(&mask, ZERO_ROW)?
                        .f_view([-1])?;
                    next_rows = Some(next);
                }
                next_rows.as_ref().expect("set above")
            } else {
                &rows
            };
            let mut shape = vec![b, l];
            shape.extend(&data.size()[1..]);
            let out = data.f_index_select(0, idx)?.f_view(shape.as_slice())?;
            columns.push((name.clone(), widen(out, dt)?));
        }
        // An episode's first and last steps are valid wherever they fall in the slice.
        let is_first = pos.f_eq_tensor(&row(P_FIRST)?)?;
        let is_last = pos.f_eq_tensor(&last_step)?;
        let terminated = is_last.f_logical_and(&row(P_TERMINATED)?)?;
        let truncated = is_last.f_logical_and(&row(P_TRUNCATED)?)?;
        let slice_end = pos.f_eq_tensor(&row(P_SLICE_END)?)?;
        Ok(TensorBatch {
            ready: None,
            columns,
            mask,
            is_first,
            is_last,
            terminated,
            truncated,
            slice_end,
            episode_id: params.f_select(0, P_EP_ID as i64)?,
            start_step: params.f_select(0, P_START as i64)?,
            flag_base: None,
            meta_base: None,
            base_columns: Vec::new(),
        })
    }
}

impl Resident {
    /// The batch of `params` (`[P_ROWS, B]` on the device) by the fused kernel: on a GPU one
    /// buffer, every column and flag plane a view of it; on the CPU a buffer each.
    fn fused_batch(&self, fused: &Fused, params: Tensor) -> Result<TensorBatch> {
        let (b, l) = (self.layout.b, self.layout.l);
        let sizes: Vec<usize> = fused.offsets.iter().map(|o| b * l * o.2).collect();
        // Each column's bytes and the flag planes' bytes: on a GPU views of one buffer (one
        // allocation; the offsets are in the device table made once), on the CPU one buffer
        // each, a size the allocator reuses (one large packed buffer was mapped afresh, and
        // page-faulted, every batch), named by a table of addresses made per batch.
        let (parts, flags, host_table, out, cols, flags_at);
        if let Some(table) = &fused.table {
            let buf = Tensor::f_empty([fused.total as i64], (Kind::Uint8, self.device))?;
            let bytes = |at: usize, n: usize| buf.f_narrow(0, at as i64, n as i64);
            parts = (fused.offsets.iter().zip(&sizes))
                .map(|(o, &n)| bytes(o.0, n))
                .collect::<Result<Vec<_>, _>>()?;
            flags = bytes(fused.flags_offset, 6 * b * l)?;
            (out, cols) = (buf.data_ptr() as u64, table.data_ptr() as u64);
            flags_at = fused.flags_offset;
        } else {
            let empty = |n: usize| Tensor::f_empty([n as i64], (Kind::Uint8, Device::Cpu));
            parts = sizes
                .iter()
                .map(|&n| empty(n))
                .collect::<Result<Vec<_>, _>>()?;
            flags = empty(6 * b * l)?;
            let mut t = fused.host_table.clone();
            for (c, part) in parts.iter().enumerate() {
                t[4 * c + 3] = part.data_ptr() as i64;
            }
            host_table = t;
            (out, cols, flags_at) = (0, host_table.as_ptr() as u64, flags.data_ptr() as usize);
        }
        let launch = Launch {
            params: params.data_ptr() as u64,
            params_out: 0,
            cols,
            ncols: self.columns.len(),
            b,
            l,
            out,
            flags_offset: flags_at,
        };
        // SAFETY: `params` is a contiguous `[P_ROWS, B]` int64 tensor on this device; the table
        // holds the addresses of `self.columns`' tensors (kept for the loader's life), whose
        // rows the workers' parameters stay within (row 0 .. 1 + N + E), and where each
        // column's `[B, L, row]` bytes go (`parts`, relative to `out` on a GPU), and the flag
        // planes' place (`flags`). On CUDA the kernel runs on the default stream, where the
        // tensors' later uses are ordered.
        unsafe { fused.kernel.run(&launch)? };
        let mut columns = Vec::with_capacity(self.columns.len());
        for (((name, data, _, dt), o), part) in self.columns.iter().zip(&fused.offsets).zip(parts) {
            let mut shape = vec![b as i64, l as i64];
            shape.extend(&data.size()[1..]);
            let t = part.f_view_dtype(o.1)?.f_view(shape.as_slice())?;
            columns.push((name.clone(), widen(t, dt)?));
        }
        // The six flag planes, one [6, B, L] view and a plane of it each.
        fused_views(columns, flags, &params, b, l)
    }
}

/// Hands `host`'s buffer back to the workers' pool with an event after what reads it on the
/// default stream (its copy, or the kernel that reads it in place). Where no event could be
/// recorded, or the pool is full, it is freed only after the device is synchronized: libtorch's
/// pinned allocator does not know of the copy or kernel issued here, and would hand the block to
/// the next pinned tensor while they still read it.
fn give_back(pool: &ParamsPool, host: HostParams, device: Device) {
    if host.done.as_ref().is_some_and(CopyDone::record) {
        let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < POOL_MAX {
            pool.push(host);
            return;
        }
    }
    if let Device::Cuda(n) = device {
        tch::Cuda::synchronize(n as i64);
    }
    drop(host);
}

impl Planner {
    /// Plans batch `k` (into `plan`) and writes its parameters: per slice, start step,
    /// episode's first row, length, flags, position, id, and last valid position in the slice;
    /// slices past the plan (a short last batch) are padding. `[P_ROWS, B]` `int64`, pinned
    /// on CUDA.
    fn params(&self, k: u64, plan: &mut Vec<SliceRef>) -> Result<HostParams> {
        let (b, l) = (self.b, self.l);
        self.sampler.plan(
            crate::loader::global_batch(k, self.rank, self.world, self.per_epoch),
            plan,
        );
        if plan.len() > b {
            return Err(Error::argument(
                "sampler",
                format!(
                    "the sampler planned {} slices for a batch of {b}",
                    plan.len()
                ),
            ));
        }
        let HostParams { t, done, mapped } = self.buffer()?;
        // SAFETY: `t` is a contiguous CPU int64 tensor of P_ROWS * b elements that only this
        // function refers to until it returns it.
        let params =
            unsafe { std::slice::from_raw_parts_mut(t.data_ptr() as *mut i64, P_ROWS * b) };
        params.fill(0);
        let episodes = self.snap.episodes();
        let n = self.snap.num_transitions() as i64;
        for i in 0..b {
            let p = |row: usize| row * b + i;
            let Some(s) = plan.get(i) else {
                // Padding: no valid position, no first or last step (positions are >= 0).
                for r in [P_FIRST, P_LAST_STEP, P_EP_ID, P_START, P_SLICE_END] {
                    params[p(r)] = -1;
                }
                continue;
            };
            if s.episode as usize >= episodes.len() {
                return Err(Error::argument(
                    "sampler",
                    format!(
                        "the sampler planned episode position {}, but the snapshot has {} \
                         episodes",
                        s.episode,
                        episodes.len()
                    ),
                ));
            }
            let loc = episodes.get(s.episode as usize);
            let len = loc.length as i64;
            let lo = (-s.start).clamp(0, l as i64);
            let hi = (len - s.start).clamp(lo, l as i64);
            if (s.len as usize) < l && s.start + (s.len as i64) < len {
                // The device gather masks by episode bounds only.
                return Err(Error::argument(
                    "sampler",
                    format!(
                        "resident mode gathers slices of {l} steps or to the end of their \
                         episode; the sampler planned {} steps from step {} of a {len}-step \
                         episode",
                        s.len, s.start
                    ),
                ));
            }
            let flags = self.episode_flags[s.episode as usize] as i64;
            params[p(P_ROW0)] = 1 + loc.start as i64 + s.start;
            params[p(P_LO)] = lo;
            params[p(P_HI)] = hi;
            params[p(P_FIRST)] = -s.start;
            params[p(P_LAST_STEP)] = len - 1 - s.start;
            params[p(P_FINAL)] = 1 + n + s.episode as i64;
            params[p(P_TERMINATED)] = flags & 1;
            params[p(P_TRUNCATED)] = (flags >> 1) & 1;
            params[p(P_EP_ID)] = loc.episode_id as i64;
            params[p(P_START)] = s.start;
            params[p(P_SLICE_END)] = if hi > lo { hi - 1 } else { -1 };
        }
        Ok(HostParams { t, done, mapped })
    }

    /// A `[P_ROWS, B]` int64 buffer for one batch's parameters: on CUDA a pinned one from the
    /// pool whose copy has finished, else a newly pinned one with its event; on the CPU a new
    /// tensor (the batch keeps it: its ids are views of it).
    fn buffer(&self) -> Result<HostParams> {
        let shape = [P_ROWS as i64, self.b as i64];
        let Some(d) = self.pin else {
            let t = Tensor::f_empty(shape, (Kind::Int64, Device::Cpu))?;
            return Ok(HostParams {
                t,
                done: None,
                mapped: None,
            });
        };
        {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            let ready = pool
                .iter()
                .position(|h| h.done.as_ref().is_some_and(CopyDone::finished));
            if let Some(i) = ready {
                return Ok(pool.swap_remove(i));
            }
        }
        let t = super::pin(&Tensor::f_empty(shape, (Kind::Int64, Device::Cpu))?, d)?;
        let done = match d {
            Device::Cuda(n) => CopyDone::new(n),
            _ => None,
        };
        Ok(HostParams {
            t,
            done,
            mapped: None,
        })
    }
}

/// Uploads one column (and, for a derived next observation, the final observations) to a new
/// device tensor, in chunks through one pinned host buffer on CUDA (a plain one on CPU).
fn upload(snap: &Snapshot, u: &Upload, device: Device) -> Result<Tensor> {
    let n = snap.num_transitions() as i64;
    let e = snap.num_episodes() as i64;
    let rows = 1 + n + if u.with_finals { e } else { 0 };
    let mut full = vec![rows];
    full.extend(&u.shape);
    let dst = Tensor::f_empty(full.as_slice(), (u.kind, device))?;
    let _ = dst.f_narrow(0, ZERO_ROW, 1)?.f_zero_()?;
    let field = snap
        .schema()
        .arrow_schema()
        .field_with_name(&u.source)?
        .clone();
    let (elem, width) = match field.data_type() {
        DataType::FixedSizeList(c, w) => (c.data_type().clone(), *w as usize),
        dt => (dt.clone(), 1),
    };
    let stored_kind = storage_kind(&elem)?;
    let step_bytes = width * stored_kind.elt_size_in_bytes();
    let chunk_rows = (CHUNK_BYTES / step_bytes).max(1);
    let mut chunk = Tensor::f_empty(
        [(chunk_rows * step_bytes) as i64],
        (Kind::Uint8, Device::Cpu),
    )?;
    if let Device::Cuda(_) = device {
        chunk = super::pin(&chunk, device)?;
    }
    let mut row = ZERO_ROW + 1;
    // Copies `bytes` (whole steps) into the chunk and from there into rows `row..` of `dst`.
    let put = |bytes: &[u8], row: &mut i64| -> Result<()> {
        // Segments are mapped for random access: ask for this column's pages in large reads.
        crate::store::ipc::will_need(bytes);
        for piece in bytes.chunks(chunk_rows * step_bytes) {
            let k = (piece.len() / step_bytes) as i64;
            // SAFETY: the chunk is a contiguous CPU byte tensor of `chunk_rows * step_bytes` bytes
            // owned by this function; the previous copy out of it was blocking, so nothing reads it.
            let host =
                unsafe { std::slice::from_raw_parts_mut(chunk.data_ptr() as *mut u8, piece.len()) };
            host.copy_from_slice(piece);
            let mut shape = vec![k];
            shape.extend(&u.shape);
            let src = chunk
                .f_narrow(0, 0, piece.len() as i64)?
                .f_view_dtype(stored_kind)?
                .f_view(shape.as_slice())?;
            let mut part = dst.f_narrow(0, *row, k)?;
            part.f_copy_(&src)?;
            *row += k;
        }
        Ok(())
    };
    let mut bools = Vec::new();
    for seg in snap.segments() {
        for array in &seg.column(&u.source)? {
            if elem == DataType::Boolean {
                let a = array.as_boolean();
                bools.clear();
                bools.extend((0..a.len()).map(|i| a.value(i) as u8));
                put(&bools, &mut row)?;
            } else {
                let (values, _, _) = values_from_row0(array);
                put(&values.as_slice()[..array.len() * step_bytes], &mut row)?;
            }
        }
    }
    if u.with_finals {
        for seg in snap.segments() {
            let a = seg.episode_table().final_observation().ok_or_else(|| {
                Error::corrupt(
                    snap.path().join(&seg.entry().episodes_path),
                    "no final_observation column, but the dataset derives next_observation from it",
                )
            })?;
            let (values, _, _) = values_from_row0(a);
            let mut bytes = values.as_slice()[..a.len() * step_bytes].to_vec();
            if let Some(nulls) = a.nulls() {
                for i in 0..a.len() {
                    if nulls.is_null(i) {
                        bytes[i * step_bytes..(i + 1) * step_bytes].fill(0);
                    }
                }
            }
            put(&bytes, &mut row)?;
        }
    }
    debug_assert_eq!(row, rows);
    Ok(dst)
}
