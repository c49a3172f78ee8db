//! Ingest: turns a file of transitions (one row per transition) into trajstore episodes. Four
//! input formats, read by one pipeline:
//!
//! - **Parquet** (D4RL/Minari/LeRobot style exports, pandas/Polars dumps);
//! - **NumPy**: a `.npz` archive (`np.savez` / `np.savez_compressed`, e.g. D4RL's
//!   `env.get_dataset()` dict saved as is) or a directory of `.npy` files, one column per array
//!   (module `numpy`);
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
//! fed in order to one [`DatasetWriter`]. Memory is bounded by the window of decoded units, plus
//! the longest episode (an episode that spans units is carried across them), plus the writer's
//! batch buffer. The ingest commits once at the end; on any error nothing is committed, and a dataset
//! directory that the ingest created is removed again.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, BooleanArray, FixedSizeListArray,
    OffsetSizeTrait, PrimitiveArray, RecordBatch,
};
use arrow::compute::{CastOptions, cast_with_options, concat_batches};
use arrow::datatypes::{
    DataType, Field, FieldRef, Float16Type, Float32Type, Float64Type, Int8Type, Int16Type,
    Int32Type, Int64Type, Schema, SchemaRef, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use indicatif::{ProgressBar, ProgressStyle};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use rayon::prelude::*;

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::format::{self, col};
use crate::schema::{TransitionSchema, field_shape, fsl, tensor_field};
use crate::writer::{DatasetWriter, EpisodeEnd, WriterOptions};

mod arrow_ipc;
mod hdf5;
mod numpy;
mod torchrl;

/// Name of the user column that keeps the input's episode id in episode-id mode.
pub const SOURCE_EPISODE: &str = "source_episode";

/// Property set on the dataset to the (canonical) path of the ingested file.
pub const SOURCE_PROPERTY: &str = "source";

/// Batches of `batch_rows` rows per unit of a source that chooses its units (NumPy arrays, Minari
/// episodes): enough to amortise a unit, few enough to bound the window of decoded units.
const UNIT_BATCHES: usize = 4;

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
    /// Rows per decoded record batch (default 64Ki).
    pub batch_rows: usize,
    /// Show a progress bar on stderr (it hides itself when stderr is not a terminal).
    pub progress: bool,
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
            progress: false,
        }
    }
}

fn strings<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Vec<String> {
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
    /// Sets [`IngestOptions::batch_rows`].
    pub fn with_batch_rows(mut self, rows: usize) -> Self {
        self.batch_rows = rows;
        self
    }
    /// Sets [`IngestOptions::progress`].
    pub fn with_progress(mut self, progress: bool) -> Self {
        self.progress = progress;
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
}

/// The former name of [`IngestOptions`].
pub type ParquetIngestOptions = IngestOptions;

/// The kinds of input [`ingest`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    /// A Parquet file (`.parquet`, `.pq`), or a directory of them read in path order (a sharded
    /// dataset; a LeRobot dataset's `data/chunk-*/episode_*.parquet`), all with the same columns.
    Parquet,
    /// A NumPy `.npz` archive (`np.savez` or `np.savez_compressed`) or a directory of `.npy`
    /// files: one column per array, named after its key.
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
    /// `storage/meta.json`), NumPy when it holds `.npy` files, else Parquet when it holds
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
            let has_npy = std::fs::read_dir(input)
                .map_err(|e| Error::io(input, e))?
                .filter_map(|e| e.ok())
                .any(|e| e.path().extension().is_some_and(|x| x == "npy"));
            if !has_npy && !parquet_files(input)?.is_empty() {
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
            _ => Err(Error::InvalidArgument(format!(
                "{}: unknown input format; trajstore ingests Parquet (.parquet), NumPy (.npz, or a \
                 directory of .npy files), HDF5 in D4RL's layout (.hdf5), Arrow IPC files \
                 (.arrow, .feather) and TorchRL replay buffers (a directory written by rb.dumps)",
                input.display()
            ))),
        }
    }
}

/// Opens `input` as a [`Source`] of the given format.
fn open_source(input: &Path, format: InputFormat, opts: &IngestOptions) -> Result<Box<dyn Source>> {
    Ok(match format {
        InputFormat::Parquet => Box::new(ParquetSource::open(input)?),
        InputFormat::Numpy => Box::new(numpy::NumpySource::open(input, &opts.drop_cols)?),
        InputFormat::TorchRl => Box::new(torchrl::open(input, &opts.drop_cols)?),
        InputFormat::Hdf5 => hdf5::open(input, &opts.drop_cols)?,
        InputFormat::Arrow => Box::new(arrow_ipc::ArrowSource::open(input)?),
    })
}

/// The [`TransitionSchema`] that ingesting the Parquet file `input` with `opts` would produce.
/// Reads the footer, plus the first row when an observation or action is a variable-size list
/// (to learn its length).
pub fn infer_parquet_schema(input: &Path, opts: &IngestOptions) -> Result<TransitionSchema> {
    infer_schema(input, InputFormat::Parquet, opts)
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
        return Ok(Plan::build(&head, opts)?.schema);
    }
    let source = open_source(input, format, opts)?;
    Ok(Plan::build(source.as_ref(), opts)?.schema)
}

/// Ingests the Parquet file `input` into `dataset`; see [`ingest`].
pub fn ingest_parquet(
    input: &Path,
    dataset: &Path,
    opts: &IngestOptions,
    writer_opts: WriterOptions,
) -> Result<IngestReport> {
    ingest(input, InputFormat::Parquet, dataset, opts, writer_opts)
}

