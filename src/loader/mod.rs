//! The loader: background workers that sample and gather batches ahead of the training loop into
//! a bounded queue, deterministic whatever the number of workers, sharded across ranks.

use std::sync::{Arc, Mutex};

use crate::error::Result;
use crate::gather::{Batch, Gatherer, ReadAhead};
use crate::sample::Sampler;

mod pipeline;
mod staged;

#[cfg(feature = "torch")]
pub(crate) use pipeline::Lane;
#[cfg(feature = "remote")]
pub(crate) use pipeline::check_rank;
pub use pipeline::{MAX_WORKERS, global_batch};
pub(crate) use pipeline::{Pipeline, WorkerPlans, check_in_flight, loader_end};
pub use staged::{StagedBatch, StagedLoader, StagingSlot};

/// Options of a [`Loader`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoaderOptions {
    /// Background worker threads (each samples and gathers whole batches). Default 2.
    pub workers: usize,
    /// Batches gathered ahead of the consumer (queue depth). Default 4.
    pub prefetch: usize,
    /// This process's rank among `world_size` data-parallel ranks; ranks draw disjoint streams.
    pub rank: u64,
    /// Number of data-parallel ranks.
    pub world_size: u64,
    /// Stop after this many batches (default: endless, or one epoch for epoch samplers).
    pub max_batches: Option<u64>,
    /// The number of the first batch (default 0): the sampler's batch `start * world_size + rank`
    /// comes first. Resumes a stream exactly where a run stopped, or starts epoch `e` of an epoch
    /// sampler (`start = e * batches_per_epoch`).
    pub start: u64,
    /// Whether each worker asks the kernel for the pages of the batch it gathers next while it
    /// copies the current one (`madvise(WILLNEED)`), so that data not in the page cache
    /// (datasets larger than RAM, cold starts) arrives with many reads in flight.
    /// [`ReadAhead::Auto`] (default) does it while the gatherer finds data missing from memory
    /// and costs nothing on data in memory; see [`Gatherer::set_read_ahead`] for the gather
    /// itself.
    pub read_ahead: ReadAhead,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            workers: 2,
            prefetch: 4,
            rank: 0,
            world_size: 1,
            max_batches: None,
            start: 0,
            read_ahead: ReadAhead::Auto,
        }
    }
}

impl LoaderOptions {
    /// Sets the worker count (at least 1).
    pub fn with_workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }
    /// Sets the queue depth (at least 1).
    pub fn with_prefetch(mut self, n: usize) -> Self {
        self.prefetch = n.max(1);
        self
    }
    /// Sets rank and world size.
    pub fn with_rank(mut self, rank: u64, world_size: u64) -> Self {
        self.rank = rank;
        self.world_size = world_size;
        self
    }
    /// Sets the read-ahead of upcoming batches (see [`LoaderOptions::read_ahead`]).
    pub fn with_read_ahead(mut self, mode: ReadAhead) -> Self {
        self.read_ahead = mode;
        self
    }
    /// `true`: [`ReadAhead::Always`]; `false`: [`ReadAhead::Never`].
    pub fn with_readahead(self, on: bool) -> Self {
        self.with_read_ahead(if on {
            ReadAhead::Always
        } else {
            ReadAhead::Never
        })
    }
    /// Stops after `n` batches.
    pub fn with_max_batches(mut self, n: u64) -> Self {
        self.max_batches = Some(n);
        self
    }
    /// Starts at batch `k` (see [`LoaderOptions::start`]).
    pub fn with_start(mut self, k: u64) -> Self {
        self.start = k;
        self
    }
}

/// Yields gathered [`Batch`]es in order: batch `k` of rank `r` is the sampler's batch
/// [`global_batch`]`(k, r, world_size, ..)` (`k * world_size + r` for endless samplers), whatever
/// the number of workers. Dropping the loader stops and joins its
/// workers.
pub struct Loader {
    pipeline: Pipeline<Batch>,
    pool: Recycler,
}

/// Hands consumed batches back to a [`Loader`]'s pool from anywhere (for instance when the last
/// Python tensor viewing a batch is freed). Cheap to clone; batches recycled after the loader is
/// gone are simply dropped.
#[derive(Debug, Clone, Default)]
pub struct Recycler(Arc<Mutex<Vec<Batch>>>);

impl Recycler {
    /// Keeps `batch` for a worker to gather into (at most 16 are kept).
    pub fn recycle(&self, batch: Batch) {
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < 16 {
            pool.push(batch);
        }
    }

    pub(crate) fn take(&self) -> Batch {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("next", &self.pipeline.next)
            .field("workers", &self.pipeline.workers.len())
            .finish()
    }
}

impl Loader {
    /// Starts the workers.
    ///
    /// Errors with [`crate::Error::InvalidArgument`] when the sampler's batches are larger than
    /// [`crate::sample::max_batch_bytes`] (about `num_slices` or `slice_len`), when the batches
    /// in flight (one per worker, `prefetch` queued, one being consumed) together are (about
    /// `workers` or `prefetch`), or when there are more than [`MAX_WORKERS`] workers, before any
    /// thread starts.
    pub fn try_new(
        sampler: Arc<dyn Sampler>,
        gatherer: Arc<Gatherer>,
        opts: LoaderOptions,
    ) -> Result<Self> {
        let end = loader_end(sampler.as_ref(), &opts)?;
        let batch_bytes =
            gatherer.batch_bytes(sampler.num_slices(), sampler.slice_len() as usize)?;
        check_in_flight(batch_bytes, &opts)?;
        let pool = Recycler::default();
        let pipeline = Pipeline::start(
            opts.workers,
            opts.prefetch,
            opts.start,
            end,
            "loader",
            |lane| {
                let (gatherer, pool) = (gatherer.clone(), pool.clone());
                let mut planner = WorkerPlans::new(sampler.clone(), &opts);
                move |k: u64| {
                    planner.plan(k, lane, &gatherer);
                    let mut batch = pool.take();
                    if let Err(e) = gatherer.gather(planner.current(), &mut batch) {
                        // Only a sampler that plans outside its snapshot gets here (a bug, see
                        // `next_batch`); the panic reaches the consumer.
                        panic!(
                            "batch {k}: the sampler planned a batch the gatherer cannot gather: {e}"
                        );
                    }
                    batch
                }
            },
        )?;
        Ok(Self { pipeline, pool })
    }

    /// The next batch, blocking until it is ready; `None` at the end.
    ///
    /// # Panics
    /// If a worker panicked (a bug in a sampler or the gather, never bad data: e.g. a sampler
    /// that plans episode positions its snapshot does not have) while producing
    /// this batch, the panic is resumed here, in the consumer, rather than ending the stream early.
    pub fn next_batch(&mut self) -> Option<Batch> {
        self.pipeline.next_item()
    }

    /// The number of the batch [`Loader::next_batch`] returns next.
    pub fn position(&self) -> u64 {
        self.pipeline.position()
    }

    /// Hands a consumed batch back so a worker reuses its buffers (no allocation in steady state).
    pub fn recycle(&self, batch: Batch) {
        self.pool.recycle(batch);
    }

    /// A handle that recycles batches into this loader's pool (see [`Recycler`]).
    pub fn recycler(&self) -> Recycler {
        self.pool.clone()
    }
}

impl Iterator for Loader {
    type Item = Batch;
    fn next(&mut self) -> Option<Batch> {
        self.next_batch()
    }
}
