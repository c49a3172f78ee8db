//! Frames left to a device to decode (`TorchLoaderOptions::device_decode`): a gatherer's twin
//! ([`Gatherer::with_stored_frames`]) writes, for each frame window, a table of the stored
//! frames its rows hold, and appends their stored bytes to a [`FrameArena`]; the torch loader
//! ships both and decodes them where the batch lands (`src/torch/frame_decode.rs`). The rows
//! are those the workers' decode would write: the same frames, repeats and zeros.

use super::frames::{FrameSource, located};
use super::{ColumnSource, Gatherer, StackPad};
use crate::error::Result;
use crate::store::Segment;

/// The stored frames of one batch, for a device to decode ([`FrameSource::table_window`]): a
/// byte buffer the gather's threads append to, each into a range of its own. A batch whose
/// frames do not fit (more [`FrameArena::used`] than the buffer holds) is gathered again into a
/// larger one.
pub(crate) struct FrameArena<'a> {
    buf: *mut u8,
    cap: usize,
    used: std::sync::atomic::AtomicUsize,
    _buf: std::marker::PhantomData<&'a mut [u8]>,
}

// SAFETY: every `put` writes only the range it reserved with an atomic add, which no other
// thread reserves; the buffer is borrowed exclusively for the arena's life.
unsafe impl Sync for FrameArena<'_> {}

