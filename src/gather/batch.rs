//! The gathered batch: [`Batch`] (every column as `[B, L, ...]`, flags and per-slice vectors,
//! reused across gathers) and its columns, with the copy into an Arrow `RecordBatch`.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, FixedSizeListArray, RecordBatch, UInt8Array, make_array,
};
use arrow::array::{ArrayData, Int64Array, UInt64Array};
use arrow::buffer::{Buffer, MutableBuffer};
use arrow::datatypes::{DataType, Field, Schema};

use super::elem_size;
use crate::error::Result;
use crate::format::col;

/// One gathered column: `num_slices * slice_len` steps of `width` values of `data_type` each,
/// row-major `[B, L, width]`, in a 64-byte aligned buffer.
#[derive(Debug)]
pub struct BatchColumn {
    /// Column name.
    pub name: String,
    /// Element type (e.g. `Float32`; `Boolean` columns hold one byte per value).
    pub data_type: DataType,
    /// Shape of one step (`[17]`, `[3, 64, 64]`, or `[]` for scalars).
    pub shape: Vec<usize>,
    /// Values per step (product of `shape`).
    pub width: usize,
    /// Rows before each slice's step 0: `K - 1` for a frame column gathered as a window
    /// ([`crate::FrameStack::window`]), 0 for every other column. A window holds `[B, L + lead,
    /// ...frame]`, one frame per row, and step `j`'s `[K, ...frame]` stack (`shape`) is rows `j
    /// ..= j + lead` of its slice ([`Batch::step`]).
    pub lead: usize,
    /// The bytes; padded steps are zero (in a window, rows no valid step's stack holds).
    pub data: MutableBuffer,
}

/// Bytes of one slice of `slice_len` steps of a column of `step_bytes` a step with `lead` rows
/// before step 0 ([`BatchColumn::lead`]): `L` steps, or a frame window's `L + K - 1` frames of
/// `step_bytes / K` each.
pub fn slice_bytes(step_bytes: usize, lead: usize, slice_len: usize) -> usize {
    (slice_len + lead) * (step_bytes / (lead + 1))
}

/// Bytes of one slice's row of a tail column ([`crate::Gatherer::tail_columns`]) of `step_bytes`
/// a step with `lead` rows before step 0: one step, or for a frame window one frame (the frame
/// after the slice's last valid step).
pub fn tail_bytes(step_bytes: usize, lead: usize) -> usize {
    step_bytes / (lead + 1)
}

impl BatchColumn {
    /// Bytes of one step.
    pub fn step_bytes(&self) -> usize {
        self.width * elem_size(&self.data_type)
    }
    /// Bytes of one row of `data`: a step, or one frame of a window.
    pub fn row_bytes(&self) -> usize {
        self.step_bytes() / (self.lead + 1)
    }
    /// Bytes of one slice of `slice_len` steps in `data`.
    pub fn slice_bytes(&self, slice_len: usize) -> usize {
        slice_bytes(self.step_bytes(), self.lead, slice_len)
    }
    /// The data as `&[T]` (`T` must match `data_type`).
    pub fn values<T: arrow::datatypes::ArrowNativeType>(&self) -> &[T] {
        self.data.typed_data()
    }
}

/// A gathered batch: every requested column as `[B, L, ...]`, plus per-step flags as one byte
/// each (`[B, L]`) and per-slice metadata (`[B]`). Reused across calls: steady-state gathering
/// allocates nothing.
#[derive(Debug, Default)]
pub struct Batch {
    /// Slices in the batch (B).
    pub num_slices: usize,
    /// Steps per slice (L).
    pub slice_len: usize,
    /// The requested columns, in request order.
    pub columns: Vec<BatchColumn>,
    /// 1 where the step holds data, 0 where it is padding.
    pub mask: Vec<u8>,
    /// 1 at step 0 of an episode.
    pub is_first: Vec<u8>,
    /// 1 at the last step of an episode.
    pub is_last: Vec<u8>,
    /// 1 at the last step of an episode that ended in a terminal state.
    pub terminated: Vec<u8>,
    /// 1 at the last step of an episode that was cut.
    pub truncated: Vec<u8>,
    /// 1 at the last valid step of each slice (where a recurrent model's sequence ends).
    pub slice_end: Vec<u8>,
    /// Episode id of each slice.
    pub episode_id: Vec<u64>,
    /// First step of each slice (negative when a span overhangs the episode's start).
    pub start_step: Vec<i64>,
    /// Part of a mix each slice came from (see [`super::Gatherer::mixed`]); 0 for a plain gatherer.
    pub source: Vec<u16>,
}

