//! `Plan`: what the loaders of one Python `Loader` draw batches from: a `BatchSource` over one
//! dataset or a mix of several (each with its sampler, weight and whether it follows new
//! versions), opened at the versions of a resumed state when given, with the gathered columns'
//! tensor types and the loaders' options. Loaders made from it one after the other (each
//! iteration, each restart at another batch) share its follow thread, priorities and indexes.

use std::str::FromStr;
use std::sync::Arc;

use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use trajstore::sql::SnapshotSql;
use trajstore::{
    BatchSource, BoundaryPolicy, Follow, FrameStack, Loader, LoaderOptions, LoaderSpec,
    LoaderState, PrioritizedSampler, ReadAhead, SamplerKind, SamplerSpec, SliceRef, Snapshot,
    StackPad, Weighting,
};

use crate::dataset::PySnapshot;
use crate::dlpack::DlType;
use crate::errors::{IntoPyResult, argument, size};

/// A gathered column: name, element type, per-step shape.
pub(crate) struct Column {
    pub(crate) name: String,
    pub(crate) dtype: DlType,
    pub(crate) shape: Vec<i64>,
    pub(crate) step_bytes: usize,
    /// Rows before each slice's step 0: `K - 1` for a frame window (`[B, L + K - 1,
    /// ...frame]`), else 0.
    pub(crate) lead: usize,
}

impl Column {
    /// Bytes of one slice of this column in a batch of `l` steps.
    pub(crate) fn slice_bytes(&self, l: usize) -> usize {
        trajstore::gather::slice_bytes(self.step_bytes, self.lead, l)
    }
}

/// The options of every part of a plan (`PlanOptions` in `python/trajstore/_types.py`): every
/// key is given by the Python package (whose `Snapshot.loader` signature holds the defaults), so
/// a missing key is an error, never a default.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct LoaderArgs {
    slice_len: u32,
    num_slices: usize,
    columns: Vec<String>,
    workers: usize,
    prefetch: usize,
    rank: u64,
    world_size: u64,
    #[pyo3(from_py_with = read_ahead)]
    readahead: ReadAhead,
    #[pyo3(from_py_with = parsed::<SamplerKind>)]
    sampler: SamplerKind,
    #[pyo3(from_py_with = parsed::<BoundaryPolicy>)]
    policy: BoundaryPolicy,
    #[pyo3(from_py_with = parsed::<Weighting>)]
    weighting: Weighting,
    seed: u64,
    alpha: f64,
    drop_last: bool,
    episode_ids: Option<Vec<u64>>,
    episodes_sql: Option<String>,
    frame_stack: Option<usize>,
    #[pyo3(from_py_with = parsed::<StackPad>)]
    frame_pad: StackPad,
    frame_channels_last: bool,
    frame_window: bool,
    #[pyo3(from_py_with = frame_cache)]
    frame_cache: u64,
}

impl LoaderArgs {
    /// The `frame_stack`, `frame_pad`, `frame_channels_last` and `frame_window` options as a
    /// [`FrameStack`].
    fn frame_stack(&self) -> PyResult<Option<FrameStack>> {
        let stack = match (self.frame_stack, self.frame_cache) {
            (None, 0) => return Ok(None),
            // A cache without a stack: one frame per step, `[H, W]`.
            (None, _) => FrameStack::unstacked(),
            (Some(k), _) => FrameStack::new(k)
                .py()?
                .with_pad(self.frame_pad)
                .with_channels_last(self.frame_channels_last)
                .with_window(self.frame_window),
        };
        Ok(Some(stack.with_cache(self.frame_cache)))
    }
}

