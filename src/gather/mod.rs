//! Gather: turns a plan of slices into contiguous `[B, L, ...]` buffers, one `memcpy` per slice
//! per column straight from the memory-mapped segments, in parallel across slices.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use arrow::buffer::{Buffer, MutableBuffer};
use arrow::datatypes::DataType;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::format::col;
use crate::index::SliceRef;
use crate::store::Snapshot;
use crate::store::segment::Segment;

mod batch;
mod into;
mod readahead;
pub use batch::{Batch, BatchColumn, slice_bytes, tail_bytes};
#[cfg(feature = "torch")]
pub(crate) use into::either;
pub use into::{CompactInto, GatherInto};
use into::{Dest, FlagPtrs, FlagsInto};
pub use readahead::{COLD_FAULTS, ReadAhead, WARM_AFTER, major_faults};
mod frame_cache;
mod frames;
mod mix;
mod simd;
mod stored;
pub use frame_cache::FrameCacheStats;
pub use frames::{FrameStack, MAX_FRAME_STACK, StackPad};
pub(crate) use stored::{FrameArena, TABLE_ROW};

fn elem_size(dt: &DataType) -> usize {
    dt.primitive_width().unwrap_or(1)
}

/// Where a requested column's values come from.
#[derive(Debug)]
enum ColumnSource {
    /// A stored column: per segment, per record batch, its values from row 0 (bytes), or the
    /// boolean array for bool columns.
    Stored(Vec<Vec<Buffer>>),
    StoredBool(Vec<Vec<BooleanArray>>),
    /// `next_observation` derived from the observation rows (same layout) and the episode tables'
    /// `final_observation` (values per segment, validity per segment).
    DerivedNext {
        obs: Vec<Vec<Buffer>>,
        finals: Vec<(Buffer, Option<arrow::buffer::NullBuffer>)>,
    },
    /// A frame column (or `next_observation` of one), decoded and stacked by the gather.
    Frames(Box<frames::FrameSource>),
}

#[derive(Debug)]
struct GatherColumn {
    name: String,
    data_type: DataType,
    shape: Vec<usize>,
    width: usize,
    /// Rows before each slice's step 0: `K - 1` for a frame window, else 0.
    lead: usize,
    source: ColumnSource,
}

impl GatherColumn {
    /// Bytes of one step (`[K, H, W]` for a frame stack, written out or not).
    fn step_bytes(&self) -> usize {
        self.width * elem_size(&self.data_type)
    }
    /// Bytes of one row of the destination: a step, or one frame of a window.
    fn row_bytes(&self) -> usize {
        self.step_bytes() / (self.lead + 1)
    }
    /// Bytes of one slice of `l` steps in the destination, `None` on overflow.
    fn slice_bytes(&self, l: usize) -> Option<usize> {
        l.checked_add(self.lead)?.checked_mul(self.row_bytes())
    }
}

/// Gathers plans from one snapshot. Build once per snapshot and column set (O(segments ×
/// batches × columns + episodes)); then [`Gatherer::gather`] is allocation-free.
#[derive(Debug)]
pub struct Gatherer {
    snap: Snapshot,
    columns: Vec<GatherColumn>,
    /// Per episode position: bit 0 terminated, bit 1 truncated.
    episode_flags: Vec<u8>,
    /// Per segment: position of its first episode in the episode index.
    segment_first_episode: Vec<usize>,
    /// Whether and when gathers read ahead (data not in memory).
    ra: readahead::ReadAheadState,
    /// The parts of a mix ([`Gatherer::mixed`]), which do all its gathering.
    mix: Option<Box<mix::Mix>>,
    /// The columns [`Gatherer::gather_compact`] writes as one row per slice.
    tails: into::Tails,
    /// The frame stack it was made with.
    #[cfg_attr(not(feature = "torch"), allow(dead_code))] // used by the torch loader
    stack: Option<FrameStack>,
}

pub(crate) fn values_from_row0(array: &ArrayRef) -> (Buffer, DataType, usize) {
    match array.data_type() {
        DataType::FixedSizeList(child, n) => {
            let fsl = array.as_fixed_size_list();
            let values = fsl.values().to_data();
            let es = elem_size(child.data_type());
            let start = (values.offset() + fsl.value_offset(0) as usize) * es;
            (
                values.buffers()[0].slice(start),
                child.data_type().clone(),
                *n as usize,
            )
        }
        dt => {
            let data = array.to_data();
            let es = elem_size(dt);
            (data.buffers()[0].slice(data.offset() * es), dt.clone(), 1)
        }
    }
}

