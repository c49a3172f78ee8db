//! Decoded frames kept in memory ([`super::FrameStack::with_cache`]): a frame column's first
//! frames, decoded once when the gatherer is made into one buffer, which the gather then copies
//! from instead of decoding again.
//!
//! Which frames: the snapshot's segments in order, each from its first row, as many as the
//! budget holds (every frame of a dataset whose decoded frames fit). Under uniform sampling any
//! set of cached frames of that size serves the same share of the frames asked for, so the first
//! ones do as well as any, and the cache needs no map from rows to slots, no eviction and no
//! lock: the buffer is written before any worker reads it and never after.
//!
//! Gatherers of one snapshot with the same budget share one cache (a process-wide list of the
//! live ones, held weakly), so that the loader, its resumed copy and a one-thread gather of the
//! same data do not each hold the frames.

use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::frames::{FrameColumn, FrameDecoder};
use crate::store::{Segment, Snapshot};

/// Frames decoded by one job of the fill (a job is part of one episode).
const JOB_FRAMES: u64 = 4096;

/// The decoded first frames of one frame column of a snapshot.
pub(crate) struct FrameCache {
    /// The column.
    column: String,
    /// The budget it was made with.
    budget: u64,
    /// Every segment of the snapshot, in its order, with the byte where its cached frames start
    /// in `data` and how many rows are cached (holding the segments keeps their addresses, which
    /// identify the snapshot when gatherers look for a cache to share).
    segments: Vec<(Arc<Segment>, usize, u64)>,
    /// The segments holding cached rows, as (segment id, index in `segments`), by id: the
    /// gather finds a slice's segment here for every slice, with a binary search.
    cached: Vec<(u64, usize)>,
    frame_len: usize,
    /// Written by the fill only, before the cache is shared.
    data: memmap2::MmapMut,
    /// Seconds the fill took.
    fill_s: f64,
}

impl std::fmt::Debug for FrameCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameCache")
            .field("column", &self.column)
            .field("frames", &self.frames())
            .field("bytes", &self.data.len())
            .finish()
    }
}

/// What a gatherer's frame caches hold ([`super::Gatherer::frame_cache`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FrameCacheStats {
    /// Frames held, over every frame column.
    pub frames: u64,
    /// Frames the cached columns store, cached or not.
    pub frames_stored: u64,
    /// Bytes of decoded frames held.
    pub bytes: u64,
    /// Seconds their fills took (each cache counted once, however many gatherers share it).
    pub fill_seconds: f64,
}

/// The caches alive in this process, for gatherers of the same snapshot to share.
static LIVE: Mutex<Vec<Weak<FrameCache>>> = Mutex::new(Vec::new());

/// Hands out the caches of one gatherer's frame columns: `budget` bytes over all of them, each
/// column's taken in the order the gatherer asks (a column asked for twice, as an observation
/// and its `next_observation`, gets the same cache).
pub(super) struct Caches {
    budget: u64,
    made: Vec<Arc<FrameCache>>,
}

impl Caches {
    pub(super) fn new(budget: u64) -> Self {
        Self {
            budget,
            made: Vec::new(),
        }
    }

    /// The cache of column `column` of `snap`: one this gatherer already has, a live one of the
    /// same snapshot, column and budget, or a new one filled now. `None` without a budget left.
    pub(super) fn of(
        &mut self,
        snap: &Snapshot,
        column: &FrameColumn,
    ) -> Result<Option<Arc<FrameCache>>> {
        if let Some(c) = self.made.iter().find(|c| c.column == column.name) {
            return Ok(Some(c.clone()));
        }
        if self.budget == 0 {
            return Ok(None);
        }
        let budget = self.budget;
        let live = || {
            let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            live.retain(|w| w.strong_count() > 0);
            let found = live
                .iter()
                .filter_map(Weak::upgrade)
                .find(|c| c.budget == budget && c.is_of(snap, &column.name));
            (live, found)
        };
        // (Its own statement: the lock is released before a fill.)
        let found = live().1;
        let cache = match found {
            Some(c) => c,
            None => {
                // Filled without the list's lock (the fill runs on the rayon pool, whose
                // threads may be making gatherers too); a cache another thread filled meanwhile
                // is taken instead of this one.
                let Some(c) = FrameCache::fill(snap, column, budget)? else {
                    return Ok(None);
                };
                match live() {
                    (_, Some(other)) => other,
                    (mut list, None) => {
                        let c = Arc::new(c);
                        list.push(Arc::downgrade(&c));
                        c
                    }
                }
            }
        };
        self.budget = self.budget.saturating_sub(cache.data.len() as u64);
        self.made.push(cache.clone());
        Ok(Some(cache))
    }
}

