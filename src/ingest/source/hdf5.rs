//! HDF5 input in D4RL's layout: a file whose datasets (at any depth: `observations`,
//! `infos/qpos`) are per-transition arrays with the transition as their first dimension, as
//! written by D4RL's `get_dataset()` files and by `h5py` dumps. Read with the pure-Rust
//! `hdf5-reader` (no libhdf5): contiguous and chunked layouts, deflate and shuffle filters, h5py's
//! booleans (an enum over int8).
//!
//! Scalars and strings (D4RL's `metadata/` group) describe the file, not transitions: they are
//! not columns.
//!
//! Minari's layout (`data/main_data.hdf5`: one group `episode_K` per episode, with `N + 1`
//! observations and `N` actions, rewards, terminations and truncations) is read by
//! [`MinariSource`]: observation row `t` is the observation, row `t + 1` the next observation
//! (stored, so an episode's final observation is kept), and the episodes are Minari's own
//! (column `episode`, kept as `source_episode`), with their flags read on the last step.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, BooleanArray, PrimitiveArray, RecordBatch, UInt64Array};
use arrow::buffer::{BooleanBuffer, ScalarBuffer};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type,
    Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use hdf5_reader::{Datatype, H5Type, Hdf5File, SliceInfo, SliceInfoElem};

use arrow::datatypes::{Field, Schema, SchemaRef};

use super::Source;
use super::array::{Array, ArraySource, Data, ReadRows, column_field, fixed_rows, unit_rows};
use super::npy::{Dtype, Header, Loc};
use crate::error::{Error, Result};

/// A dataset of an open HDF5 file.
#[derive(Clone)]
pub(crate) struct H5Data {
    file: Arc<Hdf5File>,
    path: String,
}

impl fmt::Debug for H5Data {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "H5Data({})", self.path)
    }
}

/// One value of an h5py boolean (or any 1-byte integer read as a flag).
#[derive(Clone, Debug, Default)]
struct Flag(bool);

impl H5Type for Flag {
    fn hdf5_type() -> Datatype {
        <u8 as H5Type>::hdf5_type()
    }

    fn from_bytes(bytes: &[u8], _dtype: &Datatype) -> hdf5_reader::error::Result<Self> {
        Ok(Flag(bytes.iter().any(|&b| b != 0)))
    }

    fn element_size(dtype: &Datatype) -> usize {
        hdf5_reader::dtype_element_size(dtype).unwrap_or(1)
    }
}

/// An error of the HDF5 reader, at `at`.
fn h5_error(at: &Loc, e: impl fmt::Display) -> Error {
    at.data(e.to_string())
}

/// Runs a call of the HDF5 reader, which may panic on a malformed file: a panic is an
/// [`Error::InvalidData`] at `at`.
fn guarded<T>(at: &Loc, f: impl FnOnce() -> Result<T>) -> Result<T> {
    crate::guard::quietly(f).unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(at.data(format!(
            "undecodable HDF5 data (the HDF5 reader failed: {msg})"
        )))
    })
}

/// Rows `start..start + n` of a dataset as `T`s, flat.
fn read_typed<T: H5Type>(
    d: &H5Data,
    shape: &[usize],
    start: u64,
    n: usize,
    what: &Loc,
) -> Result<Vec<T>> {
    guarded(what, || read_typed_unguarded(d, shape, start, n, what))
}

