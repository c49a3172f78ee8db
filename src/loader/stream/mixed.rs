//! A mix of streams: every batch takes a fixed number of slices from each of several datasets
//! in object storage (as a mix of local datasets does), each stream read through its own
//! bounded cache by its own [`Runs`]. Batch `k` is assembled in place: the parts' workers
//! gather their batch `k` straight into their slices of ring slot `k % slots` (disjoint ranges
//! of the same buffers), and the batch is handed over once every part has delivered it. No
//! batch is copied on the host.

use std::sync::{Arc, Mutex};

use super::runs::Runs;
use super::{Sink, StreamPlan, StreamStats};
use crate::error::{Error, Result};
use crate::gather::{Batch, BatchColumn, GatherInto, Gatherer};
use crate::index::SliceRef;
use crate::loader::ring::{Ring, StagedBatch, StagingSlot};
use crate::loader::{BatchSource, LoaderOptions, Src};

/// What a mixed streamed [`BatchSource`] holds: one plan per stream, the slices of every batch
/// each one gives (in part order), and the batch's columns.
pub(crate) struct StreamMix {
    pub(crate) parts: Vec<Arc<StreamPlan>>,
    pub(crate) counts: Vec<usize>,
    pub(crate) columns: Vec<(String, arrow::datatypes::DataType, Vec<usize>)>,
    /// Per column, the rows before each slice's step 0 (`K - 1` for a frame window), the same in
    /// every part.
    pub(crate) leads: Vec<usize>,
    /// The part of each slice position of every batch.
    pub(crate) sources: Vec<u16>,
}

