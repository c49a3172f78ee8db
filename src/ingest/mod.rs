//! Ingest: turns a file of transitions (one row per transition) into trajstore episodes. Four
//! input formats, read by one pipeline:
//!
//! - **Parquet** (D4RL/Minari/LeRobot style exports, pandas/Polars dumps);
//! - **NumPy**: a `.npz` archive (`np.savez` / `np.savez_compressed`, e.g. D4RL's
//!   `env.get_dataset()` dict saved as is), a directory of `.npy` files, one column per array,
//!   or a directory of `.npz` shards read as one dataset (OGBench's 100M/1B datasets, one
//!   episode per file); [`Convention`] says how rows make transitions (OGBench's is recognised
//!   from its keys, one episode per file with `T + 1` observations from the arrays' lengths);
//! - **TorchRL** replay buffers saved with `rb.dumps(DIR)`: one column per tensor of the stored
//!   TensorDict, oldest row first (module `torchrl`);
//! - **HDF5** (module `hdf5`, pure Rust, no libhdf5): D4RL's layout, one column per
//!   per-transition dataset, and Minari's, one group per episode.
//!
//! Common layouts need no options: D4RL's `observations, actions, rewards, terminals, timeouts,
//! next_observations`, Gymnasium's `terminated/truncated`, Minari's `terminations/truncations`
//! and LeRobot's `episode_index` are recognised when the caller leaves the corresponding option
//! at its default ([`IngestReport::columns`] and [`IngestReport::boundaries`] say what was used).
//!
//! Episode boundaries come from one of two places:
//!
//! - an **episode id column** ([`IngestOptions::episode_col`]): an episode is a maximal run
//!   of equal ids, the rows of one episode must be contiguous, and optional flag columns are read
//!   on each episode's last row. The original id is kept as the user column `source_episode`
//!   (ids are reassigned densely by the writer);
//! - **flag columns** ([`IngestOptions::terminated_col`],
//!   [`IngestOptions::truncated_col`]): an episode ends at a row where either flag is set
//!   (D4RL semantics); the rows after the last flag form a final episode marked truncated.
//!
//! Observations and actions may be fixed-size lists, variable-size lists of constant length, or
//! several scalar columns combined into one vector. Other fixed-width columns are kept as user
//! columns.
//!
//! Ingest streams: units (Parquet row groups, row ranges of NumPy arrays) are decoded in parallel
//! (a window of up to [`rayon::current_num_threads`] units; one by one for compressed `.npz`) and
//! fed in order to one [`DatasetWriter`](crate::store::DatasetWriter). Memory is bounded by the window of decoded units, plus
//! the longest episode (an episode that spans units is carried across them), plus the writer's
//! batch buffer. The ingest commits once at the end; on any error nothing is committed, and a dataset
//! directory that the ingest created is removed again.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::format::col;
use crate::progress::{Progress, ProgressSink, Unit};
use crate::schema::TransitionSchema;
use crate::store::writer::WriterOptions;

mod assemble;
mod conventions;
mod convert;
pub(crate) mod image;
mod mapping;
mod source;
mod target;
mod unstack;

use assemble::*;
use conventions::*;
use convert::*;
use mapping::*;
use source::*;
pub(crate) use target::Target;

pub use source::dqn::{DqnOptions, DqnReport, ingest_dqn, is_dqn};
pub use source::rlds::{RldsOptions, RldsReport, ingest_rlds, is_rlds};

/// Name of the user column that keeps the input's episode id in episode-id mode.
pub const SOURCE_EPISODE: &str = "source_episode";

/// Property set on the dataset to the (canonical) path of the ingested file.
pub const SOURCE_PROPERTY: &str = "source";

/// Batches of `batch_rows` rows per unit of a source that chooses its units (NumPy arrays, Minari
/// episodes): enough to amortise a unit, few enough to bound the window of decoded units.
pub(crate) const UNIT_BATCHES: usize = 4;