impl Gatherer {
    /// A gatherer of `columns` (any stored column, plus `next_observation` which is derived when
    /// not stored) from `snap`; frame columns give one decoded frame per step.
    pub fn try_new(snap: &Snapshot, columns: &[&str]) -> Result<Self> {
        Self::with_frame_stack(snap, columns, None)
    }

    /// [`Gatherer::try_new`] with frame columns (and a `next_observation` of one) stacked as
    /// `stack` says: `[K, H, W]` (or `[K, H, W, C]`) per step, or `[H, W, K]` (`[H, W, K·C]`)
    /// with [`FrameStack::channels_last`]. A stack without any frame column
    /// among `columns` is an [`Error::InvalidArgument`] about `frame_stack`.
    pub fn with_frame_stack(
        snap: &Snapshot,
        columns: &[&str],
        stack: Option<FrameStack>,
    ) -> Result<Self> {
        let schema = snap.schema().arrow_schema().clone();
        let mut plans = Vec::with_capacity(columns.len());
        let mut caches = frame_cache::Caches::new(stack.map_or(0, |s| s.cache));
        for &name in columns {
            let frame_of = if name == col::NEXT_OBSERVATION && schema.field_with_name(name).is_err()
            {
                col::OBSERVATION
            } else {
                name
            };
            if let Some(fc) = snap.frame_column(frame_of) {
                let mut source = frames::FrameSource::new(fc.clone(), frame_of != name, stack)?;
                source.cache = caches.of(snap, fc)?;
                let shape = match stack {
                    Some(st) => st.shape(&fc.spec.shape),
                    None => fc.spec.shape.clone(),
                };
                plans.push(GatherColumn {
                    name: name.to_string(),
                    data_type: DataType::UInt8,
                    width: shape.iter().product(),
                    shape,
                    lead: source.lead(),
                    source: ColumnSource::Frames(Box::new(source)),
                });
                continue;
            }
            let stored = schema.field_with_name(name).ok();
            let derive_next = stored.is_none() && name == col::NEXT_OBSERVATION;
            let field = match (stored, derive_next) {
                (Some(f), _) => f.clone(),
                (None, true) => schema.field_with_name(col::OBSERVATION)?.clone(),
                (None, false) => {
                    return Err(Error::argument(
                        "columns",
                        format!(
                            "no column `{name}` (have: {})",
                            crate::schema::names(&schema)
                        ),
                    ));
                }
            };
            let shape = match field.data_type() {
                DataType::FixedSizeList(..) => crate::schema::field_shape(&field)?,
                _ => vec![],
            };
            let per_batch = |colname: &str| -> Result<Vec<Vec<Buffer>>> {
                snap.segments()
                    .iter()
                    .map(|s| {
                        Ok(s.column(colname)?
                            .iter()
                            .map(|a| values_from_row0(a).0)
                            .collect())
                    })
                    .collect()
            };
            let (data_type, width) = match field.data_type() {
                DataType::FixedSizeList(c, n) => (c.data_type().clone(), *n as usize),
                dt => (dt.clone(), 1),
            };
            let source = if derive_next {
                let finals = snap
                    .segments()
                    .iter()
                    .map(|s| {
                        let a = s.episode_table().final_observation().ok_or_else(|| {
                            Error::corrupt(
                                snap.path().join(&s.entry().episodes_path),
                                "no final_observation column, but the dataset derives \
                                 next_observation from it",
                            )
                        })?;
                        Ok((values_from_row0(a).0, a.nulls().cloned()))
                    })
                    .collect::<Result<_>>()?;
                ColumnSource::DerivedNext {
                    obs: per_batch(col::OBSERVATION)?,
                    finals,
                }
            } else if data_type == DataType::Boolean {
                if width != 1 {
                    return Err(Error::argument(
                        "columns",
                        format!("column `{name}`: lists of bools are not gathered"),
                    ));
                }
                ColumnSource::StoredBool(
                    snap.segments()
                        .iter()
                        .map(|s| {
                            Ok(s.column(name)?
                                .iter()
                                .map(|a| a.as_boolean().clone())
                                .collect())
                        })
                        .collect::<Result<_>>()?,
                )
            } else {
                ColumnSource::Stored(per_batch(name)?)
            };
            plans.push(GatherColumn {
                name: name.to_string(),
                data_type,
                shape,
                width,
                lead: 0,
                source,
            });
        }
        if let Some(st) = stack
            && !plans
                .iter()
                .any(|p| matches!(p.source, ColumnSource::Frames(_)))
        {
            let arg = ["frame_stack", "frame_cache"][st.unstacked as usize];
            let why = "needs a frame column among the gathered columns";
            let cols = columns.join(", ");
            let tensors = "this dataset stores its observations as tensors";
            return Err(Error::argument(
                arg,
                format!("{arg} {why} ({cols}); {tensors}"),
            ));
        }
        let mut episode_flags = Vec::with_capacity(snap.episodes().len());
        let mut segment_first_episode = Vec::with_capacity(snap.segments().len());
        for s in snap.segments() {
            segment_first_episode.push(episode_flags.len());
            let t = s.episode_table();
            let (term, trunc) = (t.terminated(), t.truncated());
            for i in 0..t.len() {
                episode_flags.push(term.value(i) as u8 | (trunc.value(i) as u8) << 1);
            }
        }
        if plans
            .iter()
            .any(|c| matches!(c.source, ColumnSource::Frames(_)))
        {
            readahead::read_frame_offsets_ahead(snap);
        }
        Ok(Self {
            snap: snap.clone(),
            tails: into::Tails::of_columns(&plans),
            columns: plans,
            episode_flags,
            segment_first_episode,
            ra: Default::default(),
            mix: None,
            stack,
        })
    }

