//! [`TorchLoader`]: hands over device batches in order, from the streaming workers or from the
//! device-resident columns.

use std::sync::{Arc, Mutex};

use tch::Device;

use super::layout::Layout;
use super::options::TorchLoaderOptions;
use super::resident::Resident;
use super::streaming::StreamWorker;
use super::{TensorBatch, check_device};
use crate::error::{Error, Result};
use crate::loader::{Feed, Pipeline, Run, WorkerPlans, check_in_flight};

/// Yields [`TensorBatch`]es on the target device in a fixed order: batch `k` of rank `r` is the
/// sampler's batch [`crate::loader::global_batch`], whatever the number of workers, and equal (bit for bit,
/// before any cast) to what [`crate::gather::Gatherer::gather`] makes of that plan.
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
    feed: Arc<Feed>,
    /// The end of this loader's batches (None: endless).
    end: Option<u64>,
}

pub(crate) enum Inner {
    Streaming {
        pipeline: Pipeline<Result<TensorBatch>>,
        pool: Arc<Mutex<Vec<TensorBatch>>>,
        /// Bytes of one batch's host-to-device copy (the packed slot; 0 on CPU).
        transfer: u64,
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

impl TorchLoader {
    /// Starts a loader of `source`'s batches (see [`crate::loader::LoaderOptions`] for which)
    /// on `opts.device`. Checks the device first (a CUDA device on a machine without one is an
    /// error); on CPU no CUDA function is called. In resident mode (a fixed single dataset
    /// only) this uploads the columns (O(dataset) once).
    pub fn new(source: &crate::loader::BatchSource, opts: TorchLoaderOptions) -> Result<Self> {
        let run = source.run(&opts.loader)?;
        Self::from_run(run, opts)
    }

    /// Where this loader is (see [`crate::loader::Loader::state`]).
    pub fn state(&self) -> crate::loader::LoaderState {
        let next = self.position();
        let mut s = self.feed.state(next, true);
        s.iteration_end = self.end.filter(|&e| e > next);
        s
    }

    fn from_run(run: Run, opts: TorchLoaderOptions) -> Result<Self> {
        let (feed, start, end) = (run.feed.clone(), run.start, run.end);
        let first = feed.first();
        let (sampler, gatherer) = (first.sampler.clone(), first.gatherer.clone());
        let device = opts.device;
        check_device(device)?;
        if opts.pin_output && device == Device::Cpu {
            // Pinning needs CUDA: say so clearly instead of failing inside libtorch.
            check_device(Device::Cuda(0)).map_err(|_| {
                Error::argument(
                    "pin_output",
                    "pinned output needs CUDA, and libtorch sees no CUDA device",
                )
            })?;
        }
        // Host batches in flight (workers, prefetch queue, the one handed out) must fit memory:
        // checked before any thread starts or anything is allocated.
        let batch_bytes =
            gatherer.batch_bytes(sampler.num_slices(), sampler.slice_len() as usize)?;
        if opts.resident_budget.is_none() {
            check_in_flight(batch_bytes, &opts.loader)?;
        }
        let layout = Layout::new(
            &gatherer,
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
                feed,
                end,
            });
        }
        let compact =
            opts.compact.unwrap_or(matches!(device, Device::Cuda(_))) && opts.transform.is_none();
        let layout = if compact {
            layout.compact(&gatherer)
        } else {
            layout
        };
        let pool: Arc<Mutex<Vec<TensorBatch>>> = Arc::new(Mutex::new(Vec::new()));
        let lo = &opts.loader;
        let pipeline = Pipeline::start(
            lo.workers,
            lo.prefetch,
            start,
            end,
            "torch-loader",
            |lane| {
                let mut worker = StreamWorker {
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
                    planner: WorkerPlans::new(feed.clone()),
                    slots: Vec::new(),
                    max_slots: opts.staging_slots.max(2),
                    next_slot: 0,
                    pending: Vec::new(),
                    done: Vec::new(),
                };
                move |k: u64| worker.produce(k, lane)
            },
        )?;
        feed.consumed(start);
        let transfer = match device {
            Device::Cuda(_) => layout.packed_bytes(),
            _ => 0,
        };
        Ok(Self {
            inner: Inner::Streaming {
                pipeline,
                pool,
                transfer,
            },
            device,
            feed,
            end,
        })
    }

    /// The next batch on the target device, blocking until it is ready; `None` at the end of
    /// the stream. An error (a failed allocation or copy in libtorch) is returned at the batch it
    /// happened in.
    pub fn next_batch(&mut self) -> Option<Result<TensorBatch>> {
        let b = match &mut self.inner {
            Inner::Streaming { pipeline, .. } => pipeline.next_item(),
            Inner::Resident(r) => r.next_batch(),
        };
        self.feed.consumed(TorchLoader::position(self));
        b
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

    /// Bytes one batch's host-to-device copy carries when streaming to CUDA (the packed staging
    /// slot: the compact batch unless it is off, see [`TorchLoaderOptions::compact`]); None on
    /// CPU and in resident mode.
    pub fn transfer_bytes(&self) -> Option<u64> {
        match &self.inner {
            Inner::Streaming { transfer, .. } if *transfer > 0 => Some(*transfer),
            _ => None,
        }
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
