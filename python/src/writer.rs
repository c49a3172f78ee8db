//! Writing from Python: `create` a dataset, append whole episodes (Arrow record batches that the
//! Python side builds from NumPy or torch arrays), commit; and `ingest` files like the CLI.

use std::path::PathBuf;
use std::sync::Mutex;

use arrow::array::{ArrayRef, RecordBatch};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use trajstore::format::parse_type;
use trajstore::ingest::{IngestOptions, InputFormat};
use trajstore::schema::tensor_field;
use trajstore::{Dataset, DatasetWriter, EpisodeEnd, TransitionSchema, WriterOptions};

use crate::arrow_io::{ArrowStream, import_batch};
use crate::errors::{IntoPyResult, argument};

/// Creates the dataset at `path` with this schema (observation `observation_shape` of
/// `observation_dtype`; a continuous action of `action_shape` or a discrete `int64` action when
/// `action_shape` is None; `next_observation` stored or derived; extra per-step columns
/// `{name: (dtype, shape)}`), or opens it for appending when `append` and it exists (the schemas
/// must match). Returns its writer, which holds the dataset's lock.
#[pyfunction]
#[pyo3(signature = (path, observation_shape, action_shape=None, *, observation_dtype="float32", store_next_observation=false, columns=None, append=false, segment_bytes=None, lock_wait_ms=None, frame_codec=None, frame_level=None))]
#[allow(clippy::too_many_arguments)]
pub fn create(
    py: Python<'_>,
    path: PathBuf,
    observation_shape: Vec<usize>,
    action_shape: Option<Vec<usize>>,
    observation_dtype: &str,
    store_next_observation: bool,
    columns: Option<Vec<(String, String, Vec<usize>)>>,
    append: bool,
    segment_bytes: Option<u64>,
    lock_wait_ms: Option<u64>,
    frame_codec: Option<String>,
    frame_level: Option<i32>,
) -> PyResult<Writer> {
    if frame_level.is_some() && frame_codec.is_none() {
        return Err(argument(
            "frame_level",
            "frame_level is the zstd level of a frame column: give frame_codec too",
        ));
    }
    let obs_dt = parse_type(observation_dtype).py()?;
    let mut b =
        TransitionSchema::builder(&observation_shape, 0).observation(obs_dt, &observation_shape);
    if let Some(codec) = frame_codec {
        let codec: trajstore::frames::FrameCodec = codec.parse().py()?;
        if observation_dtype != "uint8" || !(2..=3).contains(&observation_shape.len()) {
            return Err(argument(
                "frame_codec",
                format!(
                    "frames are uint8 images [H, W] or [H, W, C]: observation_dtype=\"uint8\" \
                     and a shape of 2 or 3 axes (got {observation_dtype} {observation_shape:?})"
                ),
            ));
        }
        if store_next_observation {
            return Err(argument(
                "store_next_observation",
                "a frame column never stores next_observation: the next frame is the next \
                 step's, and each episode's final frame is kept",
            ));
        }
        b = b.frames(codec, &observation_shape);
        if let Some(level) = frame_level {
            trajstore::frames::check_level(level).py()?;
            b = b.frame_level(level);
        }
    }
    b = match action_shape.as_deref() {
        None => b.discrete_action(),
        Some([n]) => b.continuous_action(*n),
        Some([]) => b.continuous_action(1),
        Some(other) => {
            return Err(argument(
                "action_shape",
                format!("actions are vectors: action_shape must be (n,), got {other:?}"),
            ));
        }
    };
    b = b.next_observation(store_next_observation);
    for (name, dtype, shape) in columns.unwrap_or_default() {
        let dt = parse_type(&dtype).py()?;
        let field = if shape.is_empty() {
            arrow::datatypes::Field::new(&name, dt, false)
        } else {
            tensor_field(&name, dt, &shape, false).py()?
        };
        b = b.column(field);
    }
    let schema = b.build().py()?;
    let mut opts = WriterOptions::default();
    if let Some(n) = segment_bytes {
        opts = opts.with_segment_bytes(n);
    }
    if let Some(ms) = lock_wait_ms {
        opts = opts.with_lock_wait(std::time::Duration::from_millis(ms));
    }
    let writer = py
        .detach(|| -> trajstore::Result<DatasetWriter> {
            let exists = trajstore::store::manifest::versions_dir(&path).is_dir();
            let ds = if exists {
                if !append {
                    return Err(trajstore::Error::argument(
                        "path",
                        format!(
                            "{} is already a dataset: pass append=True to add episodes to it",
                            path.display()
                        ),
                    ));
                }
                let ds = Dataset::open(&path)?;
                ds.latest_manifest()?;
                ds
            } else {
                Dataset::create(&path, &schema)?
            };
            let w = ds.writer(opts)?;
            w.schema().check_same(schema.arrow_schema())?;
            Ok(w)
        })
        .py()?;
    Ok(Writer::new(writer))
}

