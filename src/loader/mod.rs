//! The loader: background workers that sample and gather batches ahead of the training loop into
//! a bounded queue, deterministic whatever the number of workers, sharded across ranks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::Result;
use crate::gather::{Batch, Gatherer};
use crate::sample::Sampler;

mod feed;
mod pipeline;
pub(crate) mod ring;
mod spec;
mod staged;
mod state;
#[cfg(feature = "remote")]
pub mod stream;

pub(crate) use feed::Feed;
pub use feed::FollowStats;
pub(crate) use pipeline::{
    Lane, Pipeline, WorkerPlans, check_in_flight, check_rank, feed_burst, items_in_use, loader_end,
};
pub use pipeline::{MAX_WORKERS, global_batch};
pub use ring::{StagedBatch, StagingSlot};
#[cfg(feature = "remote")]
pub use spec::StreamFollow;
pub use spec::{Follow, LoaderSpec, MAX_FOLLOW_PERIOD, PartSpec};
pub use staged::StagedLoader;
pub use state::{
    DATASET_ID_PROPERTY, LoaderState, MAX_BATCH_NUMBER, PartState, STATE_FORMAT, STATE_VERSION,
    SamplerState,
};
#[cfg(feature = "remote")]
use stream::StreamPlan;
#[cfg(feature = "remote")]
pub use stream::{StreamLoader, StreamStats};

/// How a loader runs over its [`BatchSource`]: worker threads, queue depth, and which batches
/// (where to start, how many). What the batches are (datasets, samplers, rank, read-ahead, a
/// resumed state) is the source's [`LoaderSpec`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoaderOptions {
    /// Background worker threads (each samples and gathers whole batches). Default 2.
    pub workers: usize,
    /// Batches gathered ahead of the consumer (queue depth). Default 4. With batches small
    /// enough, a [`Loader`] lets each worker run up to 3 more batches ahead (64 MiB in all at
    /// most, and within [`crate::sample::max_batch_bytes`]), so that workers faster than the
    /// consumer are woken once every few batches, not once a batch; not with a prioritized
    /// sampler, whose batches use the priorities current when they are planned.
    pub prefetch: usize,
    /// Stop after this many batches (default: endless, or one epoch for epoch samplers).
    pub max_batches: Option<u64>,
    /// The number of the first batch: the sampler's batch `start * world_size + rank` comes
    /// first. Default: where the source's resumed state stopped (with the end of the iteration
    /// it was taken in), else 0. Set it to iterate again over a source, or to start epoch `e` of
    /// an epoch sampler (`start = e * batches_per_epoch`).
    pub start: Option<u64>,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            workers: 2,
            prefetch: 4,
            max_batches: None,
            start: None,
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
    /// Stops after `n` batches.
    pub fn with_max_batches(mut self, n: u64) -> Self {
        self.max_batches = Some(n);
        self
    }
    /// Starts at batch `k` (see [`LoaderOptions::start`]).
    pub fn with_start(mut self, k: u64) -> Self {
        self.start = Some(k);
        self
    }
}

/// Which batches one loader yields: from `start` to `end` (None: endless), of the source's rank.
pub(crate) struct Run {
    pub(crate) feed: Arc<Feed>,
    pub(crate) start: u64,
    pub(crate) end: Option<u64>,
}

/// What loaders draw batches from: one dataset or a mix, fixed or following new versions, of
/// one rank, at the versions a resumed state names, with a prioritized sampler's priorities; or
/// one dataset streamed from object storage ([`LoaderSpec::streamed`]). Every loader is made
/// from one: `Loader::new`, `StagedLoader::new` and `TorchLoader::new` from local datasets,
/// `StreamLoader::new` from a stream. Several loaders may share a source, one after the other,
/// to iterate again with its follow thread, priorities and cached indexes. Cheap to clone
/// (shared); the follow thread stops when the last clone and loader are gone.
#[derive(Clone)]
pub struct BatchSource(Src);

