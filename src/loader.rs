//! The loader: background workers that sample and gather batches ahead of the training loop into
//! a bounded queue, deterministic whatever the number of workers, sharded across ranks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::gather::{Batch, Gatherer};
use crate::sample::{Sampler, SliceRef};

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
    /// `madvise(WILLNEED)` the pages of the batch each worker gathers next, so that data not in
    /// the page cache (datasets larger than RAM, cold starts) is read from disk while the current
    /// batch is copied. Default off: on data already in the page cache the system calls cost more
    /// than they save (see BENCHMARKS.md).
    pub readahead: bool,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            workers: 2,
            prefetch: 4,
            rank: 0,
            world_size: 1,
            max_batches: None,
            readahead: false,
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
    /// Turns read-ahead of upcoming slices on or off.
    pub fn with_readahead(mut self, on: bool) -> Self {
        self.readahead = on;
        self
    }
    /// Stops after `n` batches.
    pub fn with_max_batches(mut self, n: u64) -> Self {
        self.max_batches = Some(n);
        self
    }
}

/// Yields gathered [`Batch`]es in order: batch `k` of rank `r` is the sampler's batch
/// `k * world_size + r`, whatever the number of workers. Dropping the loader stops and joins its
/// workers.
pub struct Loader {
    pipeline: Pipeline<Batch>,
    pool: Arc<Mutex<Vec<Batch>>>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("next", &self.pipeline.next)
            .field("workers", &self.pipeline.workers.len())
            .finish()
    }
}

/// The number of batches a loader over `sampler` yields: `max_batches`, else one epoch's share of
/// this rank for epoch samplers, else endless.
pub(crate) fn loader_end(sampler: &dyn Sampler, opts: &LoaderOptions) -> Result<Option<u64>> {
    if opts.world_size == 0 || opts.rank >= opts.world_size {
        return Err(Error::InvalidArgument(format!(
            "rank {} is not in 0..world_size {}",
            opts.rank, opts.world_size
        )));
    }
    Ok(opts.max_batches.or_else(|| {
        sampler
            .batches_per_epoch()
            .map(|per| per.div_ceil(opts.world_size).max(1))
    }))
}

impl Loader {
    /// Starts the workers.
    pub fn new(
        sampler: Arc<dyn Sampler>,
        gatherer: Arc<Gatherer>,
        opts: LoaderOptions,
    ) -> Result<Self> {
        let end = loader_end(sampler.as_ref(), &opts)?;
        let pool: Arc<Mutex<Vec<Batch>>> = Arc::new(Mutex::new(Vec::new()));
        let pipeline = Pipeline::start(opts.workers, opts.prefetch, end, "loader", |lane| {
            let (gatherer, pool) = (gatherer.clone(), pool.clone());
            let mut planner = Planner::new(sampler.clone(), &opts);
            move |k: u64| {
                planner.plan(k, lane, &gatherer);
                let mut batch = pool
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pop()
                    .unwrap_or_default();
                gatherer.gather(planner.current(), &mut batch);
                batch
            }
        })?;
        Ok(Self { pipeline, pool })
    }

    /// The next batch, blocking until it is ready; `None` at the end.
    ///
    /// # Panics
    /// If a worker panicked (a bug in a sampler or the gather, never bad data) while producing
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
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < 16 {
            pool.push(batch);
        }
    }
}

impl Iterator for Loader {
    type Item = Batch;
    fn next(&mut self) -> Option<Batch> {
        self.next_batch()
    }
}

/// One worker's plans: batch `k` of this rank is the sampler's batch `k * world_size + rank`;
/// with read-ahead, the plan of the worker's next batch is made one batch early and its pages
/// `madvise`d while the current one is gathered.
pub(crate) struct Planner {
    sampler: Arc<dyn Sampler>,
    rank: u64,
    world: u64,
    readahead: bool,
    plan: Vec<SliceRef>,
    ahead: Vec<SliceRef>,
    primed: bool,
}

impl Planner {
    pub(crate) fn new(sampler: Arc<dyn Sampler>, opts: &LoaderOptions) -> Self {
        Self {
            sampler,
            rank: opts.rank,
            world: opts.world_size,
            readahead: opts.readahead,
            plan: Vec::new(),
            ahead: Vec::new(),
            primed: false,
        }
    }