fn read_typed_unguarded<T: H5Type>(
    d: &H5Data,
    shape: &[usize],
    start: u64,
    n: usize,
    what: &Loc,
) -> Result<Vec<T>> {
    let dataset = d.file.dataset(&d.path).map_err(|e| h5_error(what, e))?;
    let mut selections = vec![SliceInfoElem::Slice {
        start,
        end: start + n as u64,
        step: 1,
    }];
    selections.extend(shape[1..].iter().map(|&k| SliceInfoElem::Slice {
        start: 0,
        end: k as u64,
        step: 1,
    }));
    let array = dataset
        .read_slice::<T>(&SliceInfo { selections })
        .map_err(|e| h5_error(what, e))?;
    if array.is_standard_layout() {
        // The freshly read array owns its elements in row-major order: take them as they are.
        let len = array.len();
        let (mut values, offset) = array.into_raw_vec_and_offset();
        let offset = offset.unwrap_or(0);
        if offset == 0 && values.len() == len {
            return Ok(values);
        }
        values.truncate(offset + len);
        return Ok(values.split_off(offset));
    }
    Ok(array.iter().cloned().collect())
}

fn primitive<A: ArrowPrimitiveType>(
    d: &H5Data,
    shape: &[usize],
    start: u64,
    n: usize,
    what: &Loc,
) -> Result<ArrayRef>
where
    A::Native: H5Type,
{
    let values = read_typed::<A::Native>(d, shape, start, n, what)?;
    Ok(Arc::new(PrimitiveArray::<A>::new(
        ScalarBuffer::from(values),
        None,
    )))
}

impl ReadRows for H5Data {
    fn read_rows(&self, header: &Header, start: u64, n: usize, what: &Loc) -> Result<ArrayRef> {
        let shape = &header.shape;
        Ok(match &header.dtype.arrow {
            DataType::Boolean => {
                let flags = read_typed::<Flag>(self, shape, start, n, what)?;
                Arc::new(BooleanArray::new(
                    BooleanBuffer::collect_bool(flags.len(), |k| flags[k].0),
                    None,
                ))
            }
            DataType::Float32 => primitive::<Float32Type>(self, shape, start, n, what)?,
            DataType::Float64 => primitive::<Float64Type>(self, shape, start, n, what)?,
            DataType::Int8 => primitive::<Int8Type>(self, shape, start, n, what)?,
            DataType::Int16 => primitive::<Int16Type>(self, shape, start, n, what)?,
            DataType::Int32 => primitive::<Int32Type>(self, shape, start, n, what)?,
            DataType::Int64 => primitive::<Int64Type>(self, shape, start, n, what)?,
            DataType::UInt8 => primitive::<UInt8Type>(self, shape, start, n, what)?,
            DataType::UInt16 => primitive::<UInt16Type>(self, shape, start, n, what)?,
            DataType::UInt32 => primitive::<UInt32Type>(self, shape, start, n, what)?,
            DataType::UInt64 => primitive::<UInt64Type>(self, shape, start, n, what)?,
            other => {
                return Err(what.schema(format!("{other} is not read from HDF5")));
            }
        })
    }
}

/// The Arrow type of an HDF5 datatype, if it is one a column can hold.
fn dtype(dt: &Datatype) -> Option<Dtype> {
    let (arrow, size) = match dt {
        Datatype::FloatingPoint { size: 4, .. } => (DataType::Float32, 4),
        Datatype::FloatingPoint { size: 8, .. } => (DataType::Float64, 8),
        Datatype::FixedPoint { size, signed, .. } => match (size, signed) {
            (1, true) => (DataType::Int8, 1),
            (2, true) => (DataType::Int16, 2),
            (4, true) => (DataType::Int32, 4),
            (8, true) => (DataType::Int64, 8),
            (1, false) => (DataType::UInt8, 1),
            (2, false) => (DataType::UInt16, 2),
            (4, false) => (DataType::UInt32, 4),
            (8, false) => (DataType::UInt64, 8),
            _ => return None,
        },
        // h5py stores numpy booleans as an enum {FALSE: 0, TRUE: 1} over int8.
        Datatype::Enum { base, members }
            if members.len() == 2
                && members.iter().any(|m| m.name == "TRUE")
                && matches!(**base, Datatype::FixedPoint { size: 1, .. }) =>
        {
            (DataType::Boolean, 1)
        }
        _ => return None,
    };
    Some(Dtype { arrow, size })
}

