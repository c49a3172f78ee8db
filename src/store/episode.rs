//! An episode being appended: how it ends ([`EpisodeEnd`]), the values of one step ([`Step`],
//! [`Values`]), and the column buffers a writer accumulates them in.

use std::sync::Arc;

use arrow::array::ArrayData;
use arrow::array::{ArrayRef, BooleanArray, FixedSizeListArray, make_array};
use arrow::buffer::Buffer;
use arrow::datatypes::DataType;
use arrow::datatypes::ToByteSlice;

use crate::error::{Error, Result};

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

/// One transition for [`DatasetWriter::append_step`].
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