/// Default [`IngestOptions::batch_rows`].
pub const DEFAULT_BATCH_ROWS: usize = 64 * 1024;

/// How to read an input file of transitions. Construct with `IngestOptions::default()` and the
/// `with_*` methods (or assign the public fields); new options get defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct IngestOptions {
    /// Episodes from an id column (integers; the rows of one episode must be contiguous).
    pub episode_col: Option<String>,
    /// Per-row terminated flag (bool, or numbers where non-zero means set).
    pub terminated_col: Option<String>,
    /// Per-row truncated flag (bool, or numbers where non-zero means set).
    pub truncated_col: Option<String>,
    /// The observation column (default `observation`); ignored when
    /// [`IngestOptions::observation_cols`] is non-empty.
    pub observation_col: String,
    /// Several numeric columns (scalars or lists) concatenated, in this order, into the
    /// observation vector.
    pub observation_cols: Vec<String>,
    /// The action column (default `action`); ignored when
    /// [`IngestOptions::action_cols`] is non-empty. A scalar integer column is a
    /// discrete action stored as `int64`; a scalar float column a continuous action of
    /// dimension 1; a list of floats a continuous action (lists of integers are cast to
    /// `float32`).
    pub action_col: String,
    /// Several numeric columns concatenated into one continuous action vector.
    pub action_cols: Vec<String>,
    /// The reward column (default `reward`), cast to `float32`.
    pub reward_col: String,
    /// The input has no reward (demonstrations for imitation learning): every transition is
    /// stored with reward 0.0, and [`IngestOptions::reward_col`] is not read.
    pub no_reward: bool,
    /// A column holding o_{t+1}, converted like the observation and stored as `next_observation`.
    pub next_observation_col: Option<String>,
    /// Columns to ignore.
    pub drop_cols: Vec<String>,
    /// Rows per decoded record batch (default 64Ki; array inputs read fewer where that would be
    /// more than 16 MiB of rows, e.g. of image frames).
    pub batch_rows: usize,
    /// How image observations are stored: `uint8` observations of shape `[H, W]` or `[H, W, C]`
    /// (`C <= 4`, `H, W >= 8`) become a frame column of this codec (default `zstd-dict`; see
    /// [`crate::frames`]), as do PNG/JPEG columns (decoded). `None` keeps tensor columns.
    pub frame_codec: Option<crate::frames::FrameCodec>,
    /// The zstd level (1 to 22) of the frame columns of a dataset the ingest creates (default
    /// [`crate::frames::DEFAULT_LEVEL`]). Higher levels compress slower, store fewer bytes and
    /// decode as fast or faster; an existing dataset keeps its own level.
    pub frame_level: Option<i32>,
    /// Observations that are stacks of the last K frames (`uint8` `[H, W, K]` channels last,
    /// `[K, H, W]` or `[K, H, W, C]` channels first, oldest frame first) are stored as one frame
    /// per step, the newest of each stack: every stack must continue the previous one within an
    /// episode, and an episode's first stack must start with K-1 copies of its newest frame or
    /// zeros; otherwise the ingest fails naming the first input row where they do not. Load
    /// with `frame_stack=K` (and the matching padding) to get the stacks back. `None` (the
    /// default) stores observations as they are.
    pub unstack: Option<usize>,
    /// How the rows of a NumPy `.npz` input (a file, or a directory of them) make transitions
    /// ([`Convention`]). `None` (the default): recognised from the arrays' names and lengths,
    /// else [`Convention::Rows`].
    pub convention: Option<Convention>,
    /// Where to report progress (rows converted); nothing by default.
    pub progress: ProgressSink,
}