/// Every dataset under `group`, depth first, named by its path from the root.
fn walk(
    file: &Arc<Hdf5File>,
    group: &hdf5_reader::group::Group,
    prefix: &str,
    drop: &[String],
    path: &Path,
    out: &mut Vec<(String, Option<Array>)>,
) -> Result<()> {
    let (groups, datasets) = group
        .members()
        .map_err(|e| h5_error(&Loc::file(path), format!("group `/{prefix}`: {e}")))?;
    for d in datasets {
        let name = format!("{prefix}{}", d.name());
        if drop.contains(&name) {
            out.push((name, None));
            continue;
        }
        let shape: Vec<usize> = d.shape().iter().map(|&k| k as usize).collect();
        let is_string = matches!(d.dtype(), Datatype::String { .. } | Datatype::VarLen { .. });
        // File-level metadata (D4RL's `metadata/`), not one value per transition.
        if shape.is_empty() || is_string || name.starts_with("metadata/") {
            continue;
        }
        let dt = dtype(d.dtype()).ok_or_else(|| {
            Loc::array(path, &name).schema(format!(
                "dataset `{name}` has HDF5 type {:?}, which is not supported (bool, integers, \
                 float32/64); pass --drop-cols {name}",
                d.dtype()
            ))
        })?;
        out.push((
            name.clone(),
            Some(Array {
                name: name.clone(),
                header: Header {
                    dtype: dt,
                    shape,
                    data_offset: 0,
                },
                data: Data::Rows(Arc::new(H5Data {
                    file: file.clone(),
                    path: name,
                })),
            }),
        ));
    }
    for g in groups {
        let sub = format!("{prefix}{}/", g.name());
        walk(file, &g, &sub, drop, path, out)?;
    }
    Ok(())
}

/// Where a Minari dataset directory keeps its data.
pub(crate) fn minari_file(dir: &Path) -> PathBuf {
    dir.join("data").join("main_data.hdf5")
}

/// Opens an HDF5 file (or a Minari dataset directory) as a source: Minari's layout when the root
/// holds `episode_*` groups, else D4RL's.
pub(crate) fn open(path: &Path, drop: &[String]) -> Result<Box<dyn Source>> {
    guarded(&Loc::file(path), || open_unguarded(path, drop))
}

fn open_unguarded(path: &Path, drop: &[String]) -> Result<Box<dyn Source>> {
    let file_path = if path.is_dir() {
        minari_file(path)
    } else {
        path.to_path_buf()
    };
    let what = Loc::file(path);
    if !file_path.exists() {
        return Err(Error::io(
            &file_path,
            std::io::Error::from(std::io::ErrorKind::NotFound),
        ));
    }
    let file = Arc::new(
        Hdf5File::open(&file_path)
            .map_err(|e| what.data(format!("not a readable HDF5 file: {e}")))?,
    );
    let root = file.root_group().map_err(|e| h5_error(&what, e))?;
    let (groups, _) = root.member_names().map_err(|e| h5_error(&what, e))?;
    if !groups.is_empty() && groups.iter().all(|g| g.starts_with("episode_")) {
        return Ok(Box::new(MinariSource::open(path, file, groups, drop)?));
    }
    let mut arrays = vec![];
    walk(&file, &root, "", drop, path, &mut arrays)?;
    if arrays.iter().all(|(_, a)| a.is_none()) {
        return Err(what.data("the file holds no per-transition datasets"));
    }
    Ok(Box::new(ArraySource::from_arrays(path, arrays, None, 0)?))
}

/// The synthesized column of Minari episode ids.
const MINARI_EPISODE: &str = "episode";

/// A column of a Minari file: the dataset at `rel` inside every episode group, read from row
/// `shift` on (1 for next observations and step infos, which have a row per state).
struct MinariColumn {
    rel: String,
    shift: u64,
    /// The dataset has a row per state (steps + 1), not per step.
    per_state: bool,
    /// dtype and row shape (the first dimension is the first episode's, unused).
    header: Header,
}