    /// The snapshot this gatherer reads (part 0's for a mix).
    pub fn snapshot(&self) -> &Snapshot {
        &self.snap
    }

    /// Per episode position of the snapshot: bit 0 set if the episode ended terminated, bit 1 if
    /// truncated (from the episode tables, O(episodes) memory held by the gatherer). Part 0's
    /// for a mix.
    pub fn episode_flags(&self) -> &[u8] {
        match &self.mix {
            Some(m) => m.parts()[0].episode_flags(),
            None => &self.episode_flags,
        }
    }

    /// Gathers `plan` into `out` (resized as needed; buffers are reused). Every slice is padded
    /// to the plan's longest `len`. Parallel across slices with rayon. Sets [`Batch::source`].
    ///
    /// Errors with [`Error::InvalidArgument`] when a slice refers to an episode position the
    /// snapshot does not have (a plan made for another snapshot).
    ///
    /// A batch larger than [`crate::sample::max_batch_bytes`] (see
    /// [`Gatherer::batch_bytes`]) is an [`Error::InvalidArgument`] about `plan`, checked before
    /// anything is allocated.
    pub fn gather(&self, plan: &[SliceRef], out: &mut Batch) -> Result<()> {
        let b = plan.len();
        let l = plan.iter().map(|s| s.len as usize).max().unwrap_or(0);
        crate::sample::batch_bytes(b, l as u64, self.step_bytes_total(), Some("plan"))?;
        out.num_slices = b;
        out.slice_len = l;
        if out.columns.len() != self.columns.len()
            || out
                .columns
                .iter()
                .zip(&self.columns)
                .any(|(o, c)| o.name != c.name)
        {
            out.columns = self
                .columns
                .iter()
                .map(|c| BatchColumn {
                    name: c.name.clone(),
                    data_type: c.data_type.clone(),
                    shape: c.shape.clone(),
                    width: c.width,
                    lead: c.lead,
                    data: MutableBuffer::new(0),
                })
                .collect();
        }
        for c in &mut out.columns {
            c.data.resize(b * c.slice_bytes(l), 0);
        }
        let mut flags = [
            &mut out.mask,
            &mut out.is_first,
            &mut out.is_last,
            &mut out.terminated,
            &mut out.truncated,
            &mut out.slice_end,
        ];
        for v in flags.iter_mut() {
            v.resize(b * l, 0);
        }
        out.episode_id.resize(b, 0);
        out.start_step.resize(b, 0);
        self.fill_sources(&mut out.source, b);
        let dest = GatherInto {
            columns: out
                .columns
                .iter_mut()
                .map(|c| c.data.as_slice_mut())
                .collect(),
            flags: flags.map(|v| v.as_mut_slice()),
            episode_id: &mut out.episode_id,
            start_step: &mut out.start_step,
        };
        self.gather_into(plan, l, dest)
    }