impl<'a> FrameArena<'a> {
    #[cfg(feature = "torch")]
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Self {
            buf: buf.as_mut_ptr(),
            cap: buf.len(),
            used: std::sync::atomic::AtomicUsize::new(0),
            _buf: std::marker::PhantomData,
        }
    }

    /// Appends `bytes`; their offset, or None when they do not fit (they are counted in
    /// [`FrameArena::used`] all the same).
    fn put(&self, bytes: &[u8]) -> Option<i64> {
        let at = self
            .used
            .fetch_add(bytes.len(), std::sync::atomic::Ordering::Relaxed);
        let end = at.checked_add(bytes.len())?;
        if end > self.cap {
            return None;
        }
        // SAFETY: `at .. end` lies in the buffer and was reserved by this call alone.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.buf.add(at), bytes.len()) };
        Some(at as i64)
    }

    /// Bytes the gather appended, or wanted to (more than the capacity when they did not fit).
    #[cfg(feature = "torch")]
    pub(crate) fn used(&self) -> usize {
        self.used.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Bytes of one row of a stored window's table: three `i64`s (offset of the stored frame in
/// the arena, its length or -1 for a frame of zeros, the byte offset of its decoded frame in
/// the column's `[B, L + K - 1, ...frame]` tensor).
pub(crate) const TABLE_ROW: usize = 24;

impl Gatherer {
    /// A gatherer of the same columns that leaves its frame windows to a device to decode: for
    /// each such column it writes a table of stored frames ([`TABLE_ROW`] bytes per window row,
    /// see [`FrameArena`]) and appends their stored bytes to the arena passed to
    /// [`Gatherer::gather_stored`]. The column's shape stays the decoded one. An error without a
    /// frame window among the columns, or for a mix.
    #[cfg(feature = "torch")]
    pub(crate) fn with_stored_frames(&self) -> Result<Self> {
        if self.mix.is_some() {
            return Err(crate::error::Error::argument(
                "device_decode",
                "frames are decoded on the device from one dataset; a mix decodes them in the \
                 workers",
            ));
        }
        let names: Vec<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
        // Stored frames are shipped, not decoded here: no cache.
        let stack = self.stack.map(|s| s.with_cache(0));
        let mut g = Self::with_frame_stack(&self.snap, &names, stack)?;
        g.set_read_ahead(self.read_ahead());
        let mut any = false;
        for c in &mut g.columns {
            if let ColumnSource::Frames(fs) = &mut c.source {
                fs.set_stored()?;
                c.width = TABLE_ROW * (c.lead + 1);
                any = true;
            }
        }
        if !any {
            return Err(crate::error::Error::argument(
                "device_decode",
                "frames are decoded on the device, and none of the gathered columns is a frame \
                 column",
            ));
        }
        Ok(g)
    }

    /// Whether frame columns are left to a device to decode ([`Gatherer::with_stored_frames`]).
    pub(crate) fn stores_frames(&self) -> bool {
        self.columns
            .iter()
            .any(|c| matches!(&c.source, ColumnSource::Frames(f) if f.stored))
    }

    /// Per gathered column, the stored frame column it leaves to a device to decode
    /// ([`Gatherer::with_stored_frames`]), or None.
    #[cfg(feature = "torch")]
    pub(crate) fn stored_frame_columns(
        &self,
    ) -> Vec<Option<std::sync::Arc<crate::frames::FrameColumn>>> {
        self.columns
            .iter()
            .map(|c| match &c.source {
                ColumnSource::Frames(f) if f.stored => Some(f.column().clone()),
                _ => None,
            })
            .collect()
    }
}

impl FrameSource {
    /// The stored frames of one slice's window for a device to decode: `table` gets a row per
    /// window row ([`TABLE_ROW`] bytes: see there), destination offsets from `base` (the
    /// slice's first byte in the decoded column), and `arena` the stored bytes. The rows are
    /// those [`FrameSource::fill_window`] would decode: the same frames, repeats and zeros.
    /// Errors as [`FrameSource::fill`] (a frame's stored bytes are checked by the device).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn table_window(
        &self,
        seg: &Segment,
        row0: u64,
        table_row: usize,
        (a, b, len): (usize, usize, usize),
        start: i64,
        (table, base): (&mut [i64], i64),
        arena: &FrameArena<'_>,
    ) -> Result<()> {
        let (f, k) = (self.frame_len() as i64, self.stack);
        for (p, row) in table.chunks_exact_mut(3).enumerate() {
            row.copy_from_slice(&[0, -1, base + p as i64 * f]);
        }
        if b <= a {
            return Ok(());
        }
        let put = |row: &mut [i64], bytes: &[u8]| {
            // Where the arena is full, the batch is gathered again into a larger one.
            if let Some(at) = arena.put(bytes) {
                row[0] = at;
                row[1] = bytes.len() as i64;
            }
        };
        let shift = self.next as i64;
        let u0 = start + shift - (k as i64 - 1);
        let (lo, hi) = (a as i64 + shift - (k as i64 - 1), b as i64 - 1 + shift);
        let located = |e| located(e, seg, table_row, self.name());
        let (s_lo, s_hi) = (lo.max(0) as usize, (hi as usize).min(len.saturating_sub(1)));
        if s_hi >= s_lo {
            let run = seg
                .frames(self.name(), row0 + s_lo as u64, s_hi - s_lo + 1)
                .map_err(located)?;
            for u in s_lo..=s_hi {
                let p = (u as i64 - u0) as usize;
                put(
                    &mut table[3 * p..3 * p + 3],
                    run.frame(u - s_lo).map_err(located)?,
                );
            }
        }
        if hi as usize >= len {
            let p = (len as i64 - u0) as usize;
            if let Some(bytes) = seg.episode_table().final_frame(table_row) {
                put(&mut table[3 * p..3 * p + 3], bytes);
            }
        }
        if lo < 0 && self.pad == StackPad::Repeat {
            let p0 = (-u0) as usize;
            let first = [table[3 * p0], table[3 * p0 + 1]];
            for p in (lo - u0) as usize..p0 {
                table[3 * p..3 * p + 2].copy_from_slice(&first);
            }
        }
        Ok(())
    }

    /// [`FrameSource::fill_after`] for a device to decode: the table row (see [`TABLE_ROW`]) of
    /// the frame after the last valid step, whose decoded frame goes at byte `base`.
    pub(crate) fn table_after(
        &self,
        seg: &Segment,
        row0: u64,
        table_row: usize,
        (_, b, len): (usize, usize, usize),
        (row, base): (&mut [i64], i64),
        arena: &FrameArena<'_>,
    ) -> Result<()> {
        row.copy_from_slice(&[0, -1, base]);
        let bytes = if b < len {
            let run = seg
                .frames(self.name(), row0 + b as u64, 1)
                .map_err(|e| located(e, seg, table_row, self.name()))?;
            Some(
                run.frame(0)
                    .map_err(|e| located(e, seg, table_row, self.name()))?,
            )
        } else {
            seg.episode_table().final_frame(table_row)
        };
        if let Some(at) = bytes.and_then(|b| arena.put(b).map(|at| (at, b.len()))) {
            row[0] = at.0;
            row[1] = at.1 as i64;
        }
        Ok(())
    }
}
