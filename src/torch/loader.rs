//! [`TorchLoader`]: hands over device batches in order, from the streaming workers or from the
//! device-resident columns.

use std::sync::{Arc, Mutex};

use tch::Device;

use super::device_ring::DeviceRing;
use super::device_ring::{DeviceRingStats, RingCounts};
use super::frame_decode::{DeviceDecode, WorkerDecode};
use super::handover::{HostSlots, Issuer, Produced};
use super::kernel::Kernel;
use super::layout::Layout;
use super::options::TorchLoaderOptions;
use super::resident::Resident;
use super::streaming::StreamWorker;
use super::times::{WorkerTimes, WorkerTimesTotal};
use super::{TensorBatch, check_device};
use crate::error::{Error, Result};
use crate::loader::{Feed, Lane, Pipeline, Run, WorkerPlans, check_in_flight};

/// Yields [`TensorBatch`]es on the target device in a fixed order: batch `k` of rank `r` is the
/// sampler's batch [`crate::loader::global_batch`], whatever the number of workers, and equal (bit for bit,
/// before any cast) to what [`crate::gather::Gatherer::gather`] makes of that plan.
///
/// - **CUDA**: the workers gather each batch straight into a pinned staging slot (shared by the
///   loader's workers, allocated once) and hand it over; [`TorchLoader::next_batch`] issues its
///   one copy on the loader's own stream into the device ring (buffers whose views were made
///   once; a buffer the caller still refers to is never overwritten) and makes the default
///   stream wait for it, so kernels the training loop queues after receiving a batch see its
///   data. A slot is refilled only after an event recorded after its copy has completed. With a
///   transform or a widened column (or [`TorchLoaderOptions::with_device_ring`] off) the
///   worker copies each batch into a new device allocation on the default stream instead.
/// - **CPU**: workers gather straight into the batch's tensors (no extra copy); no CUDA function
///   is called. [`TorchLoader::recycle`] hands tensors back for reuse.
/// - **Resident** ([`TorchLoaderOptions::with_resident`]): the columns are uploaded once and
///   every batch is gathered on the device with `index_select` from indices computed on the host.
///
/// Dropping the loader stops and joins its workers.
pub struct TorchLoader {
    inner: Inner,
    device: Device,
    /// The local datasets' feed (None over a stream).
    feed: Option<Arc<Feed>>,
    /// The end of this loader's batches (None: endless).
    end: Option<u64>,
}

pub(crate) enum Inner {
    Streaming {
        batches: Batches,
        pool: Arc<Mutex<Vec<TensorBatch>>>,
        /// CPU batches `pool` keeps at most: as many as the loader can have in use at once.
        keep: usize,
        /// Bytes of one batch's host-to-device copy (the packed slot; 0 on CPU).
        transfer: u64,
        /// Frames decoded on the device: what the workers shipped.
        decode: Option<Arc<DeviceDecode>>,
        /// How a compact batch is expanded ([`TorchLoader::compact_expand`]).
        expand: Option<String>,
        /// Where the workers' time goes ([`TorchLoader::worker_times`]).
        times: Arc<WorkerTimes>,
        /// The device ring's batches ([`TorchLoader::device_ring`]).
        rings: Arc<RingCounts>,
        /// Where the workers hand gathered host slots over (None: they hand batches over), and
        /// the consumer's side, which copies them into the device ring.
        host: Option<Arc<HostSlots>>,
        issuer: Box<Issuer>,
    },
    Resident(Box<Resident>),
}

/// The workers of the streaming mode: over local datasets, or over a stream's windows.
pub(crate) enum Batches {
    Local(Pipeline<Result<Produced>>),
    #[cfg(feature = "remote")]
    Stream(Box<crate::loader::stream::Runs<Produced>>),
}

impl Batches {
    fn next_item(&mut self) -> Option<Result<Produced>> {
        match self {
            Batches::Local(p) => p.next_item(),
            #[cfg(feature = "remote")]
            Batches::Stream(r) => r.next_batch(),
        }
    }

    fn position(&self) -> u64 {
        match self {
            Batches::Local(p) => p.position(),
            #[cfg(feature = "remote")]
            Batches::Stream(r) => r.position(),
        }
    }
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

impl TorchLoader {
    /// Starts a loader of `source`'s batches (see [`crate::loader::LoaderOptions`] for which)
    /// on `opts.device`. Checks the device first (a CUDA device on a machine without one is an
    /// error); on CPU no CUDA function is called. In resident mode (a fixed single dataset
    /// only) this uploads the columns (O(dataset) once). A streamed source
    /// ([`crate::LoaderSpec::streamed`]) gives the batches of [`crate::StreamLoader::new`] with
    /// the same options, through the same cache, in the streaming mode.
    pub fn new(source: &crate::loader::BatchSource, opts: TorchLoaderOptions) -> Result<Self> {
        check_options(&opts)?;
        #[cfg(feature = "remote")]
        if source.is_streamed() {
            return Self::streamed(source, opts);
        }
        let run = source.run(&opts.loader)?;
        Self::from_run(run, opts)
    }

