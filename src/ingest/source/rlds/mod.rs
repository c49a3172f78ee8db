//! RLDS datasets as TensorFlow Datasets writes them (Open X-Embodiment, RL Unplugged's
//! `rlu_*`, anything built with `tfds` and RLDS's features): a directory with
//! `dataset_info.json`, `features.json` and `<name>-<split>.tfrecord-XXXXX-of-YYYYY` shards
//! (given directly, or a directory holding one `<name>/<version>/`). Each TFRecord record is one
//! episode, a `tf.train.Example` whose step features are flattened with a leading step
//! dimension (`steps/observation/image`: one PNG or JPEG per step; `steps/action`: the steps'
//! actions, flattened).
//!
//! **Steps → transitions.** RLDS's step `t` holds `o_t`, and the action `a_t` taken in it with
//! the reward `r_t` and discount that followed; the last step of an episode (`is_last`) holds
//! the final observation `o_T`, and its action, reward and discount are not data (RLDS's
//! spec: "considered invalid"). So an episode of `N` steps becomes `N - 1` transitions (steps
//! `0..N-1`: observation, action, reward, discount and every other step feature), and the last
//! step's observation becomes the episode's final observation (for a frame column, its final
//! frame), from which `next_observation` of the last transition is derived. The episode is
//! terminated when its last step has `is_terminal`, else truncated. The flags are checked:
//! `is_first` only on step 0, `is_last` only on the last step, `is_terminal` only there (an
//! absent flag feature is implied by the position). An episode of one step has no transition
//! and is not stored (it is counted in [`RldsReport::empty_episodes`]).
//!
//! **Columns.** The observation is one leaf of `steps/observation` (a dict is flattened with
//! `/`, as TorchRL's and HDF5's nested keys are): [`RldsOptions::observation`] if given, else
//! the first image (one named `image` first), else the only leaf, else `observation/state`,
//! else the first numeric one. A `uint8` image observation is a frame column (one compressed
//! frame per step, [`crate::frames`]) unless [`RldsOptions::frame_codec`] is `None`. Every
//! other step leaf is a user column named by its path below `steps` (`observation/wrist`,
//! `discount`, `language_embedding`; images as `uint8` `[H, W, C]` tensors); a scalar integer
//! `action` is a discrete action, a float or integer tensor (or a dict of them, concatenated in
//! name order) a continuous one; `reward` is cast to `float32` (an absent reward is stored as
//! 0.0). Text and other features trajstore does not store (strings, nested sequences, episode
//! metadata) are listed in [`RldsReport::skipped`].
//!
//! **Checks.** Every record's CRCs ([`tfrecord`]), its protobuf ([`example`]), every feature
//! against `features.json` (present, of the declared list kind, as many values as steps times
//! the declared shape, images of the declared size and channels, integers within the declared
//! type), each shard's episode count against `dataset_info.json`: a difference is an
//! [`Error::InvalidData`] naming the shard file, the record's index and byte offset. Nothing is
//! committed then, and a dataset the ingest created is removed.
//!
//! **Memory**: one record (an episode, encoded and decoded), plus the writer's buffers; shards
//! are read one at a time, records in order. Images of an episode are decoded in parallel.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Float64Array, Int64Array,
    RecordBatch, UInt8Array, UInt64Array,
};
use arrow::datatypes::{DataType, Field};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::format::col;
use crate::frames::{FrameCodec, FrameSpec};
use crate::ingest::{SOURCE_PROPERTY, Target};
use crate::schema::{TransitionSchema, tensor_field};
use crate::store::writer::{DatasetWriter, EpisodeEnd, WriterOptions};

mod example;
mod features;
mod image;
mod tfrecord;

use example::{Example, Feature};
use features::{Dtype, Encoding, Features, Kind, Leaf, find_root, parse_features, parse_info};
use tfrecord::{RecordPos, RecordReader, record_error};

/// The largest image side read when `features.json` leaves a dimension unknown.
const MAX_SIDE: usize = 1 << 14;