/// How the rows of a NumPy `.npz` input make transitions, for the layouts where a row is not
/// simply one transition. [`IngestOptions::convention`] chooses one; left unset, OGBench's is
/// recognised from its keys and [`Convention::EpisodeFiles`] from its array lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Convention {
    /// Every row is one transition, and episodes come from flags or an id column (D4RL and
    /// every other input). In a directory of `.npz` files an episode that the flags leave open
    /// at the end of a file continues in the next one.
    Rows,
    /// OGBench's files (`ogbench.load_dataset`; keys `observations`, `actions`, `terminals`,
    /// and optionally `qpos`, `qvel`, `button_states`, `rewards`): `terminals` marks the last
    /// row of each trajectory, and that row is not a transition but the state after the
    /// trajectory's last step: its observation is stored as the episode's final observation (so
    /// the last step's `next_observation` is it, as in `load_dataset`'s `next_observations`),
    /// the rest of the row is left out. Trajectories end on a time limit, so episodes end
    /// truncated, never terminated. Every file must end on a trajectory end; in a directory,
    /// `*-val.npz` (OGBench's validation split) files are left out. Without `rewards`, 0.0 is
    /// stored (OGBench's datasets are reward-free).
    Ogbench,
    /// One episode per file, with `T + 1` observations and `T` of everything else (actions,
    /// rewards, flags): observation `t` and action `t` make step `t`, and the last observation
    /// is the final observation (the last step's `next_observation`). Arrays with `T + 1` rows
    /// besides the observation are per-state too (their last row is left out). The episode ends
    /// terminated when its terminated flag (`terminals`, `terminated` or `terminations`) is set on
    /// its last step, else truncated; the file's index in name order is kept as
    /// `source_episode`.
    EpisodeFiles,
}

impl Convention {
    /// The name the CLI takes (`rows`, `ogbench`, `episode-files`).
    pub fn name(self) -> &'static str {
        match self {
            Convention::Rows => "rows",
            Convention::Ogbench => "ogbench",
            Convention::EpisodeFiles => "episode-files",
        }
    }
}

impl std::str::FromStr for Convention {
    type Err = Error;
    /// `rows`, `ogbench` or `episode-files`.
    fn from_str(s: &str) -> Result<Self> {
        [
            Convention::Rows,
            Convention::Ogbench,
            Convention::EpisodeFiles,
        ]
        .into_iter()
        .find(|c| c.name() == s)
        .ok_or_else(|| {
            Error::argument(
                "convention",
                format!("unknown convention `{s}` (one of rows, ogbench, episode-files)"),
            )
        })
    }
}

