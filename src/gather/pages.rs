//! [`Gatherer::pages_touched`]: the memory pages of the mapped files that gathering a plan reads,
//! the unit of work of out-of-core sampling (each page not in the page cache is one random read
//! from disk). A child of `gather`, whose private column sources it walks.

use super::*;

impl Gatherer {
    /// The number of distinct memory pages (of [`crate::iofloor::page_size`] bytes) that
    /// gathering `plan` reads from the mapped files: for each slice, the bytes of each gathered
    /// column at the slice's valid steps (stored values, or the bits of stored bool columns), and
    /// for a derived `next_observation` the observation rows it copies and, for a slice that
    /// reaches its episode's last step, that episode's `final_observation` (and its validity bit).
    /// Pages read by several slices count once. Slices of episode positions the snapshot does
    /// not have are skipped (gathering them is an error).
    ///
    /// On data not in the page cache, this is the number of random disk reads a batch costs (the
    /// kernel reads a mapped file a page per fault, the segments being mapped for random access).
    pub fn pages_touched(&self, plan: &[SliceRef]) -> usize {
        self.reads_touched(plan).0
    }

    /// [`Gatherer::pages_touched`], and the number of runs of adjacent pages among them: where
    /// read-ahead asks for a slice's pages at once, the kernel reads each run with one request,
    /// so a batch costs `runs` random reads of the disk (of one or a few pages each).
    ///
    /// On a mix, the pages of every part's share of `plan` (a page two parts read counts once).
    pub fn reads_touched(&self, plan: &[SliceRef]) -> (usize, usize) {
        let mut pages: Vec<usize> = vec![];
        self.pages_of(plan, &mut pages);
        pages.sort_unstable();
        pages.dedup();
        let runs =
            pages.windows(2).filter(|w| w[1] != w[0] + 1).count() + usize::from(!pages.is_empty());
        (pages.len(), runs)
    }

