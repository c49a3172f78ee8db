//! The loader: background workers that sample and gather batches ahead of the training loop into
//! a bounded queue, deterministic whatever the number of workers, sharded across ranks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::gather::{Batch, Gatherer};
use crate::sample::Sampler;

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
    rx: Option<Receiver<(u64, std::thread::Result<Batch>)>>,
    pending: BTreeMap<u64, std::thread::Result<Batch>>,
    next: u64,
    end: Option<u64>,
    stop: Arc<AtomicBool>,
    pool: Arc<Mutex<Vec<Batch>>>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("next", &self.next)
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl Loader {
    /// Starts the workers.
    pub fn new(
        sampler: Arc<dyn Sampler>,
        gatherer: Arc<Gatherer>,
        opts: LoaderOptions,
    ) -> Result<Self> {
        if opts.world_size == 0 || opts.rank >= opts.world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {} is not in 0..world_size {}",
                opts.rank, opts.world_size
            )));
        }
        let workers = opts.workers.max(1);
        let end = opts.max_batches.or_else(|| {
            sampler
                .batches_per_epoch()
                .map(|per| per.div_ceil(opts.world_size).max(1))
        });
        let (tx, rx) = sync_channel(opts.prefetch.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let pool = Arc::new(Mutex::new(Vec::new()));
        let handles = (0..workers)
            .map(|w| {
                let ctx = Worker {
                    sampler: sampler.clone(),
                    gatherer: gatherer.clone(),
                    tx: tx.clone(),
                    stop: stop.clone(),
                    pool: pool.clone(),
                    first: w as u64,
                    step: workers as u64,
                    end,
                    rank: opts.rank,
                    world: opts.world_size,
                    readahead: opts.readahead,
                };
                std::thread::Builder::new()
                    .name(format!("trajstore-loader-{w}"))
                    .spawn(move || ctx.run())
                    .map_err(|e| {
                        Error::InvalidArgument(format!("cannot start a loader thread: {e}"))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            rx: Some(rx),
            pending: BTreeMap::new(),
            next: 0,
            end,
            stop,
            pool,
            workers: handles,
        })
    }

    /// The next batch, blocking until it is ready; `None` at the end.
    ///
    /// # Panics
    /// If a worker panicked (a bug in a sampler or the gather, never bad data) while producing
    /// this batch, the panic is resumed here, in the consumer, rather than ending the stream early.
    pub fn next_batch(&mut self) -> Option<Batch> {
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

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Dropping the receiver wakes workers blocked on a full queue.
        self.rx.take();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

struct Worker {
    sampler: Arc<dyn Sampler>,
    gatherer: Arc<Gatherer>,
    tx: SyncSender<(u64, std::thread::Result<Batch>)>,
    stop: Arc<AtomicBool>,
    pool: Arc<Mutex<Vec<Batch>>>,
    first: u64,
    step: u64,
    end: Option<u64>,
    rank: u64,
    world: u64,
    readahead: bool,
}

impl Worker {
    fn run(self) {
        let current = std::cell::Cell::new(self.first);
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.produce(&current)));
        if let Err(panic) = result {
            // A bug in a sampler or the gather: hand the panic to the consumer at the batch it
            // happened in, instead of ending the stream silently.
            let _ = self.tx.send((current.get(), Err(panic)));
        }
    }

    fn produce(&self, current: &std::cell::Cell<u64>) {
        let mut plan = Vec::new();
        let mut ahead = Vec::new();
        let mut k = self.first;
        if self.readahead {
            self.sampler.plan(k * self.world + self.rank, &mut ahead);
        }
        while !self.stop.load(Ordering::Relaxed) && self.end.is_none_or(|e| k < e) {
            current.set(k);
            if self.readahead {
                std::mem::swap(&mut plan, &mut ahead);
                let next = k + self.step;
                if self.end.is_none_or(|e| next < e) {
                    self.sampler.plan(next * self.world + self.rank, &mut ahead);
                    self.gatherer.advise(&ahead);
                }
            } else {
                self.sampler.plan(k * self.world + self.rank, &mut plan);
            }
            let mut batch = self
                .pool
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()
                .unwrap_or_default();
            self.gatherer.gather(&plan, &mut batch);
            if self.tx.send((k, Ok(batch))).is_err() {
                return;
            }
            k += self.step;
        }
    }
}