#[derive(Clone)]
enum Src {
    Local(Arc<Feed>),
    #[cfg(feature = "remote")]
    Streamed(Arc<StreamPlan>),
    #[cfg(feature = "remote")]
    StreamMix(Arc<stream::mixed::StreamMix>),
}

impl std::fmt::Debug for BatchSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchSource")
            .field("versions", &self.versions(0))
            .field("local", &self.local().is_ok())
            .finish_non_exhaustive()
    }
}

impl BatchSource {
    /// Opens `spec`: builds each part's sampler and gatherer (with the spec's state, at the
    /// state's versions, checked against it, priorities restored), and starts the follow
    /// thread when a part follows; a streamed spec is checked (sampler, columns) and nothing
    /// is downloaded until a loader starts. Errors with [`crate::Error::InvalidArgument`] about
    /// the argument at fault (rank, world size, sampler options, a state of another loader).
    pub fn open(spec: LoaderSpec) -> Result<Self> {
        check_rank(spec.rank, spec.world_size)?;
        spec.check_frame_cache()?;
        #[cfg(feature = "remote")]
        let mut spec = spec;
        #[cfg(feature = "remote")]
        if !spec.streamed.is_empty() {
            if !spec.parts.is_empty() {
                return Err(crate::Error::argument(
                    "parts",
                    "a streamed source cannot be mixed with local datasets: mix streams with \
                     streams (LoaderSpec::stream_part), or pull the streamed ones",
                ));
            }
            if spec.resume.is_some() {
                return Err(crate::Error::argument(
                    "resume",
                    "a streaming loader cannot resume from a state yet: start it at the batch \
                     to continue from (LoaderOptions::with_start)",
                ));
            }
            let streams = std::mem::take(&mut spec.streamed);
            let mixed = streams.len() > 1;
            let first_slices = spec.num_slices.unwrap_or(streams[0].1.num_slices);
            let weights: Vec<f64> = streams.iter().map(|s| s.2).collect();
            let counts = if mixed {
                crate::sample::mix_counts(&weights, first_slices)?
            } else {
                vec![first_slices]
            };
            let mut plans = Vec::with_capacity(streams.len());
            for ((stream, mut sampler, _), n) in streams.into_iter().zip(counts) {
                if mixed {
                    // A part with no slice is never sampled; its plan still checks its columns.
                    sampler.num_slices = n.max(1);
                }
                plans.push(StreamPlan::new(
                    stream,
                    sampler,
                    spec.columns.clone(),
                    (
                        (spec.rank, spec.world_size),
                        spec.frame_stack,
                        spec.stream_follow,
                    ),
                )?);
            }
            if mixed {
                let mix = stream::mixed::StreamMix::new(plans, &weights, first_slices)?;
                return Ok(Self(Src::StreamMix(Arc::new(mix))));
            }
            let plan = plans.pop().expect("one stream");
            return Ok(Self(Src::Streamed(Arc::new(plan))));
        }
        Ok(Self(Src::Local(Feed::open(spec)?)))
    }

    /// The feed of local datasets, or an error naming the loader that reads a stream.
    fn local(&self) -> Result<&Arc<Feed>> {
        match &self.0 {
            Src::Local(f) => Ok(f),
            #[cfg(feature = "remote")]
            Src::Streamed(_) | Src::StreamMix(_) => Err(crate::Error::argument(
                "source",
                "this source streams from object storage: read it with StreamLoader::new",
            )),
        }
    }

    #[cfg(feature = "remote")]
    pub(crate) fn stream_mix(&self) -> Option<&Arc<stream::mixed::StreamMix>> {
        match &self.0 {
            Src::StreamMix(m) => Some(m),
            _ => None,
        }
    }

    #[cfg(feature = "remote")]
    pub(crate) fn streamed(&self) -> Option<&StreamPlan> {
        match &self.0 {
            Src::Streamed(p) => Some(p),
            Src::Local(_) | Src::StreamMix(_) => None,
        }
    }