/// One dataset's options (`PartOptions` in `python/trajstore/_types.py`): its weight and how it
/// follows new versions (keys always given, None where it does not follow), and, where given and
/// not None, sampler options overriding the loader's ([`LoaderArgs`]); its seed is otherwise the
/// loader's `seed + i`.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct PartArgs {
    weight: f64,
    follow_every: Option<f64>,
    follow_every_batches: Option<u64>,
    #[pyo3(default, from_py_with = parsed_opt::<SamplerKind>)]
    sampler: Option<SamplerKind>,
    #[pyo3(default, from_py_with = parsed_opt::<BoundaryPolicy>)]
    policy: Option<BoundaryPolicy>,
    #[pyo3(default, from_py_with = parsed_opt::<Weighting>)]
    weighting: Option<Weighting>,
    #[pyo3(default)]
    seed: Option<u64>,
    #[pyo3(default)]
    alpha: Option<f64>,
    #[pyo3(default)]
    drop_last: Option<bool>,
    #[pyo3(default)]
    episode_ids: Option<Vec<u64>>,
    #[pyo3(default)]
    episodes_sql: Option<String>,
}

/// A string option parsed by trajstore (its error names the option and what it takes).
fn parsed<T: FromStr<Err = trajstore::Error>>(v: &Bound<'_, PyAny>) -> PyResult<T> {
    v.extract::<String>()?.parse::<T>().py()
}

/// [`parsed`], None as None.
fn parsed_opt<T: FromStr<Err = trajstore::Error>>(v: &Bound<'_, PyAny>) -> PyResult<Option<T>> {
    if v.is_none() {
        return Ok(None);
    }
    parsed(v).map(Some)
}

/// The `frame_cache` option: None (0: no cache), bytes, or a size such as "2GiB".
fn frame_cache(v: &Bound<'_, PyAny>) -> PyResult<u64> {
    if v.is_none() {
        return Ok(0);
    }
    size(v).ok_or_else(|| {
        argument(
            "frame_cache",
            format!("frame_cache={v}: bytes, or a size as a string such as \"2GiB\""),
        )
    })
}

/// The `readahead` option: "auto", "always", "never" (or "on", "off"), or a bool (True: always).
fn read_ahead(v: &Bound<'_, PyAny>) -> PyResult<ReadAhead> {
    match v.extract::<bool>() {
        Ok(true) => Ok(ReadAhead::Always),
        Ok(false) => Ok(ReadAhead::Never),
        Err(_) => parsed(v),
    }
}

/// `options` as a `T`: a missing key is a `KeyError` (the Python package gives every key); a
/// value of the wrong type an `InvalidArgumentError` naming the option and the value.
fn extract_args<'py, T>(options: &Bound<'py, PyAny>) -> PyResult<T>
where
    T: for<'a> FromPyObject<'a, 'py, Error = PyErr>,
{
    options.extract::<T>().map_err(|e| {
        let py = options.py();
        if e.is_instance_of::<PyKeyError>(py) {
            return e;
        }
        let Some(cause) = e.cause(py) else {
            return e;
        };
        // An error of trajstore's own (an option it parsed) says it all.
        let ours = py
            .import("trajstore.errors")
            .and_then(|m| m.getattr("TrajstoreError"))
            .and_then(|c| cause.value(py).is_instance(&c))
            .unwrap_or(false);
        if ours {
            return cause;
        }
        // "failed to extract field LoaderArgs.seed"
        let text = e.value(py).to_string();
        let key = text.rsplit('.').next().unwrap_or("options");
        let value = options
            .get_item(key)
            .and_then(|v| v.repr())
            .map(|r| r.to_string())
            .unwrap_or_default();
        argument(key, format!("{key}={value}: {cause}"))
    })
}

/// One dataset's options, its dict's overriding the loader's.
struct PartOpts {
    snap: Snapshot,
    kind: SamplerKind,
    policy: BoundaryPolicy,
    weighting: Weighting,
    seed: u64,
    alpha: f64,
    drop_last: bool,
    episode_ids: Option<Vec<u64>>,
    episodes_sql: Option<String>,
    weight: f64,
    follow: Option<Follow>,
}

