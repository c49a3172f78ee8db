//! Episodes: one being appended (how it ends, [`EpisodeEnd`]; the values of one step, [`Step`],
//! [`Values`]; the column buffers a writer accumulates them in), and, on the way back, a
//! segment's typed [`EpisodeTable`], opened and checked against its manifest entry.

use std::path::Path;
use std::sync::Arc;

use arrow::array::ArrayData;
use arrow::array::RecordBatch;
use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, FixedSizeListArray, make_array};
use arrow::buffer::{Buffer, ScalarBuffer};
use arrow::compute::concat_batches;
use arrow::datatypes::ToByteSlice;
use arrow::datatypes::{DataType, Float64Type, UInt64Type};

use crate::error::{Error, Result};
use crate::format::{self, ep, meta};
use crate::schema::TransitionSchema;
use crate::store::ipc::{MappedIpc, open_ipc_cold};
use crate::store::manifest::SegmentEntry;

/// How an episode ended.
#[derive(Debug, Clone, Default)]
pub struct EpisodeEnd {
    /// Ended in a terminal state (no bootstrapping past the last step).
    pub terminated: bool,
    /// Cut by a time limit or the end of the data.
    pub truncated: bool,
    /// o_T after the last step, a one-row array of the observation type. Kept in the episode
    /// table when the dataset derives `next_observation`; ignored when it stores it.
    pub final_observation: Option<ArrayRef>,
}

impl EpisodeEnd {
    /// The episode reached a terminal state.
    pub fn terminated() -> Self {
        Self {
            terminated: true,
            ..Self::default()
        }
    }
    /// The episode was cut (time limit, end of data).
    pub fn truncated() -> Self {
        Self {
            truncated: true,
            ..Self::default()
        }
    }
    /// Adds the final observation.
    pub fn with_final_observation(mut self, obs: ArrayRef) -> Self {
        self.final_observation = Some(obs);
        self
    }
}