/// How to read an RLDS dataset. Construct with `RldsOptions::default()` and assign fields; new
/// options get defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RldsOptions {
    /// How an image observation is stored (default `zstd-dict`); `None` keeps it as a `uint8`
    /// tensor column.
    pub frame_codec: Option<FrameCodec>,
    /// Only these splits, in this order (default: every split, in `dataset_info.json`'s order).
    pub splits: Option<Vec<String>>,
    /// The step feature that becomes the observation (`observation/state`, or with its
    /// `steps/` prefix); default: chosen as the module documentation says.
    pub observation: Option<String>,
    /// Step features to leave out (paths below `steps`, or with the `steps/` prefix).
    pub drop: Vec<String>,
}

impl Default for RldsOptions {
    fn default() -> Self {
        RldsOptions {
            frame_codec: Some(FrameCodec::ZstdDict),
            splits: None,
            observation: None,
            drop: vec![],
        }
    }
}

/// What an RLDS ingest did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RldsReport {
    /// Transitions stored.
    pub rows: u64,
    /// Episodes stored.
    pub episodes: u64,
    /// The dataset version after the commit.
    pub version: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Stored column ← step feature (`observation ← steps/observation/image`).
    pub columns: Vec<(String, String)>,
    /// Where the episode boundaries came from.
    pub boundaries: String,
    /// The splits read, in order.
    pub splits: Vec<String>,
    /// Shard files read.
    pub shards: u64,
    /// Features not stored, with the reason (`steps/language_instruction: text is not stored`).
    pub skipped: Vec<String>,
    /// Episodes of a single step (no transition), not stored.
    pub empty_episodes: u64,
}

/// Whether `input` is a TFDS dataset directory (`dataset_info.json` and `features.json`, in it
/// or in its only `<name>/<version>/` below).
pub fn is_rlds(input: &Path) -> bool {
    input.is_dir() && find_root(input).is_some()
}

/// A stored column and where its values come from.
#[derive(Debug, Clone)]
struct Col {
    name: String,
    /// Indices into the step leaves (several: an action dict, concatenated).
    leaves: Vec<usize>,
    /// Element type stored.
    elem: DataType,
    /// Per-step shape (empty: a scalar column).
    shape: Vec<usize>,
    /// An image column of (H, W, C), and whether it is a frame column.
    image: Option<([usize; 3], bool)>,
}

impl Col {
    fn per_step(&self) -> usize {
        self.shape.iter().product::<usize>().max(1)
    }
}

/// How the step features become columns.
#[derive(Debug)]
struct Plan {
    features: Features,
    /// Observation first, then action, reward (absent: zeros), user columns.
    cols: Vec<Col>,
    reward: bool,
    /// Leaves of is_first, is_last, is_terminal.
    flags: [Option<usize>; 3],
    /// Every leaf read from each record (columns' and flags'), with its per-step element count.
    read: Vec<(usize, usize)>,
    schema: TransitionSchema,
    skipped: Vec<String>,
}

/// Where a record is, for its errors.
#[derive(Clone, Copy)]
struct At<'a> {
    path: &'a Path,
    pos: RecordPos,
}

impl At<'_> {
    fn err(&self, reason: impl std::fmt::Display) -> Error {
        record_error(self.path, self.pos, reason)
    }
}

/// The values of one leaf in one record.
enum Vals<'a> {
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Images(Vec<&'a [u8]>),
}

fn leaf_elem(dtype: Dtype, scalar: bool) -> DataType {
    match dtype {
        Dtype::Bool if scalar => DataType::Boolean,
        Dtype::Bool | Dtype::U8 => DataType::UInt8,
        Dtype::I8 => DataType::Int8,
        Dtype::I16 => DataType::Int16,
        Dtype::I32 => DataType::Int32,
        Dtype::I64 | Dtype::Str => DataType::Int64,
        Dtype::U16 => DataType::UInt16,
        Dtype::U32 => DataType::UInt32,
        Dtype::U64 => DataType::UInt64,
        Dtype::F16 | Dtype::F32 => DataType::Float32,
        Dtype::F64 => DataType::Float64,
    }
}

fn matches_name(path: &str, steps: &str, name: &str) -> bool {
    name == path || name.strip_prefix(steps).and_then(|n| n.strip_prefix('/')) == Some(path)
}

impl Plan {
    fn key(&self, leaf: usize) -> String {
        format!("{}/{}", self.features.steps, self.features.step[leaf].path)
    }

