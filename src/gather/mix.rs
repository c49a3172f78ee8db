//! Mixed gatherers ([`Gatherer::mixed`]): batches whose slices come from several snapshots (for
//! instance offline and online data, RLPD-style), each part gathering a fixed range of every
//! batch with its own [`Gatherer`], as a [`crate::sample::MixSampler`] plans them.

use arrow::array::UInt16Array;

use super::*;

/// The name of the per-step part column of [`Batch::to_record_batch`].
const SOURCE: &str = "source";

/// The parts of a mixed gatherer.
#[derive(Debug)]
pub(super) struct Mix {
    parts: Vec<Arc<Gatherer>>,
    counts: Vec<usize>,
    /// Where each part's slices start in a batch, then the slices of a batch.
    offsets: Vec<usize>,
}

impl Gatherer {
    /// A gatherer of batches whose slices `[offset_i, offset_i + counts[i])` come from part `i`
    /// (`offset_i` the sum of the counts before it), gathered by `parts[i]` from its own snapshot:
    /// the plans of a [`crate::sample::MixSampler`] whose parts plan `counts[i]` slices each over
    /// the parts' snapshots. Episode positions in a plan are those of the part's snapshot.
    ///
    /// The mixed gatherer gathers the parts' columns ([`Gatherer::columns`],
    /// [`Gatherer::step_bytes`] and [`Gatherer::batch_bytes`] are theirs); its
    /// [`Gatherer::snapshot`] and [`Gatherer::episode_flags`] are part 0's. [`Gatherer::gather`]
    /// says in [`Batch::source`] which part each slice came from ([`Gatherer::slice_sources`]
    /// gives the same for [`Gatherer::gather_into`]). A part may be mixed itself. Cost O(parts ×
    /// columns).
    ///
    /// Errors with [`Error::InvalidArgument`] about `parts` when there are none or more than
    /// [`crate::sample::MAX_PARTS`], about `counts` when there are not as many as parts or they
    /// sum to 0, about `columns` when the parts gather other columns or in another order, and
    /// with [`Error::SchemaMismatch`] naming the column when a part gathers it with another
    /// element type or step shape than part 0.
    pub fn mixed(parts: Vec<Arc<Gatherer>>, counts: &[usize]) -> Result<Gatherer> {
        let Some(first) = parts.first() else {
            return Err(Error::argument("parts", "a mix needs at least one part"));
        };
        if parts.len() > crate::sample::MAX_PARTS {
            return Err(Error::argument(
                "parts",
                format!(
                    "{} parts: a mix has at most {}",
                    parts.len(),
                    crate::sample::MAX_PARTS
                ),
            ));
        }
        if counts.len() != parts.len() {
            return Err(Error::argument(
                "counts",
                format!("{} counts for {} parts", counts.len(), parts.len()),
            ));
        }
        let names = |g: &Gatherer| g.columns().map(|c| c.0.to_string()).collect::<Vec<_>>();
        for (i, part) in parts.iter().enumerate().skip(1) {
            if names(part) != names(first) {
                return Err(Error::argument(
                    "columns",
                    format!(
                        "part 0 gathers {:?} and part {i} {:?}: the parts of a mix must gather \
                         the same columns in the same order",
                        names(first),
                        names(part)
                    ),
                ));
            }
            for ((name, dt0, shape0), (_, dt, shape)) in first.columns().zip(part.columns()) {
                if (dt0, shape0) != (dt, shape) {
                    return Err(Error::schema_types(
                        name,
                        format!("{dt0} of step shape {shape0:?} as part 0 has"),
                        format!("{dt} of step shape {shape:?} in part {i}"),
                        format!(
                            "part {i} of the mix gathers `{name}` with another element type or \
                             step shape than part 0"
                        ),
                    ));
                }
            }
            if part.leads() != first.leads() {
                return Err(Error::argument(
                    "parts",
                    format!(
                        "part 0 gathers frame windows {:?} and part {i} {:?} (rows before step \
                         0 per column): the parts of a mix must stack frames alike",
                        first.leads(),
                        part.leads()
                    ),
                ));
            }
        }
        let mut offsets = Vec::with_capacity(parts.len() + 1);
        offsets.push(0usize);
        for &c in counts {
            let next = offsets[offsets.len() - 1]
                .checked_add(c)
                .ok_or_else(|| Error::argument("counts", "the counts overflow"))?;
            offsets.push(next);
        }
        if offsets[parts.len()] == 0 {
            return Err(Error::argument(
                "counts",
                "the counts sum to 0: a batch needs at least one slice",
            ));
        }
        let columns = first
            .columns
            .iter()
            .map(|c| GatherColumn {
                name: c.name.clone(),
                data_type: c.data_type.clone(),
                shape: c.shape.clone(),
                width: c.width,
                lead: c.lead,
                // Never read: every gather of a mix goes to its parts.
                source: ColumnSource::Stored(vec![]),
            })
            .collect();
        Ok(Gatherer {
            snap: first.snap.clone(),
            tails: super::into::Tails::of_parts(&parts),
            columns,
            episode_flags: vec![],
            segment_first_episode: vec![],
            ra: Default::default(),
            stack: None,
            mix: Some(Box::new(Mix {
                parts,
                counts: counts.to_vec(),
                offsets,
            })),
        })
    }