impl std::fmt::Display for Convention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The convention an ingest of `.npz` files used ([`IngestReport::convention`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConventionReport {
    /// The convention.
    pub convention: Convention,
    /// Recognised from the input (`false`: asked for, or [`Convention::Rows`] by default).
    pub recognised: bool,
    /// The `.npz` files read, in order.
    pub files: u64,
    /// Files of the directory that were left out (OGBench's `*-val.npz`).
    pub left_out: Vec<PathBuf>,
}

impl Default for IngestOptions {
    fn default() -> Self {
        Self {
            episode_col: None,
            terminated_col: None,
            truncated_col: None,
            observation_col: col::OBSERVATION.into(),
            observation_cols: vec![],
            action_col: col::ACTION.into(),
            action_cols: vec![],
            reward_col: col::REWARD.into(),
            no_reward: false,
            next_observation_col: None,
            drop_cols: vec![],
            batch_rows: DEFAULT_BATCH_ROWS,
            frame_codec: Some(crate::frames::FrameCodec::ZstdDict),
            frame_level: None,
            unstack: None,
            convention: None,
            progress: ProgressSink::default(),
        }
    }
}

pub(crate) fn strings<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Vec<String> {
    names.into_iter().map(Into::into).collect()
}

impl IngestOptions {
    /// Sets [`IngestOptions::episode_col`].
    pub fn with_episode_col(mut self, name: impl Into<String>) -> Self {
        self.episode_col = Some(name.into());
        self
    }
    /// Sets [`IngestOptions::terminated_col`].
    pub fn with_terminated_col(mut self, name: impl Into<String>) -> Self {
        self.terminated_col = Some(name.into());
        self
    }
    /// Sets [`IngestOptions::truncated_col`].
    pub fn with_truncated_col(mut self, name: impl Into<String>) -> Self {
        self.truncated_col = Some(name.into());
        self
    }
    /// Sets [`IngestOptions::observation_col`].
    pub fn with_observation_col(mut self, name: impl Into<String>) -> Self {
        self.observation_col = name.into();
        self
    }
    /// Sets [`IngestOptions::observation_cols`].
    pub fn with_observation_cols<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        names: I,
    ) -> Self {
        self.observation_cols = strings(names);
        self
    }
    /// Sets [`IngestOptions::action_col`].
    pub fn with_action_col(mut self, name: impl Into<String>) -> Self {
        self.action_col = name.into();
        self
    }
    /// Sets [`IngestOptions::action_cols`].
    pub fn with_action_cols<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        names: I,
    ) -> Self {
        self.action_cols = strings(names);
        self
    }
    /// Sets [`IngestOptions::reward_col`].
    pub fn with_reward_col(mut self, name: impl Into<String>) -> Self {
        self.reward_col = name.into();
        self
    }
    /// Sets [`IngestOptions::no_reward`].
    pub fn with_no_reward(mut self) -> Self {
        self.no_reward = true;
        self
    }
    /// Sets [`IngestOptions::next_observation_col`].
    pub fn with_next_observation_col(mut self, name: impl Into<String>) -> Self {
        self.next_observation_col = Some(name.into());
        self
    }
    /// Sets [`IngestOptions::drop_cols`].
    pub fn with_drop_cols<I: IntoIterator<Item = S>, S: Into<String>>(mut self, names: I) -> Self {
        self.drop_cols = strings(names);
        self
    }
    /// Sets [`IngestOptions::frame_codec`] (`None`: keep image observations as tensors).
    pub fn with_frame_codec(mut self, codec: Option<crate::frames::FrameCodec>) -> Self {
        self.frame_codec = codec;
        self
    }
    /// Sets [`IngestOptions::frame_level`].
    pub fn with_frame_level(mut self, level: Option<i32>) -> Self {
        self.frame_level = level;
        self
    }
    /// Sets [`IngestOptions::unstack`]: observations are stacks of `k` frames.
    pub fn with_unstack(mut self, k: Option<usize>) -> Self {
        self.unstack = k;
        self
    }
    /// Sets [`IngestOptions::convention`] (`None`: recognise it).
    pub fn with_convention(mut self, convention: Option<Convention>) -> Self {
        self.convention = convention;
        self
    }
    /// Sets [`IngestOptions::batch_rows`].
    pub fn with_batch_rows(mut self, rows: usize) -> Self {
        self.batch_rows = rows;
        self
    }
    /// Reports progress to `progress` ([`IngestOptions::progress`]).
    pub fn with_progress(mut self, progress: impl Progress + 'static) -> Self {
        self.progress = ProgressSink::new(progress);
        self
    }
}

/// What an ingest did.
#[derive(Debug, Clone, PartialEq)]
pub struct IngestReport {
    /// Transitions ingested.
    pub rows: u64,
    /// Episodes ingested.
    pub episodes: u64,
    /// The dataset version after the commit.
    pub version: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Stored column ← input column(s), for the columns the input does not give by their stored
    /// name (`observation ← observations`, `source_episode ← ep`, ...).
    pub columns: Vec<(String, String)>,
    /// Where the episode boundaries came from, e.g. "flags terminals, timeouts".
    pub boundaries: String,
    /// For `.npz` files and directories of them: the [`Convention`] used, whether it was
    /// recognised, and which files were read or left out. `None` for other inputs.
    pub convention: Option<ConventionReport>,
}

