//! `Plan`: what the loaders of one Python `Loader` draw batches from: a `BatchSource` over one
//! dataset or a mix of several (each with its sampler, weight and whether it follows new
//! versions), opened at the versions of a resumed state when given, with the gathered columns'
//! tensor types and the loaders' options. Loaders made from it one after the other (each
//! iteration, each restart at another batch) share its follow thread, priorities and indexes.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use trajstore::sql::SnapshotSql;
use trajstore::{
    BatchSource, BoundaryPolicy, Follow, Loader, LoaderOptions, LoaderSpec, LoaderState,
    PrioritizedSampler, ReadAhead, SamplerKind, SamplerSpec, SliceRef, Snapshot, Weighting,
};

use crate::dataset::Dataset;
use crate::dlpack::DlType;
use crate::errors::{IntoPyResult, argument};

/// A gathered column: name, element type, per-step shape.
pub(crate) struct Column {
    pub(crate) name: String,
    pub(crate) dtype: DlType,
    pub(crate) shape: Vec<i64>,
    pub(crate) step_bytes: usize,
}

fn extract<'py, T>(key: &str, v: &Bound<'py, PyAny>) -> PyResult<T>
where
    T: for<'a> pyo3::conversion::FromPyObject<'a, 'py, Error = PyErr>,
{
    v.extract::<T>().map_err(|e| {
        argument(
            key,
            format!(
                "{key}={}: {e}",
                v.repr().map(|r| r.to_string()).unwrap_or_default()
            ),
        )
    })
}

/// Option `key` of the first dict that has it (not None), else `default`.
fn get<'py, T>(dicts: &[&Bound<'py, PyDict>], key: &str, default: T) -> PyResult<T>
where
    T: for<'a> pyo3::conversion::FromPyObject<'a, 'py, Error = PyErr>,
{
    for d in dicts {
        if let Some(v) = d.get_item(key)?
            && !v.is_none()
        {
            return extract(key, &v);
        }
    }
    Ok(default)
}

/// The `readahead` option: "auto" (default), "always", "never", or a bool (True: always).
fn read_ahead(opts: &Bound<'_, PyDict>) -> PyResult<ReadAhead> {
    match opts.get_item("readahead")? {
        None => Ok(ReadAhead::Auto),
        Some(v) if v.is_none() => Ok(ReadAhead::Auto),
        Some(v) => match v.extract::<bool>() {
            Ok(true) => Ok(ReadAhead::Always),
            Ok(false) => Ok(ReadAhead::Never),
            Err(_) => v.extract::<String>()?.parse::<ReadAhead>().py(),
        },
    }
}

