//! Conversion of one decoded batch into the dataset's column types (runs on the rayon pool).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, BooleanArray, FixedSizeListArray,
    OffsetSizeTrait, PrimitiveArray, RecordBatch,
};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{
    DataType, Field, Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type,
    Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};

use super::*;
use crate::error::{Error, Result};
use crate::format::col;

/// One decoded and converted record batch.
pub(crate) struct Chunk {
    /// Input row of the chunk's first row.
    pub(crate) base: u64,
    /// Converted payload, in the dataset's payload schema.
    pub(crate) payload: RecordBatch,
    /// Episode ids as u64 bit patterns (episode-id mode).
    pub(crate) ids: Option<Vec<u64>>,
    pub(crate) terminated: Option<BooleanArray>,
    pub(crate) truncated: Option<BooleanArray>,
}

/// Column `name` has a null list item in input row `row`.
fn null_item_at(name: &str, row: u64) -> Error {
    Error::invalid_data(format!("row {row} has a null list item")).in_column(name)
}

pub(crate) fn check_no_nulls(a: &dyn Array, name: &str, base: u64) -> Result<()> {
    if a.null_count() > 0
        && let Some(i) = (0..a.len()).find(|&i| a.is_null(i))
    {
        return Err(null_at(name, base + i as u64));
    }
    Ok(())
}

pub(crate) fn cast_to(a: &ArrayRef, dt: &DataType, name: &str) -> Result<ArrayRef> {
    if a.data_type() == dt {
        return Ok(a.clone());
    }
    let opts = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(a, dt, &opts)
        .map_err(|e| Error::invalid_data(format!("cannot convert to {dt}: {e}")).in_column(name))
}

/// The values of `a` flattened to `width` per row (scalar, nested fixed-size list, or list of
/// exactly `width`), checking nulls and lengths and naming the input row of any problem.
pub(crate) fn flatten(a: &ArrayRef, name: &str, width: usize, base: u64) -> Result<ArrayRef> {
    check_no_nulls(a.as_ref(), name, base)?;
    let rows = a.len();
    let values = match a.data_type() {
        DataType::FixedSizeList(..) => {
            let mut values = a.clone();
            let mut per_row = 1;
            while let DataType::FixedSizeList(_, n) = values.data_type() {
                per_row *= *n as usize;
                let next = values.as_fixed_size_list().values().clone();
                if next.null_count() > 0
                    && let Some(i) = (0..next.len()).find(|&i| next.is_null(i))
                {
                    return Err(null_item_at(name, base + (i / per_row) as u64));
                }
                values = next;
            }
            values
        }
        DataType::List(_) => list_values::<i32>(a, name, width, base)?,
        DataType::LargeList(_) => list_values::<i64>(a, name, width, base)?,
        _ => a.clone(),
    };
    if values.len() != rows * width {
        return Err(Error::invalid_data(format!(
            "{} values for {rows} rows, expected {width} per row",
            values.len()
        ))
        .in_column(name));
    }
    Ok(values)
}

pub(crate) fn list_values<O: OffsetSizeTrait>(
    a: &ArrayRef,
    name: &str,
    width: usize,
    base: u64,
) -> Result<ArrayRef> {
    let list = a.as_list::<O>();
    let offsets = list.value_offsets();
    for (i, w) in offsets.windows(2).enumerate() {
        let n = (w[1] - w[0]).as_usize();
        if n != width {
            return Err(Error::invalid_data(format!(
                "row {} has a list of length {n}, expected {width} (the length of the first row; \
                 every row must have the same length)",
                base + i as u64
            ))
            .in_column(name));
        }
    }
    let start = offsets[0].as_usize();
    let values = list
        .values()
        .slice(start, offsets[offsets.len() - 1].as_usize() - start);
    if values.null_count() > 0
        && let Some(i) = (0..values.len()).find(|&i| values.is_null(i))
    {
        return Err(null_item_at(name, base + (i / width) as u64));
    }
    Ok(values)
}

/// Concatenates per-row blocks of several primitive arrays: row r of the output is row r of
/// each part, in order.
pub(crate) fn interleave_typed<T: ArrowPrimitiveType>(
    parts: &[(ArrayRef, usize)],
    rows: usize,
) -> ArrayRef {
    let total: usize = parts.iter().map(|p| p.1).sum();
    let slices: Vec<(&[T::Native], usize)> = parts
        .iter()
        .map(|(a, w)| (a.as_primitive::<T>().values().as_ref(), *w))
        .collect();
    let mut out = Vec::with_capacity(rows * total);
    for r in 0..rows {
        for (v, w) in &slices {
            out.extend_from_slice(&v[r * w..(r + 1) * w]);
        }
    }
    Arc::new(PrimitiveArray::<T>::from_iter_values(out))
}

pub(crate) fn interleave_rows(
    parts: &[(ArrayRef, usize)],
    rows: usize,
    elem: &DataType,
) -> Result<ArrayRef> {
    Ok(match elem {
        DataType::Int8 => interleave_typed::<Int8Type>(parts, rows),
        DataType::Int16 => interleave_typed::<Int16Type>(parts, rows),
        DataType::Int32 => interleave_typed::<Int32Type>(parts, rows),
        DataType::Int64 => interleave_typed::<Int64Type>(parts, rows),
        DataType::UInt8 => interleave_typed::<UInt8Type>(parts, rows),
        DataType::UInt16 => interleave_typed::<UInt16Type>(parts, rows),
        DataType::UInt32 => interleave_typed::<UInt32Type>(parts, rows),
        DataType::UInt64 => interleave_typed::<UInt64Type>(parts, rows),
        DataType::Float16 => interleave_typed::<Float16Type>(parts, rows),
        DataType::Float32 => interleave_typed::<Float32Type>(parts, rows),
        DataType::Float64 => interleave_typed::<Float64Type>(parts, rows),
        other => {
            return Err(Error::schema_mismatch(format!(
                "cannot combine columns of type {other}"
            )));
        }
    })
}

