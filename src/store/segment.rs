//! Segments: the mapped [`Segment`], one segment's transition batches (zero-copy from
//! [`crate::store::ipc`]) with its typed [`EpisodeTable`], checked against its manifest entry.

use std::path::Path;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};

use crate::error::{Error, Result};
use crate::format::meta;
use crate::frames::FrameRun;
use crate::schema::TransitionSchema;
use crate::store::episode::{EpisodeTable, check_file, open_episode_table};
use crate::store::ipc::{MappedIpc, check_offsets, open_ipc_deferring, will_need};
use crate::store::manifest::SegmentEntry;

/// One mapped segment: its transition batches and its episode table.
#[derive(Debug)]
pub struct Segment {
    entry: SegmentEntry,
    file: MappedIpc,
    batch_starts: Vec<u64>,
    episodes: EpisodeTable,
}

impl Segment {
    /// Maps the segment `entry` names under `root` and opens its episode table, checking both
    /// against the manifest entry and each other. O(record batches + episodes): the offsets of
    /// frame columns (8 bytes per frame) are checked where they are read, not here (see
    /// [`Segment::batches`]).
    pub(crate) fn open(
        root: &Path,
        entry: &SegmentEntry,
        schema: &TransitionSchema,
    ) -> Result<Self> {
        let (path, ep_path) = (root.join(&entry.path), root.join(&entry.episodes_path));
        let file = open_ipc_deferring(&path, schema.arrow_schema())?;
        check_file(
            &path,
            &file,
            entry,
            entry.bytes,
            meta::KIND_TRANSITIONS,
            entry.rows,
        )?;
        let episodes = open_episode_table(root, entry, schema)?;
        let mut batch_starts = vec![0u64];
        for b in &file.batches {
            batch_starts.push(batch_starts.last().unwrap() + b.num_rows() as u64);
        }
        // No episode may span record batches (zero-copy slices of an episode need one batch).
        let starts = episodes.row_starts();
        for &b in &batch_starts[..batch_starts.len() - 1] {
            if starts.binary_search(&b).is_err() {
                return Err(Error::corrupt(
                    ep_path,
                    format!("an episode spans record batches at row {b}"),
                ));
            }
        }
        Ok(Segment {
            entry: entry.clone(),
            file,
            batch_starts,
            episodes,
        })
    }

