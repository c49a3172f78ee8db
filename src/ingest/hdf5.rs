//! HDF5 input in D4RL's layout: a file whose datasets (at any depth: `observations`,
//! `infos/qpos`) are per-transition arrays with the transition as their first dimension, as
//! written by D4RL's `get_dataset()` files and by `h5py` dumps. Read with the pure-Rust
//! `hdf5-reader` (no libhdf5): contiguous and chunked layouts, deflate and shuffle filters, h5py's
//! booleans (an enum over int8).
//!
//! Scalars and strings (D4RL's `metadata/` group) describe the file, not transitions: they are
//! not columns. Minari's layout (one group per episode) is recognised and rejected with what to
//! do instead.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, PrimitiveArray};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type,
    Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use hdf5_reader::{Datatype, H5Type, Hdf5File, SliceInfo, SliceInfoElem};

use super::numpy::{Array, Data, Dtype, Header, NumpySource};
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

fn h5_error(what: &str, e: impl fmt::Display) -> Error {
    Error::InvalidData(format!("{what}: {e}"))
}

/// Rows `start..start + n` of a dataset as `T`s, flat.
fn read_typed<T: H5Type>(
    d: &H5Data,
    shape: &[usize],
    start: u64,
    n: usize,
    what: &str,
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
    Ok(array.into_iter().collect())
}

fn primitive<A: ArrowPrimitiveType>(
    d: &H5Data,
    shape: &[usize],
    start: u64,
    n: usize,
    what: &str,
) -> Result<ArrayRef>
where
    A::Native: H5Type,
{
    let values = read_typed::<A::Native>(d, shape, start, n, what)?;
    Ok(Arc::new(PrimitiveArray::<A>::from_iter_values(values)))
}

impl H5Data {
    /// Rows `start..start + n`, flat (rows × width values).
    pub(super) fn read_rows(
        &self,
        header: &Header,
        start: u64,
        n: usize,
        what: &str,
    ) -> Result<ArrayRef> {
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
                return Err(Error::SchemaMismatch(format!(
                    "{what}: {other} is not read from HDF5"
                )));
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
    let what = path.display().to_string();
    let (groups, datasets) = group.members().map_err(|e| h5_error(&what, e))?;
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
            Error::SchemaMismatch(format!(
                "{what}: dataset `{name}` has HDF5 type {:?}, which is not supported (bool, \
                 integers, float32/64); pass --drop-cols {name}",
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
                data: Data::Hdf5(H5Data {
                    file: file.clone(),
                    path: name,
                }),
            }),
        ));
    }
    for g in groups {
        let sub = format!("{prefix}{}/", g.name());
        walk(file, &g, &sub, drop, path, out)?;
    }
    Ok(())
}

/// Opens an HDF5 file in D4RL's layout as a source.
pub(crate) fn open(path: &Path, drop: &[String]) -> Result<NumpySource> {
    let what = path.display().to_string();
    if !path.exists() {
        return Err(Error::io(
            path,
            std::io::Error::from(std::io::ErrorKind::NotFound),
        ));
    }
    let file = Arc::new(
        Hdf5File::open(path)
            .map_err(|e| Error::InvalidData(format!("{what}: not a readable HDF5 file: {e}")))?,
    );
    let root = file.root_group().map_err(|e| h5_error(&what, e))?;
    let (groups, _) = root.member_names().map_err(|e| h5_error(&what, e))?;
    if !groups.is_empty() && groups.iter().all(|g| g.starts_with("episode_")) {
        return Err(Error::InvalidArgument(format!(
            "{what} is in Minari's layout (one group per episode), which is not read yet; export \
             it with minari (dataset.iterate_episodes()) to Parquet or NumPy, or use D4RL's flat \
             layout"
        )));
    }
    let mut arrays = vec![];
    walk(&file, &root, "", drop, path, &mut arrays)?;
    if arrays.iter().all(|(_, a)| a.is_none()) {
        return Err(Error::InvalidData(format!(
            "{what} holds no per-transition datasets"
        )));
    }
    NumpySource::from_arrays(path, arrays, None, 0)
}