/// Ingests `input` (of `format`; [`InputFormat::detect`] guesses it) into `dataset` (a path):
/// creates the dataset, with the schema of [`infer_schema`], if it does not exist (or is an empty
/// directory), otherwise appends to it (the schemas must match). Commits once at the end and sets
/// the dataset property `source` to the input's path. On any error nothing is committed, and a
/// dataset directory this call created is removed.
///
/// Cost: one pass over the input; memory is bounded by a window of
/// [`rayon::current_num_threads`] decoded units (Parquet row groups, or 4 × `batch_rows` rows of
/// NumPy arrays), the longest episode and the writer's batch buffer
/// ([`WriterOptions::batch_bytes`]).
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
    let mut plan = Plan::build(source, opts)?;
    let target = Target::open(dataset, &plan.schema)?;
    let result = (|| {
        let mut writer = target.ds.writer(writer_opts)?;
        if !target.created {
            plan.adopt(writer.schema(), input, dataset)?;
        }
        let (rows, episodes) = stream(source, &plan, opts, &mut writer)?;
        let canonical = std::fs::canonicalize(input).unwrap_or_else(|_| input.to_path_buf());
        writer.set_property(SOURCE_PROPERTY, canonical.display().to_string());
        let version = writer.commit()?;
        Ok(plan.report(rows, episodes, version, started))
    })();
    if result.is_err() {
        target.discard();
    }
    result
}

/// The dataset an ingest writes to: opened, or created (and then removed again if the ingest
/// fails before committing anything).
struct Target {
    ds: Dataset,
    path: PathBuf,
    created: bool,
    existed: bool,
}

impl Target {
    fn open(dataset: &Path, schema: &TransitionSchema) -> Result<Self> {
        let existed = dataset.exists();
        let fresh = !existed || is_empty_dir(dataset)?;
        let (ds, created) = if fresh {
            match Dataset::create(dataset, schema) {
                Ok(ds) => (ds, true),
                // Someone else's non-empty directory: never remove it.
                Err(e @ Error::InvalidArgument(_)) => return Err(e),
                Err(e) => {
                    remove_created(dataset, existed);
                    return Err(e);
                }
            }
        } else {
            if !dataset.is_dir() {
                return Err(Error::InvalidArgument(format!(
                    "{} exists and is not a dataset directory",
                    dataset.display()
                )));
            }
            (Dataset::open(dataset)?, false)
        };
        Ok(Target {
            ds,
            path: dataset.to_path_buf(),
            created,
            existed,
        })
    }

    /// Removes the dataset if this ingest created it.
    fn discard(&self) {
        if self.created {
            remove_created(&self.path, self.existed);
        }
    }
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
/// dataset with no commit yet is removed); the error says so.
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
    let mut plan = Plan::build(&head, opts)?;
    let target = Target::open(dataset, &plan.schema)?;
    let pb = if opts.progress {
        let pb = ProgressBar::new_spinner();
        if let Ok(style) =
            ProgressStyle::with_template("{spinner} {elapsed_precise} {human_pos} rows, {per_sec}")
        {
            pb.set_style(style);
        }
        pb
    } else {
        ProgressBar::hidden()
    };
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
            pb.inc(batch.num_rows() as u64);
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
    pb.finish_and_clear();
    match (result, committed) {
        (Ok(r), _) => Ok(r),
        (Err(e), None) => {
            target.discard();
            Err(e)
        }
        (Err(e), Some((v, episodes))) => Err(Error::InvalidData(format!(
            "{e} (version {v}, committed before the error with {episodes} episodes of this \
             stream, is kept)"
        ))),
    }
}

fn remove_created(dataset: &Path, existed_empty: bool) {
    // Best effort: the original error is the one to report.
    let _ = std::fs::remove_dir_all(dataset);
    if existed_empty {
        let _ = std::fs::create_dir(dataset);
    }
}

fn is_empty_dir(path: &Path) -> Result<bool> {
    if !path.is_dir() {
        return Ok(false);
    }
    let mut entries = std::fs::read_dir(path).map_err(|e| Error::io(path, e))?;
    Ok(entries.next().is_none())
}

/// Where rows come from: a columnar input read in units (Parquet row groups, row ranges of NumPy
/// arrays), in row order.
trait Source: Sync {
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
            Some(c) => Err(Error::SchemaMismatch(format!(
                "column `{c}` is not a fixed-shape array"
            ))),
        }
    }
    /// A column of episode ids the input defines itself (Minari's episode groups), used when
    /// the caller gives no boundary option.
    fn episode_column(&self) -> Option<&str> {
        None
    }
}