pub(crate) fn convert_tensor(
    spec: &TensorSpec,
    batch: &RecordBatch,
    base: u64,
) -> Result<ArrayRef> {
    let rows = batch.num_rows();
    let parts = spec
        .sources
        .iter()
        .map(|(name, width)| {
            let flat = flatten(column(batch, name)?, name, *width, base)?;
            Ok((cast_to(&flat, &spec.elem, name)?, *width))
        })
        .collect::<Result<Vec<_>>>()?;
    let values = match parts.as_slice() {
        [(one, _)] => one.clone(),
        _ => interleave_rows(&parts, rows, &spec.elem)?,
    };
    let item = Arc::new(Field::new("item", spec.elem.clone(), false));
    Ok(Arc::new(FixedSizeListArray::try_new(
        item,
        spec.width() as i32,
        values,
        None,
    )?))
}

/// A kept column in its stored type: fixed-size lists get the stored child, nulls are checked
/// where the stored column is non-nullable.
pub(crate) fn convert_user(field: &Field, a: &ArrayRef, base: u64) -> Result<ArrayRef> {
    let name = field.name();
    if !field.is_nullable() {
        check_no_nulls(a.as_ref(), name, base)?;
    }
    match (field.data_type(), a.data_type()) {
        (DataType::FixedSizeList(item, n), DataType::FixedSizeList(_, m)) if n == m => {
            let list = a.as_fixed_size_list();
            let values = cast_to(list.values(), item.data_type(), name)?;
            let width = *n as usize;
            if values.null_count() > 0
                && let Some(i) =
                    (0..values.len()).find(|&i| values.is_null(i) && list.is_valid(i / width))
            {
                return Err(null_item_at(name, base + (i / width) as u64));
            }
            Ok(Arc::new(FixedSizeListArray::try_new(
                item.clone(),
                *n,
                values,
                list.nulls().cloned(),
            )?))
        }
        (want, _) => cast_to(a, want, name),
    }
}

pub(crate) fn convert_flags(
    batch: &RecordBatch,
    name: &Option<String>,
    base: u64,
) -> Result<Option<BooleanArray>> {
    let Some(name) = name else { return Ok(None) };
    let a = column(batch, name)?;
    check_no_nulls(a.as_ref(), name, base)?;
    Ok(Some(
        cast_to(a, &DataType::Boolean, name)?.as_boolean().clone(),
    ))
}

pub(crate) fn convert(mapping: &Mapping, batch: &RecordBatch, base: u64) -> Result<Chunk> {
    let (ids, source_ids) = match &mapping.episode {
        Some(e) => {
            let a = column(batch, &e.name)?;
            check_no_nulls(a.as_ref(), &e.name, base)?;
            if e.signed {
                let a = cast_to(a, &DataType::Int64, &e.name)?;
                let bits = a
                    .as_primitive::<Int64Type>()
                    .values()
                    .iter()
                    .map(|&v| v as u64)
                    .collect();
                (Some(bits), Some(a))
            } else {
                let a = cast_to(a, &DataType::UInt64, &e.name)?;
                (
                    Some(a.as_primitive::<UInt64Type>().values().to_vec()),
                    Some(a),
                )
            }
        }
        None => (None, None),
    };
    // What the writer takes: a frame column as its raw uint8 tensor (the writer encodes it).
    let payload_schema = mapping.converted_schema().input_schema().clone();
    let mut columns = Vec::with_capacity(payload_schema.fields().len());
    for field in payload_schema.fields() {
        let array = match field.name().as_str() {
            col::OBSERVATION => convert_tensor(&mapping.observation, batch, base)?,
            col::NEXT_OBSERVATION => match &mapping.next_observation {
                Some(spec) => convert_tensor(spec, batch, base)?,
                None => convert_user(field, column(batch, col::NEXT_OBSERVATION)?, base)?,
            },
            col::ACTION => match &mapping.action {
                ActionSpec::Discrete(name) => {
                    let a = column(batch, name)?;
                    check_no_nulls(a.as_ref(), name, base)?;
                    cast_to(a, &DataType::Int64, name)?
                }
                ActionSpec::Continuous(spec) => convert_tensor(spec, batch, base)?,
            },
            col::REWARD => match &mapping.reward {
                Some(name) => {
                    let a = column(batch, name)?;
                    check_no_nulls(a.as_ref(), name, base)?;
                    cast_to(a, &DataType::Float32, name)?
                }
                None => Arc::new(PrimitiveArray::<Float32Type>::from_value(
                    0.0,
                    batch.num_rows(),
                )),
            },
            name => match (&source_ids, name) {
                (Some(ids), SOURCE_EPISODE) => ids.clone(),
                _ => match mapping.images.iter().find(|(n, _)| n == name) {
                    Some((_, shape)) => crate::ingest::image::decode_column(
                        column(batch, name)?,
                        shape,
                        name,
                        base,
                    )?,
                    None => convert_user(field, column(batch, name)?, base)?,
                },
            },
        };
        columns.push(array);
    }
    Ok(Chunk {
        base,
        payload: RecordBatch::try_new(payload_schema, columns)?,
        ids,
        terminated: convert_flags(batch, &mapping.terminated, base)?,
        truncated: convert_flags(batch, &mapping.truncated, base)?,
    })
}

#[cfg(test)]
mod tests;
