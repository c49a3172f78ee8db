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
struct Gate {
    /// Per slot: the only batch number allowed to fill it next.
    free_for: Mutex<(Vec<u64>, bool)>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<u64>, bool)> {
        self.free_for.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until batch `k` may fill its slot; `false` if the loader stopped meanwhile.
    fn wait_for(&self, k: u64) -> bool {
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

    fn stop(&self) {
        self.lock().1 = true;
        self.changed.notify_all();
    }
}

/// Yields [`StagedBatch`]es in order, each gathered into one of the caller's slots, which the
/// caller hands back with [`StagedLoader::release`] once it no longer reads the slot.
///
/// Same sampling, sharding and determinism as [`super::Loader`] (batch `k` of rank `r` is the
/// sampler's batch [`super::global_batch`], whatever the number of workers).
pub struct StagedLoader {
    pipeline: Pipeline<Result<StagedBatch>>,
    gate: Arc<Gate>,
    slots: usize,
    feed: Arc<Feed>,
    /// The end of this loader's batches (None: endless).
    end: Option<u64>,
}

impl std::fmt::Debug for StagedLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedLoader")
            .field("next", &self.pipeline.next)
            .field("slots", &self.slots)
            .finish()
    }
}

impl StagedLoader {
    /// Starts the workers over `source`'s batches (see [`LoaderOptions`] for which), gathering
    /// into `slots` (at least 2).
    ///
    /// Errors with [`Error::InvalidArgument`] as [`super::Loader::new`] does, and about `slots`
    /// when there are fewer than two or they do not fit in memory together.
    pub fn new(
        source: &super::BatchSource,
        opts: LoaderOptions,
        slots: Vec<Box<dyn StagingSlot>>,
    ) -> Result<Self> {
        let super::Run { feed, start, end } = source.run(&opts)?;
        let first = feed.first();
        let (sampler, gatherer) = (first.sampler.clone(), first.gatherer.clone());
        let n = slots.len();
        if n < 2 {
            return Err(Error::argument(
                "slots",
                format!("{n} staging slot(s): a staged loader needs at least 2"),
            ));
        }
        let batch_bytes =
            gatherer.batch_bytes(sampler.num_slices(), sampler.slice_len() as usize)?;
        // The workers hold no batch of their own (the worker count is still bounded); the
        // caller's slots are the batches in flight.
        check_in_flight(0, &opts)?;
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
        let gate = Arc::new(Gate {
            free_for: Mutex::new(((0..n as u64).map(first_for).collect(), false)),
            changed: Condvar::new(),
        });
        let tails = slots[0].tails();
        let slots: Arc<Vec<Mutex<Box<dyn StagingSlot>>>> =
            Arc::new(slots.into_iter().map(Mutex::new).collect());
        let slice_len = sampler.slice_len() as usize;
        let pipeline = Pipeline::start(
            opts.workers,
            opts.prefetch,
            start,
            end,
            "staged-loader",
            |lane| {
                let (gate, slots, tails) = (gate.clone(), slots.clone(), tails.clone());
                let mut planner = WorkerPlans::new(feed.clone());
                move |k: u64| {
                    planner.plan(k, lane);
                    if !gate.wait_for(k) {
                        return Err(Error::invalid_argument("the staged loader was stopped"));
                    }
                    let slot = (k % slots.len() as u64) as usize;
                    let mut memory = slots[slot].lock().unwrap_or_else(|e| e.into_inner());
                    let plan = planner.current();
                    let gatherer = planner.gatherer();
                    match &tails {
                        Some(t) => {
                            gatherer.gather_into_with_tails(plan, slice_len, memory.dest(), t)?
                        }
                        None => gatherer.gather_into(plan, slice_len, memory.dest())?,
                    }
                    Ok(StagedBatch {
                        number: k,
                        slot,
                        num_slices: plan.len(),
                    })
                }
            },
        )?;
        feed.consumed(start);
        Ok(Self {
            pipeline,
            gate,
            slots: n,
            feed,
            end,
        })
    }

    /// Where this loader is (see [`super::Loader::state`]).
    pub fn state(&self) -> LoaderState {
        let next = self.pipeline.position();
        let mut s = self.feed.state(next, true);
        s.iteration_end = self.end.filter(|&e| e > next);
        s
    }

    /// The source of this loader's batches (versions, priorities, following: see
    /// [`super::BatchSource`]).
    pub fn source(&self) -> super::BatchSource {
        super::BatchSource(super::Src::Local(self.feed.clone()))
    }

    /// The next batch, blocking until it is gathered; `None` at the end. Errors when the slots do
    /// not fit the batches (see [`crate::gather::Gatherer::gather_into`]).
    ///
    /// The caller must have released every batch up to `number - slots` before asking for batch
    /// `number`, or this waits forever (a worker waits for the slot).
    pub fn next_batch(&mut self) -> Option<Result<StagedBatch>> {
        let b = self.pipeline.next_item();
        self.feed.consumed(self.pipeline.position());
        b
    }

    /// The number of the batch [`StagedLoader::next_batch`] returns next.
    pub fn position(&self) -> u64 {
        self.pipeline.position()
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Hands batch `number`'s slot back: batch `number + slots` may be gathered into it.
    /// Releasing a batch twice, or one not yet returned, is an [`Error::InvalidArgument`].
    pub fn release(&self, number: u64) -> Result<()> {
        let mut g = self.gate.lock();
        let s = (number % self.slots as u64) as usize;
        if number >= self.pipeline.position() || g.0[s] != number {
            return Err(Error::argument(
                "number",
                format!(
                    "batch {number} is not held by the consumer (released already, or not \
                     returned yet)"
                ),
            ));
        }
        g.0[s] = number + self.slots as u64;
        drop(g);
        self.gate.changed.notify_all();
        Ok(())
    }
}

impl Drop for StagedLoader {
    fn drop(&mut self) {
        // Wake workers waiting for a slot before the pipeline joins them.
        self.gate.stop();
    }
}