    /// Whether this gatherer is a mix of several ([`Gatherer::mixed`]).
    pub fn is_mixed(&self) -> bool {
        self.mix.is_some()
    }

    /// The parts of a mixed gatherer and their slices per batch; `None` for a plain one.
    pub fn mix_parts(&self) -> Option<(&[Arc<Gatherer>], &[usize])> {
        self.mix
            .as_ref()
            .map(|m| (m.parts.as_slice(), m.counts.as_slice()))
    }

    /// The part each slice of a batch of `num_slices` slices comes from (as [`Batch::source`]
    /// says after [`Gatherer::gather`]): all 0 for a plain gatherer; for a mix, `i` at positions
    /// `[offset_i, offset_i + count_i)`, and the last part's index past the mix's batch (plans of
    /// another size are refused by the gathers).
    pub fn slice_sources(&self, num_slices: usize) -> Vec<u16> {
        let mut out = Vec::with_capacity(num_slices);
        self.fill_sources(&mut out, num_slices);
        out
    }

    /// [`Gatherer::slice_sources`] into `out`, reusing its memory.
    pub(super) fn fill_sources(&self, out: &mut Vec<u16>, num_slices: usize) {
        out.clear();
        let Some(m) = &self.mix else {
            out.resize(num_slices, 0);
            return;
        };
        for (i, &c) in m.counts.iter().enumerate() {
            let n = c.min(num_slices - out.len());
            out.extend(std::iter::repeat_n(i as u16, n));
        }
        out.resize(num_slices, (m.parts.len() - 1) as u16);
    }

    /// The checks of a plan that [`Gatherer::gather_into`] makes before writing anything: every
    /// slice at most `l` steps and of an episode position the snapshot has (for a mix: a plan of
    /// its batch size, each part's range checked by that part).
    pub(super) fn check_plan(&self, plan: &[SliceRef], l: usize) -> Result<()> {
        match &self.mix {
            Some(m) => m.check_plan(plan, l),
            None => self.check_slices(plan, l),
        }
    }
}

