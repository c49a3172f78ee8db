//! Parquet input: one file or a directory of them (sharded datasets, LeRobot's `data/`).

use std::fs::File;
use std::path::{Path, PathBuf};

use ::parquet::arrow::ProjectionMask;
use ::parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use super::*;
use crate::error::{Error, Result};

/// The Parquet files of a directory, recursively, sorted by path: a sharded dataset, or the
/// `data/` directory of a LeRobot dataset (one with `meta/info.json`; its `meta/` may hold
/// Parquet files of per-episode metadata, which are not transitions).
pub(crate) fn parquet_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let root = if dir.join("meta").join("info.json").is_file() && dir.join("data").is_dir() {
        dir.join("data")
    } else {
        dir.to_path_buf()
    };
    let mut out = vec![];
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))? {
            let p = entry.map_err(|e| Error::io(&d, e))?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Parquet input: one file, or every Parquet file under a directory ([`parquet_files`]), which
/// must all have the same columns. A unit is one row group of one file.
pub(crate) struct ParquetSource {
    path: PathBuf,
    files: Vec<(PathBuf, ArrowReaderMetadata)>,
    /// (file, row group, rows) of every non-empty row group, in order.
    groups: Vec<(usize, usize, u64)>,
}

impl ParquetSource {
    pub(crate) fn open(path: &Path) -> Result<ParquetSource> {
        let paths = if path.is_dir() {
            let files = parquet_files(path)?;
            if files.is_empty() {
                return Err(Error::invalid_data("the directory holds no .parquet files")
                    .in_input(path.display()));
            }
            files
        } else {
            vec![path.to_path_buf()]
        };
        let mut files: Vec<(PathBuf, ArrowReaderMetadata)> = vec![];
        let mut groups = vec![];
        for p in paths {
            let file = File::open(&p).map_err(|e| Error::io(&p, e))?;
            // The footer's `ARROW:schema` (base64 of an IPC schema message) is decoded by
            // arrow-ipc, which panics on some damaged ones: caught, and named by the file.
            let meta = guarded(&p, "not a readable Parquet file", || {
                Ok(ArrowReaderMetadata::load(&file, Default::default())?)
            })?;
            if let Some((first, m)) = files.first() {
                let (a, b) = (m.schema(), meta.schema());
                let columns = |s: &SchemaRef| {
                    s.fields()
                        .iter()
                        .map(|f| format!("{}: {}", f.name(), f.data_type()))
                        .collect::<Vec<_>>()
                };
                if columns(a) != columns(b) {
                    // Same columns, one of another type: that column is named, with both types.
                    let same_names = a.fields().len() == b.fields().len()
                        && a.fields()
                            .iter()
                            .zip(b.fields())
                            .all(|(x, y)| x.name() == y.name());
                    let retyped = a
                        .fields()
                        .iter()
                        .zip(b.fields())
                        .find(|(x, y)| x.data_type() != y.data_type());
                    if let (true, Some((x, y))) = (same_names, retyped) {
                        return Err(Error::schema_types(
                            x.name(),
                            x.data_type(),
                            y.data_type(),
                            format!(
                                "the column's type in {} differs from its type in {}: every file \
                                 of a directory must have the same columns",
                                p.display(),
                                first.display()
                            ),
                        ));
                    }
                    return Err(Error::schema_mismatch(format!(
                        "{} has columns [{}], but {} has [{}]: every file of a directory must have \
                         the same columns",
                        p.display(),
                        columns(b).join(", "),
                        first.display(),
                        columns(a).join(", ")
                    )));
                }
            }
            let md = meta.metadata();
            for g in 0..md.num_row_groups() {
                let rows = md.row_group(g).num_rows().max(0) as u64;
                if rows > 0 {
                    groups.push((files.len(), g, rows));
                }
            }
            files.push((p, meta));
        }
        Ok(ParquetSource {
            path: path.to_path_buf(),
            files,
            groups,
        })
    }
}

impl Source for ParquetSource {
    fn path(&self) -> &Path {
        &self.path
    }

    fn schema(&self) -> SchemaRef {
        self.files[0].1.schema().clone()
    }

    fn units(&self, _batch_rows: usize) -> Vec<(usize, u64, u64)> {
        units_of(self.groups.iter().map(|g| g.2).enumerate())
    }

    fn parallel(&self) -> bool {
        true
    }

    fn read(
        &self,
        unit: usize,
        projection: &[usize],
        batch_rows: usize,
    ) -> Result<Vec<RecordBatch>> {
        let (f, group, _) = self.groups[unit];
        let (path, meta) = &self.files[f];
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        guarded(path, &format!("row group {group}"), || {
            let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
                .with_row_groups(vec![group])
                .with_projection(ProjectionMask::roots(
                    meta.parquet_schema(),
                    projection.iter().copied(),
                ))
                .with_batch_size(batch_rows)
                .build()?;
            let mut out = vec![];
            for b in reader {
                let b = b?;
                if b.num_rows() > 0 {
                    out.push(b);
                }
            }
            Ok(out)
        })
    }

    fn first_row_lengths(&self, cols: &[&str]) -> Result<Vec<(String, usize)>> {
        if cols.is_empty() {
            return Ok(vec![]);
        }
        match self.first_row(cols)? {
            Some(batch) => row0_list_lengths(&batch, cols),
            None => Err(Error::invalid_data(
                "the input has no rows, so the length of this list column cannot be inferred",
            )
            .in_input(self.path.display())
            .in_column(cols[0])),
        }
    }

    fn file_of(&self, row: u64) -> Option<&Path> {
        let mut start = 0;
        for &(f, _, rows) in &self.groups {
            if row < start + rows {
                return Some(&self.files[f].0);
            }
            start += rows;
        }
        None
    }

    fn first_row(&self, cols: &[&str]) -> Result<Option<RecordBatch>> {
        let Some(&(f, _, _)) = self.groups.first() else {
            return Ok(None);
        };
        let (path, meta) = &self.files[f];
        let schema = meta.schema();
        let idx: Vec<usize> = cols
            .iter()
            .filter_map(|c| schema.index_of(c).ok())
            .collect();
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        guarded(path, "row 0", || {
            let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
                .with_projection(ProjectionMask::roots(meta.parquet_schema(), idx))
                .with_batch_size(1)
                .with_limit(1)
                .build()?;
            Ok(reader.next().transpose()?)
        })
    }
}

/// Runs a call of the Parquet reader on file `path`: its errors, and its panics on malformed
/// input (arrow-ipc's decoding of a damaged `ARROW:schema`, for one), are
/// [`Error::InvalidData`] naming the file, `what` (e.g. `row group 3`) and the cause.
fn guarded<T>(
    path: &Path,
    what: &str,
    f: impl FnOnce() -> std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>,
) -> Result<T> {
    let reason = match crate::guard::quietly(f) {
        Ok(Ok(v)) => return Ok(v),
        Ok(Err(e)) => e.to_string(),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            format!("undecodable data (the Parquet reader failed: {msg})")
        }
    };
    Err(Error::invalid_data(format!("{what}: {reason}")).in_input(path.display()))
}

/// [`Source::units`] of units `(unit, rows)` that follow one another: each with its first row.
pub(crate) fn units_of(units: impl Iterator<Item = (usize, u64)>) -> Vec<(usize, u64, u64)> {
    let mut base = 0u64;
    units
        .map(|(unit, rows)| {
            base += rows;
            (unit, base - rows, rows)
        })
        .collect()
}