    /// The manifest entry.
    pub fn entry(&self) -> &SegmentEntry {
        &self.entry
    }
    /// Number of transitions.
    pub fn num_rows(&self) -> u64 {
        self.entry.rows
    }
    /// The zero-copy record batches of transitions.
    ///
    /// Opening a segment does not read the offsets of its frame columns (8 bytes per frame);
    /// the first call of this (or of [`Segment::column`] on a frame column) checks them all,
    /// once: O(frames) the first time, a damaged offset is [`Error::Corrupt`] naming the file.
    /// Samplers never need it: they read frames through [`Segment::frames`].
    pub fn batches(&self) -> Result<&[RecordBatch]> {
        self.file.check_deferred()?;
        Ok(&self.file.batches)
    }
    /// The record batches as mapped, whose [`Segment::deferred_columns`] may hold unchecked
    /// offsets: only for code that checks them ([`Segment::batches`]) before it reads those
    /// columns, e.g. a scan that learns its projection later.
    #[cfg(feature = "sql")]
    pub(crate) fn batches_unchecked(&self) -> &[RecordBatch] {
        &self.file.batches
    }
    /// The columns (by index) whose offsets have not been checked yet: frame columns until
    /// [`Segment::batches`] has run once, then none.
    #[cfg(feature = "sql")]
    pub(crate) fn deferred_columns(&self) -> &[usize] {
        self.file.deferred()
    }
    /// Frames stored in frame column `name` and their stored bytes, from the first and last
    /// offset of each record batch (checked at open): no other offset and no frame is read.
    /// `None` if `name` is not a frame column.
    pub fn frame_totals(&self, name: &str) -> Option<(u64, u64)> {
        let (mut frames, mut bytes) = (0u64, 0u64);
        for b in &self.file.batches {
            let a = b.column_by_name(name)?.as_binary_opt::<i64>()?;
            let o = a.value_offsets();
            frames += a.len() as u64;
            bytes += (o[o.len() - 1] - o[0]).max(0) as u64;
        }
        Some((frames, bytes))
    }
    /// Column `name` of every record batch of the segment, zero-copy. A column the snapshot's
    /// schema lacks is [`Error::InvalidArgument`] (the segment's schema was checked on open). A
    /// frame column's offsets are checked first, as by [`Segment::batches`].
    pub fn column(&self, name: &str) -> Result<Vec<ArrayRef>> {
        let schema = self.file.batches.first().map(|b| b.schema());
        let index = schema.and_then(|s| s.index_of(name).ok());
        if index.is_some_and(|i| self.file.deferred().contains(&i)) {
            self.file.check_deferred()?;
        }
        self.file
            .batches
            .iter()
            .map(|b| {
                b.column_by_name(name).cloned().ok_or_else(|| {
                    Error::argument(
                        "name",
                        format!("segment {} has no column `{name}`", self.entry.id),
                    )
                })
            })
            .collect()
    }
    /// The stored frames of rows `[row, row + len)` of frame column `name`, zero-copy from the
    /// map (decode them with [`crate::frames::FrameDecoder`], made from
    /// [`crate::Snapshot::frame_column`]). The rows must lie inside one record batch, which
    /// holds for any range inside one episode. A column that is not a frame column, or a range
    /// outside the segment or across record batches, is [`Error::InvalidArgument`].
    pub fn frames(&self, name: &str, row: u64, len: usize) -> Result<FrameRun<'_>> {
        let end = row
            .checked_add(len as u64)
            .filter(|&e| e <= self.entry.rows);
        if end.is_none() {
            return Err(Error::argument(
                "row",
                format!(
                    "rows {row}..+{len} outside segment {} of {} rows",
                    self.entry.id, self.entry.rows
                ),
            ));
        }
        let (b, off) = self.locate(row);
        let batch = &self.file.batches[b];
        if off + len > batch.num_rows() {
            return Err(Error::argument(
                "len",
                format!("rows {row}..+{len} span record batches"),
            ));
        }
        let array = batch
            .column_by_name(name)
            .and_then(|a| a.as_binary_opt::<i64>())
            .ok_or_else(|| Error::argument("name", format!("`{name}` is not a frame column")))?;
        Ok(FrameRun::new(
            &array.value_offsets()[off..off + len + 1],
            array.value_data(),
        ))
    }
    /// Asks the kernel for the offsets of every frame column of the segment (`MADV_WILLNEED`,
    /// returning at once; the kernel reads them in large requests), so that a sampler that will
    /// read frames finds them in memory. Only a hint.
    pub(crate) fn advise_frame_offsets(&self) {
        for b in &self.file.batches {
            for c in b.columns() {
                if let Some(a) = c.as_binary_opt::<i64>() {
                    self.advise_willneed(a.offsets().inner().inner().as_slice());
                }
            }
        }
    }
    /// The bytes holding the offsets of rows `[row, row + len)` of frame column `name` (`len + 1`
    /// offsets), not read: for read-ahead of the offsets before the frames they locate. `None`
    /// for a range outside one record batch, or a column that is not a frame column.
    pub(crate) fn frame_offsets_bytes(&self, name: &str, row: u64, len: usize) -> Option<&[u8]> {
        let (b, off) = self.locate(row);
        let a = self.file.batches[b]
            .column_by_name(name)?
            .as_binary_opt::<i64>()?;
        let bytes = a.offsets().inner().inner().as_slice();
        bytes.get(off * 8..(off + len + 1) * 8)
    }
    /// The episode table (one row per episode).
    pub fn episode_table(&self) -> &EpisodeTable {
        &self.episodes
    }
    /// The batch holding segment row `row` and the row's offset inside it. O(log batches).
    pub fn locate(&self, row: u64) -> (usize, usize) {
        let b = self.batch_starts.partition_point(|&s| s <= row) - 1;
        (b, (row - self.batch_starts[b]) as usize)
    }
    /// Rows `[row, row + len)` as a zero-copy batch. The range must lie inside one record batch,
    /// which holds for any range inside one episode; one that does not is
    /// [`Error::InvalidArgument`]. The range's own frame offsets are checked (O(len)), not the
    /// segment's: a damaged one is [`Error::Corrupt`] naming the file.
    pub fn slice(&self, row: u64, len: usize) -> Result<RecordBatch> {
        let (b, off) = self.locate(row);
        let batch = &self.file.batches[b];
        if off + len > batch.num_rows() {
            return Err(Error::argument(
                "len",
                format!(
                    "rows {row}..+{len} of segment {} span record batches",
                    self.entry.id
                ),
            ));
        }
        for &c in self.file.deferred() {
            if let Some(a) = batch.column(c).as_binary_opt::<i64>() {
                check_offsets(a, off, len).map_err(|reason| {
                    Error::corrupt(
                        &self.file.path,
                        format!("column `{}`: {reason}", batch.schema_ref().field(c).name()),
                    )
                })?;
            }
        }
        Ok(batch.slice(off, len))
    }
    /// Asks the kernel to read ahead the mapped bytes `bytes` (a slice of this segment's
    /// transitions, e.g. a column's values), if they lie in the mapping (for data not yet in the
    /// page cache). Bytes outside the mapping are ignored, as are errors: it is only a hint.
    pub fn advise_willneed(&self, bytes: &[u8]) {
        let base = self.file.mmap.as_ptr() as usize;
        let (p, len) = (bytes.as_ptr() as usize, bytes.len());
        if p >= base && p + len <= base + self.file.mmap.len() {
            will_need(bytes);
        }
    }
    /// The whole mapped file in chunks of `chunk` bytes, each read ahead one chunk before it is
    /// handed to `f` (for checksums and copies of whole files).
    pub fn for_each_chunk(&self, chunk: usize, mut f: impl FnMut(&[u8])) {
        let data = self.mapped_bytes();
        let chunk = chunk.max(4096);
        let mut chunks = data.chunks(chunk).peekable();
        if let Some(first) = chunks.peek() {
            self.advise_willneed(first);
        }
        while let Some(c) = chunks.next() {
            if let Some(next) = chunks.peek() {
                self.advise_willneed(next);
            }
            f(c);
        }
    }
    /// Maps every page of this segment into the process's page tables now (reading it from disk
    /// if needed: `MADV_POPULATE_READ` on Linux), so that later random reads take no page faults.
    /// Costs time and page cache proportional to the segment's size; a no-op elsewhere.
    pub fn prefault(&self) {
        #[cfg(target_os = "linux")]
        let _ = self.file.mmap.advise(memmap2::Advice::PopulateRead);
    }
    /// The whole mapped file (for checksums).
    pub fn mapped_bytes(&self) -> &[u8] {
        self.file.map.as_slice()
    }
}