impl PartOpts {
    /// Part `i`'s options: its dict's where given, else the loader's; its seed is the loader's
    /// `seed + i` unless its dict gives one.
    fn new(i: usize, snap: Snapshot, part: PartArgs, common: &LoaderArgs) -> PyResult<Self> {
        if part.follow_every_batches == Some(0) {
            return Err(argument("follow", "follow every 0 batches: at least 1"));
        }
        let follow = match (part.follow_every, part.follow_every_batches) {
            (None, None) => None,
            (None, Some(n)) => Some(Follow::every_batches(n)),
            (Some(s), n) => {
                let mut f = Follow::every_secs("follow", s).py()?;
                f.every_batches = n;
                Some(f)
            }
        };
        Ok(Self {
            snap,
            kind: part.sampler.unwrap_or(common.sampler),
            policy: part.policy.unwrap_or(common.policy),
            weighting: part.weighting.unwrap_or(common.weighting),
            seed: part
                .seed
                .unwrap_or_else(|| common.seed.wrapping_add(i as u64)),
            alpha: part.alpha.unwrap_or(common.alpha),
            drop_last: part.drop_last.unwrap_or(common.drop_last),
            episode_ids: part.episode_ids.or_else(|| common.episode_ids.clone()),
            episodes_sql: part.episodes_sql.or_else(|| common.episodes_sql.clone()),
            weight: part.weight,
            follow,
        })
    }

    /// The sampler spec, the episode query answered on the part's snapshot.
    fn spec(self, slice_len: u32, num_slices: usize) -> trajstore::Result<SamplerSpec> {
        let ids = match (self.episode_ids, self.episodes_sql) {
            (Some(_), Some(_)) => {
                return Err(trajstore::Error::argument(
                    "episodes",
                    "give episode ids or a query, not both",
                ));
            }
            (Some(ids), None) => Some(ids),
            (None, Some(q)) => Some(self.snap.episodes_where(&q)?),
            (None, None) => None,
        };
        if ids.is_some() && self.follow.is_some() {
            return Err(trajstore::Error::argument(
                "follow",
                "a loader that follows a dataset samples its new episodes too: leave out \
                 episodes= (a subset would not grow with the dataset)",
            ));
        }
        let mut s = SamplerSpec::new(self.kind, slice_len, num_slices)
            .with_seed(self.seed)
            .with_policy(self.policy)
            .with_weighting(self.weighting)
            .with_alpha(self.alpha)
            .with_drop_last(self.drop_last);
        if let Some(ids) = ids {
            s = s.with_episode_ids(ids);
        }
        Ok(s)
    }
}

/// A loader state from Python: its JSON header and each part's priorities.
fn read_state(
    py: Python<'_>,
    json: &str,
    priorities: Option<Vec<Option<Py<PyBytes>>>>,
) -> PyResult<LoaderState> {
    let mut s = LoaderState::from_json(json).py()?;
    if let Some(p) = priorities {
        if p.len() != s.parts.len() {
            return Err(argument(
                "state",
                format!(
                    "a damaged loader state: {} priorities entries for {} part(s)",
                    p.len(),
                    s.parts.len()
                ),
            ));
        }
        for (part, b) in s.parts.iter_mut().zip(p) {
            part.priorities = b.map(|b| Arc::new(b.bind(py).as_bytes().to_vec()));
        }
    }
    Ok(s)
}

/// What the loaders of one Python `Loader` draw from (see the module docs). Priorities set here
/// persist across the loaders made from it.
#[pyclass(frozen, module = "trajstore._native")]
pub struct Plan {
    pub(crate) source: BatchSource,
    pub(crate) columns: Vec<Column>,
    opts: LoaderOptions,
    num_slices: usize,
    slice_len: usize,
    per_epoch: Option<u64>,
    parts: usize,
}