/// Opens the existing dataset at `path` for appending.
pub(crate) fn open_writer(path: &PathBuf, opts: WriterOptions) -> trajstore::Result<DatasetWriter> {
    Dataset::open(path)?.writer(opts)
}

/// The single writer of a dataset (holds its lock until `close`).
#[pyclass(frozen, module = "trajstore._native")]
pub struct Writer {
    inner: Mutex<Option<DatasetWriter>>,
}

impl Writer {
    fn new(w: DatasetWriter) -> Self {
        Self {
            inner: Mutex::new(Some(w)),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut DatasetWriter) -> trajstore::Result<T>) -> PyResult<T> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let w = g
            .as_mut()
            .ok_or_else(|| argument("writer", "the writer is closed"))?;
        f(w).py()
    }
}

#[pymethods]
impl Writer {
    /// Opens the existing dataset at `path` for appending.
    #[staticmethod]
    #[pyo3(signature = (path, lock_wait_ms=None))]
    fn open(py: Python<'_>, path: PathBuf, lock_wait_ms: Option<u64>) -> PyResult<Self> {
        let mut opts = WriterOptions::default();
        if let Some(ms) = lock_wait_ms {
            opts = opts.with_lock_wait(std::time::Duration::from_millis(ms));
        }
        Ok(Self::new(py.detach(|| open_writer(&path, opts)).py()?))
    }

    /// The payload schema episodes are appended in (`pyarrow.schema(...)` of the returned
    /// stream): observation, action, reward, [next_observation], user columns.
    fn payload_schema(&self) -> PyResult<ArrowStream> {
        self.with(|w| Ok(ArrowStream::new(w.schema().input_schema().clone(), vec![])))
    }

    /// The id the next appended episode gets.
    fn next_episode_id(&self) -> PyResult<u64> {
        self.with(|w| Ok(w.next_episode_id()))
    }

    /// The version the writer started from.
    fn base_version(&self) -> PyResult<u64> {
        self.with(|w| Ok(w.base_version()))
    }

    /// Appends one episode: `batch` (a record batch of the payload columns, one row per step),
    /// how it ended, and its final observation (a one-row batch with an `observation` column,
    /// kept when next_observation is derived). Not durable before `commit`. Returns its id.
    #[pyo3(signature = (batch, terminated, truncated, final_observation=None))]
    fn append_episode(
        &self,
        py: Python<'_>,
        batch: &Bound<'_, PyAny>,
        terminated: bool,
        truncated: bool,
        final_observation: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let batch = import_batch(batch)?;
        let final_obs: Option<ArrayRef> = match final_observation {
            None => None,
            Some(f) => {
                let b = import_batch(f)?;
                Some(b.column_by_name("observation").cloned().ok_or_else(|| {
                    argument(
                        "final_observation",
                        "expected a batch with an `observation` column",
                    )
                })?)
            }
        };
        py.detach(|| {
            self.with(|w| {
                let schema = w.schema().input_schema().clone();
                // The columns in the dataset's order and with its field metadata.
                let columns = schema
                    .fields()
                    .iter()
                    .map(|f| {
                        let c = batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                            trajstore::Error::argument(
                                "episode",
                                format!("the episode has no `{}` column", f.name()),
                            )
                        })?;
                        Ok(conform(c, f.data_type()))
                    })
                    .collect::<trajstore::Result<Vec<_>>>()?;
                if let Some(extra) = batch
                    .schema()
                    .fields()
                    .iter()
                    .find(|f| schema.field_with_name(f.name()).is_err())
                {
                    return Err(trajstore::Error::argument(
                        "episode",
                        format!("the dataset has no column `{}`", extra.name()),
                    ));
                }
                let batch = RecordBatch::try_new(schema, columns).map_err(|e| {
                    trajstore::Error::argument(
                        "episode",
                        format!("columns do not fit the dataset's schema: {e}"),
                    )
                })?;
                let mut end = EpisodeEnd {
                    terminated,
                    truncated,
                    ..EpisodeEnd::default()
                };
                if let Some(f) = final_obs {
                    end = end.with_final_observation(f);
                }
                w.append_episode(&batch, end)
            })
        })
    }

    /// Sets a dataset property (saved with the next commit).
    fn set_property(&self, key: String, value: String) -> PyResult<()> {
        self.with(|w| {
            w.set_property(key, value);
            Ok(())
        })
    }

    /// Makes everything appended so far durable and visible as a new version (atomically).
    /// Returns the version.
    fn commit(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.with(|w| w.commit()))
    }

    /// Releases the lock without committing (appended, uncommitted episodes are discarded).
    fn close(&self) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }
}

