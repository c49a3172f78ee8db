//! What a stream's batches hold, from its catalog's schema alone (before any window opens): each
//! gathered column's type and per-step shape, its rows before step 0 (frame windows), which
//! columns a compact batch holds as one row per slice, and a batch's bytes.

use super::StreamPlan;
use crate::error::{Error, Result};
use crate::gather::FrameStack;
use crate::loader::BatchSource;
use crate::store::Catalog;

/// Bytes of one step of `columns` as gathered (checking that they exist: `next_observation` may
/// be derived; a frame column is its decoded frames, `stack` of them).
pub(super) fn step_bytes(
    catalog: &Catalog,
    columns: &[&str],
    stack: Option<FrameStack>,
) -> Result<u64> {
    Ok(
        column_step_bytes(&describe_columns(catalog, columns, stack)?)
            .iter()
            .sum::<usize>() as u64,
    )
}

/// Per column of a description ([`describe_columns`], [`BatchSource::columns`]): the bytes one
/// step of it takes in a batch.
pub(crate) fn column_step_bytes(
    columns: &[(String, arrow::datatypes::DataType, Vec<usize>)],
) -> Vec<usize> {
    columns
        .iter()
        .map(|(_, dt, shape)| {
            shape.iter().product::<usize>() * crate::schema::value_bytes(dt).ceil() as usize
        })
        .collect()
}

/// Per gathered column of a stream, the rows before each slice's step 0 that every window's
/// gatherer gives ([`crate::Gatherer::leads`]): `K - 1` for a frame column (or a
/// `next_observation` derived from one) gathered as a frame window, else 0.
pub(crate) fn leads(
    catalog: &Catalog,
    columns: &[String],
    stack: Option<FrameStack>,
) -> Vec<usize> {
    let lead = stack.map_or(0, |s| s.lead());
    columns
        .iter()
        .map(|c| match frame_source(catalog, c) {
            true => lead,
            false => 0,
        })
        .collect()
}

/// The stored column gathered column `c` comes from: itself, or the observation for a
/// `next_observation` the version does not store.
fn stored_source<'a>(schema: &arrow::datatypes::Schema, c: &'a str) -> &'a str {
    match c {
        crate::format::col::NEXT_OBSERVATION if schema.field_with_name(c).is_err() => {
            crate::format::col::OBSERVATION
        }
        other => other,
    }
}

/// Whether gathered column `c` of a stream comes from a frame column.
fn frame_source(catalog: &Catalog, c: &str) -> bool {
    let schema = catalog.schema();
    let name = stored_source(schema.arrow_schema(), c);
    schema.frame_columns().iter().any(|(n, _)| *n == name)
}

/// Name, element type and per-step shape of each gathered column of a stream, from its
/// catalog's schema alone, as a window's [`Gatherer`] gives them: a frame column (and a
/// `next_observation` derived from one) is `uint8` of the frame's shape, or of
/// [`FrameStack::shape`]; a `next_observation` that is not stored has the observation's.
pub(crate) fn describe_columns(
    catalog: &Catalog,
    columns: &[&str],
    stack: Option<FrameStack>,
) -> Result<Vec<(String, arrow::datatypes::DataType, Vec<usize>)>> {
    let frames = catalog.schema().frame_columns();
    let schema = catalog.schema().arrow_schema();
    let mut out = Vec::with_capacity(columns.len());
    for &c in columns {
        let name = stored_source(schema, c);
        let f = schema.field_with_name(name).map_err(|_| {
            Error::argument(
                "columns",
                format!("no column `{c}` (have: {})", crate::schema::names(schema)),
            )
        })?;
        out.push(match frames.iter().find(|(n, _)| *n == name) {
            Some((_, spec)) => (
                c.to_string(),
                arrow::datatypes::DataType::UInt8,
                stack.map_or_else(|| spec.shape.clone(), |s| s.shape(&spec.shape)),
            ),
            None => match f.data_type() {
                arrow::datatypes::DataType::FixedSizeList(item, _) => (
                    c.to_string(),
                    item.data_type().clone(),
                    crate::schema::field_shape(f)?,
                ),
                dt => (c.to_string(), dt.clone(), vec![]),
            },
        });
    }
    Ok(out)
}

/// Bytes of one full batch of a streamed `source` (one stream or a mix), and its slice length.
pub(crate) fn batch_bytes(source: &BatchSource) -> Result<(u64, usize)> {
    let (b, l) = batch_shape(source)?;
    let slice = column_step_bytes(&source.columns()?)
        .iter()
        .zip(source.leads())
        .map(|(&step, lead)| crate::gather::slice_bytes(step, lead, l))
        .sum::<usize>() as u64;
    Ok((slice.saturating_mul(b as u64), l))
}

/// Slices per batch and steps per slice of a streamed `source` (one stream or a mix).
pub(crate) fn batch_shape(source: &BatchSource) -> Result<(usize, usize)> {
    if let Some(m) = source.stream_mix() {
        return Ok((m.num_slices(), m.slice_len()));
    }
    let p = streamed_plan(source)?;
    Ok((p.sampler.num_slices, p.sampler.slice_len as usize))
}

pub(super) fn streamed_plan(source: &BatchSource) -> Result<&StreamPlan> {
    source
        .streamed()
        .ok_or_else(|| Error::argument("source", "this source's datasets are local, not streamed"))
}

/// Per gathered column of a stream, whether every window's gatherer can write it as one row
/// per slice ([`Gatherer::tail_columns`]): a `next_observation` the version does not store,
/// derived from the observation, which is gathered too (a frame window's as a window too, whose
/// tail is one frame).
pub(crate) fn tail_columns(catalog: &Catalog, columns: &[String]) -> Vec<bool> {
    use crate::format::col::{NEXT_OBSERVATION, OBSERVATION};
    let derived = catalog
        .schema()
        .arrow_schema()
        .field_with_name(NEXT_OBSERVATION)
        .is_err()
        && columns.iter().any(|c| c == OBSERVATION);
    columns
        .iter()
        .map(|c| derived && c == NEXT_OBSERVATION)
        .collect()
}
