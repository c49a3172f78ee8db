//! The episode index: where every episode of a snapshot lives, built from episode tables only.

/// Position and extent of every episode of a snapshot, in id order. O(episodes) memory
/// (16 bytes per episode, plus 16 per segment); built from the segments' episode tables without
/// touching transitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpisodeIndex {
    first_id: u64,
    start: Vec<u64>,
    length: Vec<u64>,
    rows: u64,
    /// Position of each segment's first episode (ascending).
    seg_first: Vec<usize>,
    /// Snapshot row of each segment's first row: an episode's row within its segment is its
    /// `start` minus its segment's.
    seg_row0: Vec<u64>,
    /// Every episode's row within its segment, kept only when some segment's `row_start`s are
    /// not the running sums of its lengths (never for an episode table that opened).
    segment_row: Option<Vec<u64>>,
    /// Each segment's first episode id, kept only when ids are not dense: an index over some
    /// segments of a version ([`EpisodeIndex::from_sparse_segments`]).
    seg_first_id: Option<Vec<u64>>,
}

/// Where one episode lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpisodeLocation {
    /// Episode id.
    pub episode_id: u64,
    /// Position of its segment in the snapshot.
    pub segment: usize,
    /// First row within the segment.
    pub segment_row: u64,
    /// First row within the snapshot (rows numbered over all segments in order).
    pub start: u64,
    /// Number of transitions.
    pub length: u64,
}