    /// The batches a loader of `opts` yields: checks the start, and continues the resumed state
    /// when no start is given.
    pub(crate) fn run(&self, opts: &LoaderOptions) -> Result<Run> {
        let feed = self.local()?.clone();
        let resumed = feed.resumed();
        let start = match (opts.start, resumed) {
            (Some(k), _) => k,
            (None, Some(s)) => s.next_batch,
            (None, None) => 0,
        };
        if start > MAX_BATCH_NUMBER {
            return Err(crate::Error::argument(
                "start",
                format!("batch {start} is beyond the largest batch number, {MAX_BATCH_NUMBER}"),
            ));
        }
        // A resumed state taken inside an iteration: the rest of that iteration.
        let resumed_end = resumed
            .filter(|_| opts.start.is_none())
            .and_then(|s| s.iteration_end)
            .filter(|&e| e > start);
        let end = match resumed_end {
            Some(e) => Some(e),
            None => loader_end(
                feed.first().sampler.as_ref(),
                start,
                opts.max_batches,
                feed.rank_world().1,
            ),
        };
        Ok(Run { feed, start, end })
    }

    /// The state of a loader of this source whose next batch is `next` (an error for a
    /// streamed source: a streaming loader cannot resume from a state yet).
    pub fn state(&self, next: u64) -> Result<LoaderState> {
        Ok(self.local()?.state(next, true))
    }

    /// This source's rank and world size.
    pub fn rank(&self) -> (u64, u64) {
        match &self.0 {
            Src::Local(f) => f.rank_world(),
            #[cfg(feature = "remote")]
            Src::Streamed(p) => p.rank_world,
            #[cfg(feature = "remote")]
            Src::StreamMix(m) => m.parts[0].rank_world,
        }
    }

    /// The versions batch `k` is planned from, one per dataset.
    pub fn versions(&self, k: u64) -> Vec<u64> {
        match &self.0 {
            Src::Local(f) => f.versions(k),
            #[cfg(feature = "remote")]
            Src::Streamed(p) => vec![p.stream.catalog().version()],
            #[cfg(feature = "remote")]
            Src::StreamMix(m) => m
                .parts
                .iter()
                .map(|p| p.stream.catalog().version())
                .collect(),
        }
    }

    /// The prioritized sampler of dataset `part` for batch `k` (None when not prioritized).
    pub fn prioritized(
        &self,
        k: u64,
        part: usize,
    ) -> Option<Arc<crate::sample::PrioritizedSampler>> {
        match &self.0 {
            Src::Local(f) => f.prioritized(k).get(part).cloned().flatten(),
            #[cfg(feature = "remote")]
            Src::Streamed(_) | Src::StreamMix(_) => None,
        }
    }

    /// Name, element type and per-step shape of each gathered column, in batch order (what a
    /// loader of this source puts in every [`crate::Batch`]), known before any batch.
    pub fn columns(&self) -> Result<Vec<(String, arrow::datatypes::DataType, Vec<usize>)>> {
        match &self.0 {
            Src::Local(f) => Ok(f
                .first()
                .gatherer
                .columns()
                .map(|(n, dt, shape)| (n.to_string(), dt.clone(), shape.to_vec()))
                .collect()),
            #[cfg(feature = "remote")]
            Src::Streamed(p) => {
                let cols: Vec<&str> = p.columns.iter().map(String::as_str).collect();
                stream::describe_columns(p.stream.catalog(), &cols, p.frame_stack)
            }
            #[cfg(feature = "remote")]
            Src::StreamMix(m) => Ok(m.columns.clone()),
        }
    }

    /// Per column of [`BatchSource::columns`], whether a compact batch holds it as one row per
    /// slice ([`crate::Gatherer::tail_columns`]; for a stream, what every window's gatherer
    /// gives).
    pub fn tail_columns(&self) -> Vec<bool> {
        match &self.0 {
            Src::Local(f) => f.first().gatherer.tail_columns().to_vec(),
            #[cfg(feature = "remote")]
            Src::Streamed(p) => stream::tail_columns(p.stream.catalog(), &p.columns),
            #[cfg(feature = "remote")]
            Src::StreamMix(m) => m.tail_columns(),
        }
    }