/// Minari's layout: one group per episode; a unit is a run of rows of one episode.
pub(crate) struct MinariSource {
    path: PathBuf,
    file: Arc<Hdf5File>,
    schema: SchemaRef,
    /// One per schema field; `None` for dropped columns and for [`MINARI_EPISODE`].
    columns: Vec<Option<MinariColumn>>,
    /// (group name, Minari episode id, steps), in id order.
    episodes: Vec<(String, u64, u64)>,
    /// (episode index, first step, steps) of each unit, set by `units`.
    units: Mutex<Vec<(usize, u64, u64)>>,
}

impl MinariSource {
    fn open(
        path: &Path,
        file: Arc<Hdf5File>,
        groups: Vec<String>,
        drop: &[String],
    ) -> Result<MinariSource> {
        let what = Loc::file(path);
        let mut episodes = vec![];
        for g in groups {
            let id: u64 = g["episode_".len()..]
                .parse()
                .map_err(|_| what.data(format!("group `{g}` is not `episode_<number>`")))?;
            let steps_of = |name: &str| -> Option<u64> {
                file.dataset(&format!("{g}/{name}"))
                    .ok()
                    .and_then(|d| d.shape().first().copied())
            };
            let steps = steps_of("rewards")
                .or_else(|| steps_of("actions"))
                .ok_or_else(|| {
                    what.schema(format!(
                        "episode group `{g}` has neither `rewards` nor `actions`"
                    ))
                })?;
            episodes.push((g, id, steps));
        }
        episodes.sort_by_key(|e| e.1);
        // Columns from the first episode; every other episode must have the same.
        let (first, _, n) = episodes[0].clone();
        let mut found = vec![];
        let group = file
            .group(&first)
            .map_err(|e| h5_error(&what, format!("group `{first}`: {e}")))?;
        collect(&group, &first, "", path, &mut found)?;
        let mut fields = vec![Field::new(MINARI_EPISODE, DataType::UInt64, false)];
        let mut columns = vec![None];
        for (rel, shape, dt) in found {
            let rows = shape.first().copied().unwrap_or(0) as u64;
            let Some(dt) = dt else {
                if drop.contains(&rel) {
                    continue;
                }
                return Err(Loc::array(path, &rel).schema(format!(
                    "dataset `{first}/{rel}` has a type that is not supported (bool, integers, \
                     float32/64); pass --drop-cols {rel}"
                )));
            };
            let header = Header {
                dtype: dt,
                shape,
                data_offset: 0,
            };
            let per_state = rows == n + 1;
            let mut add = |name: String, shift: u64| -> Result<()> {
                if drop.contains(&name) {
                    fields.push(Field::new(&name, DataType::Null, true));
                    columns.push(None);
                } else {
                    fields.push(column_field(&name, &header)?);
                    columns.push(Some(MinariColumn {
                        rel: rel.clone(),
                        shift,
                        per_state,
                        header: header.clone(),
                    }));
                }
                Ok(())
            };
            if rows == n {
                add(rel.clone(), 0)?;
            } else if rows == n + 1 && rel.starts_with("observations") {
                add(rel.clone(), 0)?;
                add(format!("next_{rel}"), 1)?;
            } else if rows == n + 1 {
                // Per-state infos: row 0 is the reset's, row t + 1 the one step t returned.
                add(rel.clone(), 1)?;
            } else {
                return Err(Loc::array(path, &rel).schema(format!(
                    "`{first}/{rel}` has {rows} rows for {n} steps (neither one per step nor one \
                     per state); pass --drop-cols {rel}"
                )));
            }
        }
        // Every episode has every column, with its number of rows.
        for (g, id, steps) in &episodes {
            for c in columns.iter().flatten() {
                let d = file.dataset(&format!("{g}/{}", c.rel)).map_err(|e| {
                    h5_error(&Loc::array(path, &c.rel), format!("`{g}/{}`: {e}", c.rel))
                        .in_episode(*id as i64)
                })?;
                let shape: Vec<usize> = d.shape().iter().map(|&k| k as usize).collect();
                let want = steps + u64::from(c.per_state);
                if shape.first().copied().unwrap_or(0) as u64 != want
                    || shape.get(1..) != c.header.shape.get(1..)
                {
                    let mut expected = vec![want as usize];
                    expected.extend_from_slice(c.header.shape.get(1..).unwrap_or_default());
                    return Err(Error::schema_types(
                        &c.rel,
                        format!("shape {expected:?}"),
                        format!("shape {shape:?}"),
                        format!(
                            "{}: `{g}/{}` (episode {id}) is not shaped like the first episode's \
                             ({steps} steps)",
                            what.input, c.rel
                        ),
                    ));
                }
            }
        }
        Ok(MinariSource {
            path: path.to_path_buf(),
            file,
            schema: Arc::new(Schema::new(fields)),
            columns,
            episodes,
            units: Mutex::new(vec![]),
        })
    }
}