    /// Where this loader is (see [`crate::loader::Loader::state`]); an error over a stream (a
    /// streaming loader restarts at a batch number: [`crate::LoaderOptions::with_start`]).
    pub fn state(&self) -> Result<crate::loader::LoaderState> {
        let next = self.position();
        let feed = self.feed.as_ref().ok_or_else(|| {
            Error::argument(
                "source",
                "a loader of a stream has no state: restart it at its position \
                 (LoaderOptions::with_start)",
            )
        })?;
        let mut s = feed.state(next, true);
        s.iteration_end = self.end.filter(|&e| e > next);
        Ok(s)
    }

    /// The streaming mode over a stream's windows.
    #[cfg(feature = "remote")]
    fn streamed(source: &crate::loader::BatchSource, opts: TorchLoaderOptions) -> Result<Self> {
        if source.stream_mix().is_some() {
            return Err(Error::argument(
                "source",
                "the torch loader reads one stream; read a mix of streams with StreamLoader or \
                 StagedLoader (from Python, trajstore.mix of streamed datasets runs on CUDA)",
            ));
        }
        if opts.resident_budget.is_some() {
            return Err(Error::argument(
                "resident_budget",
                "resident mode uploads a local dataset's columns once; a stream's windows \
                 rotate through its cache: pull the dataset to use it resident",
            ));
        }
        if opts.device_decode {
            return Err(Error::argument(
                "device_decode",
                "frames are decoded on the device from a local dataset; a stream's workers \
                 decode them",
            ));
        }
        let (b, l) = crate::loader::stream::columns::batch_shape(source)?;
        let columns = source.columns()?;
        let mut layout = Layout::of_columns(
            columns
                .iter()
                .map(|(n, dt, shape)| (n.as_str(), dt, shape.as_slice())),
            b,
            l,
        )?;
        layout.leads = source.leads();
        let (layout, transfer) = finish_layout(layout, &opts, &source.tail_columns());
        let (kernel, expand) = expansion(&layout, &opts);
        let pool: Arc<Mutex<Vec<TensorBatch>>> = Arc::new(Mutex::new(Vec::new()));
        let times = Arc::new(WorkerTimes::default());
        let rings = Arc::new(RingCounts::default());
        let (host, issuer) = handover(&layout, &opts, &kernel, &times, &rings);
        let sink: crate::loader::stream::Sink<Produced> = {
            let (pool, opts, times, host) =
                (pool.clone(), opts.clone(), times.clone(), host.clone());
            Arc::new(move || {
                let shared = (times.clone(), host.clone());
                let mut worker = stream_worker(&layout, &opts, &pool, None, kernel.clone(), shared);
                Box::new(move |_k, gatherer, plan| worker.produce(gatherer, plan))
            })
        };
        let runs = crate::loader::stream::Runs::new(source, opts.loader.clone(), sink)?;
        Ok(Self {
            inner: Inner::Streaming {
                batches: Batches::Stream(Box::new(runs)),
                pool,
                keep: keep(&opts.loader),
                transfer,
                decode: None,
                expand,
                times,
                rings,
                host,
                issuer,
            },
            device: opts.device,
            feed: None,
            // Only a local loader's state needs it.
            end: None,
        })
    }