    /// The numbers of the pages `plan` reads, with repeats, appended to `pages`.
    fn pages_of(&self, plan: &[SliceRef], pages: &mut Vec<usize>) {
        if let Some(m) = &self.mix {
            return m
                .ranges(plan)
                .for_each(|(p, range)| p.pages_of(range, pages));
        }
        let page = crate::iofloor::page_size();
        let mut add = |bytes: &[u8]| {
            if let Some(last) = bytes.len().checked_sub(1) {
                let p = bytes.as_ptr() as usize;
                pages.extend(p / page..=(p + last) / page);
            }
        };
        let episodes = self.snap.episodes();
        for s in plan {
            if s.episode as usize >= episodes.len() {
                continue;
            }
            let loc = episodes.get(s.episode as usize);
            let len = loc.length as i64;
            // The valid steps [a, b) of the episode, as `gather_slice` copies them.
            let a = s.start.max(0);
            let b = s.start.saturating_add(s.len as i64).min(len).max(a);
            let n = (b - a) as usize;
            if n == 0 {
                continue;
            }
            let seg = &self.snap.segments()[loc.segment];
            let (bi, r) = seg.locate(loc.segment_row + a as u64);
            for c in &self.columns {
                let step = c.width * elem_size(&c.data_type);
                match &c.source {
                    ColumnSource::Stored(bufs) => {
                        add(&bufs[loc.segment][bi].as_slice()[r * step..(r + n) * step]);
                    }
                    ColumnSource::StoredBool(arrays) => {
                        let bits = arrays[loc.segment][bi].values();
                        let first = bits.offset() + r;
                        add(&bits.inner().as_slice()[first / 8..=(first + n - 1) / 8]);
                    }
                    ColumnSource::Frames(fs) => {
                        let steps = (a as usize, b as usize, len as usize);
                        if let Some(bytes) = fs.stored(seg, loc.segment_row, steps) {
                            add(bytes);
                        }
                    }
                    ColumnSource::DerivedNext { obs, finals } => {
                        let inner = if b == len { n - 1 } else { n };
                        let src = obs[loc.segment][bi].as_slice();
                        add(&src[(r + 1) * step..(r + 1 + inner) * step]);
                        if b == len {
                            let k = s.episode as usize - self.segment_first_episode[loc.segment];
                            let (vals, nulls) = &finals[loc.segment];
                            if let Some(nb) = nulls {
                                let bit = nb.offset() + k;
                                add(&nb.buffer().as_slice()[bit / 8..=bit / 8]);
                            }
                            if !nulls.as_ref().is_some_and(|nb| nb.is_null(k)) {
                                add(&vals.as_slice()[k * step..(k + 1) * step]);
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::BTreeSet;

    use crate::store::Dataset;
    use crate::synth::SynthSpec;

    /// A synthetic dataset (observation 17 floats, action 6 floats, reward) of `transitions`
    /// steps, in segments of about `segment_bytes`.
    fn dataset(dir: &std::path::Path, transitions: u64, segment_bytes: u64) -> Snapshot {
        let spec = SynthSpec {
            transitions,
            mean_episode_len: 50.0,
            seed: 4,
            ..Default::default()
        };
        let ds = Dataset::create(dir.join("d"), &spec.schema().unwrap()).unwrap();
        let mut w = ds
            .writer(
                crate::store::writer::WriterOptions::default()
                    .with_segment_bytes(segment_bytes)
                    .with_batch_bytes(segment_bytes / 2),
            )
            .unwrap();
        spec.write(&mut w, None, |_| {}).unwrap();
        ds.snapshot().unwrap()
    }

    /// The pages of `bytes`.
    fn pages_of(bytes: &[u8], out: &mut BTreeSet<usize>) {
        let page = crate::iofloor::page_size();
        let p = bytes.as_ptr() as usize;
        out.extend(p / page..=(p + bytes.len() - 1) / page);
    }

    /// By hand, through the segment's zero-copy slices rather than the gatherer's sources: the
    /// pages of rows `[a, a + n)` of episode `e` of every stored column named, of the
    /// observation rows after them, and of the final observation when the slice ends the episode.
    fn by_hand(
        snap: &Snapshot,
        e: u32,
        a: u64,
        n: usize,
        stored: &[&str],
        out: &mut BTreeSet<usize>,
    ) {
        let loc = snap.episodes().get(e as usize);
        let seg = &snap.segments()[loc.segment];
        let rows = |from: u64, n: usize, name: &str, out: &mut BTreeSet<usize>| {
            if n == 0 {
                return;
            }
            let batch = seg.slice(loc.segment_row + from, n).unwrap();
            let (buf, dt, width) = values_from_row0(batch.column_by_name(name).unwrap());
            pages_of(&buf.as_slice()[..n * width * elem_size(&dt)], out);
        };
        for name in stored {
            rows(a, n, name, out);
        }
        let ends = a + n as u64 == loc.length;
        rows(a + 1, n - ends as usize, col::OBSERVATION, out);
        if ends {
            let k = e as usize
                - snap.segments()[..loc.segment]
                    .iter()
                    .map(|s| s.episode_table().len())
                    .sum::<usize>();
            let fin = seg.episode_table().final_observation().unwrap();
            assert_eq!(fin.null_count(), 0);
            let (buf, dt, width) = values_from_row0(fin);
            let step = width * elem_size(&dt);
            pages_of(&buf.as_slice()[k * step..(k + 1) * step], out);
        }
    }

    const COLS: [&str; 4] = [
        col::OBSERVATION,
        col::ACTION,
        col::REWARD,
        col::NEXT_OBSERVATION,
    ];
    const STORED: [&str; 3] = [col::OBSERVATION, col::ACTION, col::REWARD];

    #[test]
    fn one_slice_touches_the_pages_of_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dataset(dir.path(), 20_000, 1 << 20);
        let g = Gatherer::try_new(&snap, &COLS).unwrap();
        let idx = snap.episodes();
        // An episode in the middle, and one near the end (in another segment; the very last
        // may be cut shorter than 10 steps).
        let late = (0..idx.len())
            .rev()
            .find(|&e| idx.get(e).length >= 10)
            .unwrap();
        assert_ne!(idx.get(late).segment, idx.get(idx.len() / 2).segment);
        for e in [idx.len() as u32 / 2, late as u32] {
            let len = idx.get(e as usize).length;
            assert!(len >= 10, "episode {e} of {len} steps");
            // Inside the episode; ending at its last step; overhanging both ends (padding).
            for (start, slice_len) in [(1i64, 8u32), (len as i64 - 8, 8), (-3, len as u32 + 6)] {
                let a = start.max(0) as u64;
                let n = ((start + slice_len as i64).min(len as i64) - a as i64) as usize;
                let mut want = BTreeSet::new();
                by_hand(&snap, e, a, n, &STORED, &mut want);
                let plan = [SliceRef {
                    episode: e,
                    start,
                    len: slice_len,
                }];
                assert_eq!(
                    g.pages_touched(&plan),
                    want.len(),
                    "episode {e}, start {start}, {slice_len} steps"
                );
                assert!(!want.is_empty());
                // Runs of adjacent pages: a page whose predecessor is not touched starts one.
                let runs = want
                    .iter()
                    .filter(|&&p| !want.contains(&(p.wrapping_sub(1))))
                    .count();
                assert_eq!(g.reads_touched(&plan), (want.len(), runs));
                assert!(runs <= want.len());
            }
        }
    }

    #[test]
    fn pages_read_by_several_slices_count_once() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dataset(dir.path(), 20_000, 1 << 20);
        let g = Gatherer::try_new(&snap, &COLS).unwrap();
        let s = |episode: u32, start: i64, len: u32| SliceRef {
            episode,
            start,
            len,
        };
        let one = g.pages_touched(&[s(3, 0, 8)]);
        assert!(one > 0);
        assert_eq!(g.pages_touched(&[s(3, 0, 8), s(3, 0, 8), s(3, 0, 8)]), one);
        // A slice inside another reads no page the other does not.
        assert_eq!(g.pages_touched(&[s(3, 0, 8), s(3, 2, 4)]), one);
        // Two far-apart slices: the union, computed by hand.
        let idx = snap.episodes();
        let last = (0..idx.len())
            .rev()
            .find(|&e| idx.get(e).length >= 8)
            .unwrap() as u32;
        let mut want = BTreeSet::new();
        by_hand(&snap, 3, 0, 8, &STORED, &mut want);
        by_hand(&snap, last, 0, 8, &STORED, &mut want);
        assert_eq!(g.pages_touched(&[s(3, 0, 8), s(last, 0, 8)]), want.len());
    }

    #[test]
    fn bool_columns_count_the_pages_of_their_bits() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dataset(dir.path(), 5_000, 1 << 20);
        let g = Gatherer::try_new(&snap, &[col::IS_LAST]).unwrap();
        let loc = snap.episodes().get(5);
        let seg = &snap.segments()[loc.segment];
        let batch = seg.slice(loc.segment_row + 2, 4).unwrap();
        let bits = batch
            .column_by_name(col::IS_LAST)
            .unwrap()
            .as_boolean()
            .values()
            .clone();
        let first = bits.offset();
        let mut want = BTreeSet::new();
        pages_of(
            &bits.inner().as_slice()[first / 8..=(first + 3) / 8],
            &mut want,
        );
        let plan = [SliceRef {
            episode: 5,
            start: 2,
            len: 4,
        }];
        assert_eq!(g.pages_touched(&plan), want.len());
    }

    #[test]
    fn empty_plans_and_foreign_slices_touch_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dataset(dir.path(), 2_000, 1 << 20);
        let g = Gatherer::try_new(&snap, &COLS).unwrap();
        assert_eq!(g.pages_touched(&[]), 0);
        let beyond = snap.episodes().len() as u32;
        let s = |episode: u32, start: i64| SliceRef {
            episode,
            start,
            len: 4,
        };
        // Another snapshot's episode, and windows holding no step of their episode.
        assert_eq!(
            g.pages_touched(&[s(beyond, 0), s(0, -10), s(0, 1 << 20)]),
            0
        );
    }
}
