//! The ring of caller-owned slots that staged loaders gather into, and the gate that hands slot
//! `k % slots` to batch `k` only once batch `k - slots` is released (see
//! [`super::StagedLoader`]). Local datasets' workers and streams' sinks (one stream, or the parts
//! of a mix) fill it alike.

use std::sync::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::gather::GatherInto;

/// Caller-owned memory that a [`super::StagedLoader`] gathers one batch into.
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

/// A batch a [`super::StagedLoader`] gathered: which slot holds it, and how many of its slices are real
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
