//! Staging slots for the staged-loader tests: caller memory that a test reads between a staged
//! loader's `next_batch` and its `release` of the batch.

use std::sync::{Arc, Mutex};

use trajstore::{GatherInto, StagingSlot};

/// One slot's memory: the columns' bytes, the six flag planes, ids and start steps.
#[derive(Default)]
pub struct Memory {
    pub columns: Vec<Vec<u8>>,
    pub flags: [Vec<u8>; 6],
    pub ids: Vec<u64>,
    pub starts: Vec<i64>,
}

impl Memory {
    /// Room for `b` slices of `l` steps, column `i` taking `column_bytes[i]` bytes.
    pub fn new(column_bytes: &[usize], b: usize, l: usize) -> Self {
        Self {
            columns: column_bytes.iter().map(|&n| vec![0; n]).collect(),
            flags: std::array::from_fn(|_| vec![0; b * l]),
            ids: vec![0; b],
            starts: vec![0; b],
        }
    }
}

/// A slot over shared [`Memory`], holding the columns `tails` marks as one row per slice.
pub struct Slot(pub Arc<Mutex<Memory>>, pub Option<Vec<bool>>);

impl StagingSlot for Slot {
    fn dest(&mut self) -> GatherInto<'_> {
        let m: *mut Memory = &mut *self.0.lock().unwrap();
        // SAFETY: the `Memory` lives in the `Arc` this slot holds, at least as long as the borrow
        // of `self`. The lock above only hands out the pointer: exclusion comes from the staged
        // loader's protocol (a slot's slices are written only while the test, which reads it
        // between `next_batch` and `release`, holds none of it), which the tests check.
        let m = unsafe { &mut *m };
        GatherInto {
            columns: m.columns.iter_mut().map(|c| c.as_mut_slice()).collect(),
            flags: m.flags.each_mut().map(|f| f.as_mut_slice()),
            episode_id: &mut m.ids,
            start_step: &mut m.starts,
        }
    }

    fn tails(&self) -> Option<Vec<bool>> {
        self.1.clone()
    }
}

/// Slots for a loader, and the test's handles on their memory.
pub type Slots = (Vec<Box<dyn StagingSlot>>, Vec<Arc<Mutex<Memory>>>);

/// `n` slots of [`Memory::new`]`(column_bytes, b, l)` with `tails`.
pub fn slots(
    n: usize,
    column_bytes: &[usize],
    (b, l): (usize, usize),
    tails: Option<Vec<bool>>,
) -> Slots {
    let mems: Vec<_> = (0..n)
        .map(|_| Arc::new(Mutex::new(Memory::new(column_bytes, b, l))))
        .collect();
    let boxed = mems
        .iter()
        .map(|m| Box::new(Slot(m.clone(), tails.clone())) as Box<dyn StagingSlot>)
        .collect();
    (boxed, mems)
}