    fn from_run(run: Run, opts: TorchLoaderOptions) -> Result<Self> {
        let (feed, start, end) = (run.feed.clone(), run.start, run.end);
        let first = feed.first();
        let (sampler, gatherer) = (first.sampler.clone(), first.gatherer.clone());
        let device = opts.device;
        // Host batches in flight (workers, prefetch queue, the one handed out) must fit memory:
        // checked before any thread starts or anything is allocated.
        let batch_bytes =
            gatherer.batch_bytes(sampler.num_slices(), sampler.slice_len() as usize)?;
        if opts.resident_budget.is_none() {
            check_in_flight(batch_bytes, &opts.loader)?;
        }
        let decode = opts
            .device_decode
            .then(|| Arc::new(DeviceDecode::default()));
        // With the device decode, the slots hold what the twin gathers (tables of stored frames).
        let twin = decode.as_ref().map(|d| d.twin(&gatherer)).transpose()?;
        let layout = Layout::new(
            twin.as_ref().map_or(&gatherer, |t| &t.stored),
            sampler.num_slices(),
            sampler.slice_len() as usize,
        )?;
        if let Some(budget) = opts.resident_budget {
            if feed.follows() {
                return Err(Error::argument(
                    "resident_budget",
                    "resident mode uploads one version once: it cannot follow a growing dataset",
                ));
            }
            let resident = Resident::new(sampler, &gatherer, layout, &opts, &run, budget)?;
            return Ok(Self {
                inner: Inner::Resident(Box::new(resident)),
                device,
                feed: Some(feed),
                end,
            });
        }
        let (layout, transfer) = finish_layout(layout, &opts, gatherer.tail_columns());
        let (kernel, expand) = expansion(&layout, &opts);
        let pool: Arc<Mutex<Vec<TensorBatch>>> = Arc::new(Mutex::new(Vec::new()));
        let times = Arc::new(WorkerTimes::default());
        let rings = Arc::new(RingCounts::default());
        let (host, issuer) = handover(&layout, &opts, &kernel, &times, &rings);
        let lo = &opts.loader;
        // Bursts of 1: the pinned host slots hold `workers + prefetch` batches and a few more.
        let pipeline = Pipeline::start(
            (lo.workers, lo.prefetch, 1),
            start,
            end,
            "torch-loader",
            || {
                let mut worker = stream_worker(
                    &layout,
                    &opts,
                    &pool,
                    decode.clone(),
                    kernel.clone(),
                    (times.clone(), host.clone()),
                );
                let mut planner = WorkerPlans::new(feed.clone());
                move |k: u64, lane: &mut Lane| {
                    planner.plan(k, lane);
                    worker.produce_feed(planner.gatherer(), planner.current())
                }
            },
        )?;
        feed.consumed(start);
        Ok(Self {
            inner: Inner::Streaming {
                batches: Batches::Local(pipeline),
                pool,
                keep: keep(&opts.loader),
                transfer,
                decode,
                expand,
                times,
                rings,
                host,
                issuer,
            },
            device,
            feed: Some(feed),
            end,
        })
    }

    /// The next batch on the target device, blocking until it is ready; `None` at the end of
    /// the stream. An error (a failed allocation or copy in libtorch) is returned at the batch it
    /// happened in.
    pub fn next_batch(&mut self) -> Option<Result<TensorBatch>> {
        let b = match &mut self.inner {
            Inner::Streaming {
                batches,
                issuer,
                times,
                ..
            } => {
                let asked = std::time::Instant::now();
                let item = batches.next_item();
                times.waited(asked);
                item.map(|p| {
                    p.and_then(|p| match p {
                        Produced::Batch(b) => Ok(b),
                        Produced::Staged(s) => issuer.issue(s),
                    })
                })
            }
            Inner::Resident(r) => r.next_batch(),
        };
        if let Some(feed) = &self.feed {
            feed.consumed(TorchLoader::position(self));
        }
        b
    }

    /// The device rings ([`TorchLoaderOptions::device_ring`]): batches made in buffers whose
    /// views were made once, and buffers allocated because the user still held every one. In
    /// streaming mode the workers' rings (zero batches where none runs: on the CPU, or with a
    /// transform, a widened column or the device decode); in resident mode the output
    /// ring of the fused gather (zero batches without it, or with a widened column).
    pub fn device_ring(&self) -> DeviceRingStats {
        match &self.inner {
            Inner::Streaming { rings, .. } => rings.stats(),
            Inner::Resident(r) => r.ring_stats(),
        }
    }

    /// The number of the batch [`TorchLoader::next_batch`] returns next.
    pub fn position(&self) -> u64 {
        match &self.inner {
            Inner::Streaming { batches, .. } => batches.position(),
            Inner::Resident(r) => r.position(),
        }
    }

    /// The target device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Bytes one batch's host-to-device copy carries when streaming to CUDA (the packed staging
    /// slot: the compact batch unless it is off, see [`TorchLoaderOptions::compact`]); None on
    /// CPU and in resident mode.
    ///
    /// With [`TorchLoaderOptions::device_decode`] a copy carries only the stored frames a batch
    /// uses, and this is the mean over the batches made so far (the slot's size before the
    /// first).
    pub fn transfer_bytes(&self) -> Option<u64> {
        match &self.inner {
            Inner::Streaming {
                decode: Some(d), ..
            } if self.device != Device::Cpu => d.mean_shipped().or(Some(0)).filter(|&b| b > 0),
            Inner::Streaming { transfer, .. } if *transfer > 0 => Some(*transfer),
            _ => None,
        }
    }