impl IngestReport {
    /// The report as `trajstore ingest --json` and Python's `trajstore.ingest` give it: `rows`,
    /// `episodes`, `version`, `seconds`, `rows_per_s`, `columns` (stored ← input), `boundaries`,
    /// and `convention` (null but for `.npz` inputs).
    pub fn to_json(&self) -> serde_json::Value {
        let columns: serde_json::Map<String, serde_json::Value> = self
            .columns
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::json!(v)))
            .collect();
        let convention = self.convention.as_ref().map(|c| {
            serde_json::json!({
                "name": c.convention.name(), "recognised": c.recognised, "files": c.files,
                "left_out": c.left_out.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            })
        });
        serde_json::json!({
            "rows": self.rows, "episodes": self.episodes, "version": self.version,
            "seconds": self.seconds, "rows_per_s": self.rows as f64 / self.seconds.max(1e-9),
            "columns": columns, "boundaries": self.boundaries, "convention": convention,
        })
    }
}

/// The kinds of input [`ingest`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    /// A Parquet file (`.parquet`, `.pq`), or a directory of them read in path order (a sharded
    /// dataset; a LeRobot dataset's `data/chunk-*/episode_*.parquet`), all with the same columns.
    Parquet,
    /// A NumPy `.npz` archive (`np.savez` or `np.savez_compressed`), a directory of `.npy`
    /// files, or a directory of `.npz` files (shards, read in natural name order as one
    /// dataset): one column per array, named after its key. How rows make transitions is the
    /// [`Convention`] ([`IngestOptions::convention`]).
    Numpy,
    /// A TorchRL replay buffer saved with `rb.dumps(DIR)` (a `TensorDict` in a
    /// `LazyMemmapStorage` or `LazyTensorStorage`): one column per tensor, nested keys joined with
    /// `/` (`next/reward`), oldest row first.
    TorchRl,
    /// An HDF5 file (`.hdf5`, `.h5`) in D4RL's layout (one column per per-transition dataset, at
    /// any depth: `infos/qpos`; scalars and strings such as `metadata/` are not columns), or a
    /// Minari dataset (its directory, or its `data/main_data.hdf5`: one group per episode).
    Hdf5,
    /// An Arrow IPC file (`.arrow`, `.feather`, `.ipc`; Feather v2): one unit per record batch.
    Arrow,
}

impl InputFormat {
    /// The format of `input`: a directory is a TorchRL dump when it has a `meta.json` (or
    /// `storage/meta.json`), NumPy when it holds `.npy` or `.npz` files, else Parquet when it holds
    /// `.parquet` files (at any depth: sharded datasets, LeRobot); a file goes by its extension,
    /// else by its first bytes.
    pub fn detect(input: &Path) -> Result<InputFormat> {
        if input.is_dir() {
            if hdf5::minari_file(input).is_file() {
                return Ok(InputFormat::Hdf5);
            }
            if torchrl::is_torchrl(input) {
                return Ok(InputFormat::TorchRl);
            }
            let has_numpy = std::fs::read_dir(input)
                .map_err(|e| Error::io(input, e))?
                .filter_map(|e| e.ok())
                .any(|e| {
                    e.path()
                        .extension()
                        .is_some_and(|x| x == "npy" || x == "npz")
                });
            if !has_numpy && !source::parquet::parquet_files(input)?.is_empty() {
                return Ok(InputFormat::Parquet);
            }
            return Ok(InputFormat::Numpy);
        }
        let ext = input
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        match ext.as_str() {
            "parquet" | "pq" => return Ok(InputFormat::Parquet),
            "npz" | "npy" => return Ok(InputFormat::Numpy),
            "hdf5" | "h5" => return Ok(InputFormat::Hdf5),
            "arrow" | "feather" | "ipc" | "arrows" => return Ok(InputFormat::Arrow),
            _ => {}
        }
        let mut magic = [0u8; 8];
        let n = File::open(input)
            .and_then(|mut f| std::io::Read::read(&mut f, &mut magic))
            .map_err(|e| Error::io(input, e))?;
        match &magic[..n] {
            [b'P', b'A', b'R', b'1', ..] => Ok(InputFormat::Parquet),
            b"\x89HDF\r\n\x1a\n" => Ok(InputFormat::Hdf5),
            [b'P', b'K', ..] | [0x93, b'N', ..] => Ok(InputFormat::Numpy),
            [b'A', b'R', b'R', b'O', b'W', b'1', ..] => Ok(InputFormat::Arrow),
            head if arrow_ipc::is_stream(head) => Ok(InputFormat::Arrow),
            _ => Err(Error::argument(
                "input",
                format!(
                    "{}: unknown input format; trajstore ingests Parquet (.parquet), NumPy (.npz, or a \
                 directory of .npy files), HDF5 in D4RL's layout (.hdf5), Arrow IPC files \
                 (.arrow, .feather) and TorchRL replay buffers (a directory written by rb.dumps)",
                    input.display()
                ),
            )),
        }
    }
}