impl FrameCache {
    /// Decodes the first frames of `column` of `snap` (segments in order, rows in order), as
    /// many whole frames as `budget` bytes hold, in parallel on the rayon pool. `None` if not one
    /// frame fits. A frame that does not decode is an [`Error::InvalidData`] naming the column,
    /// the segment file and the episode; a cache larger than the memory the system has available
    /// is an [`Error::InvalidArgument`] about `frame_cache`, before anything is allocated.
    fn fill(snap: &Snapshot, column: &FrameColumn, budget: u64) -> Result<Option<Self>> {
        let t = Instant::now();
        let f = column.spec.frame_len();
        let mut left = budget / f as u64;
        let mut segments = Vec::with_capacity(snap.segments().len());
        let mut bytes = 0usize;
        for seg in snap.segments() {
            let rows = seg.num_rows().min(left);
            segments.push((seg.clone(), bytes, rows));
            bytes += rows as usize * f;
            left -= rows;
        }
        if bytes == 0 {
            return Ok(None);
        }
        check_memory(bytes as u64, budget)?;
        // Anonymous pages, zero until written: nothing is written twice; huge pages where the
        // kernel has them (fewer faults in the fill, fewer TLB misses in the gather's copies).
        let mut data = memmap2::MmapMut::map_anon(bytes)
            .map_err(|e| too_large(bytes as u64, budget, &format!("could not be mapped: {e}")))?;
        #[cfg(target_os = "linux")]
        let _ = data.advise(memmap2::Advice::HugePage);
        // Jobs: up to JOB_FRAMES rows of one episode (an episode's rows are one record batch's).
        let mut jobs: Vec<(&Segment, usize, u64, &mut [u8])> = Vec::new();
        let mut rest = &mut data[..];
        for (seg, _, rows) in &segments {
            let table = seg.episode_table();
            let mut next = 0;
            for (e, (&start, &len)) in table.row_starts().iter().zip(table.lengths()).enumerate() {
                // The jobs' destinations follow each other: so must the episodes' rows.
                if start != next && start < *rows {
                    return Err(located(
                        Error::invalid_data(format!(
                            "episode rows start at {start}, after {next} rows of episodes"
                        )),
                        seg,
                        e,
                        &column.name,
                    ));
                }
                next = start + len;
                let mut row = start;
                while row < (start + len).min(*rows) {
                    let n = (start + len).min(*rows).min(row + JOB_FRAMES) - row;
                    let (dst, tail) = std::mem::take(&mut rest).split_at_mut(n as usize * f);
                    jobs.push((seg, e, row, dst));
                    rest = tail;
                    row += n;
                }
            }
        }
        if !rest.is_empty() {
            return Err(Error::invalid_data(format!(
                "the episode tables of frame column `{}` do not cover its rows",
                column.name
            )));
        }
        let decode = |seg: &Segment, row: u64, dst: &mut [u8]| -> Result<()> {
            let mut dec = column.decoder()?;
            let run = seg.frames(&column.name, row, dst.len() / f)?;
            for (i, out) in dst.chunks_exact_mut(f).enumerate() {
                dec.decode_into(run.frame(i)?, out)?;
            }
            Ok(())
        };
        jobs.into_par_iter().try_for_each(|(seg, e, row, dst)| {
            decode(seg, row, dst).map_err(|err| located(err, seg, e, &column.name))
        })?;
        let mut cached: Vec<(u64, usize)> = (segments.iter().enumerate())
            .filter(|(_, (_, _, rows))| *rows > 0)
            .map(|(i, (s, ..))| (s.entry().id, i))
            .collect();
        cached.sort_unstable();
        Ok(Some(Self {
            column: column.name.clone(),
            budget,
            segments,
            cached,
            frame_len: f,
            data,
            fill_s: t.elapsed().as_secs_f64(),
        }))
    }

    /// Whether this is a cache of column `column` of `snap` (the same segments, in order).
    fn is_of(&self, snap: &Snapshot, column: &str) -> bool {
        self.column == column
            && self.segments.len() == snap.segments().len()
            && self
                .segments
                .iter()
                .zip(snap.segments())
                .all(|((a, ..), b)| Arc::ptr_eq(a, b))
    }

    /// Frames held.
    fn frames(&self) -> u64 {
        (self.data.len() / self.frame_len) as u64
    }

