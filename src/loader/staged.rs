//! The staged loader: workers gather batches straight into a fixed ring of caller-owned buffers
//! (pinned staging tensors that a caller copies to a device), so that no batch is copied on the
//! host between the memory map and the transfer.
//!
//! Batch `k` is gathered into slot `k % slots`, and only once the caller has released batch
//! `k - slots` (its copy out of that slot finished). Assigning slots by batch number, not first
//! come first served, keeps the ring deadlock-free whatever order the workers finish in: the
//! consumer waits for batch `k` only after releasing every batch up to `k - slots`, so the slot
//! batch `k` needs is free.

use std::sync::{Arc, Condvar, Mutex};

use super::{Feed, LoaderOptions, LoaderState, Pipeline, WorkerPlans, check_in_flight};
use crate::error::{Error, Result};
use crate::gather::GatherInto;

/// Caller-owned memory that a [`StagedLoader`] gathers one batch into.
pub trait StagingSlot: Send {
    /// The destinations of one batch of `num_slices` slices of `slice_len` steps (see
    /// [`GatherInto`] for the layout; [`crate::gather::Gatherer::gather_into`] checks the sizes).
    fn dest(&mut self) -> GatherInto<'_>;

    /// Per gathered column, whether the slot holds it as one row per slice (a derived
    /// `next_observation`, see [`crate::Gatherer::gather_into_with_tails`]); None (the default)
    /// for none. Asked once, of the first slot: every slot has the same layout.
    fn tails(&self) -> Option<Vec<bool>> {
        None
    }
}

/// A batch a [`StagedLoader`] gathered: which slot holds it, and how many of its slices are real
/// (the last batch of an epoch may be short; the rest of the slot is stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedBatch {
    /// The batch's number (as [`super::Loader::position`] counts).
    pub number: u64,
    /// The slot it was gathered into: `number % slots`.
    pub slot: usize,
    /// Its slices (at most the sampler's `num_slices`).
    pub num_slices: usize,
}

#[derive(Debug)]
pub(crate) struct Gate {
    /// Per slot: the only batch number allowed to fill it next.
    free_for: Mutex<(Vec<u64>, bool)>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<u64>, bool)> {
        self.free_for.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until batch `k` may fill its slot; `false` if the loader stopped meanwhile.
    pub(crate) fn wait_for(&self, k: u64) -> bool {
        let mut g = self.lock();
        loop {
            if g.1 {
                return false;
            }
            let n = g.0.len() as u64;
            if g.0[(k % n) as usize] == k {
                return true;
            }
            g = self.changed.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(crate) fn stop(&self) {
        self.lock().1 = true;
        self.changed.notify_all();
    }
}

impl<S: StagingSlot + ?Sized> StagingSlot for Box<S> {
    fn dest(&mut self) -> GatherInto<'_> {
        (**self).dest()
    }

    fn tails(&self) -> Option<Vec<bool>> {
        (**self).tails()
    }
}

/// The caller's slots and the gate that hands them to batches in order, shared by a staged
/// loader's workers (of local datasets or of streams).
pub(crate) struct Ring<S: StagingSlot + ?Sized = dyn StagingSlot> {
    pub(crate) gate: Gate,
    pub(crate) slots: Vec<Mutex<Box<S>>>,
    /// Asked once, of the first slot.
    pub(crate) tails: Option<Vec<bool>>,
    pub(crate) slice_len: usize,
}

impl<S: StagingSlot + ?Sized> Ring<S> {
    /// A ring of `slots` (at least two, fitting in memory together with `batch_bytes` each)
    /// whose first batch is `start`.
    pub(crate) fn new(
        slots: Vec<Box<S>>,
        start: u64,
        batch_bytes: u64,
        slice_len: usize,
    ) -> Result<Self> {
        let n = slots.len();
        if n < 2 {
            return Err(Error::argument(
                "slots",
                format!("{n} staging slot(s): a staged loader needs at least 2"),
            ));
        }
        crate::sample::check_memory(
            "slots",
            &format!(
                "{n} staging slots of {} each",
                crate::format::human_bytes(batch_bytes)
            ),
            (n as u64).checked_mul(batch_bytes),
        )?;
        let first_for = |s: u64| {
            let n = n as u64;
            start + (s + n - start % n) % n
        };
        Ok(Self {
            gate: Gate {
                free_for: Mutex::new(((0..n as u64).map(first_for).collect(), false)),
                changed: Condvar::new(),
            },
            tails: slots[0].tails(),
            slots: slots.into_iter().map(Mutex::new).collect(),
            slice_len,
        })
    }

    /// Gathers batch `k` (`plan`, by `gatherer`) into its slot once batch `k - slots` is
    /// released.
    pub(crate) fn fill(
        &self,
        k: u64,
        gatherer: &crate::gather::Gatherer,
        plan: &[crate::index::SliceRef],
    ) -> Result<StagedBatch> {
        if !self.gate.wait_for(k) {
            return Err(Error::invalid_argument("the staged loader was stopped"));
        }
        let slot = (k % self.slots.len() as u64) as usize;
        let mut memory = self.slots[slot].lock().unwrap_or_else(|e| e.into_inner());
        match &self.tails {
            Some(t) => gatherer.gather_into_with_tails(plan, self.slice_len, memory.dest(), t)?,
            None => gatherer.gather_into(plan, self.slice_len, memory.dest())?,
        }
        Ok(StagedBatch {
            number: k,
            slot,
            num_slices: plan.len(),
        })
    }

    /// Hands batch `number`'s slot back (the consumer is at `position`).
    pub(crate) fn release(&self, number: u64, position: u64) -> Result<()> {
        let mut g = self.gate.lock();
        let n = self.slots.len() as u64;
        let s = (number % n) as usize;
        if number >= position || g.0[s] != number {
            return Err(Error::argument(
                "number",
                format!(
                    "batch {number} is not held by the consumer (released already, or not \
                     returned yet)"
                ),
            ));
        }
        g.0[s] = number + n;
        drop(g);
        self.gate.changed.notify_all();
        Ok(())
    }
}

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
    /// Errors with [`Error::InvalidArgument`] as [`super::Loader::new`] (or
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
        let pipeline = Pipeline::start(
            opts.workers,
            opts.prefetch,
            start,
            end,
            "staged-loader",
            |lane| {
                let ring = ring.clone();
                let mut planner = WorkerPlans::new(feed.clone());
                move |k: u64| {
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
    /// Releasing a batch twice, or one not yet returned, is an [`Error::InvalidArgument`].
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