/// The [`TransitionSchema`] that ingesting `input` (of `format`, e.g. from
/// [`InputFormat::detect`]) with `opts` would produce. Reads headers only (and the first row of
/// variable-size list columns).
pub fn infer_schema(
    input: &Path,
    format: InputFormat,
    opts: &IngestOptions,
) -> Result<TransitionSchema> {
    if format == InputFormat::Arrow && arrow_ipc::is_stream_file(input)? {
        let file = File::open(input).map_err(|e| Error::io(input, e))?;
        let (_, head) = arrow_ipc::open_stream(file, input)?;
        return Ok(Mapping::build(&head, opts)?.schema);
    }
    let source = open_source(input, format, opts)?;
    let plan = Mapping::build(source.as_ref(), &data_options(input, format, opts)?)?;
    match cameras(input, format, opts)? {
        Some(c) => c.schema(&plan.schema),
        None => Ok(plan.schema),
    }
}

/// A LeRobot dataset's cameras (feature `video`): `None` for any other input, and without the
/// feature (the cameras are then not read: the Parquet half is ingested alone).
#[cfg(feature = "video")]
fn cameras(
    input: &Path,
    format: InputFormat,
    opts: &IngestOptions,
) -> Result<Option<lerobot::Cameras>> {
    if format != InputFormat::Parquet {
        return Ok(None);
    }
    lerobot::Cameras::detect(input, &opts.drop_cols, opts.frame_codec)
}

/// `opts` for the Parquet half of a LeRobot dataset: a camera in `drop_cols` (which leaves the
/// camera out) is not one of its columns.
#[cfg(feature = "video")]
fn data_options(input: &Path, format: InputFormat, opts: &IngestOptions) -> Result<IngestOptions> {
    let mut o = opts.clone();
    if format == InputFormat::Parquet {
        let keys = lerobot::video_keys(input)?;
        o.drop_cols.retain(|d| !keys.contains(d));
    }
    Ok(o)
}

#[cfg(not(feature = "video"))]
fn data_options(_: &Path, _: InputFormat, opts: &IngestOptions) -> Result<IngestOptions> {
    Ok(opts.clone())
}

#[cfg(not(feature = "video"))]
fn cameras(_: &Path, _: InputFormat, _: &IngestOptions) -> Result<Option<NoCameras>> {
    Ok(None)
}

/// What [`cameras`] gives without the `video` feature: never any.
#[cfg(not(feature = "video"))]
enum NoCameras {}

#[cfg(not(feature = "video"))]
impl NoCameras {
    fn schema(&self, _: &TransitionSchema) -> Result<TransitionSchema> {
        match *self {}
    }
    fn without(&self, _: &TransitionSchema) -> Result<TransitionSchema> {
        match *self {}
    }
    fn keys(&self) -> Vec<String> {
        match *self {}
    }
}