#[pymethods]
impl Plan {
    /// `parts`: `(dataset, options)` per dataset ([`PartArgs`]: `weight`, `follow_every`
    /// seconds, `follow_every_batches`, and sampler options overriding the loader's; its seed
    /// is otherwise `options["seed"] + i`). `options`: the loader's ([`LoaderArgs`]:
    /// slice_len, num_slices, columns, workers, prefetch, rank, world_size, readahead, and
    /// sampler options for every part), every key given. `state`, `priorities`: a loader state to resume (its JSON header and each part's
    /// priorities): the plan is opened at the state's versions, and refuses a state of another
    /// dataset, rank or sampler. Every bad argument fails here, before any batch is sampled.
    #[new]
    #[pyo3(signature = (parts, options, state=None, priorities=None))]
    fn new(
        py: Python<'_>,
        parts: Vec<(Py<PySnapshot>, Bound<'_, PyDict>)>,
        options: &Bound<'_, PyDict>,
        state: Option<String>,
        priorities: Option<Vec<Option<Py<PyBytes>>>>,
    ) -> PyResult<Self> {
        let common: LoaderArgs = extract_args(options.as_any())?;
        // Where a stream starts and how long it runs are the loaders' (`Plan::options`).
        let opts = LoaderOptions::default()
            .with_workers(common.workers)
            .with_prefetch(common.prefetch);
        let parts = parts
            .iter()
            .enumerate()
            .map(|(i, (ds, d))| {
                let part: PartArgs = extract_args(d.as_any())?;
                PartOpts::new(i, ds.get().snapshot(), part, &common)
            })
            .collect::<PyResult<Vec<_>>>()?;
        let resume = match state {
            Some(json) => Some(read_state(py, &json, priorities)?),
            None => None,
        };
        let frame_stack = common.frame_stack()?;
        let (columns, slice_len, num_slices) =
            (common.columns, common.slice_len, common.num_slices);
        let source = Source {
            rank: (common.rank, common.world_size),
            read_ahead: common.readahead,
            frame_stack,
            resume,
        };
        py.detach(move || Self::open(parts, columns, slice_len, num_slices, opts, source))
            .py()
    }

    /// A plan that streams `streams` (datasets in object storage, `open_stream`, each with its
    /// weight) through their bounded caches: `options` as for `Plan(...)` ([`LoaderArgs`]); the
    /// sampler is uniform or epoch (an episode subset, by ids or SQL, with uniform only). With
    /// one stream and `follow`, loaders move to newer versions at round boundaries (by
    /// themselves, one rank; or `by_caller`, stopping at every round boundary for the caller to
    /// set the version). Several streams are a mix: each gives its share of every batch, sampled
    /// uniformly with the seed `seed + i` (a SQL subset answered by each; no following).
    #[staticmethod]
    #[pyo3(signature = (streams, options, follow=false, by_caller=false))]
    fn streamed(
        py: Python<'_>,
        streams: Vec<(Py<crate::stream::PyStream>, f64)>,
        options: &Bound<'_, PyDict>,
        follow: bool,
        by_caller: bool,
    ) -> PyResult<Self> {
        let a: LoaderArgs = extract_args(options.as_any())?;
        let opts = LoaderOptions::default()
            .with_workers(a.workers)
            .with_prefetch(a.prefetch);
        if streams.is_empty() {
            return Err(crate::errors::argument("streams", "no stream to read"));
        }
        if streams.len() > 1 && a.episode_ids.is_some() {
            return Err(crate::errors::argument(
                "episodes",
                "episode ids in a mix of streams: give a SQL query (each stream answers it)",
            ));
        }
        let streams: Vec<(trajstore::remote::Stream, f64)> = streams
            .iter()
            .map(|(s, w)| (s.get().stream.clone(), *w))
            .collect();
        let frame_stack = a.frame_stack()?;
        let (slice_len, num_slices) = (a.slice_len as usize, a.num_slices);
        let parts = streams.len();
        py.detach(move || -> trajstore::Result<Self> {
            let names: Vec<&str> = a.columns.iter().map(String::as_str).collect();
            let mut l = LoaderSpec::new(&names)
                .with_rank(a.rank, a.world_size)
                .with_num_slices(num_slices);
            for (i, (stream, weight)) in streams.into_iter().enumerate() {
                let spec = SamplerSpec::new(a.sampler, a.slice_len, a.num_slices)
                    .with_seed(a.seed.wrapping_add(i as u64))
                    .with_policy(a.policy)
                    .with_weighting(a.weighting)
                    .with_alpha(a.alpha)
                    .with_drop_last(a.drop_last);
                // A subset by ids, or by a SQL query over the catalog (and ranged reads of
                // `transitions`): the stream downloads only the segments that hold its episodes.
                let ids = match (&a.episode_ids, &a.episodes_sql) {
                    (Some(ids), _) => Some(ids.clone()),
                    (None, Some(q)) => Some(trajstore::sql::StreamSql::episodes_where(&stream, q)?),
                    (None, None) => None,
                };
                let spec = match ids {
                    Some(ids) => spec.with_episode_ids(ids),
                    None => spec,
                };
                l = l.stream_part(stream, spec, weight);
            }
            if follow && by_caller {
                l = l.follow_by_caller();
            } else if follow {
                l = l.follow(trajstore::Follow::default());
            }
            if let Some(st) = frame_stack {
                l = l.with_frame_stack(st);
            }
            let source = BatchSource::open(l)?;
            Ok(Self {
                columns: describe(&source)?,
                opts,
                num_slices,
                slice_len,
                per_epoch: None,
                parts,
                source,
            })
        })
        .py()
    }

    /// A streamed plan's version now and the batch number where it began (they move when a
    /// following stream takes a newer version); None for local datasets.
    fn stream_cursor(&self) -> Option<(u64, u64)> {
        self.source.stream_cursor()
    }

    /// Puts a following streamed plan back at `version`, begun at batch `base` (a restart).
    fn set_stream_cursor(&self, py: Python<'_>, version: u64, base: u64) -> PyResult<()> {
        py.detach(|| self.source.set_stream_cursor(version, base))
            .py()
    }

    /// Whether the plan streams a dataset from object storage.
    #[getter]
    fn streamed_source(&self) -> bool {
        self.source.is_streamed()
    }

    /// `(name, dtype, per-step shape)` of each gathered column, in batch order.
    fn columns(&self) -> Vec<(String, String, Vec<i64>)> {
        self.columns
            .iter()
            .map(|c| (c.name.clone(), c.dtype.name(), c.shape.clone()))
            .collect()
    }
    /// Per column of `columns()`, whether a staging slot may hold it as one row per slice (a
    /// `next_observation` derived from the gathered observation; `SlotLoader(tails=...)`),
    /// derived on the device.
    fn tail_columns(&self) -> Vec<bool> {
        self.source.tail_columns()
    }
    /// Per column of `columns()`, the rows before each slice's step 0: `K - 1` for a frame
    /// window, whose slot region holds `[B, L + K - 1, ...frame]` (the `[B, L, K, ...frame]`
    /// stacks are a view of it), else 0.
    fn leads(&self) -> Vec<usize> {
        self.columns.iter().map(|c| c.lead).collect()
    }
    #[getter]
    fn num_slices(&self) -> usize {
        self.num_slices
    }
    #[getter]
    fn slice_len(&self) -> usize {
        self.slice_len
    }
    /// The number of datasets.
    #[getter]
    fn num_parts(&self) -> usize {
        self.parts
    }
    /// Batches per epoch of an epoch sampler (all ranks together), else None.
    #[getter]
    fn batches_per_epoch(&self) -> Option<u64> {
        self.per_epoch
    }
    /// The state of a loader whose next batch is `position`: its JSON header, and each part's
    /// priorities (bytes, None where the sampler is not prioritized).
    fn state(&self, py: Python<'_>, position: u64) -> PyResult<(String, Vec<Option<Py<PyBytes>>>)> {
        let s = py.detach(|| self.source.state(position)).py()?;
        let prios = s
            .parts
            .iter()
            .map(|p| p.priorities.as_ref().map(|b| PyBytes::new(py, b).unbind()))
            .collect();
        Ok((s.to_json(), prios))
    }
    /// The versions batch `position` is planned from, one per dataset.
    fn versions(&self, position: u64) -> Vec<u64> {
        self.source.versions(position)
    }
    /// The dataset (part index) of each slice position of every batch.
    fn slice_sources(&self) -> Vec<u16> {
        self.source.slice_sources()
    }
    /// What following new versions has done: refreshes, failures, last_error.
    fn follow_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.source.follow_stats();
        let d = PyDict::new(py);
        d.set_item("refreshes", s.refreshes)?;
        d.set_item("failures", s.failures)?;
        d.set_item("last_error", s.last_error)?;
        Ok(d)
    }
    /// Sets the priorities of the slices given by episode ids and start steps (the
    /// `episode_id` and `start_step` of a batch).
    fn update_priorities(
        &self,
        py: Python<'_>,
        episode_id: Vec<u64>,
        start_step: Vec<i64>,
        priorities: Vec<f64>,
    ) -> PyResult<()> {
        let (p, windows) = self.windows(&episode_id, &start_step)?;
        py.detach(|| p.update_priorities(&windows, &priorities))
            .py()
    }
    /// Importance-sampling weights of the slices (prioritized sampler).
    fn importance_weights(
        &self,
        episode_id: Vec<u64>,
        start_step: Vec<i64>,
        beta: f64,
    ) -> PyResult<Vec<f64>> {
        let (p, windows) = self.windows(&episode_id, &start_step)?;
        let mut out = Vec::new();
        p.importance_weights(&windows, beta, &mut out);
        Ok(out)
    }
    /// Benchmark hook: runs the Rust loader alone (no Python objects per batch) over batches
    /// `start .. start + count`, recycling each batch, and returns the seconds it took; the
    /// baseline the Python loader's overhead is measured against, in the same process.
    fn time_rust_loader(&self, py: Python<'_>, start: u64, count: u64) -> PyResult<f64> {
        let opts = self.options(start, Some(count));
        py.detach(|| -> trajstore::Result<f64> {
            let t = std::time::Instant::now();
            let mut loader = Loader::new(&self.source, opts)?;
            while let Some(b) = loader.next_batch() {
                std::hint::black_box(&b);
                loader.recycle(b);
            }
            Ok(t.elapsed().as_secs_f64())
        })
        .py()
    }
}

