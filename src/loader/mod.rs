//! The loader: background workers that sample and gather batches ahead of the training loop into
//! a bounded queue, deterministic whatever the number of workers, sharded across ranks.

use std::sync::{Arc, Mutex};

use crate::error::Result;
use crate::gather::{Batch, Gatherer, ReadAhead};
use crate::sample::Sampler;

mod feed;
mod pipeline;
mod spec;
mod staged;
mod state;

pub(crate) use feed::Feed;
pub use feed::FollowStats;
#[cfg(feature = "torch")]
pub(crate) use pipeline::Lane;
pub(crate) use pipeline::check_rank;
pub use pipeline::{MAX_WORKERS, global_batch};
pub(crate) use pipeline::{Pipeline, WorkerPlans, check_in_flight, loader_end};
pub use spec::{Follow, LoaderSpec, MAX_FOLLOW_PERIOD, PartSpec};
pub use staged::{StagedBatch, StagedLoader, StagingSlot};
pub use state::{
    DATASET_ID_PROPERTY, LoaderState, MAX_BATCH_NUMBER, PartState, STATE_FORMAT, STATE_VERSION,
    SamplerState,
};

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
    /// A state to continue from ([`LoaderOptions::with_resume`]).
    pub resume: Option<Arc<LoaderState>>,
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
            resume: None,
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
    /// Continues exactly where `state` was taken ([`Loader::state`]): the next batch is the
    /// one the interrupted loader would have returned next, and so are all that follow,
    /// whatever the number of workers before and after; inside an interrupted iteration
    /// (`max_batches`, an epoch) only the rest of it. Honoured the same way by every loader:
    /// [`BatchSource::open`] (and `Loader::open`, `StagedLoader::open`) opens the dataset(s) at
    /// the state's versions and checks that the state is of them, of this rank and world size
    /// and of these sampler options; `try_new` checks it against the sampler and gatherer it is
    /// given; a loader made `from_source` requires the state its source was opened at. Sets
    /// [`LoaderOptions::start`].
    pub fn with_resume(mut self, state: LoaderState) -> Self {
        self.start = state.next_batch;
        self.resume = Some(Arc::new(state));
        self
    }
}

/// What loaders draw batches from: one dataset or a mix, fixed or following new versions, at the
/// versions a resumed state names, with a prioritized sampler's priorities. Cheap to clone
/// (shared); the follow thread stops when the last clone and loader are gone.
#[derive(Clone)]
pub struct BatchSource(Arc<Feed>);

impl std::fmt::Debug for BatchSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchSource")
            .field("versions", &self.0.versions(0))
            .finish_non_exhaustive()
    }
}

impl BatchSource {
    /// Opens `spec` for loaders of `opts` (rank, world size, read-ahead; with `opts.resume`,
    /// at the state's versions, checked against it, priorities restored).
    pub fn open(spec: LoaderSpec, opts: &LoaderOptions) -> Result<Self> {
        check_rank(opts)?;
        Ok(Self(Feed::open(
            spec,
            opts.read_ahead,
            (opts.rank, opts.world_size),
            opts.resume.as_deref(),
        )?))
    }

    #[cfg(feature = "torch")]
    pub(crate) fn feed(&self) -> Arc<Feed> {
        self.0.clone()
    }

    /// A source of one sampler and gatherer built by hand.
    pub fn fixed(sampler: Arc<dyn Sampler>, gatherer: Arc<Gatherer>) -> Self {
        Self(Feed::fixed(sampler, gatherer))
    }

    /// The state of a loader of this source whose next batch is `next`.
    pub fn state(&self, next: u64, rank: u64, world_size: u64) -> LoaderState {
        self.0.state(next, (rank, world_size), true)
    }

    /// The versions batch `k` is planned from, one per dataset.
    pub fn versions(&self, k: u64) -> Vec<u64> {
        self.0.versions(k)
    }

    /// The prioritized sampler of dataset `part` for batch `k` (None when not prioritized).
    pub fn prioritized(
        &self,
        k: u64,
        part: usize,
    ) -> Option<Arc<crate::sample::PrioritizedSampler>> {
        self.0.prioritized(k).get(part).cloned().flatten()
    }

    /// The sampler and gatherer of batch `k`'s generation.
    pub fn at(&self, k: u64) -> (Arc<dyn Sampler>, Arc<Gatherer>) {
        let g = self.0.peek(k);
        (g.sampler.clone(), g.gatherer.clone())
    }

    /// The part index of each slice position of every batch (all zeros for one dataset).
    pub fn slice_sources(&self) -> Vec<u16> {
        let g = self.0.first();
        g.gatherer.slice_sources(g.sampler.num_slices())
    }