/// Typed values of one column for one step (the step-by-step API of live collectors).
#[derive(Debug, Clone, Copy)]
pub enum Values<'a> {
    /// `float32` values.
    F32(&'a [f32]),
    /// `float64` values.
    F64(&'a [f64]),
    /// `uint8` values (images).
    U8(&'a [u8]),
    /// `int8` values.
    I8(&'a [i8]),
    /// `int16` values.
    I16(&'a [i16]),
    /// `int32` values.
    I32(&'a [i32]),
    /// `int64` values (discrete actions).
    I64(&'a [i64]),
    /// `uint16` values.
    U16(&'a [u16]),
    /// `uint32` values.
    U32(&'a [u32]),
    /// `uint64` values.
    U64(&'a [u64]),
    /// `bool` values.
    Bool(&'a [bool]),
}

impl Values<'_> {
    pub(crate) fn data_type(&self) -> DataType {
        match self {
            Values::F32(_) => DataType::Float32,
            Values::F64(_) => DataType::Float64,
            Values::U8(_) => DataType::UInt8,
            Values::I8(_) => DataType::Int8,
            Values::I16(_) => DataType::Int16,
            Values::I32(_) => DataType::Int32,
            Values::I64(_) => DataType::Int64,
            Values::U16(_) => DataType::UInt16,
            Values::U32(_) => DataType::UInt32,
            Values::U64(_) => DataType::UInt64,
            Values::Bool(_) => DataType::Boolean,
        }
    }
    pub(crate) fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
            Values::U8(v) => v.len(),
            Values::I8(v) => v.len(),
            Values::I16(v) => v.len(),
            Values::I32(v) => v.len(),
            Values::I64(v) => v.len(),
            Values::U16(v) => v.len(),
            Values::U32(v) => v.len(),
            Values::U64(v) => v.len(),
            Values::Bool(v) => v.len(),
        }
    }
    fn extend_into(&self, out: &mut ColumnBuf) {
        match self {
            Values::F32(v) => out.bytes.extend_from_slice(v.to_byte_slice()),
            Values::F64(v) => out.bytes.extend_from_slice(v.to_byte_slice()),
            Values::U8(v) => out.bytes.extend_from_slice(v),
            Values::I8(v) => out.bytes.extend_from_slice(v.to_byte_slice()),
            Values::I16(v) => out.bytes.extend_from_slice(v.to_byte_slice()),
            Values::I32(v) => out.bytes.extend_from_slice(v.to_byte_slice()),
            Values::I64(v) => out.bytes.extend_from_slice(v.to_byte_slice()),
            Values::U16(v) => out.bytes.extend_from_slice(v.to_byte_slice()),
            Values::U32(v) => out.bytes.extend_from_slice(v.to_byte_slice()),
            Values::U64(v) => out.bytes.extend_from_slice(v.to_byte_slice()),
            Values::Bool(v) => out.bools.extend_from_slice(v),
        }
    }
}

/// One transition for [`DatasetWriter::append_step`](crate::store::DatasetWriter::append_step).
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// o_t, flattened row-major.
    pub observation: Values<'a>,
    /// a_t: the action values (one `I64` value for discrete actions).
    pub action: Values<'a>,
    /// r_{t+1}.
    pub reward: f32,
    /// o_{t+1}, required exactly when the dataset stores `next_observation`.
    pub next_observation: Option<Values<'a>>,
    /// Values of the user columns, in schema order.
    pub columns: &'a [Values<'a>],
}

/// Accumulates one column of the episode in progress.
#[derive(Debug)]
pub(crate) struct ColumnBuf {
    pub(crate) field: arrow::datatypes::FieldRef,
    pub(crate) elem: DataType,
    pub(crate) width: usize,
    bytes: Vec<u8>,
    bools: Vec<bool>,
}

impl ColumnBuf {
    pub(crate) fn new(field: &arrow::datatypes::FieldRef) -> Self {
        let (elem, width) = match field.data_type() {
            DataType::FixedSizeList(c, n) => (c.data_type().clone(), *n as usize),
            other => (other.clone(), 1),
        };
        Self {
            field: field.clone(),
            elem,
            width,
            bytes: vec![],
            bools: vec![],
        }
    }
    pub(crate) fn push(&mut self, v: &Values<'_>) -> Result<()> {
        if v.data_type() != self.elem || v.len() != self.width {
            return Err(Error::argument(
                "step",
                format!(
                    "column `{}` takes {} values of {} per step, got {} of {}",
                    self.field.name(),
                    self.width,
                    self.elem,
                    v.len(),
                    v.data_type()
                ),
            ));
        }
        v.extend_into(self);
        Ok(())
    }
    pub(crate) fn finish(&mut self, rows: usize) -> Result<ArrayRef> {
        let values: ArrayRef = if self.elem == DataType::Boolean {
            Arc::new(BooleanArray::from(std::mem::take(&mut self.bools)))
        } else {
            let buf = Buffer::from_vec(std::mem::take(&mut self.bytes));
            make_array(
                ArrayData::builder(self.elem.clone())
                    .len(rows * self.width)
                    .add_buffer(buf)
                    .build()?,
            )
        };
        Ok(match self.field.data_type() {
            DataType::FixedSizeList(c, n) => {
                Arc::new(FixedSizeListArray::try_new(c.clone(), *n, values, None)?)
            }
            _ => values,
        })
    }
}

#[derive(Debug, Default)]
pub(crate) struct EpisodeRows {
    pub(crate) ids: Vec<u64>,
    pub(crate) starts: Vec<u64>,
    pub(crate) lengths: Vec<u64>,
    pub(crate) returns: Vec<f64>,
    pub(crate) terminated: Vec<bool>,
    pub(crate) truncated: Vec<bool>,
    pub(crate) finals: Vec<Option<ArrayRef>>,
}

/// The footer and row count of `f` (file `path`) against the manifest `entry`: size `bytes`,
/// file kind `kind`, segment id, `rows` rows.
pub(super) fn check_file(
    path: &Path,
    f: &MappedIpc,
    entry: &SegmentEntry,
    bytes: u64,
    kind: &str,
    rows: u64,
) -> Result<()> {
    let bad = |r: String| Err(Error::corrupt(path, r));
    if f.bytes != bytes {
        return bad(format!("{} bytes, manifest says {bytes}", f.bytes));
    }
    if f.metadata.get(meta::FILE_KIND).map(String::as_str) != Some(kind) {
        return bad(format!("footer does not mark it as a `{kind}` file"));
    }
    if f.metadata.get(meta::SEGMENT_ID) != Some(&format::segment_name(entry.id)) {
        return bad(format!("footer names another segment than {}", entry.id));
    }
    if f.num_rows() != rows {
        return bad(format!("{} rows, manifest says {rows}", f.num_rows()));
    }
    Ok(())
}

/// The episode-table columns that opening a snapshot or catalog reads (checks, index, `info`).
const READ_ON_OPEN: [&str; 6] = [
    ep::EPISODE_ID,
    ep::ROW_START,
    ep::LENGTH,
    ep::EPISODE_RETURN,
    ep::TERMINATED,
    ep::TRUNCATED,
];

/// Opens and checks the episode table of segment `entry` under `root` (see [`episode_table`]).
pub(crate) fn open_episode_table(
    root: &Path,
    entry: &SegmentEntry,
    schema: &TransitionSchema,
) -> Result<EpisodeTable> {
    let path = root.join(&entry.episodes_path);
    let (file, cold) = open_ipc_cold(&path, schema.episode_schema())?;
    episode_table(&path, file, cold, entry, schema)
}

/// The episode table in `file` (opened from `path`, `cold` if it was not in the page cache),
/// checked: its footer against the manifest entry, then ids consecutive and rows contiguous,
/// covering the segment. O(episodes), over whole columns (no per-episode Arrow accessor).
fn episode_table(
    path: &Path,
    file: MappedIpc,
    cold: bool,
    entry: &SegmentEntry,
    schema: &TransitionSchema,
) -> Result<EpisodeTable> {
    check_file(
        path,
        &file,
        entry,
        entry.episodes_bytes,
        meta::KIND_EPISODES,
        entry.episodes,
    )?;
    // A cold file: ask for the pages of the columns every open reads, in one request (the map is
    // advised random: faults would read them a page at a time); `final_observation`, most of the
    // file, is left to the gathers that need it.
    let (base, mut span) = (file.map.as_ptr() as usize, (usize::MAX, 0));
    for b in file.batches.iter().filter(|_| cold) {
        let read = READ_ON_OPEN.iter().filter_map(|c| b.column_by_name(c));
        for d in read.map(|c| c.to_data()) {
            for buf in d.buffers().iter().filter(|b| !b.is_empty()) {
                let off = buf.as_ptr() as usize - base;
                span = (span.0.min(off), span.1.max(off + buf.len()));
            }
        }
    }
    if span.0 < span.1 {
        let _ = (file.mmap).advise_range(memmap2::Advice::WillNeed, span.0, span.1 - span.0);
    }
    let t = match file.batches.len() {
        1 => file.batches[0].clone(),
        _ => concat_batches(schema.episode_schema(), &file.batches)?,
    };
    let mut t = EpisodeTable::try_new(t).map_err(|e| Error::corrupt(path, e.to_string()))?;
    t.file = Some(file.map);
    let bad = |i: usize| {
        let (id, start, len) = (t.ids()[i], t.row_starts()[i], t.lengths()[i]);
        Err(Error::corrupt(
            path,
            format!(
                "episode row {i} (id {id}, row_start {start}, length {len}) breaks the episode sequence"
            ),
        ))
    };
    let mut row = 0u64;
    let first = entry.first_episode_id;
    let rows = t.ids().iter().zip(t.row_starts()).zip(t.lengths());
    for (i, ((&id, &start), &len)) in rows.enumerate() {
        if id != first.wrapping_add(i as u64) || start != row || len == 0 {
            return bad(i);
        }
        row = match row.checked_add(len) {
            Some(r) => r,
            None => return bad(i),
        };
    }
    if row != entry.rows {
        return Err(Error::corrupt(
            path,
            format!("episodes cover {row} rows, segment has {}", entry.rows),
        ));
    }
    Ok(t)
}

/// A segment's episode table (one row per episode), with its required columns typed once when
/// the segment opens: `episode_id`, `row_start`, `length`, `episode_return`, `terminated`,
/// `truncated`, and `final_observation` when the dataset derives `next_observation`. Cloning is
/// cheap (the columns are shared views of the mapped file).
#[derive(Debug, Clone)]
pub struct EpisodeTable {
    batch: RecordBatch,
    /// The whole mapped file, when the table was opened from one (for checksums without
    /// reopening the file by path, which retention may have removed since).
    pub(super) file: Option<arrow::buffer::Buffer>,
    ids: ScalarBuffer<u64>,
    row_starts: ScalarBuffer<u64>,
    lengths: ScalarBuffer<u64>,
    returns: ScalarBuffer<f64>,
    terminated: BooleanArray,
    truncated: BooleanArray,
}

impl PartialEq for EpisodeTable {
    fn eq(&self, other: &Self) -> bool {
        self.batch == other.batch
    }
}

impl EpisodeTable {
    /// Types the required columns of `batch`; a missing column or one of another type is
    /// [`Error::SchemaMismatch`]. O(1): the columns are not copied.
    pub fn try_new(batch: RecordBatch) -> Result<Self> {
        fn typed<'a, T: 'static>(
            batch: &'a RecordBatch,
            name: &str,
            want: DataType,
            cast: impl Fn(&'a ArrayRef) -> Option<&'a T>,
        ) -> Result<&'a T> {
            let a = batch.column_by_name(name).ok_or_else(|| {
                Error::schema(name, format!("missing (an episode-table {want} column)"))
            })?;
            cast(a).ok_or_else(|| {
                Error::schema_types(
                    name,
                    &want,
                    a.data_type(),
                    "an episode-table column of another type",
                )
            })
        }
        let u64s = |name| {
            typed(&batch, name, DataType::UInt64, |a| {
                a.as_primitive_opt::<UInt64Type>()
            })
            .map(|a| a.values().clone())
        };
        let bools = |name| typed(&batch, name, DataType::Boolean, |a| a.as_boolean_opt()).cloned();
        Ok(Self {
            ids: u64s(ep::EPISODE_ID)?,
            row_starts: u64s(ep::ROW_START)?,
            lengths: u64s(ep::LENGTH)?,
            returns: typed(&batch, ep::EPISODE_RETURN, DataType::Float64, |a| {
                a.as_primitive_opt::<Float64Type>()
            })?
            .values()
            .clone(),
            terminated: bools(ep::TERMINATED)?,
            truncated: bools(ep::TRUNCATED)?,
            batch,
            file: None,
        })
    }

    /// The bytes of the mapped file the table was opened from (`None` for a table built in
    /// memory).
    pub(crate) fn file_bytes(&self) -> Option<&[u8]> {
        self.file.as_ref().map(|b| b.as_slice())
    }
    /// Number of episodes.
    pub fn len(&self) -> usize {
        self.batch.num_rows()
    }
    /// Whether the table holds no episode.
    pub fn is_empty(&self) -> bool {
        self.batch.num_rows() == 0
    }
    /// Episode ids (consecutive).
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }
    /// First row of each episode within the segment.
    pub fn row_starts(&self) -> &[u64] {
        &self.row_starts
    }
    /// Number of transitions of each episode.
    pub fn lengths(&self) -> &[u64] {
        &self.lengths
    }
    /// `(row_starts, lengths)`: what [`crate::EpisodeIndex::from_segments`] takes.
    pub fn spans(&self) -> (&[u64], &[u64]) {
        (&self.row_starts, &self.lengths)
    }
    /// Sum of rewards of each episode.
    pub fn returns(&self) -> &[f64] {
        &self.returns
    }
    /// Whether each episode ended in a terminal state.
    pub fn terminated(&self) -> &BooleanArray {
        &self.terminated
    }
    /// Whether each episode was cut (time limit or end of data).
    pub fn truncated(&self) -> &BooleanArray {
        &self.truncated
    }
    /// `final_observation` (o_T after each episode's last step), present when the dataset does
    /// not store `next_observation`.
    pub fn final_observation(&self) -> Option<&ArrayRef> {
        self.batch.column_by_name(ep::FINAL_OBSERVATION)
    }
    /// The stored final frame of episode row `i` (o_T after its last step) when observations
    /// are a frame column, zero-copy; `None` when the writer was given none (or `i` is out of
    /// range, or the dataset has no frame column). Decode it like any frame.
    pub fn final_frame(&self, i: usize) -> Option<&[u8]> {
        let a = self.final_observation()?.as_binary_opt::<i64>()?;
        (i < a.len() && a.is_valid(i)).then(|| a.value(i))
    }
    /// A column by name, including per-episode user metadata.
    pub fn column(&self, name: &str) -> Option<&ArrayRef> {
        self.batch.column_by_name(name)
    }
    /// The table as an Arrow record batch (what the file holds).
    pub fn batch(&self) -> &RecordBatch {
        &self.batch
    }
}