    /// With [`TorchLoaderOptions::device_decode`], the mean bytes of the batches the workers
    /// made so far (tables and stored frames; on the CPU, what a copy to a GPU would carry).
    pub fn device_decode_bytes(&self) -> Option<u64> {
        match &self.inner {
            Inner::Streaming {
                decode: Some(d), ..
            } => d.mean_shipped(),
            _ => None,
        }
    }

    /// Whether frames are decoded where the batches land
    /// ([`TorchLoaderOptions::device_decode`]).
    pub fn decodes_on_device(&self) -> bool {
        matches!(
            &self.inner,
            Inner::Streaming {
                decode: Some(_),
                ..
            }
        )
    }

    /// Whether this loader samples from device-resident columns.
    pub fn is_resident(&self) -> bool {
        matches!(self.inner, Inner::Resident(_))
    }

    /// When streaming a compact batch ([`TorchLoaderOptions::compact`]), how it is expanded
    /// where it lands: `fused` (one kernel, `expand.cu`: NVRTC-compiled on a GPU, its C++ copy
    /// on the CPU), `ops` (libtorch operations: [`TorchLoaderOptions::fused_expand`] is off),
    /// or `ops (...)` with why the kernel could not be loaded. None in resident mode or for a
    /// batch that is not compact.
    pub fn compact_expand(&self) -> Option<String> {
        match &self.inner {
            Inner::Streaming { expand, .. } => expand.clone(),
            Inner::Resident(_) => None,
        }
    }

    /// Where the workers' and the consumer's time has gone since the loader started: batches,
    /// and nanoseconds summed over every worker waiting for a staging slot, gathering (resident
    /// mode: planning the parameters), and issuing the rest, and the consumer's waiting and
    /// issuing (see [`WorkerTimesTotal`]). Two readings give the means of the batches between
    /// them.
    pub fn worker_times(&self) -> Option<WorkerTimesTotal> {
        match &self.inner {
            Inner::Streaming { times, .. } => Some(times.total()),
            Inner::Resident(r) => Some(r.times()),
        }
    }

    /// In resident mode, how each batch is gathered: `fused` (one kernel writes the whole
    /// batch: NVRTC-compiled on a GPU, its C++ copy on the CPU), `fused, parameters read in
    /// place` (with [`TorchLoaderOptions::resident_mapped_params`]), or `unfused: ` and why
    /// (libtorch operations: NVRTC could not be loaded, or
    /// [`TorchLoaderOptions::resident_fused`] is off).
    /// None when streaming.
    pub fn resident_gather(&self) -> Option<String> {
        match &self.inner {
            Inner::Resident(r) => Some(r.gather_kind()),
            _ => None,
        }
    }

    /// Resident mode with the fused gather's output ring: the kernel alone, µs a launch over
    /// `launches` launches of the last batch's parameters (`bench --resident` reports it beside
    /// the rate). None in the other modes, before the first batch, or while every buffer of the
    /// ring is held.
    #[doc(hidden)]
    pub fn time_resident_kernel(&self, launches: u32) -> Option<Result<f64>> {
        match &self.inner {
            Inner::Resident(r) => r.time_kernel(launches),
            _ => None,
        }
    }