    /// What following new versions has done so far.
    pub fn follow_stats(&self) -> FollowStats {
        self.0.stats()
    }

    /// Whether the source follows a dataset's new versions.
    pub fn follows(&self) -> bool {
        self.0.follows()
    }
}

/// Yields gathered [`Batch`]es in order: batch `k` of rank `r` is the sampler's batch
/// [`global_batch`]`(k, r, world_size, ..)` (`k * world_size + r` for endless samplers), whatever
/// the number of workers. Dropping the loader stops and joins its
/// workers.
pub struct Loader {
    pipeline: Pipeline<Batch>,
    pool: Recycler,
    feed: Arc<Feed>,
    rank_world: (u64, u64),
    /// The end of this loader's batches (None: endless).
    end: Option<u64>,
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
        let feed = Feed::fixed_resumed(
            sampler,
            gatherer,
            (opts.rank, opts.world_size),
            opts.resume.as_deref(),
        )?;
        Self::from_feed(feed, opts)
    }

    /// A loader of `spec`: one dataset or a mix, fixed or following new versions, resumed
    /// from `opts.resume` when given. Errors as [`Loader::try_new`] does, and when a state
    /// cannot resume this loader (see [`LoaderOptions::with_resume`]).
    pub fn open(spec: LoaderSpec, opts: LoaderOptions) -> Result<Self> {
        Self::from_source(&BatchSource::open(spec, &opts)?, opts)
    }

    /// A loader of `source`'s batches from `opts.start` on (several loaders may share a source:
    /// one after the other to iterate again, with their follow thread, priorities and cached
    /// indexes). `opts.resume`, when given, must be the state the source was opened at (it sets
    /// the start and the end of the resumed iteration); any other is an error.
    pub fn from_source(source: &BatchSource, opts: LoaderOptions) -> Result<Self> {
        source.0.check_resume(opts.resume.as_ref())?;
        Self::from_feed(source.0.clone(), opts)
    }

    fn from_feed(feed: Arc<Feed>, opts: LoaderOptions) -> Result<Self> {
        let first = feed.first();
        let (sampler, gatherer) = (first.sampler.clone(), first.gatherer.clone());
        let end = loader_end(sampler.as_ref(), &opts)?;
        let batch_bytes =
            gatherer.batch_bytes(sampler.num_slices(), sampler.slice_len() as usize)?;
        check_in_flight(batch_bytes, &opts)?;
        let pool = Recycler::default();
        feed.consumed(opts.start);
        let pipeline = Pipeline::start(
            opts.workers,
            opts.prefetch,
            opts.start,
            end,
            "loader",
            |lane| {
                let pool = pool.clone();
                let mut planner = WorkerPlans::new(feed.clone(), &opts);
                move |k: u64| {
                    planner.plan(k, lane);
                    let mut batch = pool.take();
                    if let Err(e) = planner.gatherer().gather(planner.current(), &mut batch) {
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
        Ok(Self {
            pipeline,
            pool,
            feed,
            rank_world: (opts.rank, opts.world_size),
            end,
        })
    }

    /// Where this loader is: enough to continue exactly here after a restart
    /// ([`LoaderOptions::with_resume`]). Small and cheap (no per-batch data), except that a
    /// prioritized sampler's priorities are copied in (16 bytes per run of equal priorities at
    /// most 8 per window).
    pub fn state(&self) -> LoaderState {
        let next = self.pipeline.position();
        let mut s = self.feed.state(next, self.rank_world, true);
        s.iteration_end = self.end.filter(|&e| e > next);
        s
    }

    /// The versions the next batch is planned from, one per dataset.
    pub fn versions(&self) -> Vec<u64> {
        self.feed.versions(self.pipeline.position())
    }

    /// The prioritized sampler of dataset `part` for the next batch, to update priorities
    /// with (`None` when that part's sampler is not prioritized).
    pub fn prioritized(&self, part: usize) -> Option<Arc<crate::sample::PrioritizedSampler>> {
        self.source().prioritized(self.pipeline.position(), part)
    }

    /// The source of this loader's batches.
    pub fn source(&self) -> BatchSource {
        BatchSource(self.feed.clone())
    }

    /// What following new versions has done so far.
    pub fn follow_stats(&self) -> FollowStats {
        self.feed.stats()
    }

    /// The next batch, blocking until it is ready; `None` at the end.
    ///
    /// # Panics
    /// If a worker panicked (a bug in a sampler or the gather, never bad data: e.g. a sampler
    /// that plans episode positions its snapshot does not have) while producing
    /// this batch, the panic is resumed here, in the consumer, rather than ending the stream early.
    pub fn next_batch(&mut self) -> Option<Batch> {
        let b = self.pipeline.next_item();
        self.feed.consumed(self.pipeline.position());
        b
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
