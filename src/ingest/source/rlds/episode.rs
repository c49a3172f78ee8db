//! One record (an episode's `tf.train.Example`) into one appended episode: every read leaf's
//! values checked against `features.json`, the flags checked, images decoded (in parallel),
//! steps `0..N-1` as transitions and the last step's observation as the final observation.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Float64Array, Int64Array,
    RecordBatch, UInt8Array, UInt64Array,
};
use arrow::datatypes::{DataType, Field};
use rayon::prelude::*;

use super::example::{Example, Feature};
use super::features::{Dtype, Encoding, Kind};
use super::image;
use super::plan::Plan;
use super::tfrecord::{RecordPos, record_error};
use crate::error::{Error, Result};
use crate::format::col;
use crate::store::writer::{DatasetWriter, EpisodeEnd};

/// Where a record is, for its errors.
#[derive(Clone, Copy)]
pub(super) struct At<'a> {
    pub(super) path: &'a Path,
    pub(super) pos: RecordPos,
}

impl At<'_> {
    pub(super) fn err(&self, reason: impl std::fmt::Display) -> Error {
        record_error(self.path, self.pos, reason)
    }
}

/// The values of one leaf in one record.
enum Vals<'a> {
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Images(Vec<&'a [u8]>),
}

/// The values of leaf `i` in `ex`, with the number of steps they hold.
fn values<'a>(
    plan: &Plan,
    ex: &Example<'a>,
    i: usize,
    per_step: usize,
) -> std::result::Result<(usize, Vals<'a>), String> {
    let leaf = &plan.features.step[i];
    let key = plan.key(i);
    let Some(f) = ex.get(key.as_str()) else {
        return Err(format!(
            "the record has no feature `{key}`, which features.json lists"
        ));
    };
    let wrong = |want: &str| {
        format!(
            "feature `{key}` is a {} of {} values, features.json declares {want}",
            f.kind(),
            f.len()
        )
    };
    let steps_of = |n: usize| {
        if !n.is_multiple_of(per_step) {
            Err(format!(
                "feature `{key}` has {n} values, not a whole number of steps of {per_step} \
                 (shape {:?} in features.json)",
                leaf.shape
            ))
        } else {
            Ok(n / per_step)
        }
    };
    match (&leaf.kind, f) {
        (Kind::Image, Feature::Bytes(b)) => Ok((b.len(), Vals::Images(b.clone()))),
        (Kind::Image, Feature::Empty) => Ok((0, Vals::Images(vec![]))),
        (Kind::Image, _) => Err(wrong("encoded images (a bytes_list)")),
        (
            Kind::Tensor {
                encoding: Encoding::None,
                dtype,
            },
            f,
        ) => match (dtype.is_float(), f) {
            (true, Feature::Floats(v)) => Ok((
                steps_of(v.len())?,
                Vals::Floats(v.iter().map(|&x| f64::from(x)).collect()),
            )),
            (false, Feature::Ints(v)) => Ok((steps_of(v.len())?, Vals::Ints(v.clone()))),
            (_, Feature::Empty) => Ok((0, Vals::Ints(vec![]))),
            (true, _) => Err(wrong("floats (a float_list)")),
            (false, _) => Err(wrong("integers (an int64_list)")),
        },
        (Kind::Tensor { encoding, dtype }, Feature::Bytes(blobs)) => {
            let size = dtype.size();
            let mut raw = vec![];
            let (mut ints, mut floats) = (vec![], vec![]);
            for (s, blob) in blobs.iter().enumerate() {
                let bytes: &[u8] = if *encoding == Encoding::Zlib {
                    use std::io::Read;
                    raw.clear();
                    flate2::read::ZlibDecoder::new(*blob)
                        .take((per_step * size) as u64 + 1)
                        .read_to_end(&mut raw)
                        .map_err(|e| format!("feature `{key}` step {s}: does not inflate: {e}"))?;
                    &raw
                } else {
                    blob
                };
                if bytes.len() != per_step * size {
                    return Err(format!(
                        "feature `{key}` step {s}: {} bytes, shape {:?} of {dtype:?} is {}",
                        bytes.len(),
                        leaf.shape,
                        per_step * size
                    ));
                }
                for c in bytes.chunks_exact(size) {
                    let mut b = [0u8; 8];
                    b[..size].copy_from_slice(c);
                    match dtype {
                        Dtype::F16 => {
                            floats.push(f64::from(half::f16::from_le_bytes([b[0], b[1]])))
                        }
                        Dtype::F32 => {
                            floats.push(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                        }
                        Dtype::F64 => floats.push(f64::from_le_bytes(b)),
                        Dtype::I8 => ints.push(i64::from(b[0] as i8)),
                        Dtype::I16 => ints.push(i64::from(i16::from_le_bytes([b[0], b[1]]))),
                        Dtype::I32 => {
                            ints.push(i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                        }
                        // u64 is kept as its bits, as TFDS does in int64 lists.
                        Dtype::Bool
                        | Dtype::U8
                        | Dtype::U16
                        | Dtype::U32
                        | Dtype::I64
                        | Dtype::U64 => ints.push(i64::from_le_bytes(b)),
                        Dtype::Str => return Err(format!("feature `{key}`: strings are not read")),
                    }
                }
            }
            let vals = if dtype.is_float() {
                Vals::Floats(floats)
            } else {
                Vals::Ints(ints)
            };
            Ok((blobs.len(), vals))
        }
        (Kind::Tensor { .. }, Feature::Empty) => Ok((0, Vals::Ints(vec![]))),
        (Kind::Tensor { .. }, _) => Err(wrong("tensors encoded as bytes (a bytes_list)")),
        (Kind::Skipped(_), _) => Err(format!("feature `{key}` is not read")),
    }
}

/// Elements `range` of `vals` as a flat array of `elem`.
fn flat(
    elem: &DataType,
    vals: &Vals<'_>,
    range: std::ops::Range<usize>,
    key: &str,
) -> std::result::Result<ArrayRef, String> {
    Ok(match (elem, vals) {
        (DataType::Float32, Vals::Floats(v)) => Arc::new(Float32Array::from_iter_values(
            v[range].iter().map(|&x| x as f32),
        )),
        (DataType::Float32, Vals::Ints(v)) => Arc::new(Float32Array::from_iter_values(
            v[range].iter().map(|&x| x as f32),
        )),
        (DataType::Float64, Vals::Floats(v)) => Arc::new(Float64Array::from(v[range].to_vec())),
        (DataType::Boolean, Vals::Ints(v)) => Arc::new(BooleanArray::from_iter(
            v[range].iter().map(|&x| Some(x != 0)),
        )),
        (DataType::Int64, Vals::Ints(v)) => Arc::new(Int64Array::from(v[range].to_vec())),
        (DataType::UInt64, Vals::Ints(v)) => Arc::new(UInt64Array::from_iter_values(
            v[range].iter().map(|&x| x as u64),
        )),
        (narrow, Vals::Ints(v)) => {
            let wide = Int64Array::from(v[range].to_vec());
            let opts = arrow::compute::CastOptions {
                safe: false,
                ..Default::default()
            };
            arrow::compute::cast_with_options(&wide, narrow, &opts).map_err(|_| {
                format!("feature `{key}` has a value out of the range of its declared {narrow}")
            })?
        }
        (e, _) => return Err(format!("feature `{key}`: cannot store its values as {e}")),
    })
}

fn fixed(values: ArrayRef, n: usize) -> Result<ArrayRef> {
    let item = Arc::new(Field::new("item", values.data_type().clone(), false));
    let n = i32::try_from(n).map_err(|_| Error::invalid_data(format!("{n} values per step")))?;
    Ok(Arc::new(FixedSizeListArray::try_new(
        item, n, values, None,
    )?))
}

/// Decodes images `[from, to)` of `blobs` into one buffer of `H * W * C` bytes each.
fn decode_images(
    blobs: &[&[u8]],
    dims: [usize; 3],
    key: &str,
) -> std::result::Result<Vec<u8>, String> {
    let [h, w, c] = dims;
    let len = h * w * c;
    // The first image is decoded (and its size checked) before the buffer of all is allocated.
    let mut first = vec![];
    if let Some(b) = blobs.first() {
        let got = image::decode(b, c, h.max(w), &mut first)
            .map_err(|e| format!("feature `{key}` step 0: {e}"))?;
        if got != (h, w) {
            return Err(format!(
                "feature `{key}` step 0: an image of {}x{}, features.json (or the first image \
                 of the dataset) says {h}x{w}",
                got.0, got.1
            ));
        }
    }
    let mut out = vec![0u8; len * blobs.len()];
    out.par_chunks_mut(len.max(1))
        .zip(blobs.par_iter())
        .enumerate()
        .try_for_each_init(Vec::new, |tmp, (s, (dst, blob))| {
            let got = image::decode(blob, c, h.max(w), tmp)
                .map_err(|e| format!("feature `{key}` step {s}: {e}"))?;
            if got != (h, w) {
                return Err(format!(
                    "feature `{key}` step {s}: an image of {}x{}, features.json (or the first \
                     image) says {h}x{w}",
                    got.0, got.1
                ));
            }
            dst.copy_from_slice(tmp);
            Ok(())
        })?;
    Ok(out)
}

/// What one record did.
pub(super) enum Stored {
    Episode(u64),
    Empty,
}

/// Converts and appends the episode of one record.
pub(super) fn episode(
    plan: &Plan,
    ex: &Example<'_>,
    writer: &mut DatasetWriter,
    at: At<'_>,
) -> Result<Stored> {
    let mut vals: Vec<Option<Vals<'_>>> = (0..plan.features.step.len()).map(|_| None).collect();
    let mut steps: Option<(usize, usize)> = None;
    for &(i, per) in &plan.read {
        let (n, v) = values(plan, ex, i, per).map_err(|e| at.err(e))?;
        match steps {
            None => steps = Some((n, i)),
            Some((m, j)) if m != n => {
                return Err(at.err(format!(
                    "feature `{}` has {n} steps, `{}` has {m}",
                    plan.key(i),
                    plan.key(j)
                )));
            }
            Some(_) => {}
        }
        vals[i] = Some(v);
    }
    let n = steps.map_or(0, |s| s.0);
    let flag = |k: usize, s: usize| -> bool {
        match plan.flags[k].and_then(|f| vals[f].as_ref()) {
            Some(Vals::Ints(v)) => v[s] != 0,
            _ => match k {
                0 => s == 0,
                1 => s + 1 == n,
                _ => false,
            },
        }
    };
    for s in 0..n {
        let (first, last, terminal) = (flag(0, s), flag(1, s), flag(2, s));
        let where_ = |what: &str| {
            at.err(format!(
                "step {s} of {n}: {what} (RLDS: is_first on the first step, is_last on the last, \
                 is_terminal only with is_last)"
            ))
        };
        if first != (s == 0) {
            return Err(where_(if first {
                "is_first is set"
            } else {
                "is_first is not set"
            }));
        }
        if last != (s + 1 == n) {
            return Err(where_(if last {
                "is_last is set"
            } else {
                "is_last is not set"
            }));
        }
        if terminal && !last {
            return Err(where_("is_terminal is set"));
        }
    }
    if n <= 1 {
        return Ok(Stored::Empty);
    }
    let t = n - 1;
    let terminated = flag(2, n - 1);
    let mut columns: Vec<(String, ArrayRef)> = vec![];
    let mut final_obs = None;
    for (k, c) in plan.cols.iter().enumerate() {
        let is_obs = k == 0;
        let rows = if is_obs { n } else { t };
        let array: ArrayRef = if let Some((dims, _)) = c.image {
            let key = plan.key(c.leaves[0]);
            let Some(Vals::Images(blobs)) = &vals[c.leaves[0]] else {
                return Err(at.err(format!("feature `{key}`: no images")));
            };
            let pixels = decode_images(&blobs[..rows], dims, &key).map_err(|e| at.err(e))?;
            fixed(Arc::new(UInt8Array::from(pixels)), c.per_step())?
        } else if c.leaves.len() > 1 {
            // An action dict: each step's leaves concatenated, in name order.
            let mut out = Vec::with_capacity(rows * c.per_step());
            let parts: Vec<(usize, &Vals<'_>)> = c
                .leaves
                .iter()
                .map(|&i| {
                    let per = plan.read.iter().find(|r| r.0 == i).map_or(1, |r| r.1);
                    (per, vals[i].as_ref().expect("read"))
                })
                .collect();
            for s in 0..rows {
                for (per, v) in &parts {
                    match v {
                        Vals::Floats(x) => {
                            out.extend(x[s * per..(s + 1) * per].iter().map(|&f| f as f32))
                        }
                        Vals::Ints(x) => {
                            out.extend(x[s * per..(s + 1) * per].iter().map(|&f| f as f32))
                        }
                        Vals::Images(_) => unreachable!("an action leaf is numeric"),
                    }
                }
            }
            fixed(Arc::new(Float32Array::from(out)), c.per_step())?
        } else {
            let i = c.leaves[0];
            let key = plan.key(i);
            let v = vals[i].as_ref().expect("read");
            let per = c.per_step();
            let a = flat(&c.elem, v, 0..rows * per, &key).map_err(|e| at.err(e))?;
            if c.shape.is_empty() {
                a
            } else {
                fixed(a, per)?
            }
        };
        if is_obs {
            final_obs = Some(array.slice(t, 1));
            columns.push((c.name.clone(), array.slice(0, t)));
        } else {
            columns.push((c.name.clone(), array));
        }
    }
    if !plan.reward {
        columns.push((
            col::REWARD.into(),
            Arc::new(Float32Array::from(vec![0f32; t])),
        ));
    }
    let batch = RecordBatch::try_from_iter(columns)?;
    let end = if terminated {
        EpisodeEnd::terminated()
    } else {
        EpisodeEnd::truncated()
    };
    let end = match final_obs {
        Some(o) => end.with_final_observation(o),
        None => end,
    };
    writer.append_episode(&batch, end)?;
    Ok(Stored::Episode(t as u64))
}