impl StreamMix {
    /// Checks the parts (uniform samplers, no following, the same columns in each) and splits
    /// `num_slices` by `weights` ([`crate::sample::mix_counts`]).
    pub(crate) fn new(parts: Vec<StreamPlan>, weights: &[f64], num_slices: usize) -> Result<Self> {
        let counts = crate::sample::mix_counts(weights, num_slices)?;
        let mut columns = None;
        for (i, p) in parts.iter().enumerate() {
            if p.sampler.kind != crate::sample::SamplerKind::Uniform {
                return Err(Error::argument(
                    "sampler",
                    format!(
                        "a mix of streams samples uniform, not '{}': each stream's windows \
                         rotate on their own, so epochs of the parts would not end together",
                        p.sampler.kind.name()
                    ),
                ));
            }
            if p.follow.is_some() {
                return Err(Error::argument(
                    "follow",
                    "a mix of streams does not follow new versions yet: open each stream at \
                     the version to read",
                ));
            }
            let cols: Vec<&str> = p.columns.iter().map(String::as_str).collect();
            let desc = (
                super::describe_columns(p.stream.catalog(), &cols, p.frame_stack)?,
                super::leads(p.stream.catalog(), &p.columns, p.frame_stack),
            );
            match &columns {
                None => columns = Some(desc),
                Some(first) if *first != desc => {
                    return Err(Error::argument(
                        "columns",
                        format!(
                            "stream {i} ({}) gives the columns (and frame-window rows) {desc:?}, \
                             stream 0 {first:?}: the parts of a mix must have the same types and \
                             per-step shapes",
                            p.stream.url()
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        let sources = counts
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| std::iter::repeat_n(i as u16, n))
            .collect();
        let (columns, leads) = columns.unwrap_or_default();
        Ok(Self {
            parts: parts.into_iter().map(Arc::new).collect(),
            counts,
            columns,
            leads,
            sources,
        })
    }

    pub(crate) fn num_slices(&self) -> usize {
        self.counts.iter().sum()
    }

    pub(crate) fn slice_len(&self) -> usize {
        self.parts
            .first()
            .map_or(0, |p| p.sampler.slice_len as usize)
    }

    /// Per column, whether every part's windows can write it as one row per slice.
    pub(crate) fn tail_columns(&self) -> Vec<bool> {
        let mut out = vec![true; self.columns.len()];
        for p in &self.parts {
            for (t, c) in out
                .iter_mut()
                .zip(super::tail_columns(p.stream.catalog(), &p.columns))
            {
                *t &= c;
            }
        }
        out
    }
}

/// The raw destinations (address, bytes) of the batch being assembled in one slot: taken once
/// per batch (from [`StagingSlot::dest`]), so that the parts can write their disjoint slices
/// concurrently.
struct Regions {
    columns: Vec<(usize, usize)>,
    flags: [(usize, usize); 6],
    ids: (usize, usize),
    starts: (usize, usize),
}

impl Regions {
    fn of(d: GatherInto<'_>) -> Self {
        let r = |s: &mut [u8]| (s.as_mut_ptr() as usize, s.len());
        Self {
            columns: d.columns.into_iter().map(r).collect(),
            flags: d.flags.map(r),
            ids: (
                d.episode_id.as_mut_ptr() as usize,
                std::mem::size_of_val(d.episode_id),
            ),
            starts: (
                d.start_step.as_mut_ptr() as usize,
                std::mem::size_of_val(d.start_step),
            ),
        }
    }
}

/// # Safety
/// `(p, n)` must address `n` writable bytes aligned for `T` that nothing else accesses while
/// the slice lives, and `at + len` elements of `T` must fit in them.
unsafe fn part_of<'a, T>((p, n): (usize, usize), at: usize, len: usize) -> Result<&'a mut [T]> {
    let size = std::mem::size_of::<T>();
    if (at + len) * size > n {
        return Err(Error::argument(
            "slots",
            format!(
                "a slot of {n} bytes holds no elements {at}..{} of {size} bytes",
                at + len
            ),
        ));
    }
    // SAFETY: in bounds (checked above); the caller's contract for the rest.
    Ok(unsafe { std::slice::from_raw_parts_mut((p as *mut T).add(at), len) })
}

/// The number of the batch a slot is assembling, and that slot's destinations.
type Assembling = (u64, Arc<Regions>);

/// The ring a mix's parts assemble batches in.
pub(crate) struct MixRing<S: StagingSlot + ?Sized> {
    pub(crate) ring: Arc<Ring<S>>,
    /// Per slot: the batch being assembled in it and its destinations.
    regions: Vec<Mutex<Option<Assembling>>>,
    /// Per column: its bytes per slice in a slot (one row for a tail column, else `L`).
    per_slice: Vec<usize>,
}

impl<S: StagingSlot + ?Sized> MixRing<S> {
    /// Gathers `plan` (a part's batch `k`, by `gatherer`) into slices `at..` of batch `k`'s
    /// slot, once batch `k - slots` is released.
    fn fill_part(&self, k: u64, gatherer: &Gatherer, plan: &[SliceRef], at: usize) -> Result<()> {
        let ring = &self.ring;
        if !ring.gate.wait_for(k) {
            return Err(Error::invalid_argument("the loader was stopped"));
        }
        let slot = (k % ring.slots.len() as u64) as usize;
        let regions = {
            let mut r = self.regions[slot].lock().unwrap_or_else(|e| e.into_inner());
            match &*r {
                Some((held, regions)) if *held == k => regions.clone(),
                _ => {
                    let mut memory = ring.slots[slot].lock().unwrap_or_else(|e| e.into_inner());
                    let regions = Arc::new(Regions::of(memory.dest()));
                    *r = Some((k, regions.clone()));
                    regions
                }
            }
        };
        let (n, l) = (plan.len(), ring.slice_len);
        // SAFETY: the regions address the slot's memory, which its owner keeps alive and in
        // place while the loader runs (a slot's memory is replaced only between batches, after
        // every part delivered its batch and the consumer released it); batch `k` holds the
        // slot until then, and each part writes only its own slices `at..at + n`.
        let dest = unsafe {
            GatherInto {
                columns: regions
                    .columns
                    .iter()
                    .zip(&self.per_slice)
                    .map(|(&r, &per)| part_of(r, at * per, n * per))
                    .collect::<Result<_>>()?,
                flags: {
                    let mut f = Vec::with_capacity(6);
                    for &r in &regions.flags {
                        f.push(part_of(r, at * l, n * l)?);
                    }
                    f.try_into()
                        .map_err(|_| Error::invalid_argument("six flag planes"))?
                },
                episode_id: part_of(regions.ids, at, n)?,
                start_step: part_of(regions.starts, at, n)?,
            }
        };
        match &ring.tails {
            Some(t) => gatherer.gather_into_with_tails(plan, l, dest, t),
            None => gatherer.gather_into(plan, l, dest),
        }
    }
}

/// The batches of a mix of streams, assembled in a ring of slots: every part's [`Runs`] gathers
/// into its slices of the slot of each batch.
pub(crate) struct MixStream<S: StagingSlot + ?Sized> {
    parts: Vec<Runs<()>>,
    pub(crate) mix: Arc<MixRing<S>>,
    num_slices: usize,
    next: u64,
}

impl<S: StagingSlot + ?Sized + 'static> MixStream<S> {
    /// Starts every part of `mix` (parts with no slice download nothing) from `opts.start`,
    /// each with `opts`' workers and prefetch, gathering into `slots`.
    pub(crate) fn new(
        mix: &StreamMix,
        opts: LoaderOptions,
        slots: Vec<Box<S>>,
        batch_bytes: u64,
    ) -> Result<Self> {
        let start = opts.start.unwrap_or(0);
        let ring = Arc::new(Ring::new(slots, start, batch_bytes, mix.slice_len())?);
        let tails = ring
            .tails
            .clone()
            .unwrap_or_else(|| vec![false; mix.columns.len()]);
        let l = mix.slice_len();
        // Per slice: one row of a tail (a frame window's one frame), else its slice (a frame
        // window's `L + K - 1` frames).
        let per_slice = super::column_step_bytes(&mix.columns)
            .iter()
            .zip(&tails)
            .zip(&mix.leads)
            .map(|((&s, &t), &lead)| {
                if t {
                    crate::gather::tail_bytes(s, lead)
                } else {
                    crate::gather::slice_bytes(s, lead, l)
                }
            })
            .collect();
        let n = ring.slots.len();
        let ring = Arc::new(MixRing {
            ring,
            regions: (0..n).map(|_| Mutex::new(None)).collect(),
            per_slice,
        });
        let mut parts = Vec::new();
        let mut at = 0;
        for (plan, &count) in mix.parts.iter().zip(&mix.counts) {
            if count > 0 {
                let sink: Sink<()> = {
                    let ring = ring.clone();
                    Arc::new(move || {
                        let ring = ring.clone();
                        Box::new(move |k: u64, g: &Gatherer, plan: &[SliceRef]| {
                            ring.fill_part(k, g, plan, at)
                        })
                    })
                };
                let source = BatchSource(Src::Streamed(plan.clone()));
                parts.push(Runs::new(&source, opts.clone(), sink)?);
            }
            at += count;
        }
        Ok(Self {
            parts,
            mix: ring,
            num_slices: mix.num_slices(),
            next: start,
        })
    }

    /// The next batch once every part delivered it; the first error of a part, at the batch it
    /// happened in; `None` at the end.
    pub(crate) fn next_batch(&mut self) -> Option<Result<StagedBatch>> {
        let k = self.next;
        let mut error = None;
        for p in &mut self.parts {
            match p.next_batch()? {
                Ok(()) => {}
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        self.next += 1;
        Some(match error {
            Some(e) => Err(e),
            None => Ok(StagedBatch {
                number: k,
                slot: (k % self.mix.ring.slots.len() as u64) as usize,
                num_slices: self.num_slices,
            }),
        })
    }

    pub(crate) fn position(&self) -> u64 {
        self.next
    }

    /// What every part downloaded and held: sums (the peaks too, a bound on the parts' peak
    /// together).
    pub(crate) fn stats(&self) -> StreamStats {
        self.parts.iter().fold(StreamStats::default(), |a, p| {
            let s = p.stats();
            StreamStats {
                cache_bytes: a.cache_bytes + s.cache_bytes,
                peak_cache_bytes: a.peak_cache_bytes + s.peak_cache_bytes,
                cache_limit: a.cache_limit + s.cache_limit,
                ..a.plus(&s)
            }
        })
    }

    /// Every part's window of its batch `k`.
    pub(crate) fn window_episodes(&self, k: u64) -> Vec<std::ops::Range<u64>> {
        self.parts
            .iter()
            .flat_map(|p| p.window_episodes(k))
            .collect()
    }
}

impl<S: StagingSlot + ?Sized> Drop for MixStream<S> {
    fn drop(&mut self) {
        // Wake the parts' workers waiting for a slot before their runs join them.
        self.mix.ring.gate.stop();
    }
}

/// A slot a [`crate::StreamLoader`] of a mix assembles a host batch in.
pub(crate) struct BatchSlot(pub(crate) Batch);

impl StagingSlot for BatchSlot {
    fn dest(&mut self) -> GatherInto<'_> {
        let b = &mut self.0;
        GatherInto {
            columns: b
                .columns
                .iter_mut()
                .map(|c| c.data.as_slice_mut())
                .collect(),
            flags: [
                &mut b.mask,
                &mut b.is_first,
                &mut b.is_last,
                &mut b.terminated,
                &mut b.truncated,
                &mut b.slice_end,
            ]
            .map(|v| v.as_mut_slice()),
            episode_id: &mut b.episode_id,
            start_step: &mut b.start_step,
        }
    }
}

/// A host batch of `mix`'s shape (reusing `batch`'s memory where it has it).
pub(crate) fn shaped(mix: &StreamMix, mut batch: Batch) -> Batch {
    let (b, l) = (mix.num_slices(), mix.slice_len());
    batch.num_slices = b;
    batch.slice_len = l;
    let same = batch.columns.len() == mix.columns.len()
        && batch
            .columns
            .iter()
            .zip(mix.columns.iter().zip(&mix.leads))
            .all(|(c, ((n, dt, shape), &lead))| {
                c.name == *n && c.data_type == *dt && c.shape == *shape && c.lead == lead
            });
    if !same {
        batch.columns = mix
            .columns
            .iter()
            .zip(&mix.leads)
            .map(|((name, dt, shape), &lead)| BatchColumn {
                name: name.clone(),
                data_type: dt.clone(),
                shape: shape.clone(),
                width: shape.iter().product(),
                lead,
                data: arrow::buffer::MutableBuffer::new(0),
            })
            .collect();
    }
    for c in &mut batch.columns {
        let n = b * c.slice_bytes(l);
        c.data.resize(n, 0);
    }
    for v in batch.flag_planes_mut() {
        v.resize(b * l, 0);
    }
    batch.episode_id.resize(b, 0);
    batch.start_step.resize(b, 0);
    // Into the batch's own memory: no allocation for a recycled batch.
    batch.source.clone_from(&mix.sources);
    batch
}
