//! Gathers into memory the caller owns: the full batch ([`GatherInto`]), the compact batch the
//! CUDA loaders ship ([`CompactInto`]), or the full one with tail columns (the Python ring's).

use super::*;

/// Caller-owned destinations of [`Gatherer::gather_into`] for a batch of `B` slices of `L` steps.
#[derive(Debug)]
pub struct GatherInto<'a> {
    /// One buffer per gathered column, in [`Gatherer::columns`] order, each at least
    /// `B * L * step_bytes` long (`[B, L, ...]` row-major; padded steps are zeroed), or `B * (L
    /// + K - 1) * frame` for a frame window ([`Gatherer::column_bytes`] says each).
    pub columns: Vec<&'a mut [u8]>,
    /// `[B, L]` planes, one byte per step: mask, is_first, is_last, terminated, truncated,
    /// slice_end (as the fields of [`Batch`]).
    pub flags: [&'a mut [u8]; 6],
    /// `[B]`: episode id of each slice.
    pub episode_id: &'a mut [u64],
    /// `[B]`: first step of each slice.
    pub start_step: &'a mut [i64],
}

/// Caller-owned destinations of [`Gatherer::gather_compact`]: a batch in fewer bytes, for a
/// device that expands it (the `torch` module's CUDA loader does, feature `torch`). Each column
/// is `[B, L, ...]` as in [`GatherInto`], except the columns [`Gatherer::tail_columns`] marks (a
/// `next_observation` derived from the gathered observation): those hold `[B, ...]`, the
/// `next_observation` of each slice's last valid step only (zero for an empty slice), since at
/// every other valid step it is the observation one step later. For a frame window (`lead = K -
/// 1` rows before step 0, `[B, L + lead, ...frame]`) the tail is `[B, ...frame]`, the one frame
/// after the slice's last valid step, and the `next_observation` window is the observation's one
/// row later: row `r` of slice `i` is the tail where `r == off + n - 1 + lead`, the
/// observation's row `r + 1` where `off <= r < off + n - 1 + lead`, zero elsewhere. The six flag planes become
/// `spans`, `[B, 3]` per slice: the position of its first valid step, its number of valid steps,
/// and its end bits ([`CompactInto::FIRST`] ...). The expansion, for step `j` of slice `i`:
/// `mask = off <= j < off + n`; `slice_end = n > 0 && j == off + n - 1`;
/// `is_first = n > 0 && j == off && FIRST`; `is_last = slice_end && LAST`;
/// `terminated = slice_end && TERMINATED`; `truncated = slice_end && TRUNCATED`; and
/// `next_observation = tail[i]` where `slice_end`, `observation[j + 1]` at the other valid steps,
/// zero at padded ones.
#[derive(Debug)]
pub struct CompactInto<'a> {
    /// One buffer per gathered column, in [`Gatherer::columns`] order: `[B, L, ...]`, or `[B,
    /// ...]` for a tail column.
    pub columns: Vec<&'a mut [u8]>,
    /// `[B, 3]`: first valid position, valid steps, end bits.
    pub spans: &'a mut [i32],
    /// `[B]`: episode id of each slice.
    pub episode_id: &'a mut [u64],
    /// `[B]`: first step of each slice.
    pub start_step: &'a mut [i64],
}

impl CompactInto<'_> {
    /// End bit: the slice's first valid step is its episode's first.
    pub const FIRST: i32 = 1;
    /// End bit: the slice's last valid step is its episode's last.
    pub const LAST: i32 = 2;
    /// End bit: ... and the episode ended in a terminal state.
    pub const TERMINATED: i32 = 4;
    /// End bit: ... and the episode was cut.
    pub const TRUNCATED: i32 = 8;
}