/// Ingests `input` into the dataset at `dataset` (created, or appended to), as `trajstore
/// ingest` does; `options` holds the column mapping. Returns the report as JSON.
#[pyfunction]
#[pyo3(signature = (input, dataset, options=None))]
pub fn ingest(
    py: Python<'_>,
    input: PathBuf,
    dataset: PathBuf,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let mut o = IngestOptions::default();
    let mut dqn = trajstore::ingest::DqnOptions::default();
    let mut format: Option<String> = None;
    let mut wopts = WriterOptions::default();
    let mut keep_tensor = false;
    let mut rlds = trajstore::ingest::RldsOptions::default();
    // Options that name input columns: not for RLDS, whose steps say what they are.
    let mut mapped: Vec<String> = vec![];
    if let Some(d) = options {
        for (k, v) in d.iter() {
            if v.is_none() {
                continue;
            }
            let key: String = k.extract()?;
            if !matches!(
                key.as_str(),
                "format"
                    | "observation_col"
                    | "drop_cols"
                    | "batch_rows"
                    | "segment_bytes"
                    | "frame_codec"
                    | "frame_level"
                    | "keep_tensor"
                    | "splits"
            ) {
                mapped.push(key.clone());
            }
            let s = || v.extract::<String>();
            let list = || v.extract::<Vec<String>>();
            match key.as_str() {
                "format" => format = Some(s()?),
                "episode_col" => o.episode_col = Some(s()?),
                "terminated_col" => o.terminated_col = Some(s()?),
                "truncated_col" => o.truncated_col = Some(s()?),
                "observation_col" => {
                    o.observation_col = s()?;
                    rlds.observation = Some(o.observation_col.clone());
                }
                "observation_cols" => o.observation_cols = list()?,
                "action_col" => o.action_col = s()?,
                "action_cols" => o.action_cols = list()?,
                "reward_col" => o.reward_col = s()?,
                "no_reward" => o.no_reward = v.extract()?,
                "next_observation_col" => o.next_observation_col = Some(s()?),
                "drop_cols" => {
                    o.drop_cols = list()?;
                    rlds.drop.clone_from(&o.drop_cols);
                }
                "batch_rows" => o.batch_rows = v.extract()?,
                "segment_bytes" => wopts = wopts.with_segment_bytes(v.extract()?),
                "frame_codec" => {
                    let codec: trajstore::frames::FrameCodec = s()?.parse().py()?;
                    o.frame_codec = Some(codec);
                    dqn.frame_codec = codec;
                }
                "frame_level" => {
                    let level: i32 = v.extract()?;
                    (o.frame_level, dqn.frame_level) = (Some(level), Some(level));
                }
                "keep_tensor" => keep_tensor = v.extract()?,
                "unstack" => o.unstack = Some(v.extract()?),
                "stack_size" => dqn.stack_size = v.extract()?,
                "checkpoints" => dqn.checkpoints = Some(v.extract()?),
                "convention" => o.convention = Some(s()?.parse().py()?),
                "splits" => rlds.splits = Some(list()?),
                other => {
                    return Err(argument(other, format!("unknown ingest option `{other}`")));
                }
            }
        }
    }
    if keep_tensor {
        o.frame_codec = None;
    }
    let is_dqn = match format.as_deref() {
        Some("dqn") => true,
        None => trajstore::ingest::is_dqn(&input),
        Some(_) => false,
    };
    if is_dqn {
        if keep_tensor || o.unstack.is_some() {
            return Err(argument(
                if keep_tensor {
                    "keep_tensor"
                } else {
                    "unstack"
                },
                "DQN Replay frames are single frames stored as a frame column \
                 (their stack size is stack_size)",
            ));
        }
        let r = py
            .detach(|| trajstore::ingest::ingest_dqn(&input, &dataset, &dqn, wopts))
            .py()?;
        return Ok(serde_json::json!({
            "rows": r.rows, "episodes": r.episodes, "version": r.version, "seconds": r.seconds,
            "checkpoints": r.checkpoints, "padding": r.padding, "skipped": r.skipped,
            "overlap": r.overlap,
        })
        .to_string());
    }
    let is_rlds = match format.as_deref() {
        Some("rlds") => true,
        None => trajstore::ingest::is_rlds(&input),
        Some(_) => false,
    };
    if is_rlds {
        if let Some(key) = mapped.first() {
            return Err(argument(
                key,
                format!(
                    "`{key}`: an RLDS dataset's episodes, flags, action and reward are its steps' \
                     own (observation_col, drop_cols, splits, frame_codec, frame_level and keep_tensor \
                     apply)"
                ),
            ));
        }
        rlds.frame_codec = o.frame_codec;
        rlds.frame_level = o.frame_level;
        let r = py
            .detach(|| trajstore::ingest::ingest_rlds(&input, &dataset, &rlds, wopts))
            .py()?;
        return Ok(r.to_json().to_string());
    }
    if rlds.splits.is_some() {
        return Err(argument("splits", "splits are RLDS datasets' only"));
    }
    if dqn.checkpoints.is_some() {
        return Err(argument("checkpoints", "checkpoints are DQN Replay's only"));
    }
    let format = match format.as_deref() {
        None => InputFormat::detect(&input).py()?,
        Some("parquet") => InputFormat::Parquet,
        Some("numpy" | "npz" | "npy") => InputFormat::Numpy,
        Some("torchrl") => InputFormat::TorchRl,
        Some("hdf5" | "d4rl" | "minari") => InputFormat::Hdf5,
        Some("arrow" | "ipc" | "feather") => InputFormat::Arrow,
        Some(other) => {
            return Err(argument(
                "format",
                format!(
                    "unknown format `{other}`: use parquet, numpy, hdf5, arrow, torchrl, dqn or rlds"
                ),
            ));
        }
    };
    let report = py
        .detach(|| trajstore::ingest::ingest(&input, format, &dataset, &o, wopts))
        .py()?;
    Ok(report.to_json().to_string())
}

/// `array` with the list child field of `want` when only the child's name or nullability
/// differs (pyarrow names list children `item`, nullable); anything else is left for the schema
/// check to report.
fn conform(array: ArrayRef, want: &arrow::datatypes::DataType) -> ArrayRef {
    use arrow::array::{Array, AsArray, FixedSizeListArray};
    use arrow::datatypes::DataType;
    match (array.data_type(), want) {
        (DataType::FixedSizeList(have, n), DataType::FixedSizeList(child, m))
            if n == m && have.data_type() == child.data_type() && have != child =>
        {
            let list = array.as_fixed_size_list();
            if list.values().null_count() > 0 && !child.is_nullable() {
                return array;
            }
            FixedSizeListArray::try_new(
                child.clone(),
                *m,
                list.values().clone(),
                list.nulls().cloned(),
            )
            .map(|a| std::sync::Arc::new(a) as ArrayRef)
            .unwrap_or(array)
        }
        _ => array,
    }
}