/// Every dataset under `group` (relative names; `None` type where a column cannot hold it),
/// skipping scalars and strings.
fn collect(
    group: &hdf5_reader::group::Group,
    base: &str,
    prefix: &str,
    path: &Path,
    out: &mut Vec<(String, Vec<usize>, Option<Dtype>)>,
) -> Result<()> {
    let (groups, datasets) = group
        .members()
        .map_err(|e| h5_error(&Loc::file(path), format!("group `{base}/{prefix}`: {e}")))?;
    for d in datasets {
        let shape: Vec<usize> = d.shape().iter().map(|&k| k as usize).collect();
        let is_string = matches!(d.dtype(), Datatype::String { .. } | Datatype::VarLen { .. });
        if shape.is_empty() || is_string {
            continue;
        }
        out.push((format!("{prefix}{}", d.name()), shape, dtype(d.dtype())));
    }
    for g in groups {
        collect(&g, base, &format!("{prefix}{}/", g.name()), path, out)?;
    }
    Ok(())
}

impl Source for MinariSource {
    super::path_and_schema_fields!();

    fn units(&self, batch_rows: usize) -> Vec<(usize, u64, u64)> {
        let per = unit_rows(batch_rows);
        let mut units = vec![];
        let mut out = vec![];
        let mut base = 0;
        for (e, &(_, _, steps)) in self.episodes.iter().enumerate() {
            let mut at = 0;
            while at < steps {
                let k = per.min(steps - at);
                out.push((units.len(), base + at, k));
                units.push((e, at, k));
                at += k;
            }
            base += steps;
        }
        *self.units.lock().expect("units lock") = units;
        out
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
        let (e, at, rows) = self.units.lock().expect("units lock")[unit];
        let (group, id, _) = &self.episodes[e];
        let schema = Arc::new(self.schema.project(projection)?);
        let mut out = vec![];
        let mut done = 0;
        while done < rows {
            let n = (rows - done).min(batch_rows as u64) as usize;
            let mut arrays: Vec<ArrayRef> = vec![];
            for &i in projection {
                arrays.push(match &self.columns[i] {
                    None => Arc::new(UInt64Array::from(vec![*id; n])),
                    Some(c) => {
                        let d = H5Data {
                            file: self.file.clone(),
                            path: format!("{group}/{}", c.rel),
                        };
                        let what = Loc::array(&self.path, self.schema.field(i).name());
                        let rows = d
                            .read_rows(&c.header, c.shift + at + done, n, &what)
                            .map_err(|e| e.in_episode(*id as i64))?;
                        fixed_rows(&c.header, rows)?
                    }
                });
            }
            out.push(RecordBatch::try_new(schema.clone(), arrays)?);
            done += n as u64;
        }
        Ok(out)
    }

    fn episode_column(&self) -> Option<&str> {
        Some(MINARI_EPISODE)
    }
}