#[cfg(not(feature = "video"))]
impl EpisodeColumns for NoCameras {
    fn attach(&mut self, _: arrow::array::RecordBatch) -> Result<arrow::array::RecordBatch> {
        match *self {}
    }
}

/// Ingests `input` (of `format`; [`InputFormat::detect`] guesses it) into `dataset` (a path):
/// creates the dataset, with the schema of [`infer_schema`], if it does not exist (or is an empty
/// directory), otherwise appends to it (the schemas must match). Commits once at the end and sets
/// the dataset property `source` to the input's path. On any error nothing is committed, and a
/// dataset directory this call created is removed.
///
/// Cost: one pass over the input; memory is bounded by a window of
/// [`rayon::current_num_threads`] decoded units (Parquet row groups, or 4 × `batch_rows` rows of
/// NumPy arrays, fewer where rows are large: a batch holds at most 16 MiB of image rows), the
/// longest episode and the writer's batch buffer ([`WriterOptions::batch_bytes`]).
pub fn ingest(
    input: &Path,
    format: InputFormat,
    dataset: &Path,
    opts: &IngestOptions,
    writer_opts: WriterOptions,
) -> Result<IngestReport> {
    if format == InputFormat::Arrow && arrow_ipc::is_stream_file(input)? {
        let file = File::open(input).map_err(|e| Error::io(input, e))?;
        let name = std::fs::canonicalize(input).unwrap_or_else(|_| input.to_path_buf());
        return ingest_stream(
            file,
            &name,
            dataset,
            opts,
            writer_opts,
            CommitPolicy::default(),
        );
    }
    let started = Instant::now();
    let source = open_source(input, format, opts)?;
    let source = source.as_ref();
    let mut plan = Mapping::build(source, &data_options(input, format, opts)?)?;
    let mut cams = cameras(input, format, opts)?;
    let stored = match &cams {
        Some(c) => c.schema(&plan.schema)?,
        None => plan.schema.clone(),
    };
    let target = Target::open(dataset, &stored, opts.frame_level)?;
    let result = (|| {
        let mut writer = target.ds.writer(writer_opts)?;
        if !target.created {
            match &cams {
                Some(c) => {
                    let existing = writer.schema();
                    let keys = c.keys();
                    let has = |s: &TransitionSchema| {
                        s.payload_schema()
                            .fields()
                            .iter()
                            .filter(|f| keys.contains(f.name()))
                            .map(|f| (f.name().clone(), f.data_type().clone()))
                            .collect::<Vec<_>>()
                    };
                    if has(existing) != has(&stored) {
                        return Err(Error::schema_mismatch(format!(
                            "cannot append {} to {}: it does not store the cameras {} as given",
                            input.display(),
                            dataset.display(),
                            keys.join(", ")
                        )));
                    }
                    plan.adopt(&c.without(existing)?, input, dataset)?;
                }
                None => plan.adopt(writer.schema(), input, dataset)?,
            }
        }
        let extra = cams.as_mut().map(|c| c as &mut dyn EpisodeColumns);
        let (rows, episodes) = stream(source, &plan, opts, &mut writer, extra)?;
        let canonical = std::fs::canonicalize(input).unwrap_or_else(|_| input.to_path_buf());
        writer.set_property(SOURCE_PROPERTY, canonical.display().to_string());
        let version = writer.commit()?;
        let mut report = plan.report(rows, episodes, version, started);
        if let Some(c) = &cams {
            report.columns.extend(
                c.keys()
                    .into_iter()
                    .map(|k| (k.clone(), format!("videos/{k}"))),
            );
        }
        Ok(report)
    })();
    if result.is_err() {
        target.discard();
    }
    result
}

/// Whether `path` is a file in the Arrow IPC stream format (which [`ingest`] reads in order,
/// through [`ingest_stream`]).
pub fn is_arrow_stream(path: &Path) -> Result<bool> {
    arrow_ipc::is_stream_file(path)
}