    /// Makes the plan of this worker's batch `k` (the worker produces the batches of `lane`),
    /// then [`Planner::current`].
    pub(crate) fn plan(&mut self, k: u64, lane: Lane, gatherer: &Gatherer) {
        let global = |k: u64| k * self.world + self.rank;
        if self.readahead {
            if !self.primed {
                self.sampler.plan(global(k), &mut self.ahead);
                self.primed = true;
            }
            std::mem::swap(&mut self.plan, &mut self.ahead);
            if let Some(next) = lane.after(k) {
                self.sampler.plan(global(next), &mut self.ahead);
                gatherer.advise(&self.ahead);
            }
        } else {
            self.sampler.plan(global(k), &mut self.plan);
        }
    }

    /// The plan [`Planner::plan`] made last.
    pub(crate) fn current(&self) -> &[SliceRef] {
        &self.plan
    }
}

/// Which batch numbers one worker produces: `first, first + step, ...` below `end`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lane {
    /// The worker's number (its first batch).
    pub(crate) worker: usize,
    step: u64,
    end: Option<u64>,
}

impl Lane {
    /// The batch this worker produces after `k`, if any.
    pub(crate) fn after(&self, k: u64) -> Option<u64> {
        let next = k + self.step;
        self.end.is_none_or(|e| next < e).then_some(next)
    }
}

type Produced<T> = (u64, std::thread::Result<T>);

/// Background workers producing numbered items into a bounded queue, consumed in number order
/// whatever the number of workers: the machinery shared by [`Loader`] and the torch loader.
pub(crate) struct Pipeline<T> {
    rx: Option<Receiver<Produced<T>>>,
    pending: BTreeMap<u64, std::thread::Result<T>>,
    next: u64,
    end: Option<u64>,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<()>>,
}

impl<T: Send + 'static> Pipeline<T> {
    /// Starts `workers` threads; worker `w` produces items `w, w + workers, ...` (below `end`)
    /// with the closure `make(lane)` returns, at most `prefetch` items ahead of the consumer.
    pub(crate) fn start<F>(
        workers: usize,
        prefetch: usize,
        end: Option<u64>,
        name: &str,
        make: impl Fn(Lane) -> F,
    ) -> Result<Self>
    where
        F: FnMut(u64) -> T + Send + 'static,
    {
        let workers = workers.max(1);
        let (tx, rx) = sync_channel(prefetch.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..workers)
            .map(|w| {
                let lane = Lane {
                    worker: w,
                    step: workers as u64,
                    end,
                };
                let produce = make(lane);
                let (tx, stop) = (tx.clone(), stop.clone());
                std::thread::Builder::new()
                    .name(format!("trajstore-{name}-{w}"))
                    .spawn(move || run_lane(lane, produce, tx, stop))
                    .map_err(|e| {
                        Error::InvalidArgument(format!("cannot start a {name} thread: {e}"))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            rx: Some(rx),
            pending: BTreeMap::new(),
            next: 0,
            end,
            stop,
            workers: handles,
        })
    }

    /// The next item in number order, blocking until it is ready; `None` at the end. A worker's
    /// panic is resumed here, at the item it happened in.
    pub(crate) fn next_item(&mut self) -> Option<T> {
        if self.end.is_some_and(|e| self.next >= e) {
            return None;
        }
        loop {
            if let Some(b) = self.pending.remove(&self.next) {
                self.next += 1;
                return Some(b.unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
            }
            let (k, b) = self.rx.as_ref()?.recv().ok()?;
            self.pending.insert(k, b);
        }
    }

    /// Number of the next item [`Pipeline::next_item`] returns.
    pub(crate) fn position(&self) -> u64 {
        self.next
    }
}

impl<T> Drop for Pipeline<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Dropping the receiver (and the items waiting in it) wakes workers blocked on a full
        // queue.
        self.rx.take();
        self.pending.clear();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

fn run_lane<T, F: FnMut(u64) -> T>(
    lane: Lane,
    mut produce: F,
    tx: SyncSender<Produced<T>>,
    stop: Arc<AtomicBool>,
) {
    let mut k = lane.worker as u64;
    while !stop.load(Ordering::Relaxed) && lane.end.is_none_or(|e| k < e) {
        let item = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| produce(k)));
        let failed = item.is_err();
        // A panic (a bug in a sampler or the gather) goes to the consumer at the item it happened
        // in, instead of ending the stream silently; the worker stops there.
        if tx.send((k, item)).is_err() || failed {
            return;
        }
        k += lane.step;
    }
}