impl Mix {
    /// Each part with its share of `plan` (cut short where `plan` is).
    pub(super) fn ranges<'p>(
        &self,
        plan: &'p [SliceRef],
    ) -> impl Iterator<Item = (&Arc<Gatherer>, &'p [SliceRef])> {
        self.parts
            .iter()
            .zip(self.offsets.windows(2))
            .map(|(p, w)| {
                let (a, b) = (w[0].min(plan.len()), w[1].min(plan.len()));
                (p, &plan[a..b])
            })
    }

    /// The parts.
    pub(super) fn parts(&self) -> &[Arc<Gatherer>] {
        &self.parts
    }

    fn check_plan(&self, plan: &[SliceRef], l: usize) -> Result<()> {
        let total = self.offsets[self.parts.len()];
        if plan.len() != total {
            return Err(Error::argument(
                "plan",
                format!(
                    "a plan of {} slices for a mix of {total} slices per batch (counts {:?}): \
                     plan it with a MixSampler of these counts",
                    plan.len(),
                    self.counts
                ),
            ));
        }
        self.ranges(plan)
            .enumerate()
            .try_for_each(|(i, (part, range))| {
                part.check_plan(range, l).map_err(|e| match e {
                    Error::InvalidArgument { argument, reason } => Error::InvalidArgument {
                        argument,
                        reason: format!("part {i} of the mix: {reason}"),
                    },
                    e => e,
                })
            })
    }

    /// [`Gatherer::gather_into`] and [`Gatherer::gather_compact`] of a mix: the plan and
    /// destinations checked whole, then each part gathers its range of slices into its range of
    /// every destination (`tails`: the mix's tail columns, one row per slice; `layout`: each
    /// column's bytes per row and rows before each slice's step 0, see [`Gatherer::leads`]).
    pub(super) fn gather_any(
        &self,
        plan: &[SliceRef],
        l: usize,
        (mut columns, flags, mut episode_id, mut start_step): Dest<'_>,
        layout: &[(usize, usize)],
        tails: &[bool],
    ) -> Result<()> {
        self.check_plan(plan, l)?;
        let b = plan.len();
        if columns.len() != layout.len() {
            return Err(Error::argument(
                "dest",
                format!(
                    "{} destination columns for {} gathered columns",
                    columns.len(),
                    layout.len()
                ),
            ));
        }
        let steps = b.checked_mul(l).ok_or_else(|| {
            Error::argument(
                "slice_len",
                format!("{b} slices of {l} steps overflow a count of steps"),
            )
        })?;
        // Bytes of `n` slices of a column: one row each for a tail, else `l + lead` rows.
        let bytes = |n: usize, (row, lead): (usize, usize), tail: bool| match tail {
            true => n.checked_mul(row),
            false => n.checked_mul(l.checked_add(lead)?)?.checked_mul(row),
        };
        let short = columns
            .iter()
            .zip(layout)
            .zip(tails)
            .any(|((d, &r), &t)| bytes(b, r, t).is_none_or(|need| d.len() < need));
        let flags_short = match &flags {
            FlagsInto::Planes(p) => p.iter().any(|f| f.len() < steps),
            FlagsInto::Spans(s) => s.len() / 3 < b,
        };
        if short || flags_short || episode_id.len() < b || start_step.len() < b {
            return Err(Error::argument(
                "dest",
                format!("destinations smaller than a batch of {b} x {l} steps"),
            ));
        }
        fn cut<'a, T>(rest: &mut &'a mut [T], n: usize) -> &'a mut [T] {
            let (head, tail) = std::mem::take(rest).split_at_mut(n);
            *rest = tail;
            head
        }
        let mut flags = flags;
        for (part, range) in self.ranges(plan) {
            let n = range.len();
            let part_columns = columns
                .iter_mut()
                .zip(layout)
                .zip(tails)
                .map(|((c, &r), &t)| cut(c, bytes(n, r, t).expect("checked for all b slices")))
                .collect();
            let part_flags = match &mut flags {
                FlagsInto::Planes(p) => FlagsInto::Planes(p.each_mut().map(|f| cut(f, n * l))),
                FlagsInto::Spans(s) => FlagsInto::Spans(cut(s, n * 3)),
            };
            let ids = cut(&mut episode_id, n);
            let starts = cut(&mut start_step, n);
            part.gather_any(
                range,
                l,
                (part_columns, part_flags, ids, starts),
                (tails, None),
            )?;
        }
        Ok(())
    }
}

impl Batch {
    /// The `source` column of [`Batch::to_record_batch`] (`[B * L]`, the part of each step's
    /// slice), when a slice came from a part other than part 0 and no gathered column is named
    /// `source`.
    pub(super) fn source_column(&self) -> Option<(&'static str, ArrayRef)> {
        let l = self.slice_len.max(1);
        if self.source.iter().all(|&s| s == 0) || self.columns.iter().any(|c| c.name == SOURCE) {
            return None;
        }
        let at = |i: usize| self.source.get(i / l).copied().unwrap_or(0);
        let n = self.num_slices * self.slice_len;
        Some((
            SOURCE,
            Arc::new(UInt16Array::from_iter_values((0..n).map(at))),
        ))
    }
}