    /// Builds the plan from `features.json`; image dimensions it leaves unknown come from
    /// `dims` (the first record's images).
    fn build(
        features: Features,
        opts: &RldsOptions,
        dims: &dyn Fn(usize) -> Result<[usize; 3]>,
    ) -> Result<Plan> {
        let steps = features.steps.clone();
        let leaves = &features.step;
        let mut skipped: Vec<String> = features
            .episode
            .iter()
            .map(|l| format!("{}: episode-level features are not stored", l.path))
            .collect();
        let find = |p: &str| leaves.iter().position(|l| l.path == p);
        let flags = [find(col::IS_FIRST), find(col::IS_LAST), find("is_terminal")];
        let mut usable = vec![];
        for (i, l) in leaves.iter().enumerate() {
            let key = format!("{steps}/{}", l.path);
            if opts.drop.iter().any(|d| matches_name(&l.path, &steps, d)) {
                skipped.push(format!("{key}: dropped"));
            } else if let Kind::Skipped(why) = &l.kind {
                skipped.push(format!("{key}: {why}"));
            } else if matches!(l.kind, Kind::Tensor { .. }) && l.shape.contains(&None) {
                return Err(Error::schema(
                    key,
                    format!(
                        "a tensor of shape {:?} (a dimension of variable size) inside `{steps}` \
                         is not stored; leave it out with --drop-cols",
                        l.shape
                    ),
                ));
            } else {
                // Sizes a damaged features.json may claim: bounded before anything is allocated.
                let elements = l
                    .shape
                    .iter()
                    .try_fold(1usize, |n, d| n.checked_mul(d.unwrap_or(1)))
                    .filter(|&n| n <= 1 << 30);
                let side = l.kind != Kind::Image
                    || l.shape[..2].iter().all(|d| d.is_none_or(|d| d <= MAX_SIDE));
                if elements.is_none() || !side {
                    return Err(Error::schema(
                        key,
                        format!("shape {:?} in features.json is too large", l.shape),
                    ));
                }
                if !flags.contains(&Some(i)) {
                    usable.push(i);
                }
            }
        }
        if let Some(o) = &opts.observation
            && !usable
                .iter()
                .any(|&i| matches_name(&leaves[i].path, &steps, o))
        {
            return Err(Error::argument(
                "observation",
                format!("`{o}` is not a stored step feature"),
            ));
        }
        for (&f, name) in flags
            .iter()
            .zip([col::IS_FIRST, col::IS_LAST, "is_terminal"])
        {
            if let Some(f) = f {
                let l = &leaves[f];
                if !matches!(l.kind, Kind::Tensor { dtype, .. } if !dtype.is_float())
                    || !l.shape.is_empty()
                {
                    return Err(Error::schema(
                        format!("{steps}/{name}"),
                        "an RLDS flag must be a boolean (or integer) scalar",
                    ));
                }
            }
        }
        let in_obs = |l: &Leaf| l.path == col::OBSERVATION || l.path.starts_with("observation/");
        let obs_leaves: Vec<usize> = usable
            .iter()
            .copied()
            .filter(|&i| in_obs(&leaves[i]))
            .collect();
        let is_image = |i: &usize| leaves[*i].kind == Kind::Image;
        let last = |i: &usize| leaves[*i].path.rsplit('/').next() == Some("image");
        let obs = match &opts.observation {
            Some(o) => usable
                .iter()
                .copied()
                .find(|&i| matches_name(&leaves[i].path, &steps, o)),
            None => obs_leaves
                .iter()
                .copied()
                .find(|i| is_image(i) && last(i))
                .or_else(|| obs_leaves.iter().copied().find(is_image))
                .or_else(|| (obs_leaves.len() == 1).then(|| obs_leaves[0]))
                .or_else(|| find("observation/state").filter(|i| obs_leaves.contains(i)))
                .or_else(|| obs_leaves.first().copied()),
        };
        let Some(obs) = obs else {
            return Err(Error::schema(
                format!("{steps}/observation"),
                "no observation among the step features (pick one with --observation-col)",
            ));
        };
        let column = |i: usize, name: String, tensor: bool| -> Result<Col> {
            let l = &leaves[i];
            match l.kind {
                Kind::Image => {
                    let d = match l.shape.as_slice() {
                        [Some(h), Some(w), Some(c)] => [*h, *w, *c],
                        _ => dims(i)?,
                    };
                    Ok(Col {
                        name,
                        leaves: vec![i],
                        elem: DataType::UInt8,
                        shape: d.to_vec(),
                        image: Some((d, false)),
                    })
                }
                Kind::Tensor { dtype, .. } => {
                    let shape: Vec<usize> = l.shape.iter().map(|d| d.unwrap_or(0)).collect();
                    let shape = if tensor && shape.is_empty() {
                        vec![1]
                    } else {
                        shape
                    };
                    if shape.contains(&0) {
                        return Err(Error::schema(
                            format!("{steps}/{}", l.path),
                            format!("a tensor of shape {shape:?} holds no value"),
                        ));
                    }
                    Ok(Col {
                        name,
                        leaves: vec![i],
                        elem: leaf_elem(dtype, shape.is_empty()),
                        shape,
                        image: None,
                    })
                }
                Kind::Skipped(_) => unreachable!("skipped leaves are not usable"),
            }
        };
        let mut observation = column(obs, col::OBSERVATION.into(), true)?;
        let mut builder;
        match (&mut observation.image, opts.frame_codec) {
            (Some((d, frames)), Some(codec)) if FrameSpec::new(codec, d).is_ok() => {
                *frames = true;
                builder = TransitionSchema::builder(d, 1).frames(codec, d);
            }
            _ => {
                builder = TransitionSchema::builder(&observation.shape, 1)
                    .observation(observation.elem.clone(), &observation.shape);
            }
        }
        // The action: one leaf, or a dict of numeric leaves concatenated.
        let action_leaves: Vec<usize> = usable
            .iter()
            .copied()
            .filter(|&i| leaves[i].path == col::ACTION || leaves[i].path.starts_with("action/"))
            .collect();
        let action = match action_leaves.as_slice() {
            [] => {
                return Err(Error::schema(
                    format!("{steps}/action"),
                    "the steps have no action (trajstore stores transitions with actions)",
                ));
            }
            [one]
                if leaves[*one].path == col::ACTION
                    && leaves[*one].shape.is_empty()
                    && matches!(leaves[*one].kind, Kind::Tensor { dtype, .. } if !dtype.is_float()) =>
            {
                builder = builder.discrete_action();
                Col {
                    name: col::ACTION.into(),
                    leaves: vec![*one],
                    elem: DataType::Int64,
                    shape: vec![],
                    image: None,
                }
            }
            many => {
                let mut dim = 0;
                for &i in many {
                    let l = &leaves[i];
                    if !matches!(l.kind, Kind::Tensor { .. }) {
                        return Err(Error::schema(
                            format!("{steps}/{}", l.path),
                            "an action must be numeric",
                        ));
                    }
                    dim += l.shape.iter().map(|d| d.unwrap_or(0)).product::<usize>();
                }
                builder = builder.continuous_action(dim);
                Col {
                    name: col::ACTION.into(),
                    leaves: many.to_vec(),
                    elem: DataType::Float32,
                    shape: vec![dim],
                    image: None,
                }
            }
        };
        let reward_leaf = usable
            .iter()
            .copied()
            .find(|&i| leaves[i].path == col::REWARD);
        let mut cols = vec![observation, action];
        if let Some(r) = reward_leaf {
            let l = &leaves[r];
            let n: usize = l.shape.iter().map(|d| d.unwrap_or(0)).product();
            if !matches!(l.kind, Kind::Tensor { .. }) || n != 1 {
                return Err(Error::schema(
                    format!("{steps}/reward"),
                    format!("a reward must be one number per step (shape {:?})", l.shape),
                ));
            }
            cols.push(Col {
                name: col::REWARD.into(),
                leaves: vec![r],
                elem: DataType::Float32,
                shape: vec![],
                image: None,
            });
        }
        for &i in &usable {
            if i == obs || action_leaves.contains(&i) || Some(i) == reward_leaf {
                continue;
            }
            let c = column(i, leaves[i].path.clone(), false)?;
            let field = if c.shape.is_empty() {
                Field::new(&c.name, c.elem.clone(), false)
            } else {
                tensor_field(&c.name, c.elem.clone(), &c.shape, false)?
            };
            builder = builder.column(field);
            cols.push(c);
        }
        let schema = builder.build()?;
        let mut read: Vec<(usize, usize)> = vec![];
        for c in &cols {
            for &i in &c.leaves {
                let n = match &c.image {
                    Some(_) => 1,
                    None => leaves[i]
                        .shape
                        .iter()
                        .map(|d| d.unwrap_or(0))
                        .product::<usize>()
                        .max(1),
                };
                read.push((i, n));
            }
        }
        read.extend(flags.iter().flatten().map(|&f| (f, 1)));
        Ok(Plan {
            cols,
            reward: reward_leaf.is_some(),
            flags,
            read,
            schema,
            skipped,
            features,
        })
    }

