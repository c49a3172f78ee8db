//! The staged loader: workers gather batches straight into a fixed ring of caller-owned buffers
//! (pinned staging tensors that a caller copies to a device), so that no batch is copied on the
//! host between the memory map and the transfer.
//!
//! Batch `k` is gathered into slot `k % slots`, and only once the caller has released batch
//! `k - slots` (its copy out of that slot finished). Assigning slots by batch number, not first
//! come first served, keeps the ring deadlock-free whatever order the workers finish in: the
//! consumer waits for batch `k` only after releasing every batch up to `k - slots`, so the slot
//! batch `k` needs is free.

use std::sync::Arc;

use super::ring::Ring;
use super::{Feed, Lane, LoaderOptions, LoaderState, Pipeline, WorkerPlans, check_in_flight};
use super::{StagedBatch, StagingSlot};
use crate::error::Result;

/// Yields [`StagedBatch`]es in order, each gathered into one of the caller's slots, which the
/// caller hands back with [`StagedLoader::release`] once it no longer reads the slot.
///
/// Same sampling, sharding and determinism as [`super::Loader`] (batch `k` of rank `r` is the
/// sampler's batch [`super::global_batch`], whatever the number of workers), or, over a
/// streamed source, as [`super::StreamLoader`] (the same batches, through the same cache).
pub struct StagedLoader {
    inner: Inner,
    ring: Arc<Ring>,
}

enum Inner {
    Local {
        pipeline: Pipeline<Result<StagedBatch>>,
        feed: Arc<Feed>,
        /// The end of this loader's batches (None: endless).
        end: Option<u64>,
    },
    #[cfg(feature = "remote")]
    Stream(Box<super::stream::Runs<StagedBatch>>),
    /// A mix of streams, assembled in the caller's slots.
    #[cfg(feature = "remote")]
    StreamMix(
        Box<super::stream::mixed::MixStream<dyn StagingSlot>>,
        super::BatchSource,
    ),
}

impl std::fmt::Debug for StagedLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedLoader")
            .field("next", &self.position())
            .field("slots", &self.slots())
            .finish()
    }
}

impl StagedLoader {
    /// Starts the workers over `source`'s batches (see [`LoaderOptions`] for which), gathering
    /// into `slots` (at least 2). A streamed source's batches are those of
    /// [`super::StreamLoader::new`] with the same options.
    ///
    /// Errors with [`crate::Error::InvalidArgument`] as [`super::Loader::new`] (or
    /// [`super::StreamLoader::new`]) does, and about `slots` when there are fewer than two or
    /// they do not fit in memory together.
    pub fn new(
        source: &super::BatchSource,
        opts: LoaderOptions,
        slots: Vec<Box<dyn StagingSlot>>,
    ) -> Result<Self> {
        #[cfg(feature = "remote")]
        if source.is_streamed() {
            return Self::streamed(source, opts, slots);
        }
        let super::Run { feed, start, end } = source.run(&opts)?;
        let first = feed.first();
        let (sampler, gatherer) = (first.sampler.clone(), first.gatherer.clone());
        let batch_bytes =
            gatherer.batch_bytes(sampler.num_slices(), sampler.slice_len() as usize)?;
        // The workers hold no batch of their own (the worker count is still bounded); the
        // caller's slots are the batches in flight.
        check_in_flight(0, &opts)?;
        let ring = Arc::new(Ring::new(
            slots,
            start,
            batch_bytes,
            sampler.slice_len() as usize,
        )?);
        // Bursts of 1: the caller's slots bound the batches in flight anyway.
        let pipeline = Pipeline::start(
            (opts.workers, opts.prefetch, 1),
            start,
            end,
            "staged-loader",
            || {
                let ring = ring.clone();
                let mut planner = WorkerPlans::new(feed.clone());
                move |k: u64, lane: &mut Lane| {
                    planner.plan(k, lane);
                    ring.fill(k, planner.gatherer(), planner.current())
                }
            },
        )?;
        feed.consumed(start);
        Ok(Self {
            inner: Inner::Local {
                pipeline,
                feed,
                end,
            },
            ring,
        })
    }