/// What the source of a plan is besides its datasets: rank and world size, read-ahead, and the
/// state to resume.
struct Source {
    rank: (u64, u64),
    read_ahead: ReadAhead,
    frame_stack: Option<FrameStack>,
    resume: Option<LoaderState>,
}

/// The gathered columns of `source`'s batches, as tensors: name, dtype, per-step shape and
/// bytes.
fn describe(source: &BatchSource) -> trajstore::Result<Vec<Column>> {
    source
        .columns()?
        .into_iter()
        .zip(source.leads())
        .map(|((name, dt, shape), lead)| {
            let dtype = DlType::of(&dt).ok_or_else(|| {
                trajstore::Error::argument(
                    "columns",
                    format!("column `{name}` of type {dt} has no tensor dtype; leave it out"),
                )
            })?;
            let step_bytes = shape.iter().product::<usize>() * dtype.bytes();
            Ok(Column {
                name,
                dtype,
                shape: shape.iter().map(|&d| d as i64).collect(),
                step_bytes,
                lead,
            })
        })
        .collect()
}

impl Plan {
    /// Opens the source of `parts` (at `resume`'s versions) and describes its columns.
    fn open(
        parts: Vec<PartOpts>,
        columns: Vec<String>,
        slice_len: u32,
        num_slices: usize,
        opts: LoaderOptions,
        Source {
            rank,
            read_ahead,
            frame_stack,
            resume,
        }: Source,
    ) -> trajstore::Result<Self> {
        let n = parts.len();
        if n > 1 && parts.iter().any(|p| p.kind == SamplerKind::Prioritized) {
            return Err(trajstore::Error::argument(
                "sampler",
                "a mix cannot use sampler='prioritized' (priorities are per dataset): use an \
                 endless sampler such as 'uniform'",
            ));
        }
        let names: Vec<&str> = columns.iter().map(String::as_str).collect();
        let mut spec = LoaderSpec::new(&names);
        for (i, mut p) in parts.into_iter().enumerate() {
            // At the version the state was taken on, so that an episode query is answered on
            // it (the source checks the state, and falls back to the newest version of a
            // followed dataset whose state version is gone).
            if let Some(v) = resume
                .as_ref()
                .and_then(|r| r.parts.get(i))
                .map(|s| s.version)
                && v != p.snap.version()
                && let Ok(at) =
                    trajstore::Dataset::open(p.snap.path()).and_then(|d| d.snapshot_at(v))
            {
                p.snap = at;
            }
            let (snap, weight, follow) = (p.snap.clone(), p.weight, p.follow);
            spec = spec.part(snap, p.spec(slice_len, num_slices)?, weight);
            if let Some(f) = follow {
                spec = spec.follow(f);
            }
        }
        if n > 1 {
            spec = spec.with_num_slices(num_slices);
        }
        spec = spec.with_rank(rank.0, rank.1).with_read_ahead(read_ahead);
        if let Some(st) = frame_stack {
            spec = spec.with_frame_stack(st);
        }
        if let Some(s) = resume {
            spec = spec.with_resume(s);
        }
        let source = BatchSource::open(spec)?;
        let (sampler, _) = source.at(0).expect("a source of local datasets");
        Ok(Self {
            columns: describe(&source)?,
            opts,
            num_slices: sampler.num_slices(),
            slice_len: sampler.slice_len() as usize,
            per_epoch: sampler.batches_per_epoch(),
            parts: n,
            source,
        })
    }