impl Batch {
    /// The six per-step flag planes, in the order a [`super::GatherInto`] takes them: mask,
    /// is_first, is_last, terminated, truncated, slice_end.
    pub fn flag_planes_mut(&mut self) -> [&mut Vec<u8>; 6] {
        [
            &mut self.mask,
            &mut self.is_first,
            &mut self.is_last,
            &mut self.terminated,
            &mut self.truncated,
            &mut self.slice_end,
        ]
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Option<&BatchColumn> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The bytes of step `step` of slice `slice` in column `column` (`[...shape]`, row-major),
    /// also for a frame window, where consecutive steps' stacks share frames.
    ///
    /// # Panics
    /// If `column`, `slice` or `step` is out of range.
    pub fn step(&self, column: usize, slice: usize, step: usize) -> &[u8] {
        let c = &self.columns[column];
        assert!(
            slice < self.num_slices && step < self.slice_len,
            "step out of range"
        );
        let at = slice * c.slice_bytes(self.slice_len) + step * c.row_bytes();
        &c.data.as_slice()[at..at + c.step_bytes()]
    }
    /// Total valid transitions.
    pub fn valid_steps(&self) -> usize {
        self.mask.iter().map(|&m| m as usize).sum()
    }
    /// Bytes of all column data.
    pub fn data_bytes(&self) -> usize {
        self.columns.iter().map(|c| c.data.len()).sum()
    }

    /// Copies the batch into an Arrow `RecordBatch` of `B * L` rows (step-major within slices):
    /// `slice` (u64), `episode_id`, `step`, then `source` (u16, the part of a mix) only when a
    /// slice came from a part other than part 0 (so never for a plain gatherer, always for a mix
    /// whose later parts have slices), the columns (fixed-size lists for vector steps), and the
    /// flags as `u8`. Costs one copy of the data (a frame window's stacks are written out).
    pub fn to_record_batch(&self) -> Result<RecordBatch> {
        let (b, l) = (self.num_slices, self.slice_len);
        let n = b * l;
        let mut fields = vec![];
        let mut arrays: Vec<ArrayRef> = vec![];
        // Per-step metadata, unless a gathered column of the same name carries it already.
        let gathered = |name: &str| self.columns.iter().any(|c| c.name == name);
        let meta: [(&str, DataType, ArrayRef); 3] = [
            (
                "slice",
                DataType::UInt64,
                Arc::new(UInt64Array::from_iter_values(
                    (0..n).map(|i| (i / l) as u64),
                )),
            ),
            (
                col::EPISODE_ID,
                DataType::UInt64,
                Arc::new(UInt64Array::from_iter_values(
                    (0..n).map(|i| self.episode_id[i / l]),
                )),
            ),
            (
                col::STEP,
                DataType::Int64,
                Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|i| self.start_step[i / l] + (i % l) as i64),
                )),
            ),
        ];
        for (name, dt, array) in meta {
            if !gathered(name) {
                fields.push(Field::new(name, dt, false));
                arrays.push(array);
            }
        }
        if let Some((name, array)) = self.source_column() {
            fields.push(Field::new(name, DataType::UInt16, false));
            arrays.push(array);
        }
        let mut stacks = Vec::new();
        for (j, c) in self.columns.iter().enumerate() {
            // A window's stacks, written out: a row per step.
            let data = if c.lead == 0 {
                c.data.as_slice()
            } else {
                stacks.clear();
                stacks.reserve(n * c.step_bytes());
                for i in 0..n {
                    stacks.extend_from_slice(self.step(j, i / l, i % l));
                }
                &stacks[..]
            };
            let values: ArrayRef = if c.data_type == DataType::Boolean {
                Arc::new(BooleanArray::from_iter(data.iter().map(|&x| Some(x != 0))))
            } else {
                make_array(
                    ArrayData::builder(c.data_type.clone())
                        .len(n * c.width)
                        .add_buffer(Buffer::from_slice_ref(data))
                        .build()?,
                )
            };
            let array: ArrayRef = if c.shape.is_empty() {
                values
            } else {
                let item = Arc::new(Field::new("item", c.data_type.clone(), false));
                Arc::new(FixedSizeListArray::try_new(
                    item,
                    c.width as i32,
                    values,
                    None,
                )?)
            };
            fields.push(Field::new(&c.name, array.data_type().clone(), false));
            arrays.push(array);
        }
        for (name, v) in [
            ("mask", &self.mask),
            (col::IS_FIRST, &self.is_first),
            (col::IS_LAST, &self.is_last),
            (col::TERMINATED, &self.terminated),
            (col::TRUNCATED, &self.truncated),
            ("slice_end", &self.slice_end),
        ] {
            if !gathered(name) {
                fields.push(Field::new(name, DataType::UInt8, false));
                arrays.push(Arc::new(UInt8Array::from(v.clone())));
            }
        }
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
    }
}