    /// Per column of [`BatchSource::columns`], the rows before each slice's step 0
    /// ([`crate::Gatherer::leads`]: `K - 1` for a frame window, else 0).
    pub fn leads(&self) -> Vec<usize> {
        match &self.0 {
            Src::Local(f) => f.first().gatherer.leads(),
            #[cfg(feature = "remote")]
            Src::Streamed(p) => stream::leads(p.stream.catalog(), &p.columns, p.frame_stack),
            #[cfg(feature = "remote")]
            Src::StreamMix(m) => m.leads.clone(),
        }
    }

    /// Whether this source streams a dataset from object storage (read it with
    /// [`StreamLoader::new`]).
    pub fn is_streamed(&self) -> bool {
        match &self.0 {
            Src::Local(_) => false,
            #[cfg(feature = "remote")]
            Src::Streamed(_) | Src::StreamMix(_) => true,
        }
    }

    /// For a streamed source: the version its loaders read now and the batch number where that
    /// version began (0, and the opened version, until a following loader moves on). With the
    /// next batch's number, what a following stream's state needs.
    #[cfg(feature = "remote")]
    pub fn stream_cursor(&self) -> Option<(u64, u64)> {
        let p = self.streamed()?;
        let c = p.cursor.lock().unwrap_or_else(|e| e.into_inner());
        Some((c.stream.catalog().version(), c.base))
    }

    /// Puts a following streamed source back at `version`, begun at batch `base` (from
    /// [`BatchSource::stream_cursor`], as a restart does): opens that version's catalog. Its
    /// next loaders continue there, and move on at the next round boundary.
    #[cfg(feature = "remote")]
    pub fn set_stream_cursor(&self, version: u64, base: u64) -> Result<()> {
        let p = self.streamed().ok_or_else(|| {
            crate::Error::argument("source", "this source's datasets are local, not streamed")
        })?;
        let now = p.cursor.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if now.stream.catalog().version() == version {
            p.cursor.lock().unwrap_or_else(|e| e.into_inner()).base = base;
            return Ok(());
        }
        let mut o = now.stream.options().clone();
        o.version = Some(version);
        let stream = crate::remote::Stream::open(now.stream.url(), o)?;
        *p.cursor.lock().unwrap_or_else(|e| e.into_inner()) = stream::Cursor { stream, base };
        Ok(())
    }

    /// The sampler and gatherer of batch `k`'s generation (`None` for a streamed source, whose
    /// samplers and gatherers are made per window of cached files).
    pub fn at(&self, k: u64) -> Option<(Arc<dyn Sampler>, Arc<Gatherer>)> {
        let g = self.local().ok()?.peek(k);
        Some((g.sampler.clone(), g.gatherer.clone()))
    }

    /// The part index of each slice position of every batch (all zeros for one dataset).
    pub fn slice_sources(&self) -> Vec<u16> {
        match &self.0 {
            Src::Local(f) => {
                let g = f.first();
                g.gatherer.slice_sources(g.sampler.num_slices())
            }
            #[cfg(feature = "remote")]
            Src::Streamed(p) => vec![0; p.sampler.num_slices],
            #[cfg(feature = "remote")]
            Src::StreamMix(m) => m.sources.clone(),
        }
    }

    /// What following new versions has done so far.
    pub fn follow_stats(&self) -> FollowStats {
        self.local().map(|f| f.stats()).unwrap_or_default()
    }

    /// Whether the source follows a dataset's new versions.
    pub fn follows(&self) -> bool {
        self.local().is_ok_and(|f| f.follows())
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
    /// The end of this loader's batches (None: endless).
    end: Option<u64>,
}

/// Hands consumed batches back to a [`Loader`]'s pool from anywhere (for instance when the last
/// Python tensor viewing a batch is freed). Cheap to clone; batches recycled after the loader is
/// gone are simply dropped.
#[derive(Debug, Clone)]
pub struct Recycler {
    pool: Arc<Mutex<Vec<Batch>>>,
    /// Batches kept at most: as many as the loader can have in use at once, so that a steady
    /// state makes none.
    keep: usize,
    /// Batches made because the pool was empty.
    made: Arc<AtomicU64>,
}

impl Default for Recycler {
    fn default() -> Self {
        Self::keeping(16)
    }
}

impl Recycler {
    /// A pool that keeps at most `keep` batches (at least 16).
    pub(crate) fn keeping(keep: usize) -> Self {
        Self {
            pool: Arc::default(),
            keep: keep.max(16),
            made: Arc::default(),
        }
    }

