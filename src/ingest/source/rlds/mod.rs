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
//! `discount`, `language_embedding`; other images are frame columns too, each with its own
//! dictionary, or `uint8` `[H, W, C]` tensors when `frame_codec` is `None`); a scalar integer
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
use std::time::Instant;

use crate::error::{Error, Result};
use crate::frames::FrameCodec;
use crate::ingest::{SOURCE_PROPERTY, Target};
use crate::store::writer::WriterOptions;

mod episode;
mod example;
mod features;
use crate::ingest::image;
mod plan;
mod tfrecord;

use episode::{At, Stored, episode};
use example::Feature;
use features::{Features, find_root, parse_features, parse_info};
use image::MAX_SIDE;
use plan::Plan;
use tfrecord::RecordReader;

/// How to read an RLDS dataset. Construct with `RldsOptions::default()` and assign fields; new
/// options get defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RldsOptions {
    /// How images (the observation and every other image feature) are stored (default
    /// `zstd-dict`); `None` keeps them as `uint8` tensor columns.
    pub frame_codec: Option<FrameCodec>,
    /// The frame columns' zstd level where the ingest creates the dataset (see
    /// [`crate::ingest::IngestOptions::frame_level`]).
    pub frame_level: Option<i32>,
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
            frame_level: None,
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

impl RldsReport {
    /// The report as `trajstore ingest --json` and Python's `trajstore.ingest` give it: the
    /// fields of [`crate::ingest::IngestReport::to_json`] (`convention` null), plus `splits`,
    /// `shards`, `skipped` and `empty_episodes`.
    pub fn to_json(&self) -> serde_json::Value {
        let common = crate::ingest::IngestReport {
            rows: self.rows,
            episodes: self.episodes,
            version: self.version,
            seconds: self.seconds,
            columns: self.columns.clone(),
            boundaries: self.boundaries.clone(),
            convention: None,
        };
        let mut json = common.to_json();
        json["splits"] = serde_json::json!(self.splits);
        json["shards"] = serde_json::json!(self.shards);
        json["skipped"] = serde_json::json!(self.skipped);
        json["empty_episodes"] = serde_json::json!(self.empty_episodes);
        json
    }
}

/// Whether `input` is a TFDS dataset directory (`dataset_info.json` and `features.json`, in it
/// or in its only `<name>/<version>/` below).
pub fn is_rlds(input: &Path) -> bool {
    input.is_dir() && find_root(input).is_some()
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
    let target = Target::open(dataset, &plan.schema, opts.frame_level)?;
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