/// When [`ingest_stream`] commits while its stream is still open, so that readers see episodes
/// as they arrive (each commit holds whole episodes only). The default commits once, at the end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitPolicy {
    /// Commit once at least this many new episodes have ended (checked after each record
    /// batch, so a commit holds whole batches' worth of finished episodes).
    pub episodes: Option<u64>,
    /// Commit when this much time has passed since the last commit and there are new episodes
    /// (checked as record batches arrive).
    pub interval: Option<std::time::Duration>,
}

impl CommitPolicy {
    fn due(&self, new_episodes: u64, since: std::time::Duration) -> bool {
        new_episodes > 0
            && (self.episodes.is_some_and(|n| new_episodes >= n)
                || self.interval.is_some_and(|t| since >= t))
    }
}

/// Ingests an Arrow IPC **stream** read from `reader` (a file in the stream format, or a live
/// collector's pipe: `pa.ipc.new_stream(sys.stdout.buffer, schema)`), with the same options,
/// conversions and checks as [`ingest`]. Record batches are converted as they arrive (memory
/// holds one batch plus the episode in progress), and `policy` commits whole episodes while the
/// stream is open. At the end of the stream the last episode is closed (truncated unless its
/// last row is terminated) and committed. `name` names the input in messages and in the
/// dataset's `source` property.
///
/// On an error (bad data, a broken stream) what was committed before it stays committed (a new
/// dataset with no commit yet is removed) and the error is [`Error::StreamBroken`], which carries
/// the kept version and how many of the stream's episodes it holds.
pub fn ingest_stream(
    reader: impl std::io::Read,
    name: &Path,
    dataset: &Path,
    opts: &IngestOptions,
    writer_opts: WriterOptions,
    policy: CommitPolicy,
) -> Result<IngestReport> {
    let started = Instant::now();
    let (mut batches, head) = arrow_ipc::open_stream(reader, name)?;
    let first = head.first().cloned();
    let mut plan = Mapping::build(&head, opts)?;
    let target = Target::open(dataset, &plan.schema, opts.frame_level)?;
    let pb = &opts.progress;
    pb.start("ingest", Unit::Rows, None);
    let mut committed: Option<(u64, u64)> = None;
    let result = (|| {
        let mut writer = target.ds.writer(writer_opts)?;
        if !target.created {
            plan.adopt(writer.schema(), name, dataset)?;
        }
        writer.set_property(SOURCE_PROPERTY, name.display().to_string());
        let mut asm = Assembler::new(&mut writer, &plan);
        let (mut at_commit, mut commit_time) = (0u64, Instant::now());
        let mut next = first;
        while let Some(batch) = next {
            let batch = batch.project(&plan.projection)?;
            let step = opts.batch_rows.max(1);
            for off in (0..batch.num_rows()).step_by(step) {
                let part = batch.slice(off, step.min(batch.num_rows() - off));
                let chunk = convert(&plan, &part, asm.rows)?;
                asm.push(chunk)?;
            }
            pb.advance(batch.num_rows() as u64);
            if policy.due(asm.episodes - at_commit, commit_time.elapsed()) {
                let v = asm.writer.commit()?;
                committed = Some((v, asm.episodes));
                (at_commit, commit_time) = (asm.episodes, Instant::now());
            }
            next = arrow_ipc::next_batch(&mut batches, name, asm.rows)?;
        }
        asm.finish()?;
        let (rows, episodes) = (asm.rows, asm.episodes);
        let version = writer.commit()?;
        Ok(plan.report(rows, episodes, version, started))
    })();
    pb.finish(result.is_ok());
    match (result, committed) {
        (Ok(r), _) => Ok(r),
        (Err(e), None) => {
            target.discard();
            Err(e)
        }
        (Err(e), Some((v, episodes))) => Err(Error::StreamBroken {
            kept_version: v,
            episodes_kept: episodes,
            source: Box::new(e),
        }),
    }
}