/// The Parquet files of a directory, recursively, sorted by path: a sharded dataset, or the
/// `data/` directory of a LeRobot dataset (one with `meta/info.json`; its `meta/` may hold
/// Parquet files of per-episode metadata, which are not transitions).
fn parquet_files(dir: &Path) -> Result<Vec<PathBuf>> {
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
struct ParquetSource {
    path: PathBuf,
    files: Vec<(PathBuf, ArrowReaderMetadata)>,
    /// (file, row group, rows) of every non-empty row group, in order.
    groups: Vec<(usize, usize, u64)>,
}

impl ParquetSource {
    fn open(path: &Path) -> Result<ParquetSource> {
        let paths = if path.is_dir() {
            let files = parquet_files(path)?;
            if files.is_empty() {
                return Err(Error::InvalidData(format!(
                    "{} holds no .parquet files",
                    path.display()
                )));
            }
            files
        } else {
            vec![path.to_path_buf()]
        };
        let mut files: Vec<(PathBuf, ArrowReaderMetadata)> = vec![];
        let mut groups = vec![];
        for p in paths {
            let file = File::open(&p).map_err(|e| Error::io(&p, e))?;
            let meta = ArrowReaderMetadata::load(&file, Default::default()).map_err(|e| {
                Error::InvalidData(format!("{}: not a readable Parquet file: {e}", p.display()))
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
                    return Err(Error::SchemaMismatch(format!(
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
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
            .with_row_groups(vec![group])
            .with_projection(ProjectionMask::roots(
                meta.parquet_schema(),
                projection.iter().copied(),
            ))
            .with_batch_size(batch_rows)
            .build()?;
        reader
            .filter(|b| b.as_ref().map_or(true, |b| b.num_rows() > 0))
            .map(|b| Ok(b?))
            .collect()
    }

    fn first_row_lengths(&self, cols: &[&str]) -> Result<Vec<(String, usize)>> {
        if cols.is_empty() {
            return Ok(vec![]);
        }
        let Some(&(f, _, _)) = self.groups.first() else {
            return Err(Error::InvalidData(format!(
                "{} has no rows, so the length of list column `{}` cannot be inferred",
                self.path.display(),
                cols[0]
            )));
        };
        let (path, meta) = &self.files[f];
        let schema = meta.schema();
        let idx: Vec<usize> = cols
            .iter()
            .filter_map(|c| schema.index_of(c).ok())
            .collect();
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
            .with_projection(ProjectionMask::roots(meta.parquet_schema(), idx))
            .with_batch_size(1)
            .with_limit(1)
            .build()?;
        let batch = match reader.next() {
            Some(b) => b?,
            None => {
                return Err(Error::InvalidData(format!(
                    "{} has no rows, so the length of list column `{}` cannot be inferred",
                    self.path.display(),
                    cols[0]
                )));
            }
        };
        row0_list_lengths(&batch, cols)
    }
}

/// [`Source::units`] of units `(unit, rows)` that follow one another: each with its first row.
fn units_of(units: impl Iterator<Item = (usize, u64)>) -> Vec<(usize, u64, u64)> {
    let mut base = 0u64;
    units
        .map(|(unit, rows)| {
            base += rows;
            (unit, base - rows, rows)
        })
        .collect()
}

/// The length of row 0 of each list column `cols` of `batch` (which must have a row).
fn row0_list_lengths(batch: &RecordBatch, cols: &[&str]) -> Result<Vec<(String, usize)>> {
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
                return Err(Error::InvalidData(format!(
                    "row 0: column `{c}` is an empty list"
                )));
            }
            Ok((c.to_string(), n))
        })
        .collect()
}

/// Fills in what `opts` leaves at its defaults from the input's column names, so that common
/// layouts ingest without flags:
///
/// - `observations`, `actions`, `rewards`, `next_observations` (D4RL, Minari, most NumPy dumps),
///   TorchRL's `next/reward`, LeRobot's `observation.state` and `next.reward`, when the input has
///   no `observation`, `action`, `reward` column;
///   `next_observation(s)` and TorchRL's `next/observation` are stored as `next_observation`;
/// - episode boundaries, when no boundary option is given: flags `terminals`/`timeouts` (D4RL),
///   `terminated`/`truncated` (Gymnasium), `terminations`/`truncations` (Minari),
///   `next/terminated`/`next/truncated` (TorchRL; `next/done` is then dropped), else an episode
///   id column `episode_index` (LeRobot), `episode_id`, `episode`, `collector/traj_ids` or
///   `traj_ids` (TorchRL), else TorchRL's `next/done` alone as the terminated flag; a file written by
///   `trajstore export` (it has `episode_id, step, is_first, is_last`) takes its episode ids and
///   flags, and its computed `step, is_first, is_last` are dropped (the store recomputes them).
///
/// Columns named in `drop_cols` are never picked.
fn resolve_conventions(
    opts: &IngestOptions,
    schema: &Schema,
    source_episodes: Option<&str>,
) -> IngestOptions {
    let mut o = opts.clone();
    let has =
        |name: &str| schema.field_with_name(name).is_ok() && !o.drop_cols.iter().any(|d| d == name);
    let plural = |default: &str, set: &str, others: &[&str]| {
        if set != default || has(default) {
            return None;
        }
        others.iter().find(|n| has(n)).map(|n| n.to_string())
    };
    if o.observation_cols.is_empty()
        && let Some(p) = plural(
            col::OBSERVATION,
            &o.observation_col,
            &["observations", "observation.state"],
        )
    {
        o.observation_col = p;
    }
    if o.action_cols.is_empty()
        && let Some(p) = plural(col::ACTION, &o.action_col, &["actions"])
    {
        o.action_col = p;
    }
    if let Some(p) = plural(
        col::REWARD,
        &o.reward_col,
        &["rewards", "next/reward", "next.reward"],
    ) {
        o.reward_col = p;
    }
    if o.next_observation_col.is_none() {
        o.next_observation_col = ["next_observation", "next_observations", "next/observation"]
            .into_iter()
            .find(|n| has(n))
            .map(String::from);
    }
    let computed = [col::STEP, col::IS_FIRST, col::IS_LAST];
    let no_boundaries =
        o.episode_col.is_none() && o.terminated_col.is_none() && o.truncated_col.is_none();
    if let Some(id) = source_episodes.filter(|_| no_boundaries) {
        // The input's own episodes (Minari's groups), with its flags read on each last row.
        o.episode_col = Some(id.to_string());
        o.terminated_col = has("terminations").then(|| "terminations".to_string());
        o.truncated_col = has("truncations").then(|| "truncations".to_string());
        return o;
    }
    if no_boundaries {
        if has(col::EPISODE_ID) && computed.iter().all(|c| has(c)) {
            // A trajstore export: its own ids and flags; the computed columns are recomputed.
            o.episode_col = Some(col::EPISODE_ID.to_string());
            o.terminated_col = has(col::TERMINATED).then(|| col::TERMINATED.to_string());
            o.truncated_col = has(col::TRUNCATED).then(|| col::TRUNCATED.to_string());
            o.drop_cols.extend(computed.iter().map(|c| c.to_string()));
            return o;
        }
        let flags = [
            ("terminals", "timeouts"),
            (col::TERMINATED, col::TRUNCATED),
            ("terminations", "truncations"),
            ("next/terminated", "next/truncated"),
        ];
        if let Some((t, tr)) = flags.into_iter().find(|(t, tr)| has(t) || has(tr)) {
            o.terminated_col = has(t).then(|| t.to_string());
            o.truncated_col = has(tr).then(|| tr.to_string());
            // TorchRL's done is terminated OR truncated: nothing to keep.
            if t == "next/terminated" && has("next/done") {
                o.drop_cols.push("next/done".into());
            }
        } else if let Some(id) = [
            "episode_index",
            col::EPISODE_ID,
            "episode",
            "collector/traj_ids",
            "traj_ids",
        ]
        .into_iter()
        .find(|n| has(n))
        {
            o.episode_col = Some(id.into());
        } else if has("next/done") {
            // Older TorchRL data: done alone, read as terminated (the pre-truncation convention).
            o.terminated_col = Some("next/done".into());
        }
    }
    o
}

// ---------------------------------------------------------------------------------------------
// The plan: which input column becomes which stored column, and how.
// ---------------------------------------------------------------------------------------------

/// A tensor column (observation, continuous action, next observation) built from one or more
/// input columns, concatenated per row.
#[derive(Debug, Clone)]
struct TensorSpec {
    /// Input column and its number of values per row.
    sources: Vec<(String, usize)>,
    /// Element type after conversion.
    elem: DataType,
    /// Tensor shape (product = sum of the widths).
    shape: Vec<usize>,
}

impl TensorSpec {
    fn width(&self) -> usize {
        self.sources.iter().map(|s| s.1).sum()
    }
}

#[derive(Debug, Clone)]
enum ActionSpec {
    Discrete(String),
    Continuous(TensorSpec),
}

#[derive(Debug, Clone)]
struct EpisodeCol {
    name: String,
    signed: bool,
}

#[derive(Debug, Clone)]
struct Plan {
    schema: TransitionSchema,
    /// Root column indices to decode.
    projection: Vec<usize>,
    observation: TensorSpec,
    action: ActionSpec,
    /// `None`: no reward in the input, 0.0 is stored.
    reward: Option<String>,
    next_observation: Option<TensorSpec>,
    episode: Option<EpisodeCol>,
    terminated: Option<String>,
    truncated: Option<String>,
}

/// The shape of one input column.
#[derive(Debug, Clone)]
enum Kind {
    /// One number per row.
    Scalar(DataType),
    /// A (possibly nested) fixed-size list of numbers: element type, shape.
    Fixed(DataType, Vec<usize>),
    /// A variable-size list of numbers.
    List(DataType),
}

impl Kind {
    fn elem(&self) -> &DataType {
        match self {
            Kind::Scalar(e) | Kind::Fixed(e, _) | Kind::List(e) => e,
        }
    }
}

fn is_numeric(dt: &DataType) -> bool {
    dt.is_integer() || dt.is_floating()
}

/// Classifies a column as a numeric scalar, fixed-size list or list; `None` otherwise.
fn kind_of(field: &Field) -> Option<Kind> {
    match field.data_type() {
        dt if is_numeric(dt) => Some(Kind::Scalar(dt.clone())),
        DataType::FixedSizeList(child, n) => {
            let n = usize::try_from(*n).ok().filter(|&n| n > 0)?;
            match kind_of(child)? {
                Kind::Scalar(e) => {
                    // A flat list may carry `arrow.fixed_shape_tensor` metadata (e.g. our export).
                    let shape = field_shape(field).unwrap_or_else(|_| vec![n]);
                    Some(Kind::Fixed(e, shape))
                }
                Kind::Fixed(e, inner) => {
                    let mut shape = vec![n];
                    shape.extend(inner);
                    Some(Kind::Fixed(e, shape))
                }
                Kind::List(_) => None,
            }
        }
        DataType::List(child) | DataType::LargeList(child) if is_numeric(child.data_type()) => {
            Some(Kind::List(child.data_type().clone()))
        }
        _ => None,
    }
}

/// Reserved names a leftover input column may not take.
fn reserved(name: &str) -> bool {
    col::BOUNDARY.contains(&name)
        || [
            col::OBSERVATION,
            col::ACTION,
            col::REWARD,
            col::NEXT_OBSERVATION,
        ]
        .contains(&name)
}

/// Why a leftover column with a reserved name cannot be kept, and what to do instead.
fn reserved_error(name: &str) -> Error {
    let role = match name {
        col::TERMINATED | col::TRUNCATED | col::OBSERVATION | col::ACTION | col::REWARD => name,
        col::NEXT_OBSERVATION => "next-observation",
        _ => "",
    };
    let fix = if role.is_empty() {
        format!(
            "the store computes `{name}` itself; pass --drop-cols {name} (or --episode-col {name} if it holds episode ids)"
        )
    } else {
        format!("use it with --{role}-col {name}, or pass --drop-cols {name}")
    };
    Error::SchemaMismatch(format!(
        "column `{name}` would be kept as a user column, but its name is reserved for a stored column; {fix}"
    ))
}

/// The user-column type of an input column, if it is fixed-width: fixed-size list children are
/// renamed to a non-nullable `item`.
fn user_type(dt: &DataType) -> Option<DataType> {
    let out = match dt {
        DataType::FixedSizeList(child, n) => DataType::FixedSizeList(
            Field::new("item", child.data_type().clone(), false).into(),
            *n,
        ),
        other => other.clone(),
    };
    // Only types that survive the manifest round trip.
    format::parse_type(&format::type_name(&out)?).ok()?;
    Some(out)
}

impl Plan {
    /// What an ingest that used this plan reports.
    fn report(&self, rows: u64, episodes: u64, version: u64, started: Instant) -> IngestReport {
        IngestReport {
            rows,
            episodes,
            version,
            seconds: started.elapsed().as_secs_f64(),
            columns: self.mapping(),
            boundaries: self.boundaries(),
        }
    }

    fn build(source: &dyn Source, opts: &IngestOptions) -> Result<Plan> {
        let input = source.path();
        let file_schema = source.schema();
        let opts = &resolve_conventions(opts, &file_schema, source.episode_column());
        if opts.batch_rows == 0 {
            return Err(Error::InvalidArgument(
                "batch_rows must be at least 1".into(),
            ));
        }
        if opts.episode_col.is_none()
            && opts.terminated_col.is_none()
            && opts.truncated_col.is_none()
        {
            return Err(Error::InvalidArgument(
                "no way to find episode boundaries: give an episode id column (--episode-col NAME; an \
                 episode is a run of equal ids, optional flag columns are read on its last row), or \
                 flag columns (--terminated-col NAME and/or --truncated-col NAME; an episode ends at a \
                 row where either is set)"
                    .into(),
            ));
        }
        let mut seen = HashSet::new();
        for f in file_schema.fields() {
            if !seen.insert(f.name().as_str()) {
                return Err(Error::SchemaMismatch(format!(
                    "{} has two columns named `{}`",
                    input.display(),
                    f.name()
                )));
            }
        }
        let all_names = || {
            file_schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        // Every input column used, with the role it plays (to reject double use).
        let mut used: Vec<(String, &'static str)> = vec![];
        let mut take = |name: &str, role: &'static str, flag: &str| -> Result<FieldRef> {
            if let Some((_, other)) = used.iter().find(|(n, _)| n == name) {
                return Err(Error::InvalidArgument(format!(
                    "column `{name}` is used both as {other} and as {role}"
                )));
            }
            if opts.drop_cols.iter().any(|d| d == name) {
                return Err(Error::InvalidArgument(format!(
                    "column `{name}` is used as {role} and also listed in --drop-cols"
                )));
            }
            let field = file_schema.field_with_name(name).map_err(|_| {
                Error::SchemaMismatch(format!(
                    "{} has no column `{name}` for the {role} (set it with {flag}); columns: {}",
                    input.display(),
                    all_names()
                ))
            })?;
            used.push((name.to_string(), role));
            Ok(Arc::new(field.clone()))
        };

        // Episode boundaries.
        let episode = match &opts.episode_col {
            Some(name) => {
                let f = take(name, "episode id", "--episode-col")?;
                if !f.data_type().is_integer() {
                    return Err(Error::SchemaMismatch(format!(
                        "episode id column `{name}` must hold integers, found {}",
                        f.data_type()
                    )));
                }
                Some(EpisodeCol {
                    name: name.clone(),
                    signed: f.data_type().is_signed_integer(),
                })
            }
            None => None,
        };
        let mut flag = |name: &Option<String>,
                        role: &'static str,
                        opt: &str|
         -> Result<Option<String>> {
            let Some(name) = name else { return Ok(None) };
            let f = take(name, role, opt)?;
            let dt = f.data_type();
            if !(dt == &DataType::Boolean || is_numeric(dt)) {
                return Err(Error::SchemaMismatch(format!(
                    "{role} column `{name}` must be bool or numeric (non-zero = set), found {dt}"
                )));
            }
            Ok(Some(name.clone()))
        };
        let terminated = flag(&opts.terminated_col, "terminated flag", "--terminated-col")?;
        let truncated = flag(&opts.truncated_col, "truncated flag", "--truncated-col")?;

        // Tensors: collect their kinds first; lengths of variable-size lists come from row 0.
        let mut tensor_kinds = |names: Vec<String>,
                                role: &'static str,
                                opt: &str|
         -> Result<Vec<(String, Kind)>> {
            names
                .into_iter()
                .map(|name| {
                    let f = take(&name, role, opt)?;
                    let kind = kind_of(&f).ok_or_else(|| {
                        Error::SchemaMismatch(format!(
                            "{role} column `{name}` must be numbers or (fixed-size) lists of numbers, found {}",
                            f.data_type()
                        ))
                    })?;
                    Ok((name, kind))
                })
                .collect()
        };
        let obs_names = if opts.observation_cols.is_empty() {
            vec![opts.observation_col.clone()]
        } else {
            opts.observation_cols.clone()
        };
        let obs_opt = if opts.observation_cols.is_empty() {
            "--observation-col"
        } else {
            "--observation-cols"
        };
        let obs_kinds = tensor_kinds(obs_names, "observation", obs_opt)?;
        let act_names = if opts.action_cols.is_empty() {
            vec![opts.action_col.clone()]
        } else {
            opts.action_cols.clone()
        };
        let act_opt = if opts.action_cols.is_empty() {
            "--action-col"
        } else {
            "--action-cols"
        };
        let act_kinds = tensor_kinds(act_names, "action", act_opt)?;
        let next_kinds = match &opts.next_observation_col {
            Some(n) => Some(tensor_kinds(
                vec![n.clone()],
                "next observation",
                "--next-observation-col",
            )?),
            None => None,
        };
        let reward = if opts.no_reward {
            None
        } else {
            if file_schema.field_with_name(&opts.reward_col).is_err() {
                return Err(Error::SchemaMismatch(format!(
                    "{} has no column `{}` for the reward (set it with --reward-col, or pass \
                     --no-reward if the data has none, e.g. demonstrations); columns: {}",
                    input.display(),
                    opts.reward_col,
                    all_names()
                )));
            }
            let reward_field = take(&opts.reward_col, "reward", "--reward-col")?;
            if !is_numeric(reward_field.data_type()) {
                return Err(Error::SchemaMismatch(format!(
                    "reward column `{}` must be a number, found {}",
                    opts.reward_col,
                    reward_field.data_type()
                )));
            }
            Some(opts.reward_col.clone())
        };

        let list_cols: Vec<&str> = obs_kinds
            .iter()
            .chain(&act_kinds)
            .chain(next_kinds.iter().flatten())
            .filter(|(_, k)| matches!(k, Kind::List(_)))
            .map(|(n, _)| n.as_str())
            .collect();
        let lengths = source.first_row_lengths(&list_cols)?;
        let width_of = |name: &str, kind: &Kind| -> usize {
            match kind {
                Kind::Scalar(_) => 1,
                Kind::Fixed(_, shape) => shape.iter().product(),
                Kind::List(_) => lengths.iter().find(|(n, _)| n == name).map_or(0, |l| l.1),
            }
        };
        let tensor = |kinds: &[(String, Kind)], force_float: bool| -> TensorSpec {
            let sources: Vec<(String, usize)> = kinds
                .iter()
                .map(|(n, k)| (n.clone(), width_of(n, k)))
                .collect();
            let first = kinds[0].1.elem().clone();
            let mut elem = if kinds.iter().all(|(_, k)| k.elem() == &first) {
                first
            } else {
                DataType::Float32
            };
            if force_float && !elem.is_floating() {
                elem = DataType::Float32;
            }
            let width = sources.iter().map(|s| s.1).sum();
            let shape = match kinds {
                [(_, Kind::Fixed(_, shape))] => shape.clone(),
                _ => vec![width],
            };
            TensorSpec {
                sources,
                elem,
                shape,
            }
        };

        let observation = tensor(&obs_kinds, false);
        let action = match act_kinds.as_slice() {
            [(name, Kind::Scalar(dt))] if dt.is_integer() => ActionSpec::Discrete(name.clone()),
            kinds => {
                let mut spec = tensor(kinds, true);
                spec.shape = vec![spec.width()];
                ActionSpec::Continuous(spec)
            }
        };
        let next_observation = match next_kinds {
            Some(kinds) => {
                let mut spec = tensor(&kinds, false);
                if spec.elem != observation.elem || spec.width() != observation.width() {
                    return Err(Error::SchemaMismatch(format!(
                        "next observation column `{}` holds {} values of {} per row, the observation {} of {}",
                        spec.sources[0].0,
                        spec.width(),
                        spec.elem,
                        observation.width(),
                        observation.elem
                    )));
                }
                spec.shape = observation.shape.clone();
                Some(spec)
            }
            None => None,
        };

        // Payload fields in canonical order; `source_episode` leads the user columns.
        let mut fields = vec![
            tensor_field(
                col::OBSERVATION,
                observation.elem.clone(),
                &observation.shape,
                false,
            )?,
            match &action {
                ActionSpec::Discrete(_) => Field::new(col::ACTION, DataType::Int64, false),
                ActionSpec::Continuous(spec) => {
                    Field::new(col::ACTION, fsl(spec.elem.clone(), spec.width())?, false)
                }
            },
            Field::new(col::REWARD, DataType::Float32, false),
        ];
        if next_observation.is_some() {
            fields.push(tensor_field(
                col::NEXT_OBSERVATION,
                observation.elem.clone(),
                &observation.shape,
                false,
            )?);
        }
        if let Some(e) = &episode {
            let dt = if e.signed {
                DataType::Int64
            } else {
                DataType::UInt64
            };
            fields.push(Field::new(SOURCE_EPISODE, dt, false));
        }

        // Everything else is kept as a user column, or dropped.
        for d in &opts.drop_cols {
            if file_schema.field_with_name(d).is_err() {
                return Err(Error::InvalidArgument(format!(
                    "--drop-cols names `{d}`, which {} does not have; columns: {}",
                    input.display(),
                    all_names()
                )));
            }
        }
        let mut projection = vec![];
        for (i, f) in file_schema.fields().iter().enumerate() {
            let name = f.name().as_str();
            if opts.drop_cols.iter().any(|d| d == name) {
                continue;
            }
            projection.push(i);
            if used.iter().any(|(n, _)| n == name) {
                continue;
            }
            if reserved(name) || (episode.is_some() && name == SOURCE_EPISODE) {
                return Err(reserved_error(name));
            }
            let dt = user_type(f.data_type()).ok_or_else(|| {
                Error::SchemaMismatch(format!(
                    "column `{name}` has type {}, but only fixed-width columns (bool, ints, floats and \
                     fixed-size lists of numbers) can be stored; pass --drop-cols {name} to ignore it",
                    f.data_type()
                ))
            })?;
            fields.push(Field::new(name, dt, f.is_nullable()));
        }
        let schema = TransitionSchema::from_payload(&Schema::new(fields))?;
        Ok(Plan {
            schema,
            projection,
            observation,
            action,
            reward,
            next_observation,
            episode,
            terminated,
            truncated,
        })
    }

    /// Stored column ← input column(s), where the names differ.
    fn mapping(&self) -> Vec<(String, String)> {
        let sources = |t: &TensorSpec| {
            t.sources
                .iter()
                .map(|s| s.0.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut out = vec![(col::OBSERVATION.to_string(), sources(&self.observation))];
        out.push((
            col::ACTION.to_string(),
            match &self.action {
                ActionSpec::Discrete(name) => name.clone(),
                ActionSpec::Continuous(t) => sources(t),
            },
        ));
        out.push((
            col::REWARD.to_string(),
            self.reward.clone().unwrap_or_else(|| "none (0.0)".into()),
        ));
        if let Some(t) = &self.next_observation {
            out.push((col::NEXT_OBSERVATION.to_string(), sources(t)));
        }
        if let Some(e) = &self.episode {
            out.push((SOURCE_EPISODE.to_string(), e.name.clone()));
        }
        out.retain(|(a, b)| a != b);
        out
    }

    /// Where episode boundaries come from, in words.
    fn boundaries(&self) -> String {
        let flags: Vec<&str> = [&self.terminated, &self.truncated]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        match &self.episode {
            Some(e) if flags.is_empty() => format!("episode ids in `{}`", e.name),
            Some(e) => format!(
                "episode ids in `{}` (flags {} on each episode's last row)",
                e.name,
                flags.join(", ")
            ),
            None => format!("flags {}", flags.join(", ")),
        }
    }

    /// Appending: the dataset's schema must match the inferred one (nullability of user columns
    /// aside: the dataset's wins, and nulls are checked row by row). The dataset's schema is then
    /// the one converted batches take.
    fn adopt(&mut self, existing: &TransitionSchema, input: &Path, dataset: &Path) -> Result<()> {
        let mismatch = |why: String| {
            Error::SchemaMismatch(format!(
                "cannot append {} to {}: {why}",
                input.display(),
                dataset.display()
            ))
        };
        let a = existing.payload_schema();
        let b = self.schema.payload_schema();
        let names = |s: &SchemaRef| {
            s.fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if a.fields().len() != b.fields().len() {
            return Err(mismatch(format!(
                "the file gives columns [{}], the dataset has [{}]",
                names(b),
                names(a)
            )));
        }
        for (x, y) in a.fields().iter().zip(b.fields()) {
            if x.name() != y.name() || x.data_type() != y.data_type() {
                return Err(mismatch(format!(
                    "the file gives `{}: {}` where the dataset has `{}: {}`",
                    y.name(),
                    type_label(y.data_type()),
                    x.name(),
                    type_label(x.data_type())
                )));
            }
        }
        let (mine, theirs) = (
            self.schema.observation_shape(),
            existing.observation_shape(),
        );
        if mine.len() > 1 && mine != theirs {
            return Err(mismatch(format!(
                "observation shape {mine:?}, the dataset stores {theirs:?}"
            )));
        }
        self.schema = existing.clone();
        Ok(())
    }
}

fn type_label(dt: &DataType) -> String {
    format::type_name(dt).unwrap_or_else(|| dt.to_string())
}

// ---------------------------------------------------------------------------------------------
// Conversion of one decoded batch (runs on the rayon pool).
// ---------------------------------------------------------------------------------------------

/// One decoded and converted record batch.
struct Chunk {
    /// Input row of the chunk's first row.
    base: u64,
    /// Converted payload, in the dataset's payload schema.
    payload: RecordBatch,
    /// Episode ids as u64 bit patterns (episode-id mode).
    ids: Option<Vec<u64>>,
    terminated: Option<BooleanArray>,
    truncated: Option<BooleanArray>,
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| Error::SchemaMismatch(format!("decoded batch has no column `{name}`")))
}

fn null_at(name: &str, row: u64) -> Error {
    Error::InvalidData(format!("row {row}: column `{name}` is null"))
}

fn check_no_nulls(a: &dyn Array, name: &str, base: u64) -> Result<()> {
    if a.null_count() > 0
        && let Some(i) = (0..a.len()).find(|&i| a.is_null(i))
    {
        return Err(null_at(name, base + i as u64));
    }
    Ok(())
}

fn cast_to(a: &ArrayRef, dt: &DataType, name: &str) -> Result<ArrayRef> {
    if a.data_type() == dt {
        return Ok(a.clone());
    }
    let opts = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(a, dt, &opts)
        .map_err(|e| Error::InvalidData(format!("column `{name}`: cannot convert to {dt}: {e}")))
}

/// The values of `a` flattened to `width` per row (scalar, nested fixed-size list, or list of
/// exactly `width`), checking nulls and lengths and naming the input row of any problem.
fn flatten(a: &ArrayRef, name: &str, width: usize, base: u64) -> Result<ArrayRef> {
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
                    return Err(Error::InvalidData(format!(
                        "row {}: column `{name}` has a null list item",
                        base + (i / per_row) as u64
                    )));
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
        return Err(Error::InvalidData(format!(
            "column `{name}` has {} values for {rows} rows, expected {width} per row",
            values.len()
        )));
    }
    Ok(values)
}

fn list_values<O: OffsetSizeTrait>(
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
            return Err(Error::InvalidData(format!(
                "row {}: column `{name}` has a list of length {n}, expected {width} (the length of the \
                 first row; every row must have the same length)",
                base + i as u64
            )));
        }
    }
    let start = offsets[0].as_usize();
    let values = list
        .values()
        .slice(start, offsets[offsets.len() - 1].as_usize() - start);
    if values.null_count() > 0
        && let Some(i) = (0..values.len()).find(|&i| values.is_null(i))
    {
        return Err(Error::InvalidData(format!(
            "row {}: column `{name}` has a null list item",
            base + (i / width) as u64
        )));
    }
    Ok(values)
}

/// Concatenates per-row blocks of several primitive arrays: row r of the output is row r of
/// each part, in order.
fn interleave_typed<T: ArrowPrimitiveType>(parts: &[(ArrayRef, usize)], rows: usize) -> ArrayRef {
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

fn interleave_rows(parts: &[(ArrayRef, usize)], rows: usize, elem: &DataType) -> Result<ArrayRef> {
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
            return Err(Error::SchemaMismatch(format!(
                "cannot combine columns of type {other}"
            )));
        }
    })
}

fn convert_tensor(spec: &TensorSpec, batch: &RecordBatch, base: u64) -> Result<ArrayRef> {
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
fn convert_user(field: &Field, a: &ArrayRef, base: u64) -> Result<ArrayRef> {
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
                return Err(Error::InvalidData(format!(
                    "row {}: column `{name}` has a null list item",
                    base + (i / width) as u64
                )));
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

fn convert_flags(
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

fn convert(plan: &Plan, batch: &RecordBatch, base: u64) -> Result<Chunk> {
    let (ids, source_ids) = match &plan.episode {
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
    let payload_schema = plan.schema.payload_schema().clone();
    let mut columns = Vec::with_capacity(payload_schema.fields().len());
    for field in payload_schema.fields() {
        let array = match field.name().as_str() {
            col::OBSERVATION => convert_tensor(&plan.observation, batch, base)?,
            col::NEXT_OBSERVATION => match &plan.next_observation {
                Some(spec) => convert_tensor(spec, batch, base)?,
                None => convert_user(field, column(batch, col::NEXT_OBSERVATION)?, base)?,
            },
            col::ACTION => match &plan.action {
                ActionSpec::Discrete(name) => {
                    let a = column(batch, name)?;
                    check_no_nulls(a.as_ref(), name, base)?;
                    cast_to(a, &DataType::Int64, name)?
                }
                ActionSpec::Continuous(spec) => convert_tensor(spec, batch, base)?,
            },
            col::REWARD => match &plan.reward {
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
                _ => convert_user(field, column(batch, name)?, base)?,
            },
        };
        columns.push(array);
    }
    Ok(Chunk {
        base,
        payload: RecordBatch::try_new(payload_schema, columns)?,
        ids,
        terminated: convert_flags(batch, &plan.terminated, base)?,
        truncated: convert_flags(batch, &plan.truncated, base)?,
    })
}

// ---------------------------------------------------------------------------------------------
// Episode assembly (runs on the calling thread, in input order).
// ---------------------------------------------------------------------------------------------

struct Assembler<'a> {
    writer: &'a mut DatasetWriter,
    plan: &'a Plan,
    /// Converted rows of the episode in progress.
    pending: Vec<RecordBatch>,
    /// Episode-id mode: id of the episode in progress and ids of finished episodes.
    current: Option<u64>,
    finished: HashSet<u64>,
    /// Flags of the last row added to `pending`.
    last_terminated: bool,
    last_truncated: bool,
    episodes: u64,
    rows: u64,
}

impl<'a> Assembler<'a> {
    fn new(writer: &'a mut DatasetWriter, plan: &'a Plan) -> Self {
        Assembler {
            writer,
            plan,
            pending: vec![],
            current: None,
            finished: HashSet::new(),
            last_terminated: false,
            last_truncated: false,
            episodes: 0,
            rows: 0,
        }
    }

    fn show_id(&self, bits: u64) -> String {
        match &self.plan.episode {
            Some(e) if e.signed => (bits as i64).to_string(),
            _ => bits.to_string(),
        }
    }

    fn take(&mut self, chunk: &Chunk, from: usize, to: usize) {
        if to > from {
            self.pending.push(chunk.payload.slice(from, to - from));
        }
    }

    fn end_episode(&mut self, terminated: bool, truncated: bool) -> Result<()> {
        let batch = match self.pending.len() {
            0 => return Ok(()),
            1 => self.pending.pop().expect("one batch"),
            _ => concat_batches(self.plan.schema.payload_schema(), &self.pending)?,
        };
        self.pending.clear();
        let end = EpisodeEnd {
            terminated,
            truncated: truncated || !terminated,
            ..Default::default()
        };
        self.writer.append_episode(&batch, end)?;
        self.episodes += 1;
        Ok(())
    }

    fn push(&mut self, chunk: Chunk) -> Result<()> {
        let n = chunk.payload.num_rows();
        let flag = |a: &Option<BooleanArray>, i: usize| a.as_ref().is_some_and(|a| a.value(i));
        let mut from = 0;
        if let Some(ids) = &chunk.ids {
            for (i, &id) in ids.iter().enumerate() {
                let row = chunk.base + i as u64;
                match self.current {
                    Some(c) if c == id => {
                        if self.last_terminated {
                            let name = self.plan.terminated.as_deref().unwrap_or(col::TERMINATED);
                            return Err(Error::InvalidData(format!(
                                "row {}: `{name}` is set, but row {row} continues episode {}; a terminated \
                                 flag may only be set on the last row of an episode",
                                row - 1,
                                self.show_id(id)
                            )));
                        }
                    }
                    Some(c) => {
                        self.take(&chunk, from, i);
                        from = i;
                        self.end_episode(self.last_terminated, self.last_truncated)?;
                        self.finished.insert(c);
                        if self.finished.contains(&id) {
                            let name = &self.plan.episode.as_ref().expect("episode-id mode").name;
                            return Err(Error::InvalidData(format!(
                                "row {row}: episode id {} (column `{name}`) reappears after other episodes; \
                                 the rows of one episode must be contiguous (sort the file by episode, then step)",
                                self.show_id(id)
                            )));
                        }
                        self.current = Some(id);
                    }
                    None => self.current = Some(id),
                }
                self.last_terminated = flag(&chunk.terminated, i);
                self.last_truncated = flag(&chunk.truncated, i);
            }
        } else {
            for i in 0..n {
                let (t, tr) = (flag(&chunk.terminated, i), flag(&chunk.truncated, i));
                if t || tr {
                    self.take(&chunk, from, i + 1);
                    from = i + 1;
                    self.end_episode(t, tr)?;
                }
            }
            self.last_terminated = false;
            self.last_truncated = false;
        }
        self.take(&chunk, from, n);
        self.rows += n as u64;
        Ok(())
    }

    /// Ends the last episode: its last row's flags decide, and without a terminated flag it is
    /// truncated (end of data).
    fn finish(&mut self) -> Result<()> {
        self.end_episode(self.last_terminated, self.last_truncated)
    }
}

fn progress_bar(show: bool, total: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} {elapsed_precise} [{wide_bar}] {human_pos}/{human_len} rows, {per_sec}, ETA {eta}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// Reads and converts one unit.
fn decode_unit(
    source: &dyn Source,
    plan: &Plan,
    unit: usize,
    base: u64,
    batch_rows: usize,
) -> Result<Vec<Chunk>> {
    let mut row = base;
    let mut out = vec![];
    for batch in source.read(unit, &plan.projection, batch_rows)? {
        out.push(convert(plan, &batch, row)?);
        row += batch.num_rows() as u64;
    }
    Ok(out)
}

/// Decodes units (in parallel windows where the source allows) on a producer thread and
/// assembles episodes in order on this one. Returns (rows, episodes).
fn stream(
    source: &dyn Source,
    plan: &Plan,
    opts: &IngestOptions,
    writer: &mut DatasetWriter,
) -> Result<(u64, u64)> {
    let batch_rows = opts.batch_rows;
    let units = source.units(batch_rows);
    let total = units.last().map_or(0, |&(_, base, rows)| base + rows);
    let pb = progress_bar(opts.progress, total);
    let window = if source.parallel() {
        rayon::current_num_threads().max(1)
    } else {
        1
    };
    let mut asm = Assembler::new(writer, plan);
    let result = std::thread::scope(|s| -> Result<()> {
        let (tx, rx) = sync_channel::<Result<Vec<Chunk>>>(window);
        s.spawn(move || {
            for win in units.chunks(window) {
                let decoded: Vec<Result<Vec<Chunk>>> = win
                    .par_iter()
                    .map(|&(unit, base, _)| decode_unit(source, plan, unit, base, batch_rows))
                    .collect();
                for r in decoded {
                    let failed = r.is_err();
                    // A closed channel means the consumer stopped (on an error): stop decoding.
                    if tx.send(r).is_err() || failed {
                        return;
                    }
                }
            }
        });
        for group in rx {
            for chunk in group? {
                let n = chunk.payload.num_rows() as u64;
                asm.push(chunk)?;
                pb.inc(n);
            }
        }
        asm.finish()
    });
    match &result {
        Ok(()) => pb.finish_and_clear(),
        Err(_) => pb.abandon(),
    }
    result?;
    Ok((asm.rows, asm.episodes))
}