impl EpisodeIndex {
    /// Builds the index from each segment's episodes, in order: their first rows within the
    /// segment and their lengths (the `row_start` and `length` columns of its episode table).
    /// Cost O(episodes).
    pub fn from_segments<'a>(
        first_id: u64,
        segments: impl IntoIterator<Item = (&'a [u64], &'a [u64])>,
    ) -> Self {
        let mut idx = EpisodeIndex {
            first_id,
            ..Default::default()
        };
        idx.push_segments(segments);
        idx
    }

    /// Builds the index of some segments of a version, not necessarily adjacent (a streaming
    /// cache's resident window): each with its first episode id, row starts and lengths. Episode
    /// ids keep their values (dense within a segment, with gaps between segments), so positions
    /// and ids are no longer `id = first_id + position`: use [`EpisodeIndex::position`].
    /// Such an index is never [`EpisodeIndex::extended`].
    pub fn from_sparse_segments<'a>(
        segments: impl IntoIterator<Item = (u64, &'a [u64], &'a [u64])>,
    ) -> Self {
        let segments: Vec<_> = segments.into_iter().collect();
        let ids: Vec<u64> = segments.iter().map(|s| s.0).collect();
        let mut idx = Self::from_segments(
            ids.first().copied().unwrap_or(0),
            segments.iter().map(|s| (s.1, s.2)),
        );
        let dense = ids
            .iter()
            .zip(&idx.seg_first)
            .all(|(&id, &pos)| id == idx.first_id + pos as u64);
        if !dense {
            idx.seg_first_id = Some(ids);
        }
        idx
    }

    /// Appends `segments`, each with bulk copies of its columns (one pass for the running sums):
    /// nothing per episode but one addition.
    fn push_segments<'a>(&mut self, segments: impl IntoIterator<Item = (&'a [u64], &'a [u64])>) {
        let segments: Vec<_> = segments.into_iter().collect();
        let n: usize = segments.iter().map(|(s, l)| s.len().min(l.len())).sum();
        self.start.reserve_exact(n);
        self.length.reserve_exact(n);
        for (starts, lengths) in segments {
            let n = starts.len().min(lengths.len());
            let (starts, lengths, pos) = (&starts[..n], &lengths[..n], self.start.len());
            let row0 = self.rows;
            self.seg_first.push(pos);
            self.seg_row0.push(row0);
            self.length.extend_from_slice(lengths);
            // Saturating: lengths come from episode tables on disk.
            let (mut rows, mut contiguous) = (row0, true);
            self.start
                .extend(starts.iter().zip(lengths).map(|(&r, &l)| {
                    let s = rows;
                    contiguous &= r == s - row0;
                    rows = rows.saturating_add(l);
                    s
                }));
            self.rows = rows;
            if !contiguous && self.segment_row.is_none() {
                self.segment_row = Some((0..pos).map(|i| self.derived_row(i)).collect());
            }
            if let Some(r) = &mut self.segment_row {
                r.extend_from_slice(starts);
            }
        }
    }

    /// The segment of the `i`-th episode. O(log segments).
    fn segment_of(&self, i: usize) -> usize {
        self.seg_first.partition_point(|&f| f <= i) - 1
    }

    /// The row within its segment of the `i`-th episode, from the running sums.
    fn derived_row(&self, i: usize) -> u64 {
        self.start[i] - self.seg_row0[self.segment_of(i)]
    }

    /// The index after dropping the first `dropped_segments` segments (retention) and appending
    /// `new_segments` (as in [`EpisodeIndex::from_segments`]): extended in O(new episodes +
    /// dropped episodes), not rebuilt.
    pub fn extended<'a>(
        &self,
        dropped_segments: usize,
        new_segments: impl IntoIterator<Item = (&'a [u64], &'a [u64])>,
    ) -> Self {
        debug_assert!(
            self.seg_first_id.is_none(),
            "sparse indexes are not extended"
        );
        let dropped = dropped_segments.min(self.seg_first.len());
        let cut = self.seg_first.get(dropped).copied().unwrap_or(self.len());
        let row_cut = self.start.get(cut).copied().unwrap_or(self.rows);
        let mut idx = EpisodeIndex {
            first_id: self.first_id + cut as u64,
            start: self.start[cut..].iter().map(|s| s - row_cut).collect(),
            length: self.length[cut..].to_vec(),
            rows: self.rows - row_cut,
            seg_first: self.seg_first[dropped..].iter().map(|f| f - cut).collect(),
            seg_row0: self.seg_row0[dropped..]
                .iter()
                .map(|r| r - row_cut)
                .collect(),
            segment_row: self.segment_row.as_ref().map(|r| r[cut..].to_vec()),
            seg_first_id: None,
        };
        // Kept only while some segment needs it (the one that did may be gone).
        if let Some(rows) = &idx.segment_row
            && (0..idx.len()).all(|i| rows[i] == idx.derived_row(i))
        {
            idx.segment_row = None;
        }
        idx.push_segments(new_segments);
        idx
    }

    /// Number of episodes.
    pub fn len(&self) -> usize {
        self.length.len()
    }
    /// Whether there are no episodes.
    pub fn is_empty(&self) -> bool {
        self.length.is_empty()
    }
    /// Total transitions.
    pub fn num_rows(&self) -> u64 {
        self.rows
    }
    /// Id of the first episode. Ids are dense (episode `i` has id `first_id() + i`) except in
    /// an index over some segments of a version ([`EpisodeIndex::from_sparse_segments`]).
    pub fn first_id(&self) -> u64 {
        self.first_id
    }
    /// Whether episode `i` has id `first_id() + i` for every `i`.
    pub fn is_dense(&self) -> bool {
        self.seg_first_id.is_none()
    }
    /// Position of the episode with id `id`, if present.
    pub fn position(&self, id: u64) -> Option<usize> {
        let i = match &self.seg_first_id {
            None => id.checked_sub(self.first_id)? as usize,
            Some(ids) => {
                let s = ids.partition_point(|&f| f <= id).checked_sub(1)?;
                let i = self.seg_first[s] + (id - ids[s]) as usize;
                let end = self.seg_first.get(s + 1).copied().unwrap_or(self.len());
                if i >= end {
                    return None;
                }
                i
            }
        };
        (i < self.len()).then_some(i)
    }
    /// Episode lengths in id order.
    pub fn lengths(&self) -> &[u64] {
        &self.length
    }
    /// Snapshot row where each episode starts.
    pub fn starts(&self) -> &[u64] {
        &self.start
    }
    /// Location of the `i`-th episode (not its id).
    pub fn get(&self, i: usize) -> EpisodeLocation {
        let segment = self.segment_of(i);
        EpisodeLocation {
            episode_id: match &self.seg_first_id {
                None => self.first_id + i as u64,
                Some(ids) => ids[segment] + (i - self.seg_first[segment]) as u64,
            },
            segment,
            segment_row: match &self.segment_row {
                Some(r) => r[i],
                None => self.derived_row(i),
            },
            start: self.start[i],
            length: self.length[i],
        }
    }
    /// Location of the episode with id `id`, if present.
    pub fn by_id(&self, id: u64) -> Option<EpisodeLocation> {
        self.position(id).map(|i| self.get(i))
    }
    /// Position of the episode containing snapshot row `row` (binary search, O(log E)).
    pub fn position_of_row(&self, row: u64) -> Option<usize> {
        if row >= self.rows {
            return None;
        }
        Some(self.start.partition_point(|&s| s <= row) - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(segment, segment_row, start, length)` of every episode, as the old layout stored them.
    fn rows(idx: &EpisodeIndex) -> Vec<(usize, u64, u64, u64)> {
        (0..idx.len())
            .map(|i| idx.get(i))
            .map(|l| (l.segment, l.segment_row, l.start, l.length))
            .collect()
    }

    #[test]
    fn locations_and_extension_match_a_rebuild_with_or_without_running_row_starts() {
        let a: (&[u64], &[u64]) = (&[0, 3, 5], &[3, 2, 4]);
        let b: (&[u64], &[u64]) = (&[0, 7], &[7, 1]);
        // Not running sums: rows left between episodes (never in an episode table that opens).
        let gaps: (&[u64], &[u64]) = (&[2, 10], &[3, 5]);
        let idx = EpisodeIndex::from_segments(4, [a, b]);
        assert!(idx.segment_row.is_none(), "derived from the running sums");
        assert_eq!(
            rows(&idx),
            [
                (0, 0, 0, 3),
                (0, 3, 3, 2),
                (0, 5, 5, 4),
                (1, 0, 9, 7),
                (1, 7, 16, 1)
            ]
        );
        assert_eq!(idx.by_id(7).unwrap().segment, 1);
        assert_eq!(idx.position_of_row(16), Some(4));
        // Some segments of a version: ids keep their values, with a gap between segments.
        let sparse = EpisodeIndex::from_sparse_segments([(4, a.0, a.1), (20, b.0, b.1)]);
        assert!(!sparse.is_dense());
        let ids: Vec<u64> = (0..sparse.len())
            .map(|i| sparse.get(i).episode_id)
            .collect();
        assert_eq!(ids, [4, 5, 6, 20, 21]);
        assert_eq!(rows(&sparse), rows(&idx), "locations as if adjacent");
        assert_eq!(sparse.position(21), Some(4));
        assert_eq!(sparse.by_id(20).unwrap().segment, 1);
        for missing in [3, 7, 19, 22] {
            assert_eq!(sparse.position(missing), None, "id {missing}");
        }
        let adjacent = EpisodeIndex::from_sparse_segments([(4, a.0, a.1), (7, b.0, b.1)]);
        assert!(adjacent.is_dense());
        assert_eq!(adjacent, idx);
        let with_gaps = EpisodeIndex::from_segments(4, [a, gaps, b]);
        assert_eq!(
            rows(&with_gaps)[3..5],
            [(1, 2, 9, 3), (1, 10, 12, 5)],
            "rows within the segment as given"
        );
        assert_eq!(rows(&with_gaps)[5], (2, 0, 17, 7));
        // Extending equals rebuilding, including once the segment with gaps is dropped.
        let empty: (&[u64], &[u64]) = (&[], &[]);
        for (base, dropped, new, rebuilt) in [
            (&idx, 1, vec![a], vec![b, a]),
            (&with_gaps, 1, vec![b], vec![gaps, b, b]),
            (&with_gaps, 2, vec![a], vec![b, a]),
            (&idx, 2, vec![empty, b], vec![empty, b]),
        ] {
            let first =
                base.first_id() + base.seg_first.get(dropped).copied().unwrap_or(base.len()) as u64;
            assert_eq!(
                base.extended(dropped, new),
                EpisodeIndex::from_segments(first, rebuilt),
                "dropped {dropped}"
            );
        }
    }
}