    /// The gathered columns in order: name, element type and shape of one step. Destinations of
    /// [`Gatherer::gather_into`] follow this order.
    pub fn columns(&self) -> impl ExactSizeIterator<Item = (&str, &DataType, &[usize])> {
        self.columns
            .iter()
            .map(|c| (c.name.as_str(), &c.data_type, c.shape.as_slice()))
    }

    /// The bytes a [`Batch`] of `num_slices` slices of `slice_len` steps of these columns takes
    /// (columns, flags and per-slice vectors; see [`crate::sample::max_batch_bytes`]). Errors with
    /// [`Error::InvalidArgument`] about `num_slices` or `slice_len` when the count overflows or
    /// the batch is larger than the limit, so that a caller can refuse a batch size before
    /// sampling anything.
    pub fn batch_bytes(&self, num_slices: usize, slice_len: usize) -> Result<u64> {
        crate::sample::batch_bytes(num_slices, slice_len as u64, self.step_bytes_total(), None)
    }

    /// Bytes of all gathered columns together: per step (a window's frame, not its stack),
    /// and per slice besides its steps (the `K - 1` frames before a window's step 0).
    fn step_bytes_total(&self) -> (u64, u64) {
        self.columns.iter().fold((0u64, 0u64), |(step, lead), c| {
            let row = c.row_bytes() as u64;
            (
                step.saturating_add(row),
                lead.saturating_add(row.saturating_mul(c.lead as u64)),
            )
        })
    }

    /// Bytes of one step of each gathered column, in [`Gatherer::columns`] order (of a stack
    /// of frames, `K` frames, also where a frame window holds it).
    pub fn step_bytes(&self) -> Vec<usize> {
        self.columns.iter().map(GatherColumn::step_bytes).collect()
    }

    /// Per gathered column, in [`Gatherer::columns`] order, the rows before each slice's step 0:
    /// `K - 1` for a frame column gathered as a window ([`FrameStack::window`]), whose
    /// destination holds `[B, L + K - 1, ...frame]`, and 0 for every other column (`[B, L,
    /// ...step]`).
    pub fn leads(&self) -> Vec<usize> {
        self.columns.iter().map(|c| c.lead).collect()
    }

    /// Bytes of each gathered column's destination for a batch of `num_slices` slices of
    /// `slice_len` steps, in [`Gatherer::columns`] order: `B * L * step` bytes, or `B * (L + K -
    /// 1) * frame` for a frame window. `None` where a count overflows.
    pub fn column_bytes(&self, num_slices: usize, slice_len: usize) -> Vec<Option<usize>> {
        self.columns
            .iter()
            .map(|c| c.slice_bytes(slice_len)?.checked_mul(num_slices))
            .collect()
    }

    /// Whether a frame column is gathered as a window ([`FrameStack::window`]).
    pub fn has_windows(&self) -> bool {
        self.columns.iter().any(|c| c.lead > 0)
    }

    /// The checks of a plan on a plain gatherer (see [`Gatherer::check_plan`]).
    fn check_slices(&self, plan: &[SliceRef], l: usize) -> Result<()> {
        if let Some(s) = plan.iter().find(|s| s.len as usize > l) {
            return Err(Error::invalid_argument(format!(
                "a slice of {} steps does not fit a batch of {l}-step slices",
                s.len
            )));
        }
        let episodes = self.snap.episodes().len();
        if let Some(s) = plan.iter().find(|s| s.episode as usize >= episodes) {
            return Err(Error::argument(
                "plan",
                format!(
                    "a slice refers to episode position {}, but the snapshot has {episodes} \
                     episodes (a plan made for another snapshot?)",
                    s.episode
                ),
            ));
        }
        Ok(())
    }

