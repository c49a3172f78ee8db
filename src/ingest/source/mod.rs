//! Input formats: each is a [`Source`] that reads a columnar input in units (Parquet row groups,
//! Arrow record batches, row ranges of NumPy or HDF5 arrays), in row order.

use std::path::Path;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use super::*;
use crate::error::{Error, Result};

pub(crate) mod array;
pub(crate) mod arrow_ipc;
pub(crate) mod hdf5;
mod npy;
pub(crate) mod parquet;
pub(crate) mod torchrl;
mod zip;

pub(crate) use parquet::ParquetSource;

/// [`Source::path`] and [`Source::schema`] of a source that keeps both in `path` and `schema`
/// fields.
macro_rules! path_and_schema_fields {
    () => {
        fn path(&self) -> &std::path::Path {
            &self.path
        }

        fn schema(&self) -> arrow::datatypes::SchemaRef {
            self.schema.clone()
        }
    };
}
pub(crate) use path_and_schema_fields;

/// Where rows come from: a columnar input read in units (Parquet row groups, row ranges of NumPy
/// arrays), in row order.
pub(crate) trait Source: Sync {
    fn path(&self) -> &Path;
    /// Every column of the input (columns the caller dropped may have type `Null`).
    fn schema(&self) -> SchemaRef;
    /// The units, in row order: (unit, first row, rows).
    fn units(&self, batch_rows: usize) -> Vec<(usize, u64, u64)>;
    /// Whether units may be read concurrently (else they are read one by one, in order).
    fn parallel(&self) -> bool;
    /// The rows of one unit as batches of at most `batch_rows` rows holding the columns of
    /// `projection` (indices into [`Source::schema`]), in order.
    fn read(
        &self,
        unit: usize,
        projection: &[usize],
        batch_rows: usize,
    ) -> Result<Vec<RecordBatch>>;
    /// Length of row 0 of each named variable-size list column (sources of fixed-shape arrays
    /// have none).
    fn first_row_lengths(&self, cols: &[&str]) -> Result<Vec<(String, usize)>> {
        match cols.first() {
            None => Ok(vec![]),
            Some(c) => Err(Error::schema(*c, "the column is not a fixed-shape array")),
        }
    }
    /// A column of episode ids the input defines itself (Minari's episode groups), used when
    /// the caller gives no boundary option.
    fn episode_column(&self) -> Option<&str> {
        None
    }
}

/// Opens `input` as a [`Source`] of the given format.
pub(crate) fn open_source(
    input: &Path,
    format: InputFormat,
    opts: &IngestOptions,
) -> Result<Box<dyn Source>> {
    Ok(match format {
        InputFormat::Parquet => Box::new(ParquetSource::open(input)?),
        InputFormat::Numpy => Box::new(array::ArraySource::open(input, &opts.drop_cols)?),
        InputFormat::TorchRl => Box::new(torchrl::open(input, &opts.drop_cols)?),
        InputFormat::Hdf5 => hdf5::open(input, &opts.drop_cols)?,
        InputFormat::Arrow => Box::new(arrow_ipc::ArrowSource::open(input)?),
    })
}
