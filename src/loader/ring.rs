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

/// Which batch may fill each slot next. A release wakes only the workers waiting for that
/// slot, and none when none waits: the consumer (the training thread, in Python) makes no system
/// call for a release while the workers are busy, and never wakes every worker for one of them
/// to go on.
#[derive(Debug)]
pub(crate) struct Gate {
    state: Mutex<GateState>,
    /// Per slot: where the workers waiting for it sleep.
    changed: Vec<Condvar>,
}

#[derive(Debug)]
struct GateState {
    /// Per slot: the only batch number allowed to fill it next.
    free_for: Vec<u64>,
    /// Per slot: how many workers wait for it.
    waiting: Vec<u32>,
    stopped: bool,
}

impl Gate {
    fn new(free_for: Vec<u64>) -> Self {
        Self {
            changed: free_for.iter().map(|_| Condvar::new()).collect(),
            state: Mutex::new(GateState {
                waiting: vec![0; free_for.len()],
                free_for,
                stopped: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until batch `k` may fill its slot; `false` if the loader stopped meanwhile.
    pub(crate) fn wait_for(&self, k: u64) -> bool {
        let mut g = self.lock();
        let s = (k % g.free_for.len() as u64) as usize;
        loop {
            if g.stopped {
                return false;
            }
            if g.free_for[s] == k {
                return true;
            }
            g.waiting[s] += 1;
            g = self.changed[s].wait(g).unwrap_or_else(|e| e.into_inner());
            g.waiting[s] -= 1;
        }
    }

    pub(crate) fn stop(&self) {
        self.lock().stopped = true;
        self.changed.iter().for_each(Condvar::notify_all);
    }

    /// Hands batch `number`'s slot to batch `number + slots` (the consumer is at `position`).
    fn release(&self, number: u64, position: u64) -> Result<()> {
        let mut g = self.lock();
        let n = g.free_for.len() as u64;
        let s = (number % n) as usize;
        if number >= position || g.free_for[s] != number {
            return Err(Error::argument(
                "number",
                format!(
                    "batch {number} is not held by the consumer (released already, or not \
                     returned yet)"
                ),
            ));
        }
        g.free_for[s] = number + n;
        // Several may wait for one slot (for batches `slots` apart): each checks its number.
        let waiting = g.waiting[s] > 0;
        drop(g);
        if waiting {
            self.changed[s].notify_all();
        }
        Ok(())
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
            gate: Gate::new((0..n as u64).map(first_for).collect()),
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
        self.gate.release(number, position)
    }
}

#[cfg(test)]
mod tests {
    use super::Gate;
    use std::sync::Arc;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn workers_waiting_at_the_gate_are_woken_by_each_release_in_order() {
        // 3 slots, 5 workers taking batches w, w + 5, ...: most of them wait at the gate, some
        // for the same slot (batches 3 apart), and each release must wake the right one.
        let (slots, workers, batches) = (3u64, 5u64, 300u64);
        let gate = Arc::new(Gate::new((0..slots).collect()));
        let (filled, done) = channel();
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (gate, filled) = (gate.clone(), filled.clone());
                std::thread::spawn(move || {
                    for k in (w..batches).step_by(workers as usize) {
                        if !gate.wait_for(k) {
                            return;
                        }
                        filled.send(k).unwrap();
                    }
                })
            })
            .collect();
        let mut got = std::collections::BTreeSet::new();
        for position in 0..batches {
            // Batch `position` is filled (its slot was free) before the consumer takes it.
            while !got.contains(&position) {
                let k = done
                    .recv_timeout(Duration::from_secs(60))
                    .expect("a worker was never woken");
                assert!(
                    k < position + slots,
                    "batch {k} filled before its slot was free"
                );
                got.insert(k);
            }
            if position % 37 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            gate.release(position, position + 1).unwrap();
        }
        handles.into_iter().for_each(|h| h.join().unwrap());
        // A batch released twice, or not yet taken, is refused.
        assert!(gate.release(0, batches).is_err());
        assert!(gate.release(batches + 10, batches).is_err());
    }

    #[test]
    fn stopping_wakes_every_waiting_worker() {
        let gate = Arc::new(Gate::new(vec![0, 1]));
        let (tx, rx) = channel();
        for k in [2u64, 3, 4, 5] {
            let (gate, tx) = (gate.clone(), tx.clone());
            std::thread::spawn(move || tx.send(gate.wait_for(k)).unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
        gate.stop();
        for _ in 0..4 {
            let r = rx.recv_timeout(Duration::from_secs(60));
            assert_eq!(r, Ok(false), "woken, and told the loader stopped");
        }
    }
}