    fn report_columns(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .cols
            .iter()
            .map(|c| {
                let from: Vec<String> = c.leaves.iter().map(|&i| self.key(i)).collect();
                (c.name.clone(), from.join(" + "))
            })
            .collect();
        if !self.reward {
            out.insert(2, (col::REWARD.into(), "(none: 0.0)".into()));
        }
        out
    }

    fn boundaries(&self) -> String {
        let names: Vec<String> = self.flags.iter().flatten().map(|&f| self.key(f)).collect();
        format!(
            "RLDS episodes (one record each; flags {}): the is_last step's observation is the \
             final observation, terminated where it has is_terminal",
            if names.is_empty() {
                "implied".to_string()
            } else {
                names.join(", ")
            }
        )
    }
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
enum Stored {
    Episode(u64),
    Empty,
}

/// Converts and appends the episode of one record.
fn episode(
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

/// The splits to read, in order.
fn chosen_splits(info: &features::Info, opts: &RldsOptions) -> Result<Vec<features::Split>> {
    match &opts.splits {
        None => Ok(info.splits.clone()),
        Some(names) => names
            .iter()
            .map(|n| {
                info.splits
                    .iter()
                    .find(|s| &s.name == n)
                    .cloned()
                    .ok_or_else(|| {
                        Error::argument(
                            "splits",
                            format!(
                                "no split `{n}` (have {})",
                                info.splits
                                    .iter()
                                    .map(|s| s.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        )
                    })
            })
            .collect(),
    }
}

/// The (H, W, C) of the first image of leaf `i` in the first record with a step.
fn first_image_dims(plan_features: &Features, shards: &[PathBuf], i: usize) -> Result<[usize; 3]> {
    let leaf = &plan_features.step[i];
    let key = format!("{}/{}", plan_features.steps, leaf.path);
    let c = leaf.shape.get(2).copied().flatten().unwrap_or(3);
    for path in shards {
        let mut r = RecordReader::open(path)?;
        while let Some((pos, data)) = r.next_record()? {
            let at = At { path, pos };
            let ex = example::decode(data)
                .map_err(|e| at.err(format!("not a tf.train.Example: {e}")))?;
            if let Some(Feature::Bytes(b)) = ex.get(key.as_str())
                && let Some(first) = b.first()
            {
                let mut tmp = vec![];
                let (h, w) = image::decode(first, c, MAX_SIDE, &mut tmp)
                    .map_err(|e| at.err(format!("feature `{key}` step 0: {e}")))?;
                for (d, got) in leaf.shape.iter().take(2).zip([h, w]) {
                    if d.is_some_and(|d| d != got) {
                        return Err(at.err(format!(
                            "feature `{key}` step 0: an image of {h}x{w}, features.json \
                             declares {:?}",
                            leaf.shape
                        )));
                    }
                }
                return Ok([h, w, c]);
            }
        }
    }
    Err(Error::schema(
        key,
        "no record has an image to learn the image size from",
    ))
}

/// A schema error of the plan, which `features.json` decided: named with that file.
fn in_features(e: Error, path: &Path) -> Error {
    let named = |reason: String| format!("{}: {reason}", path.display());
    match e {
        Error::SchemaMismatch {
            column,
            expected,
            found,
            reason,
        } => Error::SchemaMismatch {
            column,
            expected,
            found,
            reason: named(reason),
        },
        Error::InvalidArgument { argument, reason }
            if argument.as_deref() != Some("observation") =>
        {
            Error::InvalidArgument {
                argument,
                reason: named(reason),
            }
        }
        other => other,
    }
}

/// Ingests the RLDS (TFDS) dataset `input` into `dataset` (created if it does not exist,
/// otherwise appended to: the schemas must match). Commits once at the end; on any error
/// nothing is committed and a dataset this call created is removed.
///
/// Cost: one pass over the shards (plus one record read ahead when `features.json` leaves an
/// image size unknown); memory is one episode's record and arrays plus the writer's buffers.
pub fn ingest_rlds(
    input: &Path,
    dataset: &Path,
    opts: &RldsOptions,
    writer_opts: WriterOptions,
) -> Result<RldsReport> {
    let started = Instant::now();
    let root = find_root(input).ok_or_else(|| {
        Error::argument(
            "input",
            format!(
                "{}: no {} and {} (in it or in one <name>/<version>/ below): not a TFDS dataset \
                 directory",
                input.display(),
                features::DATASET_INFO,
                features::FEATURES
            ),
        )
    })?;
    let features = parse_features(&root.join(features::FEATURES))?;
    let info = parse_info(&root)?;
    let splits = chosen_splits(&info, opts)?;
    let shards: Vec<PathBuf> = splits
        .iter()
        .flat_map(|s| s.shards.iter().map(|x| x.0.clone()))
        .collect();
    let features_path = root.join(features::FEATURES);
    let plan = {
        let f = features.clone();
        Plan::build(features, opts, &|i| first_image_dims(&f, &shards, i))
            .map_err(|e| in_features(e, &features_path))?
    };
    let target = Target::open(dataset, &plan.schema)?;
    let result = (|| {
        let mut writer = target.ds.writer(writer_opts)?;
        if !target.created {
            plan.schema
                .check_same(writer.schema().arrow_schema())
                .map_err(|e| {
                    Error::schema_mismatch(format!(
                        "{} does not store what {} holds: {e}",
                        dataset.display(),
                        root.display()
                    ))
                })?;
        }
        let mut report = RldsReport {
            columns: plan.report_columns(),
            boundaries: plan.boundaries(),
            skipped: plan.skipped.clone(),
            ..Default::default()
        };
        for split in &splits {
            for (path, expected) in &split.shards {
                let mut r = RecordReader::open(path)?;
                let mut count = 0u64;
                loop {
                    let Some((pos, data)) = r.next_record()? else {
                        break;
                    };
                    let at = At { path, pos };
                    let ex = example::decode(data)
                        .map_err(|e| at.err(format!("not a tf.train.Example: {e}")))?;
                    match episode(&plan, &ex, &mut writer, at)? {
                        Stored::Episode(rows) => {
                            report.rows += rows;
                            report.episodes += 1;
                        }
                        Stored::Empty => report.empty_episodes += 1,
                    }
                    count += 1;
                }
                if count != *expected {
                    return Err(Error::invalid_data(format!(
                        "{count} episodes (records), dataset_info.json says {expected} for this shard"
                    ))
                    .in_input(r.path().display()));
                }
                report.shards += 1;
            }
            report.splits.push(split.name.clone());
        }
        let canonical = std::fs::canonicalize(input).unwrap_or_else(|_| input.to_path_buf());
        writer.set_property(SOURCE_PROPERTY, canonical.display().to_string());
        writer.set_property("rlds.dataset", info.name.clone());
        writer.set_property("rlds.splits", report.splits.join(","));
        report.version = writer.commit()?;
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    })();
    if result.is_err() {
        target.discard();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_with_or_without_the_steps_prefix() {
        assert!(matches_name(
            "observation/state",
            "steps",
            "observation/state"
        ));
        assert!(matches_name(
            "observation/state",
            "steps",
            "steps/observation/state"
        ));
        assert!(!matches_name(
            "observation/state",
            "steps",
            "steps/observation"
        ));
        assert!(!matches_name(
            "observation/state",
            "steps",
            "stepsobservation/state"
        ));
    }
}