    /// Issues CPU prefetches for the first rows of every stored column of slice `s`.
    #[inline]
    fn prefetch(&self, s: &SliceRef) {
        #[cfg(target_arch = "x86_64")]
        {
            let loc = self.snap.episodes().get(s.episode as usize);
            let a = s.start.max(0);
            let b = s.start.saturating_add(s.len as i64).min(loc.length as i64);
            if b <= a {
                return;
            }
            let seg = &self.snap.segments()[loc.segment];
            let (bi, r) = seg.locate(loc.segment_row + a as u64);
            for c in &self.columns {
                let bufs = match &c.source {
                    ColumnSource::Stored(bufs) | ColumnSource::DerivedNext { obs: bufs, .. } => {
                        bufs
                    }
                    ColumnSource::StoredBool(_) | ColumnSource::Frames(_) => continue,
                };
                let step = c.width * elem_size(&c.data_type);
                let src = bufs[loc.segment][bi].as_slice();
                let from = (r * step).min(src.len());
                let to = (from + (b - a) as usize * step).min(src.len());
                for off in (from..to).step_by(64) {
                    // SAFETY: a prefetch is a hint with no architectural effect; `off` lies
                    // inside `src`, a live mapping.
                    unsafe {
                        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                            src.as_ptr().add(off) as *const i8,
                        )
                    };
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = s;
    }

    /// Frames per step over the gathered frame columns (0 without any).
    fn frame_slots(&self) -> usize {
        self.columns
            .iter()
            .filter_map(|c| match &c.source {
                ColumnSource::Frames(f) => Some(c.width / f.frame_len()),
                _ => None,
            })
            .sum()
    }

    /// Whether a gathered column is a frame column (decoded, not copied).
    pub(crate) fn has_frames(&self) -> bool {
        self.columns
            .iter()
            .any(|c| matches!(c.source, ColumnSource::Frames(_)))
    }

    /// Gathers slice `i`. An error only from a frame column whose stored frame does not decode
    /// (the slice's other bytes are then unspecified).
    ///
    /// # Safety
    /// The destination pointers must be valid for a batch of `i + 1` or more slices of `l` steps
    /// and no other thread may write slice `i`'s ranges.
    unsafe fn gather_slice(
        &self,
        i: usize,
        s: &SliceRef,
        l: usize,
        (dst, tails, arena): (&[SendPtr], &[bool], Option<&FrameArena<'_>>),
        flags: &FlagPtrs,
        meta: &(SendPtr, SendPtr),
    ) -> Result<()> {
        let loc = self.snap.episodes().get(s.episode as usize);
        let seg = &self.snap.segments()[loc.segment];
        let len = loc.length as i64;
        // Valid steps [a, b) of the episode; output positions [a - start, b - start). A slice
        // covers its own `len` steps (at most `l`); the rest of its row is padding.
        let a = s.start.max(0);
        let b = s
            .start
            .saturating_add(s.len.min(l as u32) as i64)
            .min(len)
            .max(a);
        let n = (b - a) as usize;
        // A window holding no step of its episode is all padding.
        let off = if n == 0 { 0 } else { (a - s.start) as usize };
        // SAFETY: every write below stays in slice `i`'s part of the buffers; see the caller's contract.
        unsafe {
            *(meta.0.0 as *mut u64).add(i) = loc.episode_id;
            *(meta.1.0 as *mut i64).add(i) = s.start;
            let ef = self.episode_flags[s.episode as usize];
            match flags {
                FlagPtrs::Planes(planes) => {
                    for (k, f) in planes.iter().enumerate() {
                        let row = std::slice::from_raw_parts_mut(f.0.add(i * l), l);
                        row.fill(0);
                        if n == 0 {
                            continue;
                        }
                        match k {
                            0 => row[off..off + n].fill(1),
                            1 if a == 0 => row[off] = 1,
                            2 if b == len => row[off + n - 1] = 1,
                            3 if b == len && ef & 1 != 0 => row[off + n - 1] = 1,
                            4 if b == len && ef & 2 != 0 => row[off + n - 1] = 1,
                            5 => row[off + n - 1] = 1,
                            _ => {}
                        }
                    }
                }
                FlagPtrs::Spans(p) => {
                    let span = std::slice::from_raw_parts_mut((p.0 as *mut i32).add(3 * i), 3);
                    let mut bits = 0;
                    if n > 0 {
                        if a == 0 {
                            bits |= CompactInto::FIRST;
                        }
                        if b == len {
                            bits |= CompactInto::LAST;
                            if ef & 1 != 0 {
                                bits |= CompactInto::TERMINATED;
                            }
                            if ef & 2 != 0 {
                                bits |= CompactInto::TRUNCATED;
                            }
                        }
                    }
                    // Slices are at most `l` steps, and `l` fits an i32 (checked by the caller's
                    // layout; a longer slice could not be a batch).
                    span.copy_from_slice(&[off as i32, n as i32, bits]);
                }
            }
            let first_row = loc.segment_row + a as u64;
            let (bi, r) = if n > 0 { seg.locate(first_row) } else { (0, 0) };
            for ((c, d), &tail) in self.columns.iter().zip(dst).zip(tails) {
                let step = c.width * elem_size(&c.data_type);
                if tail {
                    let t = c.row_bytes();
                    let row = std::slice::from_raw_parts_mut(d.0.add(i * t), t);
                    if n == 0 {
                        row.fill(0);
                        continue;
                    }
                    match &c.source {
                        ColumnSource::Frames(fs) if fs.stored => {
                            // No frame: a table row of zeros (see TABLE_ROW).
                            let row = std::slice::from_raw_parts_mut(d.0.add(i * t) as *mut i64, 3);
                            row.copy_from_slice(&[0, -1, (i * fs.frame_len()) as i64]);
                        }
                        // Written below, from the observation's last row.
                        ColumnSource::Frames(_) => {}
                        ColumnSource::DerivedNext { obs, finals } => {
                            let src = obs[loc.segment][bi].as_slice();
                            let after = (b < len).then(|| &src[(r + n) * step..(r + n + 1) * step]);
                            self.next_of_last(s, loc.segment, after, finals, row);
                        }
                        _ => unreachable!("only derived next_observation columns are tails"),
                    }
                    continue;
                }
                if c.lead > 0 {
                    // A frame window: written whole below (zeros for an empty slice).
                    if let (0, ColumnSource::Frames(fs), Some(arena)) = (n, &c.source, arena) {
                        // A table of zero frames (see TABLE_ROW).
                        let rows = l + c.lead;
                        let table = std::slice::from_raw_parts_mut(
                            d.0.add(i * rows * TABLE_ROW) as *mut i64,
                            rows * 3,
                        );
                        let base = (i * rows * fs.frame_len()) as i64;
                        let none = (0, 0, 0);
                        fs.table_window(seg, 0, 0, none, 0, (table, base), arena)?;
                    } else if n == 0 {
                        let bytes = (l + c.lead) * c.row_bytes();
                        std::slice::from_raw_parts_mut(d.0.add(i * bytes), bytes).fill(0);
                    }
                    continue;
                }
                let out = std::slice::from_raw_parts_mut(d.0.add(i * l * step), l * step);
                out[..off * step].fill(0);
                out[(off + n) * step..].fill(0);
                if n == 0 {
                    continue;
                }
                let dst = &mut out[off * step..(off + n) * step];
                match &c.source {
                    // Decoded below, once the copied columns are in place.
                    ColumnSource::Frames(_) => {}
                    ColumnSource::Stored(bufs) => {
                        dst.copy_from_slice(
                            &bufs[loc.segment][bi].as_slice()[r * step..(r + n) * step],
                        );
                    }
                    ColumnSource::StoredBool(arrays) => {
                        let arr = &arrays[loc.segment][bi];
                        for (j, x) in dst.iter_mut().enumerate() {
                            *x = arr.value(r + j) as u8;
                        }
                    }
                    ColumnSource::DerivedNext { obs, finals } => {
                        // o_{t+1} for t in [a, b): rows a+1 .. min(b, len - 1) + 1 of the episode,
                        // then the final observation if the window reaches the last step.
                        let inner = n - 1;
                        let src = obs[loc.segment][bi].as_slice();
                        dst[..inner * step]
                            .copy_from_slice(&src[(r + 1) * step..(r + 1 + inner) * step]);
                        let after = (b < len).then(|| &src[(r + n) * step..(r + n + 1) * step]);
                        self.next_of_last(s, loc.segment, after, finals, &mut dst[inner * step..]);
                    }
                }
            }
            if n > 0 && self.has_frames() {
                let table_row = s.episode as usize - self.segment_first_episode[loc.segment];
                let steps = (a as usize, b as usize, len as usize);
                // The observation first, so that `next_observation` can copy its frames.
                let obs = self.columns.iter().position(|c| {
                    c.name == col::OBSERVATION
                        && matches!(&c.source, ColumnSource::Frames(f) if !f.next)
                });
                let frames = |next: bool| {
                    self.columns
                        .iter()
                        .zip(dst)
                        .enumerate()
                        .filter_map(move |(j, (c, d))| match &c.source {
                            ColumnSource::Frames(fs) if fs.next == next => {
                                Some((j, c.width, fs, d))
                            }
                            _ => None,
                        })
                };
                for (j, step, fs, d) in frames(false).chain(frames(true)) {
                    if let Some(arena) = arena.filter(|_| fs.stored) {
                        // Left to the device: the window's table and stored frames.
                        let (f, rows) = (fs.frame_len(), l + fs.lead());
                        let (seg_row, start) = (loc.segment_row, s.start);
                        if tails[j] {
                            let row = std::slice::from_raw_parts_mut(
                                d.0.add(i * TABLE_ROW) as *mut i64,
                                3,
                            );
                            let base = (i * f) as i64;
                            fs.table_after(seg, seg_row, table_row, steps, (row, base), arena)?;
                        } else {
                            let table = std::slice::from_raw_parts_mut(
                                d.0.add(i * rows * TABLE_ROW) as *mut i64,
                                rows * 3,
                            );
                            let base = (i * rows * f) as i64;
                            let t = (table, base);
                            fs.table_window(seg, seg_row, table_row, steps, start, t, arena)?;
                        }
                        continue;
                    }
                    if fs.window && tails[j] {
                        // The frame after the last valid step only: the rest of the
                        // next_observation window is the observation's, one row later.
                        let f = fs.frame_len();
                        let out = std::slice::from_raw_parts_mut(d.0.add(i * f), f);
                        fs.fill_after(seg, loc.segment_row, table_row, steps, out)?;
                        continue;
                    }
                    if fs.window {
                        let bytes = (l + fs.lead()) * fs.frame_len();
                        let out = std::slice::from_raw_parts_mut(d.0.add(i * bytes), bytes);
                        let obs_window = obs.filter(|_| fs.next).map(|o| {
                            let p = dst[o].0.add(i * bytes);
                            std::slice::from_raw_parts(p as *const u8, bytes)
                        });
                        let (seg_row, start) = (loc.segment_row, s.start);
                        fs.fill_window(seg, seg_row, table_row, steps, start, out, obs_window)?;
                        continue;
                    }
                    let from_obs = |from: usize, rows: usize| {
                        obs.filter(|_| fs.next).map(|o| {
                            let p = dst[o].0.add((i * l + from) * step);
                            std::slice::from_raw_parts(p as *const u8, rows * step)
                        })
                    };
                    if tails[j] {
                        // The last valid step's next stack only, from the observation's last.
                        let out = std::slice::from_raw_parts_mut(d.0.add(i * step), step);
                        let last = (b as usize - 1, b as usize, len as usize);
                        fs.fill(
                            seg,
                            loc.segment_row,
                            table_row,
                            last,
                            out,
                            from_obs(off + n - 1, 1),
                        )?;
                        continue;
                    }
                    let out =
                        std::slice::from_raw_parts_mut(d.0.add((i * l + off) * step), n * step);
                    fs.fill(
                        seg,
                        loc.segment_row,
                        table_row,
                        steps,
                        out,
                        from_obs(off, n),
                    )?;
                }
            }
        }
        Ok(())
    }
}

impl Gatherer {
    /// The `next_observation` of a window's last valid step into `out` (one step): `after`, the
    /// observation of the step after the window, or where the window ends the episode (`after`
    /// None) the episode's final observation (zero where the episode has none).
    fn next_of_last(
        &self,
        s: &SliceRef,
        segment: usize,
        after: Option<&[u8]>,
        finals: &[(Buffer, Option<arrow::buffer::NullBuffer>)],
        out: &mut [u8],
    ) {
        if let Some(after) = after {
            out.copy_from_slice(after);
            return;
        }
        let step = out.len();
        let k = s.episode as usize - self.segment_first_episode[segment];
        let (vals, nulls) = &finals[segment];
        if nulls.as_ref().is_some_and(|nb| nb.is_null(k)) {
            out.fill(0);
        } else {
            out.copy_from_slice(&vals.as_slice()[k * step..(k + 1) * step]);
        }
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: used only to hand disjoint output ranges to rayon workers (see `Gatherer::gather`).
unsafe impl Send for SendPtr {}
// SAFETY: as above; the pointer itself is never written through by two threads for one range.
unsafe impl Sync for SendPtr {}

mod pages;
#[cfg(test)]
mod tests;