    #[cfg(feature = "remote")]
    fn streamed(
        source: &super::BatchSource,
        opts: LoaderOptions,
        slots: Vec<Box<dyn StagingSlot>>,
    ) -> Result<Self> {
        let (batch_bytes, l) = super::stream::batch_bytes(source)?;
        if let Some(mix) = source.stream_mix() {
            let runs = super::stream::mixed::MixStream::new(mix, opts, slots, batch_bytes)?;
            return Ok(Self {
                ring: runs.mix.ring.clone(),
                inner: Inner::StreamMix(Box::new(runs), source.clone()),
            });
        }
        let start = opts.start.unwrap_or(0);
        let ring = Arc::new(Ring::new(slots, start, batch_bytes, l)?);
        let sink = {
            let ring = ring.clone();
            Arc::new(move || {
                let ring = ring.clone();
                Box::new(
                    move |k: u64, g: &crate::gather::Gatherer, plan: &[crate::index::SliceRef]| {
                        ring.fill(k, g, plan)
                    },
                ) as super::stream::Produce<StagedBatch>
            })
        };
        let runs = super::stream::Runs::new(source, opts, sink)?;
        Ok(Self {
            inner: Inner::Stream(Box::new(runs)),
            ring,
        })
    }

    /// Where this loader is (see [`super::Loader::state`]); an error for a streamed source (a
    /// streaming loader starts at a batch number: [`LoaderOptions::with_start`]).
    pub fn state(&self) -> Result<LoaderState> {
        match &self.inner {
            Inner::Local {
                pipeline,
                feed,
                end,
            } => {
                let next = pipeline.position();
                let mut s = feed.state(next, true);
                s.iteration_end = end.filter(|&e| e > next);
                Ok(s)
            }
            #[cfg(feature = "remote")]
            Inner::Stream(r) => r.source().state(r.position()),
            #[cfg(feature = "remote")]
            Inner::StreamMix(_, source) => source.state(0),
        }
    }

    /// The source of this loader's batches (versions, priorities, following: see
    /// [`super::BatchSource`]).
    pub fn source(&self) -> super::BatchSource {
        match &self.inner {
            Inner::Local { feed, .. } => super::BatchSource(super::Src::Local(feed.clone())),
            #[cfg(feature = "remote")]
            Inner::Stream(r) => r.source().clone(),
            #[cfg(feature = "remote")]
            Inner::StreamMix(_, source) => source.clone(),
        }
    }

    /// The next batch, blocking until it is gathered; `None` at the end. Errors when the slots do
    /// not fit the batches (see [`crate::gather::Gatherer::gather_into`]), and for a stream
    /// when a download fails (naming the object).
    ///
    /// The caller must have released every batch up to `number - slots` before asking for batch
    /// `number`, or this waits forever (a worker waits for the slot).
    pub fn next_batch(&mut self) -> Option<Result<StagedBatch>> {
        match &mut self.inner {
            Inner::Local { pipeline, feed, .. } => {
                let b = pipeline.next_item();
                feed.consumed(pipeline.position());
                b
            }
            #[cfg(feature = "remote")]
            Inner::Stream(r) => r.next_batch(),
            #[cfg(feature = "remote")]
            Inner::StreamMix(r, _) => r.next_batch(),
        }
    }

    /// The number of the batch [`StagedLoader::next_batch`] returns next.
    pub fn position(&self) -> u64 {
        match &self.inner {
            Inner::Local { pipeline, .. } => pipeline.position(),
            #[cfg(feature = "remote")]
            Inner::Stream(r) => r.position(),
            #[cfg(feature = "remote")]
            Inner::StreamMix(r, _) => r.position(),
        }
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.ring.slots.len()
    }

    /// What a streaming loader downloaded and held so far (None for local datasets).
    #[cfg(feature = "remote")]
    pub fn stream_stats(&self) -> Option<super::StreamStats> {
        match &self.inner {
            Inner::Stream(r) => Some(r.stats()),
            Inner::StreamMix(r, _) => Some(r.stats()),
            Inner::Local { .. } => None,
        }
    }

    /// Hands batch `number`'s slot back: batch `number + slots` may be gathered into it.
    /// Releasing a batch twice, or one not yet returned, is an [`crate::Error::InvalidArgument`].
    pub fn release(&self, number: u64) -> Result<()> {
        self.ring.release(number, self.position())
    }
}

impl Drop for StagedLoader {
    fn drop(&mut self) {
        // Wake workers waiting for a slot before the pipeline joins them.
        self.ring.gate.stop();
    }
}