/// One dataset's options, read from its dict (then the loader's).
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
    /// Part `i`'s options: its dict's, else the loader's; its seed is the loader's `seed + i`
    /// unless its dict gives one.
    fn read(
        i: usize,
        snap: Snapshot,
        part: &Bound<'_, PyDict>,
        common: &Bound<'_, PyDict>,
    ) -> PyResult<Self> {
        let both = [part, common];
        let seed = match get::<Option<u64>>(&[part], "seed", None)? {
            Some(s) => s,
            None => get::<u64>(&[common], "seed", 0)?.wrapping_add(i as u64),
        };
        let every: Option<f64> = get(&both, "follow_every", None)?;
        let every_batches: Option<u64> = get(&both, "follow_every_batches", None)?;
        if every_batches == Some(0) {
            return Err(argument("follow", "follow every 0 batches: at least 1"));
        }
        let follow = match (every, every_batches) {
            (None, None) => None,
            (None, Some(n)) => Some(Follow::every_batches(n)),
            (Some(s), n) => {
                let mut f = Follow::every_secs("follow", s).py()?;
                f.every_batches = n;
                Some(f)
            }
        };
        let kind: String = get(&both, "sampler", "uniform".to_string())?;
        let policy: String = get(&both, "policy", "strict".to_string())?;
        let weighting: String = get(&both, "weighting", "windows".to_string())?;
        Ok(Self {
            snap,
            kind: kind.parse().py()?,
            policy: policy.parse().py()?,
            weighting: weighting.parse().py()?,
            seed,
            alpha: get(&both, "alpha", 0.6)?,
            drop_last: get(&both, "drop_last", false)?,
            episode_ids: get(&both, "episode_ids", None)?,
            episodes_sql: get(&both, "episodes_sql", None)?,
            weight: get(&[part], "weight", 1.0)?,
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
    /// `parts`: `(dataset, options)` per dataset (sampler options, `weight`, `follow_every`
    /// seconds, `follow_every_batches`; what a part does not give comes from `options`, its
    /// seed from `options["seed"] + i`). `options`: the loader's (slice_len, num_slices,
    /// columns, workers, prefetch, rank, world_size, readahead, and sampler options for every
    /// part). `state`, `priorities`: a loader state to resume (its JSON header and each part's
    /// priorities): the plan is opened at the state's versions, and refuses a state of another
    /// dataset, rank or sampler. Every bad argument fails here, before any batch is sampled.
    #[new]
    #[pyo3(signature = (parts, options, state=None, priorities=None))]
    fn new(
        py: Python<'_>,
        parts: Vec<(Py<Dataset>, Py<PyDict>)>,
        options: &Bound<'_, PyDict>,
        state: Option<String>,
        priorities: Option<Vec<Option<Py<PyBytes>>>>,
    ) -> PyResult<Self> {
        let common = [options];
        let slice_len: u32 = get(&common, "slice_len", 64)?;
        let num_slices: usize = get(&common, "num_slices", 256)?;
        let columns: Vec<String> = get(&common, "columns", vec![])?;
        // Where a stream starts and how long it runs are the loaders' (`Plan::options`).
        let opts = LoaderOptions::default()
            .with_workers(get(&common, "workers", 2)?)
            .with_prefetch(get(&common, "prefetch", 4)?)
            .with_rank(get(&common, "rank", 0)?, get(&common, "world_size", 1)?)
            .with_read_ahead(read_ahead(options)?);
        let parts = parts
            .iter()
            .enumerate()
            .map(|(i, (ds, d))| PartOpts::read(i, ds.get().snapshot(), d.bind(py), options))
            .collect::<PyResult<Vec<_>>>()?;
        let resume = match state {
            Some(json) => Some(read_state(py, &json, priorities)?),
            None => None,
        };
        py.detach(move || Self::open(parts, columns, slice_len, num_slices, opts, resume))
            .py()
    }

    /// `(name, dtype, per-step shape)` of each gathered column, in batch order.
    fn columns(&self) -> Vec<(String, String, Vec<i64>)> {
        self.columns
            .iter()
            .map(|c| (c.name.clone(), c.dtype.name(), c.shape.clone()))
            .collect()
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
    fn state(&self, py: Python<'_>, position: u64) -> (String, Vec<Option<Py<PyBytes>>>) {
        let s = py.detach(|| {
            self.source
                .state(position, self.opts.rank, self.opts.world_size)
        });
        let prios = s
            .parts
            .iter()
            .map(|p| p.priorities.as_ref().map(|b| PyBytes::new(py, b).unbind()))
            .collect();
        (s.to_json(), prios)
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
            let mut loader = Loader::from_source(&self.source, opts)?;
            while let Some(b) = loader.next_batch() {
                std::hint::black_box(&b);
                loader.recycle(b);
            }
            Ok(t.elapsed().as_secs_f64())
        })
        .py()
    }
}

impl Plan {
    /// Opens the source of `parts` (at `resume`'s versions) and describes its columns.
    fn open(
        parts: Vec<PartOpts>,
        columns: Vec<String>,
        slice_len: u32,
        num_slices: usize,
        opts: LoaderOptions,
        resume: Option<LoaderState>,
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
        let mut open = opts.clone();
        if let Some(s) = resume {
            open = open.resume(s);
        }
        let source = BatchSource::open(spec, &open)?;
        let (sampler, gatherer) = source.at(0);
        let mut cols = Vec::new();
        for ((name, dt, shape), step) in gatherer.columns().zip(gatherer.step_bytes()) {
            let dtype = DlType::of(dt).ok_or_else(|| {
                trajstore::Error::argument(
                    "columns",
                    format!("column `{name}` of type {dt} has no tensor dtype; leave it out"),
                )
            })?;
            cols.push(Column {
                name: name.to_string(),
                dtype,
                shape: shape.iter().map(|&d| d as i64).collect(),
                step_bytes: step,
            });
        }
        Ok(Self {
            columns: cols,
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
        let first_id = self.source.at(0).1.snapshot().episodes().first_id();
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