    /// Loader options starting at batch `start`, for `count` batches (None: endless).
    pub(crate) fn options(&self, start: u64, count: Option<u64>) -> LoaderOptions {
        let mut o = self.opts.clone().with_start(start);
        o.max_batches = count;
        o
    }

    pub(crate) fn num_slices_(&self) -> usize {
        self.num_slices
    }

    pub(crate) fn slice_len_(&self) -> usize {
        self.slice_len
    }

    /// The windows of slices given by episode ids and start steps (prioritized sampler).
    fn windows(
        &self,
        ids: &[u64],
        starts: &[i64],
    ) -> PyResult<(Arc<PrioritizedSampler>, Vec<u64>)> {
        // A prioritized sampler neither follows nor mixes: one generation, one part.
        let Some(p) = self.source.prioritized(0, 0) else {
            return Err(argument("sampler", "priorities need sampler='prioritized'"));
        };
        if ids.len() != starts.len() {
            return Err(argument(
                "start_step",
                format!("{} episode ids for {} start steps", ids.len(), starts.len()),
            ));
        }
        let (_, gatherer) = self.source.at(0).expect("a source of local datasets");
        let first_id = gatherer.snapshot().episodes().first_id();
        let l = self.slice_len as u32;
        ids.iter()
            .zip(starts)
            .map(|(&id, &start)| {
                let pos = id.checked_sub(first_id).and_then(|p| u32::try_from(p).ok());
                pos.map(|episode| {
                    p.window_of(&SliceRef {
                        episode,
                        start,
                        len: l,
                    })
                })
                .ok_or_else(|| {
                    argument(
                        "episode_id",
                        format!("episode id {id} is not in this stream's snapshot"),
                    )
                })
            })
            .collect::<PyResult<Vec<_>>>()
            .map(|w| (p, w))
    }
}