/// The flag destinations of a gather: six planes, or the compact per-slice spans.
pub(super) enum FlagsInto<'a> {
    Planes([&'a mut [u8]; 6]),
    Spans(&'a mut [i32]),
}

/// A destination with flag planes or with spans, for [`Gatherer::gather_stored`].
#[cfg(feature = "torch")]
pub(crate) mod either {
    /// [`super::GatherInto`] or [`super::CompactInto`].
    pub(crate) enum Dest<'a> {
        Planes(super::GatherInto<'a>),
        Compact(super::CompactInto<'a>),
    }
}

/// The destinations of a gather: columns, flags, episode ids, start steps.
pub(super) type Dest<'a> = (
    Vec<&'a mut [u8]>,
    FlagsInto<'a>,
    &'a mut [u64],
    &'a mut [i64],
);

/// [`FlagsInto`] as pointers for the workers.
pub(super) enum FlagPtrs {
    Planes([SendPtr; 6]),
    Spans(SendPtr),
}

impl Gatherer {
    /// Gathers `plan` into caller-owned memory (pinned staging tensors, a device upload
    /// buffer, ...) laid out as [`Batch`] is: each column `[B, slice_len, ...]` row-major, six
    /// `[B, slice_len]` flag planes and two `[B]` per-slice vectors. Nothing is allocated. Every
    /// slice of `plan` must be at most `slice_len` steps; shorter ones are padded with zeros.
    ///
    /// Errors with [`Error::InvalidArgument`] when a destination is too small, a slice too long,
    /// or a slice refers to an episode position the snapshot does not have. On a mix, `plan`
    /// must have the mix's slices per batch; each part gets its ranges (a list of destination
    /// columns per part is allocated; see [`Gatherer::mixed`]). Nothing is written on error.
    pub fn gather_into(
        &self,
        plan: &[SliceRef],
        slice_len: usize,
        dest: GatherInto<'_>,
    ) -> Result<()> {
        self.gather_planes(plan, slice_len, dest, &self.tails.none, None)
    }

    /// [`Gatherer::gather_into`] (or with `compact`, [`Gatherer::gather_compact`]) by a gatherer
    /// that leaves frame windows to the device ([`Gatherer::with_stored_frames`]): their columns
    /// get tables of stored frames, and `arena` the frames' bytes. Where the arena is too small
    /// ([`FrameArena`]'s used bytes exceed it after the gather), gather again into a larger one.
    #[cfg(feature = "torch")]
    pub(crate) fn gather_stored(
        &self,
        plan: &[SliceRef],
        slice_len: usize,
        dest: either::Dest<'_>,
        arena: &FrameArena<'_>,
    ) -> Result<()> {
        match dest {
            either::Dest::Planes(d) => {
                self.gather_planes(plan, slice_len, d, &self.tails.none, Some(arena))
            }
            either::Dest::Compact(d) => self.compact(plan, slice_len, d, Some(arena)),
        }
    }

    /// [`Gatherer::gather_into`] with the columns `tails` marks (some of
    /// [`Gatherer::tail_columns`]) written as one row per slice, as [`CompactInto`] describes,
    /// and the flags as planes: for a device that derives `next_observation` but takes the flags
    /// as they are (the Python package's CUDA ring). Errors as `gather_into` does, and with
    /// [`Error::InvalidArgument`] about `tails` where it marks a column that is not a tail column.
    pub fn gather_into_with_tails(
        &self,
        plan: &[SliceRef],
        slice_len: usize,
        dest: GatherInto<'_>,
        tails: &[bool],
    ) -> Result<()> {
        let can = self.tail_columns();
        if tails.len() != can.len() || tails.iter().zip(can).any(|(&t, &c)| t && !c) {
            return Err(Error::argument(
                "tails",
                format!(
                    "{tails:?}: only derived next_observation columns gathered with their \
                     observation can be tails ({can:?})"
                ),
            ));
        }
        self.gather_planes(plan, slice_len, dest, tails, None)
    }

    /// A gather with flag planes and `tails`, checked by the caller.
    fn gather_planes(
        &self,
        plan: &[SliceRef],
        slice_len: usize,
        dest: GatherInto<'_>,
        tails: &[bool],
        arena: Option<&FrameArena<'_>>,
    ) -> Result<()> {
        let GatherInto {
            columns,
            flags,
            episode_id,
            start_step,
        } = dest;
        let dest = (columns, FlagsInto::Planes(flags), episode_id, start_step);
        self.gather_any(plan, slice_len, dest, (tails, arena))
    }

    /// Gathers `plan` into the compact layout of [`CompactInto`]: the columns
    /// [`Gatherer::tail_columns`] marks as one row per slice, the flags as per-slice spans. The
    /// same checks and errors as [`Gatherer::gather_into`].
    pub fn gather_compact(
        &self,
        plan: &[SliceRef],
        slice_len: usize,
        dest: CompactInto<'_>,
    ) -> Result<()> {
        self.compact(plan, slice_len, dest, None)
    }

    fn compact(
        &self,
        plan: &[SliceRef],
        slice_len: usize,
        dest: CompactInto<'_>,
        arena: Option<&FrameArena<'_>>,
    ) -> Result<()> {
        let CompactInto {
            columns,
            spans,
            episode_id,
            start_step,
        } = dest;
        if i32::try_from(slice_len).is_err() {
            return Err(Error::argument(
                "slice_len",
                format!("{slice_len} steps per slice: a compact batch's spans hold an i32"),
            ));
        }
        let dest = (columns, FlagsInto::Spans(spans), episode_id, start_step);
        self.gather_any(plan, slice_len, dest, (&self.tails.derived, arena))
    }

    /// Per gathered column, whether [`Gatherer::gather_compact`] writes it as one row per slice:
    /// a `next_observation` derived from the observation rows (not a stored column), with the
    /// observation gathered too. On a mix, only where every part derives it.
    pub fn tail_columns(&self) -> &[bool] {
        &self.tails.derived
    }

    /// [`Gatherer::gather_into`] and [`Gatherer::gather_compact`]: `tails` marks the columns
    /// written as one row per slice (only with spans; see [`Gatherer::tail_columns`]).
    pub(super) fn gather_any(
        &self,
        plan: &[SliceRef],
        slice_len: usize,
        (mut columns, flags, episode_id, start_step): Dest<'_>,
        (tails, arena): (&[bool], Option<&FrameArena<'_>>),
    ) -> Result<()> {
        if self.stores_frames() != arena.is_some() {
            return Err(Error::argument(
                "arena",
                "a gatherer that leaves frames to the device gathers with an arena for their \
                 stored bytes, and only such a gatherer",
            ));
        }
        if let Some(m) = &self.mix {
            let dest = (columns, flags, episode_id, start_step);
            let layout: Vec<(usize, usize)> = self
                .columns
                .iter()
                .map(|c| (c.row_bytes(), c.lead))
                .collect();
            return m.gather_any(plan, slice_len, dest, &layout, tails);
        }
        let (b, l) = (plan.len(), slice_len);
        self.check_slices(plan, l)?;
        if columns.len() != self.columns.len() {
            return Err(Error::argument(
                "dest",
                format!(
                    "{} destination columns for {} gathered columns",
                    columns.len(),
                    self.columns.len()
                ),
            ));
        }
        // Checked: a product that wrapped around would pass for a small destination.
        let steps = b.checked_mul(l).ok_or_else(|| {
            Error::argument(
                "slice_len",
                format!("{b} slices of {l} steps overflow a count of steps"),
            )
        })?;
        for ((c, d), &tail) in self.columns.iter().zip(&columns).zip(tails) {
            let need = match tail {
                true => b.checked_mul(c.row_bytes()),
                false => c.slice_bytes(l).and_then(|s| s.checked_mul(b)),
            };
            if need.is_none_or(|need| d.len() < need) {
                return Err(Error::argument(
                    "dest",
                    format!(
                        "destination of `{}` holds {} bytes, the batch of {b} x {l} steps needs \
                         {}",
                        c.name,
                        d.len(),
                        need.map_or("more than fits in memory".into(), |n| n.to_string())
                    ),
                ));
            }
        }
        let flags_short = match &flags {
            FlagsInto::Planes(p) => p.iter().any(|f| f.len() < steps),
            FlagsInto::Spans(s) => s.len() / 3 < b,
        };
        if flags_short || episode_id.len() < b || start_step.len() < b {
            return Err(Error::argument(
                "dest",
                format!("flag or per-slice destinations smaller than a batch of {b} x {l}"),
            ));
        }
        let dst: Vec<SendPtr> = columns
            .iter_mut()
            .map(|c| SendPtr(c.as_mut_ptr()))
            .collect();
        let flags = match flags {
            FlagsInto::Planes(p) => FlagPtrs::Planes(p.map(|f| SendPtr(f.as_mut_ptr()))),
            FlagsInto::Spans(s) => FlagPtrs::Spans(SendPtr(s.as_mut_ptr() as *mut u8)),
        };
        let meta = (
            SendPtr(episode_id.as_mut_ptr() as *mut u8),
            SendPtr(start_step.as_mut_ptr() as *mut u8),
        );
        let total_bytes: usize = self
            .columns
            .iter()
            .zip(tails)
            .map(|(c, &t)| match t {
                true => b * c.row_bytes(),
                false => b * (l + c.lead) * c.row_bytes(),
            })
            .sum();
        self.before_gather(plan);
        let work = |(i, s): (usize, &SliceRef)| {
            // Start loading the next slice's rows while this one is copied: the copies are bound
            // by memory latency (a few KiB at random places), which the prefetch overlaps.
            if let Some(next) = plan.get(i + 1) {
                self.prefetch(next);
            }
            // SAFETY: slice `i` writes only bytes `[i * L * step, (i + 1) * L * step)` of each
            // column (`[i * row, (i + 1) * row)` of a tail column, `[i * R * frame, (i + 1) *
            // R * frame)` of a window of `R = L + K - 1` rows), `[i * L, (i + 1) * L)` of
            // each flag plane (elements `3i .. 3i + 3` of the spans) and element `i` of the
            // per-slice vectors; the destinations were checked above to hold all B slices and are
            // exclusively borrowed for this call.
            unsafe { self.gather_slice(i, s, l, (&dst, tails, arena), &flags, &meta) }
        };
        // Small batches are faster on one thread than across the pool: under 256 KiB of copies,
        // or under 1,024 frames to decode or copy (about 1 µs each; a loader's workers already
        // gather batches in parallel).
        let small = match self.frame_slots() {
            0 => total_bytes < (256 << 10),
            per_step => b * l * per_step < 1024,
        };
        let r = if small {
            plan.iter().enumerate().try_for_each(work)
        } else {
            plan.par_iter()
                .enumerate()
                .with_min_len(1)
                .try_for_each(work)
        };
        self.after_gather();
        r
    }
}

/// Which columns a gatherer can write as one row per slice, computed once (gathers allocate
/// nothing), and the all-false list of a full gather.
#[derive(Debug, Clone, Default)]
pub(super) struct Tails {
    pub(super) derived: Vec<bool>,
    pub(super) none: Vec<bool>,
}

impl Tails {
    /// Of a plain gatherer's columns: a `next_observation` derived from the observation rows
    /// (not a stored column), with the observation gathered too.
    pub(super) fn of_columns(columns: &[GatherColumn]) -> Self {
        let vector_obs = columns
            .iter()
            .any(|c| c.name == col::OBSERVATION && !matches!(c.source, ColumnSource::Frames(_)));
        // A frame `next_observation` is a tail when the observation is gathered the same way
        // (both stacks, or both windows).
        let obs_window = columns.iter().find_map(|c| match &c.source {
            ColumnSource::Frames(f) if c.name == col::OBSERVATION && !f.next => Some(f.window),
            _ => None,
        });
        let derived = columns
            .iter()
            .map(|c| match &c.source {
                ColumnSource::DerivedNext { .. } => vector_obs,
                ColumnSource::Frames(f) => f.next && obs_window == Some(f.window),
                _ => false,
            })
            .collect();
        Self {
            derived,
            none: vec![false; columns.len()],
        }
    }

    /// Of a mix: where every part can.
    pub(super) fn of_parts(parts: &[Arc<Gatherer>]) -> Self {
        let n = parts.first().map_or(0, |p| p.columns.len());
        let mut derived = vec![true; n];
        for part in parts {
            for (t, &p) in derived.iter_mut().zip(part.tail_columns()) {
                *t &= p;
            }
        }
        Self {
            derived,
            none: vec![false; n],
        }
    }
}
