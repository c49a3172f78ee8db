//! The episode index: where every episode of a snapshot lives, built from episode tables only.

/// Position and extent of every episode of a snapshot, in id order. O(episodes) memory
/// (28 bytes per episode); built from the segments' episode tables without touching transitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpisodeIndex {
    first_id: u64,
    segment: Vec<u32>,
    segment_row: Vec<u64>,
    start: Vec<u64>,
    length: Vec<u64>,
    rows: u64,
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
        for (seg, (starts, lengths)) in segments.into_iter().enumerate() {
            idx.push_segment(seg as u32, starts, lengths);
        }
        idx
    }

    fn push_segment(&mut self, seg: u32, starts: &[u64], lengths: &[u64]) {
        for (r, l) in starts.iter().zip(lengths) {
            self.segment.push(seg);
            self.segment_row.push(*r);
            self.start.push(self.rows);
            self.length.push(*l);
            // Saturating: lengths come from episode tables on disk.
            self.rows = self.rows.saturating_add(*l);
        }
    }

    /// The index after dropping the first `dropped_segments` segments (retention) and appending
    /// `new_segments` (as in [`EpisodeIndex::from_segments`]): extended in O(new episodes +
    /// dropped episodes), not rebuilt.
    pub fn extended<'a>(
        &self,
        dropped_segments: usize,
        new_segments: impl IntoIterator<Item = (&'a [u64], &'a [u64])>,
    ) -> Self {
        let cut = self
            .segment
            .partition_point(|&s| (s as usize) < dropped_segments);
        let row_cut = self.start.get(cut).copied().unwrap_or(self.rows);
        let mut idx = EpisodeIndex {
            first_id: self.first_id + cut as u64,
            segment: self.segment[cut..]
                .iter()
                .map(|s| s - dropped_segments as u32)
                .collect(),
            segment_row: self.segment_row[cut..].to_vec(),
            start: self.start[cut..].iter().map(|s| s - row_cut).collect(),
            length: self.length[cut..].to_vec(),
            rows: self.rows - row_cut,
        };
        let next_seg = self
            .segment
            .last()
            .map_or(0, |s| *s as usize + 1)
            .saturating_sub(dropped_segments);
        for (i, (starts, lengths)) in new_segments.into_iter().enumerate() {
            idx.push_segment((next_seg + i) as u32, starts, lengths);
        }
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
    /// Id of the first episode (ids are dense: episode `i` has id `first_id() + i`).
    pub fn first_id(&self) -> u64 {
        self.first_id
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
        EpisodeLocation {
            episode_id: self.first_id + i as u64,
            segment: self.segment[i] as usize,
            segment_row: self.segment_row[i],
            start: self.start[i],
            length: self.length[i],
        }
    }
    /// Location of the episode with id `id`, if present.
    pub fn by_id(&self, id: u64) -> Option<EpisodeLocation> {
        let i = id.checked_sub(self.first_id)? as usize;
        (i < self.len()).then(|| self.get(i))
    }
    /// Position of the episode containing snapshot row `row` (binary search, O(log E)).
    pub fn position_of_row(&self, row: u64) -> Option<usize> {
        if row >= self.rows {
            return None;
        }
        Some(self.start.partition_point(|&s| s <= row) - 1)
    }
}