    /// Hands a consumed CPU batch back so that a worker gathers into its tensors again instead of
    /// allocating new ones. Only recycle a batch none of whose tensors (or views of them) you
    /// still use: they will be overwritten. Batches on a CUDA device are simply dropped (their
    /// memory goes back to libtorch's caching allocator).
    pub fn recycle(&self, batch: TensorBatch) {
        if let Inner::Streaming { pool, keep, .. } = &self.inner
            && batch.device() == Device::Cpu
            && batch.flag_base.is_some()
        {
            let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < *keep {
                pool.push(batch);
            }
        }
    }
}

/// CPU batches the pool keeps at most (at least 16): as many as the loader can have in use at
/// once (bursts of 1), so that a steady state allocates none.
fn keep(opts: &crate::loader::LoaderOptions) -> usize {
    crate::loader::items_in_use(opts.workers, opts.prefetch, 1).max(16)
}

/// Checks the device (a CUDA device on a machine without one is an error) and that pinned
/// output has CUDA, before anything starts.
fn check_options(opts: &TorchLoaderOptions) -> Result<()> {
    check_device(opts.device)?;
    if opts.device_decode {
        let clash = if opts.resident_budget.is_some() {
            Some("resident mode (its frames are decoded once, at upload)")
        } else if opts.transform.is_some() {
            Some("a transform (it sees host batches, whose frames are not decoded yet)")
        } else if !matches!(opts.device, Device::Cpu | Device::Cuda(_)) {
            Some("this device (frames are decoded on CUDA, or on the CPU)")
        } else {
            None
        };
        if let Some(clash) = clash {
            return Err(Error::argument(
                "device_decode",
                format!("frames are not decoded on the device with {clash}"),
            ));
        }
    }
    if opts.pin_output && opts.device == Device::Cpu {
        // Pinning needs CUDA: say so clearly instead of failing inside libtorch.
        check_device(Device::Cuda(0)).map_err(|_| {
            Error::argument(
                "pin_output",
                "pinned output needs CUDA, and libtorch sees no CUDA device",
            )
        })?;
    }
    Ok(())
}

/// The slots' layout for `opts` (compact by default on CUDA without a transform, `tails` the
/// columns it holds as one row per slice), and the bytes of one batch's copy to CUDA (0 on
/// CPU).
fn finish_layout(layout: Layout, opts: &TorchLoaderOptions, tails: &[bool]) -> (Layout, u64) {
    let compact = opts
        .compact
        .unwrap_or(matches!(opts.device, Device::Cuda(_)))
        && opts.transform.is_none();
    let layout = if compact {
        layout.compact(tails)
    } else {
        layout
    };
    let transfer = match opts.device {
        Device::Cuda(_) => layout.packed_bytes(),
        _ => 0,
    };
    (layout, transfer)
}

/// How a compact layout's batches are expanded: the fused kernel on the target's side (and
/// "fused"), or tensor operations ("ops", with why where the kernel could not be loaded); None
/// for a layout that is not compact.
fn expansion(layout: &Layout, opts: &TorchLoaderOptions) -> (Option<Arc<Kernel>>, Option<String>) {
    if !layout.compact {
        return (None, None);
    }
    if !opts.fused_expand {
        return (None, Some("ops".into()));
    }
    match Kernel::for_device(opts.device) {
        Ok(k) => (Some(Arc::new(k)), Some("fused".into())),
        // Where NVRTC is missing the operations give the same batch, more slowly; the reason
        // is kept for `compact_expand`.
        Err(e) => (None, Some(format!("ops ({e})"))),
    }
}

/// Whether the workers hand gathered host slots to the consumer's device ring (on CUDA, or its
/// CPU stand-in, without a transform or a layout the ring cannot take), and the consumer's
/// side.
fn handover(
    layout: &Layout,
    opts: &TorchLoaderOptions,
    kernel: &Option<Arc<Kernel>>,
    times: &Arc<WorkerTimes>,
    rings: &Arc<RingCounts>,
) -> (Option<Arc<HostSlots>>, Box<Issuer>) {
    let staged = opts.device_ring
        && (matches!(opts.device, Device::Cuda(_)) || opts.ring_on_cpu)
        && opts.transform.is_none()
        && DeviceRing::fits(layout, kernel.as_deref());
    let lo = &opts.loader;
    let host = staged.then(|| HostSlots::new(lo.workers, lo.prefetch, opts.staging_slots));
    let issuer = Issuer::new(
        layout,
        (opts.device, opts.cast),
        kernel.clone(),
        rings.clone(),
        times.clone(),
    );
    (host, Box::new(issuer))
}

/// One worker of the streaming mode (its staging slots are allocated on first use).
fn stream_worker(
    layout: &Layout,
    opts: &TorchLoaderOptions,
    pool: &Arc<Mutex<Vec<TensorBatch>>>,
    decode: Option<Arc<DeviceDecode>>,
    expand: Option<Arc<Kernel>>,
    (times, staged): (Arc<WorkerTimes>, Option<Arc<HostSlots>>),
) -> StreamWorker {
    StreamWorker {
        times,
        staged,
        expand,
        decode: decode.map(|d| (d, WorkerDecode::new(opts.device_decode_per_thread))),
        layout: layout.clone(),
        device: opts.device,
        pin: match opts.device {
            Device::Cuda(_) => Some(opts.device),
            _ if opts.pin_output => Some(Device::Cuda(0)),
            _ => None,
        },
        cast: opts.cast,
        transform: opts.transform.clone(),
        pool: pool.clone(),
        slots: Vec::new(),
        max_slots: opts.staging_slots.max(2),
        next_slot: 0,
        pending: Vec::new(),
        done: Vec::new(),
    }
}

impl Drop for TorchLoader {
    fn drop(&mut self) {
        // Workers waiting for a host slot stop waiting (the pipeline joins them next).
        if let Inner::Streaming { host: Some(h), .. } = &self.inner {
            h.close();
        }
    }
}

impl Iterator for TorchLoader {
    type Item = Result<TensorBatch>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch()
    }
}