    /// The decoded frames of `seg`'s first rows that are held, row after row (empty if none).
    /// `seg` is one of the snapshot's segments (ids are unique within a dataset).
    pub(super) fn rows(&self, seg: &Segment) -> &[u8] {
        let id = seg.entry().id;
        match self.cached.binary_search_by_key(&id, |&(id, _)| id) {
            Ok(i) => {
                let (_, at, rows) = self.segments[self.cached[i].1];
                &self.data[at..at + rows as usize * self.frame_len]
            }
            Err(_) => &[],
        }
    }

    /// Adds this cache to `stats`.
    pub(super) fn add_to(&self, stats: &mut FrameCacheStats) {
        stats.frames += self.frames();
        stats.frames_stored += self
            .segments
            .iter()
            .map(|(s, ..)| s.num_rows())
            .sum::<u64>();
        stats.bytes += self.data.len() as u64;
        stats.fill_seconds += self.fill_s;
    }
}

impl super::Gatherer {
    /// What this gatherer's decoded-frame caches hold ([`super::FrameStack::with_cache`]); all
    /// zeros without one.
    pub fn frame_cache(&self) -> FrameCacheStats {
        let mut stats = FrameCacheStats::default();
        let mut seen: Vec<*const FrameCache> = Vec::new();
        for c in &self.columns {
            if let super::ColumnSource::Frames(fs) = &c.source
                && let Some(cache) = &fs.cache
                && !seen.contains(&Arc::as_ptr(cache))
            {
                seen.push(Arc::as_ptr(cache));
                cache.add_to(&mut stats);
            }
        }
        stats
    }
}

/// `e` naming the segment file (relative to the dataset), the frame column `column` and the
/// episode at `table_row` of the segment's episode table.
pub(super) fn located(e: Error, seg: &Segment, table_row: usize, column: &str) -> Error {
    let e = e.in_input(&seg.entry().path).in_column(column);
    match seg.episode_table().ids().get(table_row) {
        Some(&id) => e.in_episode(id as i64),
        None => e,
    }
}

/// Bytes of one slice's destination from which cached frames are copied with non-temporal
/// stores ([`super::simd::copy_streaming`]): a window of 64 steps of Atari frames is 473 KB, and
/// a batch of such slices is far larger than the caches.
pub(super) const STREAM_SLICE_BYTES: usize = 256 << 10;

/// Frame `row` of a segment into `out`: copied from `cached` ([`FrameCache::rows`] of that
/// segment) where it holds the row (with non-temporal stores if `streaming`), else decoded with
/// `dec` from the bytes `stored` gives.
pub(super) fn frame_into<'a>(
    (cached, streaming): (&[u8], bool),
    row: u64,
    stored: impl FnOnce() -> Result<&'a [u8]>,
    out: &mut [u8],
    dec: &mut FrameDecoder,
) -> Result<()> {
    let f = out.len();
    let at = row as usize * f;
    match cached.get(at..at + f) {
        Some(frame) if streaming => {
            super::simd::copy_streaming(out, frame);
            Ok(())
        }
        Some(frame) => {
            out.copy_from_slice(frame);
            Ok(())
        }
        None => dec.decode_into(stored()?, out),
    }
}

/// A cache of `bytes` is refused when the system reports less memory available: Linux's
/// `MemAvailable`, or what the process's cgroup (v2) still allows when that is less, as in a
/// container; elsewhere nothing is checked.
fn check_memory(bytes: u64, budget: u64) -> Result<()> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let system = read("/proc/meminfo").and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    });
    let number = |p: &str| read(p).and_then(|v| v.trim().parse::<u64>().ok());
    let cgroup = number("/sys/fs/cgroup/memory.max")
        .zip(number("/sys/fs/cgroup/memory.current"))
        .map(|(max, used)| max.saturating_sub(used));
    let available = match (system, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    match available {
        Some(a) if a < bytes => Err(too_large(
            bytes,
            budget,
            &format!(
                "more than the {} of memory available",
                crate::format::human_bytes(a)
            ),
        )),
        _ => Ok(()),
    }
}

fn too_large(bytes: u64, budget: u64, why: &str) -> Error {
    Error::argument(
        "frame_cache",
        format!(
            "a cache of {} of decoded frames (budget {}): {why}; give a smaller budget",
            crate::format::human_bytes(bytes),
            crate::format::human_bytes(budget)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More memory than the machine has is refused before anything is mapped, naming the option.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_cache_larger_than_the_available_memory_is_refused() {
        match check_memory(1 << 60, 1 << 60) {
            Err(Error::InvalidArgument {
                argument: Some(a),
                reason,
            }) => {
                assert_eq!(a, "frame_cache");
                assert!(reason.contains("memory available"), "{reason}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(check_memory(4096, 4096).is_ok());
    }
}