    /// Keeps `batch` for a worker to gather into, unless the pool already holds as many as the
    /// loader can have in use at once (at least 16).
    pub fn recycle(&self, batch: Batch) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < self.keep {
            pool.push(batch);
        }
    }

    pub(crate) fn take(&self) -> Batch {
        let batch = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        batch.unwrap_or_else(|| {
            self.made.fetch_add(1, Ordering::Relaxed);
            Batch::default()
        })
    }

    /// The batches made so far because none was recycled: they stop growing once the loader
    /// runs in a steady state with every batch recycled.
    pub fn batches_made(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
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
    /// Starts the workers over `source`'s batches (see [`LoaderOptions`] for which).
    ///
    /// Errors with [`crate::Error::InvalidArgument`] when the sampler's batches are larger than
    /// [`crate::sample::max_batch_bytes`] (about `num_slices` or `slice_len`), when the batches
    /// in flight (one per worker, `prefetch` queued, one being consumed) together are (about
    /// `workers` or `prefetch`), when there are more than [`MAX_WORKERS`] workers, or when the
    /// start is past [`MAX_BATCH_NUMBER`], before any thread starts.
    pub fn new(source: &BatchSource, opts: LoaderOptions) -> Result<Self> {
        let Run { feed, start, end } = source.run(&opts)?;
        let first = feed.first();
        let (sampler, gatherer) = (first.sampler.clone(), first.gatherer.clone());
        let batch_bytes =
            gatherer.batch_bytes(sampler.num_slices(), sampler.slice_len() as usize)?;
        check_in_flight(batch_bytes, &opts)?;
        feed.consumed(start);
        let burst = feed_burst(&feed, start, batch_bytes, (opts.workers, opts.prefetch));
        let pool = Recycler::keeping(items_in_use(opts.workers, opts.prefetch, burst));
        let depth = (opts.workers, opts.prefetch, burst);
        let pipeline = Pipeline::start(depth, start, end, "loader", || {
            let pool = pool.clone();
            let mut planner = WorkerPlans::new(feed.clone());
            move |k: u64, lane: &mut Lane| {
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
        })?;
        Ok(Self {
            pipeline,
            pool,
            feed,
            end,
        })
    }

    /// Where this loader is: enough to continue exactly here after a restart
    /// ([`LoaderSpec::with_resume`]). Small and cheap (no per-batch data), except that a
    /// prioritized sampler's priorities are copied in (16 bytes per run of equal priorities at
    /// most 8 per window).
    pub fn state(&self) -> LoaderState {
        let next = self.pipeline.position();
        let mut s = self.feed.state(next, true);
        s.iteration_end = self.end.filter(|&e| e > next);
        s
    }

    /// The batches each worker gathered so far, in worker order. Each worker gathers the next
    /// batch no worker has taken, so a worker on a slower or busier core gathers fewer: the
    /// spread says how evenly the cores ran.
    pub fn batches_per_worker(&self) -> Vec<u64> {
        self.pipeline.made_per_worker()
    }

    /// The versions the next batch is planned from, one per dataset.
    pub fn versions(&self) -> Vec<u64> {
        self.feed.versions(self.pipeline.position())
    }

    /// The prioritized sampler of dataset `part` for the next batch, to update priorities
    /// with (`None` when that part's sampler is not prioritized).
    pub fn prioritized(&self, part: usize) -> Option<Arc<crate::sample::PrioritizedSampler>> {
        self.feed
            .prioritized(self.pipeline.position())
            .get(part)
            .cloned()
            .flatten()
    }

    /// The source of this loader's batches.
    pub fn source(&self) -> BatchSource {
        BatchSource(Src::Local(self.feed.clone()))
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
