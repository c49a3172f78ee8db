//! Input formats: each is a [`Source`] that reads a columnar input in units (Parquet row groups,
//! Arrow record batches, row ranges of NumPy or HDF5 arrays), in row order; and the helpers that
//! read columns of the decoded batches (for sources, the mapping and the conversion).

use std::path::Path;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};

use super::*;
use crate::error::{Error, Result};

pub(crate) mod array;
pub(crate) mod arrow_ipc;
pub(crate) mod dqn;
pub(crate) mod hdf5;
#[cfg(feature = "video")]
pub(crate) mod lerobot;
mod npy;
pub(crate) mod npz_dir;
pub(crate) mod parquet;
pub(crate) mod rlds;
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

/// Columns a source adds to each assembled episode before the writer gets it (a LeRobot
/// dataset's cameras, decoded from its videos).
pub(crate) trait EpisodeColumns {
    /// `batch` (one whole episode, in the converted payload schema) with the columns added.
    fn attach(&mut self, batch: RecordBatch) -> Result<RecordBatch>;
}

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
    /// Row 0 of the named columns (`None`: the input has no rows, or the source cannot say:
    /// only Parquet inputs hold encoded images).
    fn first_row(&self, cols: &[&str]) -> Result<Option<RecordBatch>> {
        let _ = cols;
        Ok(None)
    }
    /// A column of episode ids the input defines itself (Minari's episode groups), used when
    /// the caller gives no boundary option.
    fn episode_column(&self) -> Option<&str> {
        None
    }
    /// The [`Convention`] of `.npz` inputs, and the files read.
    fn convention(&self) -> Option<ConventionReport> {
        None
    }
    /// Input rows at which an input file ends where an episode must end too (OGBench files
    /// end every trajectory), with the file.
    fn file_ends(&self) -> Vec<(u64, std::path::PathBuf)> {
        vec![]
    }
    /// The input file that holds input row `row`, for inputs of several files (errors about a
    /// row name it).
    fn file_of(&self, row: u64) -> Option<&Path> {
        let _ = row;
        None
    }
}

/// `e`, an error about input row `row`, naming the file of `source` that holds it when the
/// error names no input.
pub(crate) fn in_file_of(e: Error, source: &dyn Source, row: u64) -> Error {
    match (&e, source.file_of(row)) {
        (Error::InvalidData { input: None, .. }, Some(p)) => e.in_input(p.display()),
        _ => e,
    }
}

/// Opens `input` as a [`Source`] of the given format.
pub(crate) fn open_source(
    input: &Path,
    format: InputFormat,
    opts: &IngestOptions,
) -> Result<Box<dyn Source>> {
    let convention = opts.convention.filter(|&c| c != Convention::Rows);
    if let (Some(c), false) = (convention, format == InputFormat::Numpy) {
        return Err(Error::argument(
            "convention",
            format!("--convention {c} applies to NumPy .npz files and directories of them"),
        ));
    }
    Ok(match format {
        InputFormat::Parquet => Box::new(ParquetSource::open(input)?),
        InputFormat::Numpy => match npz_dir::NpzFiles::open(input, opts)? {
            Some(files) => Box::new(files),
            None if convention.is_some() => {
                return Err(Error::argument(
                    "convention",
                    format!(
                        "--convention {} applies to .npz files and directories of them; {} is \
                         neither",
                        convention.expect("a convention"),
                        input.display()
                    ),
                ));
            }
            None => Box::new(array::ArraySource::open(input, &opts.drop_cols)?),
        },
        InputFormat::TorchRl => Box::new(torchrl::open(input, &opts.drop_cols)?),
        InputFormat::Hdf5 => hdf5::open(input, &opts.drop_cols)?,
        InputFormat::Arrow => Box::new(arrow_ipc::ArrowSource::open(input)?),
    })
}

/// Column `name` of a decoded input batch.
pub(crate) fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| Error::schema(name, "the decoded batch has no such column"))
}

/// Column `name` is null at input row `row`.
pub(crate) fn null_at(name: &str, row: u64) -> Error {
    Error::invalid_data(format!("row {row} is null")).in_column(name)
}

/// The length of row 0 of each list column `cols` of `batch` (which must have a row).
pub(crate) fn row0_list_lengths(
    batch: &RecordBatch,
    cols: &[&str],
) -> Result<Vec<(String, usize)>> {
    cols.iter()
        .map(|&c| {
            let a = column(batch, c)?;
            if a.is_null(0) {
                return Err(null_at(c, 0));
            }
            let n = match a.data_type() {
                DataType::List(_) => a.as_list::<i32>().value_length(0) as usize,
                _ => a.as_list::<i64>().value_length(0) as usize,
            };
            if n == 0 {
                return Err(Error::invalid_data("row 0 is an empty list").in_column(c));
            }
            Ok((c.to_string(), n))
        })
        .collect()
}
