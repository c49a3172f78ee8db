//! [`StreamLoader`]: the host batches of a streamed source (its [`Runs`]), or of a mix of
//! streams (assembled by [`MixStream`]).

use std::sync::Arc;

use super::mixed::{BatchSlot, MixStream, StreamMix, shaped};
use super::runs::Runs;
use super::{BatchSource, LoaderOptions, Recycler, StreamStats, batch_sink};
use crate::error::Result;
use crate::gather::Batch;

/// Yields the batches of a [`crate::remote::Stream`] in order (see the module docs), as `Result`s: a download
/// that fails (a damaged or missing object, a store that cannot be reached) is an error naming
/// the object, at the batch that needed it. Dropping the loader stops its workers and
/// prefetcher and lets the downloads in flight finish; a process that dies leaves them partial,
/// resumed by the next loader of the same rank.
///
/// **Following** (`LoaderSpec::streamed(..).follow(..)`, one rank; for several ranks, which
/// must agree on every round's version, `follow_by_caller`): at the end of every round
/// (an epoch, for epoch sampling) the loader reads the store's newest manifest; when it is newer,
/// the next batches are drawn from it by its own schedule, numbered from the batch where it
/// began (its *base*; [`BatchSource::stream_cursor`]) and sampled with a seed derived from the
/// base, so that they are a pure function of (seed, version, base, batch number). A look is one
/// listing of the store's manifests; a newer version's catalog is fetched only then. The files
/// the new version shares with the old one stay in the cache. The round boundary costs a
/// pipeline restart (the prefetcher does not fetch past a round before the version of the next
/// is known). A look that fails (the store unreachable) keeps the version and is retried at the
/// next boundary ([`StreamLoader::follow_failures`]).
pub struct StreamLoader {
    inner: Inner,
    pool: Recycler,
}

enum Inner {
    One(Box<Runs<Batch>>),
    /// A mix of streams, assembled in host batches.
    Mix {
        runs: Box<MixStream<BatchSlot>>,
        mix: Arc<StreamMix>,
    },
}

impl std::fmt::Debug for StreamLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamLoader")
            .field("position", &self.position())
            .finish_non_exhaustive()
    }
}

impl StreamLoader {
    /// Starts a loader of a streamed `source` ([`super::super::LoaderSpec::streamed`]) for its
    /// rank, from the rank's batch `opts.start` (default 0). Uniform sampling is endless (or
    /// `max_batches`); epoch sampling stops at the end of the epoch it starts in. A mix of
    /// streams ([`super::super::LoaderSpec::stream_part`]) runs each stream with `opts`'
    /// workers and prefetch, and assembles every batch in place (in a ring of `workers +
    /// prefetch` batches). Errors with [`crate::Error::InvalidArgument`] for a source of local datasets
    /// (use `Loader::new`).
    pub fn new(source: &BatchSource, opts: LoaderOptions) -> Result<Self> {
        // Bursts of 1.
        let pool = Recycler::keeping(super::super::items_in_use(opts.workers, opts.prefetch, 1));
        if let Some(mix) = source.stream_mix() {
            let (bytes, _) = super::batch_bytes(source)?;
            let n = (opts.workers.max(1) + opts.prefetch.max(1)).max(2);
            let slots = (0..n)
                .map(|_| Box::new(BatchSlot(shaped(mix, Batch::default()))))
                .collect();
            let runs = MixStream::new(mix, opts, slots, bytes)?;
            return Ok(Self {
                inner: Inner::Mix {
                    runs: Box::new(runs),
                    mix: mix.clone(),
                },
                pool,
            });
        }
        let runs = Runs::new(source, opts, batch_sink(pool.clone()))?;
        Ok(Self {
            inner: Inner::One(Box::new(runs)),
            pool,
        })
    }

    /// The next batch, blocking until it is ready; `None` at the end.
    pub fn next_batch(&mut self) -> Option<Result<Batch>> {
        match &mut self.inner {
            Inner::One(r) => r.next_batch(),
            Inner::Mix { runs, mix } => Some(runs.next_batch()?.and_then(|got| {
                // Take the assembled batch out of its slot (a recycled one takes its place),
                // and hand the slot back.
                let fresh = shaped(mix, self.pool.take());
                let ring = &runs.mix.ring;
                let batch = {
                    let mut slot = ring.slots[got.slot]
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    std::mem::replace(&mut slot.0, fresh)
                };
                ring.release(got.number, runs.position())?;
                Ok(batch)
            })),
        }
    }

    /// The number of the batch [`StreamLoader::next_batch`] returns next.
    pub fn position(&self) -> u64 {
        match &self.inner {
            Inner::One(r) => r.position(),
            Inner::Mix { runs, .. } => runs.position(),
        }
    }

    /// Hands a consumed batch back so a worker reuses its buffers.
    pub fn recycle(&self, batch: Batch) {
        self.pool.recycle(batch);
    }

    /// A handle that hands batches back from anywhere (e.g. when the last view of a batch
    /// exported to Python is freed).
    pub fn recycler(&self) -> Recycler {
        self.pool.clone()
    }

    /// What the loader downloaded and held so far (all its runs, when it followed new
    /// versions; `cache_bytes` and `cache_limit` are the current run's; for a mix, every
    /// stream's together).
    pub fn stats(&self) -> StreamStats {
        match &self.inner {
            Inner::One(r) => r.stats(),
            Inner::Mix { runs, .. } => runs.stats(),
        }
    }

    /// Newer versions this loader moved to.
    pub fn follow_refreshes(&self) -> u64 {
        match &self.inner {
            Inner::One(r) => r.refreshes,
            Inner::Mix { .. } => 0,
        }
    }

    /// Looks for a newer version that failed (and were retried at the next round boundary).
    pub fn follow_failures(&self) -> u64 {
        match &self.inner {
            Inner::One(r) => r.failures,
            Inner::Mix { .. } => 0,
        }
    }

    /// The episode ids of the segments that the loader's batch `k` (of the current version) is
    /// drawn from: its window (for a mix, every stream's, in part order).
    pub fn window_episodes(&self, k: u64) -> Vec<std::ops::Range<u64>> {
        match &self.inner {
            Inner::One(r) => r.window_episodes(k),
            Inner::Mix { runs, .. } => runs.window_episodes(k),
        }
    }
}

impl Iterator for StreamLoader {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Result<Batch>> {
        self.next_batch()
    }
}
