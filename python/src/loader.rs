//! Loaders: `BatchLoader` hands out batches gathered by background workers as DLPack buffers
//! (CPU tensors or NumPy arrays over the batch's own memory, recycled when freed); `SlotLoader`
//! has the workers gather into a ring of caller-owned buffers (pinned staging tensors that the
//! Python side copies to a GPU). Both release the GIL while they wait.

use std::any::Any;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use trajstore::sql::SnapshotSql;
use trajstore::{
    Batch, BoundaryPolicy, EpisodeSampler, EpochSampler, GatherInto, Gatherer, Loader,
    LoaderOptions, PrioritizedSampler, ReadAhead, Recycler, Sampler, SliceOptions, SliceRef,
    SliceSampler, Snapshot, StagedLoader, StagingSlot, Weighting,
};

use crate::dataset::Dataset;
use crate::dlpack::{Buffer, DlType};
use crate::errors::{IntoPyResult, argument};

/// The largest batch a loader accepts, in bytes (`TRAJSTORE_MAX_BATCH_BYTES`).
#[pyfunction]
pub fn max_batch_bytes() -> u64 {
    trajstore::sample::max_batch_bytes()
}

/// A gathered column: name, element type, per-step shape.
struct Column {
    name: String,
    dtype: DlType,
    shape: Vec<i64>,
    step_bytes: usize,
}

/// What both loaders are built from: the sampler, the gatherer and the options of one stream.
struct Spec {
    sampler: Arc<dyn Sampler>,
    prioritized: Option<Arc<PrioritizedSampler>>,
    gatherer: Arc<Gatherer>,
    columns: Vec<Column>,
    opts: LoaderOptions,
    first_id: u64,
    per_epoch: Option<u64>,
}

fn get<'py, T>(d: &Bound<'py, PyDict>, key: &str, default: T) -> PyResult<T>
where
    T: for<'a> pyo3::conversion::FromPyObject<'a, 'py, Error = PyErr>,
{
    match d.get_item(key)? {
        Some(v) if !v.is_none() => v.extract::<T>().map_err(|e| {
            argument(
                key,
                format!(
                    "{key}={}: {e}",
                    v.repr().map(|r| r.to_string()).unwrap_or_default()
                ),
            )
        }),
        _ => Ok(default),
    }
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

impl Spec {
    /// Reads the loader options of `opts` (a dict the Python `Dataset.loader` fills) and builds
    /// the sampler and gatherer over `snap`. Every bad argument fails here, before any thread
    /// starts.
    fn build(py: Python<'_>, snap: Snapshot, opts: &Bound<'_, PyDict>) -> PyResult<Self> {
        let slice_len: u32 = get(opts, "slice_len", 64)?;
        let num_slices: usize = get(opts, "num_slices", 256)?;
        let policy: String = get(opts, "policy", "strict".to_string())?;
        let weighting: String = get(opts, "weighting", "windows".to_string())?;
        let kind: String = get(opts, "sampler", "uniform".to_string())?;
        let seed: u64 = get(opts, "seed", 0)?;
        let alpha: f64 = get(opts, "alpha", 0.6)?;
        let drop_last: bool = get(opts, "drop_last", false)?;
        let episode_ids: Option<Vec<u64>> = get(opts, "episode_ids", None)?;
        let episodes_sql: Option<String> = get(opts, "episodes_sql", None)?;
        let columns: Vec<String> = get(opts, "columns", vec![])?;
        // Where a stream starts and how long it runs are the loaders' (`Plan::options`).
        let lo = LoaderOptions::default()
            .with_workers(get(opts, "workers", 2)?)
            .with_prefetch(get(opts, "prefetch", 4)?)
            .with_rank(get(opts, "rank", 0)?, get(opts, "world_size", 1)?)
            .with_read_ahead(read_ahead(opts)?);
        let ra = lo.read_ahead;
        let policy: BoundaryPolicy = policy.parse().py()?;
        let weighting: Weighting = weighting.parse().py()?;
        py.detach(move || -> trajstore::Result<Self> {
            let ids = match (episode_ids, episodes_sql) {
                (Some(_), Some(_)) => {
                    return Err(trajstore::Error::argument(
                        "episodes",
                        "give episode ids or a query, not both",
                    ));
                }
                (Some(ids), None) => Some(ids),
                (None, Some(q)) => Some(snap.episodes_where(&q)?),
                (None, None) => None,
            };
            if ids.as_ref().is_some_and(|i| i.is_empty()) {
                return Err(trajstore::Error::argument(
                    "episodes",
                    "the episode subset is empty: there is nothing to sample",
                ));
            }
            if ids.is_some() && kind != "uniform" {
                return Err(trajstore::Error::argument(
                    "episodes",
                    format!(
                        "an episode subset is supported by sampler='uniform' only, not '{kind}'"
                    ),
                ));
            }
            let names: Vec<&str> = columns.iter().map(String::as_str).collect();
            let gatherer = Gatherer::try_new(&snap, &names)?;
            gatherer.set_read_ahead(ra);
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
            let mut prioritized = None;
            let sampler: Arc<dyn Sampler> = match kind.as_str() {
                "uniform" => {
                    let mut o = SliceOptions::new(slice_len, num_slices)
                        .with_policy(policy)
                        .with_weighting(weighting)
                        .with_seed(seed);
                    if let Some(ids) = ids {
                        o = o.with_episode_ids(ids);
                    }
                    o.validate()?;
                    let index = snap.slice_index(slice_len, policy)?;
                    Arc::new(SliceSampler::try_new(index, snap.episodes(), &o)?)
                }
                "epoch" | "epoch_episodes" => {
                    SliceOptions::new(slice_len, num_slices).validate()?;
                    let index = snap.slice_index(slice_len, policy)?;
                    Arc::new(if kind == "epoch" {
                        EpochSampler::windows(index, num_slices, seed, drop_last)?
                    } else {
                        EpochSampler::episodes(index, num_slices, seed, drop_last)?
                    })
                }
                "episodes" => Arc::new(EpisodeSampler::try_new(
                    snap.episodes(),
                    num_slices,
                    slice_len,
                    seed,
                )?),
                "prioritized" => {
                    SliceOptions::new(slice_len, num_slices).validate()?;
                    let index = snap.slice_index(slice_len, policy)?;
                    let p = Arc::new(PrioritizedSampler::try_new(index, num_slices, alpha, seed)?);
                    prioritized = Some(p.clone());
                    p
                }
                other => {
                    return Err(trajstore::Error::argument(
                        "sampler",
                        format!(
                            "unknown sampler `{other}`: use uniform, epoch, epoch_episodes, \
                             episodes or prioritized"
                        ),
                    ));
                }
            };
            let per_epoch = sampler.batches_per_epoch();
            Ok(Self {
                sampler,
                prioritized,
                gatherer: Arc::new(gatherer),
                columns: cols,
                opts: lo,
                first_id: snap.episodes().first_id(),
                per_epoch,
            })
        })
        .py()
    }

    fn num_slices(&self) -> usize {
        self.sampler.num_slices()
    }

    fn slice_len(&self) -> usize {
        self.sampler.slice_len() as usize
    }

    /// `(name, dtype name, per-step shape)` of each gathered column.
    fn describe(&self) -> Vec<(String, String, Vec<i64>)> {
        self.columns
            .iter()
            .map(|c| (c.name.clone(), c.dtype.name(), c.shape.clone()))
            .collect()
    }

    /// The windows of slices given by episode ids and start steps (prioritized sampler).
    fn windows(
        &self,
        ids: &[u64],
        starts: &[i64],
    ) -> PyResult<(Arc<PrioritizedSampler>, Vec<u64>)> {
        let Some(p) = self.prioritized.clone() else {
            return Err(argument("sampler", "priorities need sampler='prioritized'"));
        };
        if ids.len() != starts.len() {
            return Err(argument(
                "start_step",
                format!("{} episode ids for {} start steps", ids.len(), starts.len()),
            ));
        }
        let l = self.sampler.slice_len();
        let windows = ids
            .iter()
            .zip(starts)
            .map(|(&id, &start)| {
                let pos = id
                    .checked_sub(self.first_id)
                    .and_then(|p| u32::try_from(p).ok());
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
            .collect::<PyResult<Vec<_>>>()?;
        Ok((p, windows))
    }
}

/// The sampler, gatherer and options of a stream, from which loaders start at any batch
/// number (iterations, resumption). Priorities set here persist across the loaders made from it.
#[pyclass(frozen, module = "trajstore._native")]
pub struct Plan {
    spec: Spec,
}

#[pymethods]
impl Plan {
    #[new]
    fn new(
        py: Python<'_>,
        dataset: &Bound<'_, Dataset>,
        options: &Bound<'_, PyDict>,
    ) -> PyResult<Self> {
        Ok(Self {
            spec: Spec::build(py, dataset.get().snapshot(), options)?,
        })
    }
    /// `(name, dtype, per-step shape)` of each gathered column, in batch order.
    fn columns(&self) -> Vec<(String, String, Vec<i64>)> {
        self.spec.describe()
    }
    #[getter]
    fn num_slices(&self) -> usize {
        self.spec.num_slices()
    }
    #[getter]
    fn slice_len(&self) -> usize {
        self.spec.slice_len()
    }
    /// Batches per epoch of an epoch sampler (all ranks together), else None.
    #[getter]
    fn batches_per_epoch(&self) -> Option<u64> {
        self.spec.per_epoch
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
        let (p, windows) = self.spec.windows(&episode_id, &start_step)?;
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
        let (p, windows) = self.spec.windows(&episode_id, &start_step)?;
        let mut out = Vec::new();
        p.importance_weights(&windows, beta, &mut out);
        Ok(out)
    }
    /// Benchmark hook: runs the Rust loader alone (no Python objects per batch) over batches
    /// `start .. start + count`, recycling each batch, and returns the seconds it took; the
    /// baseline the Python loader's overhead is measured against, in the same process.
    fn time_rust_loader(&self, py: Python<'_>, start: u64, count: u64) -> PyResult<f64> {
        let (sampler, gatherer) = (self.spec.sampler.clone(), self.spec.gatherer.clone());
        let opts = self.options(start, Some(count));
        py.detach(|| -> trajstore::Result<f64> {
            let t = std::time::Instant::now();
            let mut loader = Loader::try_new(sampler, gatherer, opts)?;
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
    /// Loader options starting at batch `start`, for `count` batches (None: endless).
    fn options(&self, start: u64, count: Option<u64>) -> LoaderOptions {
        let mut o = self.spec.opts.clone().with_start(start);
        o.max_batches = count;
        o
    }
}

/// A gathered batch, owned by the buffers exported from it; back to the loader's pool when the
/// last one is freed.
struct BatchOwner {
    batch: Option<Batch>,
    recycler: Recycler,
}

impl Drop for BatchOwner {
    fn drop(&mut self) {
        if let Some(b) = self.batch.take() {
            self.recycler.recycle(b);
        }
    }
}

/// Batches gathered by background workers into their own memory, handed out as DLPack
/// buffers.
#[pyclass(frozen, module = "trajstore._native")]
pub struct BatchLoader {
    loader: Mutex<Option<Loader>>,
    recycler: Recycler,
    plan: Py<Plan>,
}

#[pymethods]
impl BatchLoader {
    /// Starts workers producing batches `start ..` (`count` of them; None: endless, or to the
    /// end of the epoch of an epoch sampler).
    #[new]
    #[pyo3(signature = (plan, start, count=None))]
    fn new(py: Python<'_>, plan: Py<Plan>, start: u64, count: Option<u64>) -> PyResult<Self> {
        let p = plan.get();
        let (sampler, gatherer) = (p.spec.sampler.clone(), p.spec.gatherer.clone());
        let opts = p.options(start, count);
        let loader = py
            .detach(|| Loader::try_new(sampler, gatherer, opts))
            .py()?;
        Ok(Self {
            recycler: loader.recycler(),
            loader: Mutex::new(Some(loader)),
            plan,
        })
    }

    /// The number of the batch `next` returns next (None once closed).
    fn position(&self) -> Option<u64> {
        self.loader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(Loader::position)
    }

    /// Stops and joins the workers (batches handed out stay valid). `next` then returns None.
    fn close(&self, py: Python<'_>) {
        let taken = self.loader.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(|| drop(taken));
    }

    /// The next batch as `(number, num_slices, buffers)`: one buffer per column `[B, L, ...]`,
    /// then mask, is_first, is_last, terminated, truncated, slice_end (`[B, L]` bool), then
    /// episode_id and start_step (`[B]` int64). None at the end.
    fn next(&self, py: Python<'_>) -> PyResult<Option<(u64, usize, Vec<Buffer>)>> {
        let got = py.detach(|| {
            let mut g = self.loader.lock().unwrap_or_else(|e| e.into_inner());
            let l = g.as_mut()?;
            let k = Loader::position(l);
            l.next_batch().map(|b| (k, b))
        });
        let Some((k, mut batch)) = got else {
            return Ok(None);
        };
        let (b, l) = (batch.num_slices as i64, batch.slice_len as i64);
        // Raw pointers first (from `&mut`), then the batch moves into its owner; its heap buffers
        // do not move with it.
        let mut views: Vec<(*mut u8, Vec<i64>, DlType)> = Vec::new();
        for (c, meta) in batch.columns.iter_mut().zip(&self.plan.get().spec.columns) {
            let mut shape = vec![b, l];
            shape.extend(&meta.shape);
            debug_assert_eq!(c.data.len(), (b * l) as usize * meta.step_bytes);
            views.push((c.data.as_mut_ptr(), shape, meta.dtype));
        }
        for plane in [
            &mut batch.mask,
            &mut batch.is_first,
            &mut batch.is_last,
            &mut batch.terminated,
            &mut batch.truncated,
            &mut batch.slice_end,
        ] {
            views.push((plane.as_mut_ptr(), vec![b, l], DlType::BOOL));
        }
        views.push((
            batch.episode_id.as_mut_ptr() as *mut u8,
            vec![b],
            DlType::I64,
        ));
        views.push((
            batch.start_step.as_mut_ptr() as *mut u8,
            vec![b],
            DlType::I64,
        ));
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(BatchOwner {
            batch: Some(batch),
            recycler: self.recycler.clone(),
        });
        let buffers = views
            .into_iter()
            // SAFETY: each pointer addresses a buffer of the batch that `owner` holds, sized by
            // the gather to `B * L * step` (columns), `B * L` (flag bytes, 0 or 1, valid bools) or
            // `B` (ids, starts); nothing touches the batch again until `owner` is dropped, which
            // happens after the last exported tensor is freed.
            .map(|(p, shape, dt)| unsafe { Buffer::new(owner.clone(), p, shape, dt) })
            .collect();
        Ok(Some((k, b as usize, buffers)))
    }
}

/// Caller-owned destinations of one batch: raw addresses and byte lengths, kept valid by the
/// Python objects the `SlotLoader` holds.
struct PtrSlot {
    columns: Vec<(usize, usize)>,
    flags: [(usize, usize); 6],
    episode_id: (usize, usize),
    start_step: (usize, usize),
}

impl StagingSlot for PtrSlot {
    fn dest(&mut self) -> GatherInto<'_> {
        /// # Safety
        /// `p` must address `n` writable bytes that nothing else accesses while the slice lives.
        unsafe fn bytes<'a>((p, n): (usize, usize)) -> &'a mut [u8] {
            // SAFETY: the caller's contract.
            unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) }
        }
        // SAFETY: `SlotLoader::new` checked every region (non-null, sized for a batch, the
        // per-slice ones 8-byte aligned); the Python tensors owning them are kept alive by the
        // loader (dropped after its workers are joined); the staged loader hands a slot to one
        // worker at a time, and only while the consumer holds none of it.
        unsafe {
            GatherInto {
                columns: self.columns.iter().map(|&r| bytes(r)).collect(),
                flags: self.flags.map(|r| bytes(r)),
                episode_id: std::slice::from_raw_parts_mut(
                    self.episode_id.0 as *mut u64,
                    self.episode_id.1 / 8,
                ),
                start_step: std::slice::from_raw_parts_mut(
                    self.start_step.0 as *mut i64,
                    self.start_step.1 / 8,
                ),
            }
        }
    }
}

/// Workers gather into a ring of caller-owned slots (pinned staging tensors); the caller copies
/// a slot out and releases it.
#[pyclass(frozen, module = "trajstore._native")]
pub struct SlotLoader {
    // Dropped first: stops and joins the workers before the memory they write goes.
    loader: Mutex<Option<StagedLoader>>,
    _keep: Py<PyAny>,
}

#[pymethods]
impl SlotLoader {
    /// `slots`: per slot, `(address, bytes)` of each column, the six flag planes, episode_id and
    /// start_step, in the order of `columns()`; `keep`: the object owning that memory (kept
    /// alive as long as the loader).
    #[new]
    #[pyo3(signature = (plan, start, count, slots, keep))]
    fn new(
        py: Python<'_>,
        plan: Py<Plan>,
        start: u64,
        count: Option<u64>,
        slots: Vec<Vec<(usize, usize)>>,
        keep: Py<PyAny>,
    ) -> PyResult<Self> {
        let spec = &plan.get().spec;
        let (b, l) = (spec.num_slices(), spec.slice_len());
        let need: Vec<usize> = spec
            .columns
            .iter()
            .map(|c| b * l * c.step_bytes)
            .chain(std::iter::repeat_n(b * l, 6))
            .chain([b * 8, b * 8])
            .collect();
        let mut staged: Vec<Box<dyn StagingSlot>> = Vec::new();
        for (i, regions) in slots.iter().enumerate() {
            if regions.len() != need.len() {
                return Err(argument(
                    "slots",
                    format!(
                        "slot {i}: {} regions, expected {}",
                        regions.len(),
                        need.len()
                    ),
                ));
            }
            for (j, (&(p, n), &want)) in regions.iter().zip(&need).enumerate() {
                if p == 0 || n < want || (j >= need.len() - 2 && p % 8 != 0) {
                    return Err(argument(
                        "slots",
                        format!(
                            "slot {i}, region {j}: {n} bytes at {p:#x}, need {want} (8-aligned for ids)"
                        ),
                    ));
                }
            }
            let c = spec.columns.len();
            let mut flags = [(0, 0); 6];
            flags.copy_from_slice(&regions[c..c + 6]);
            staged.push(Box::new(PtrSlot {
                columns: regions[..c].to_vec(),
                flags,
                episode_id: regions[c + 6],
                start_step: regions[c + 7],
            }));
        }
        let (sampler, gatherer) = (spec.sampler.clone(), spec.gatherer.clone());
        let opts = plan.get().options(start, count);
        let loader = py
            .detach(|| StagedLoader::try_new(sampler, gatherer, opts, staged))
            .py()?;
        Ok(Self {
            loader: Mutex::new(Some(loader)),
            _keep: keep,
        })
    }

    /// The next batch as `(number, slot, num_slices)`, None at the end. Every batch up to
    /// `number - slots` must have been released.
    fn next(&self, py: Python<'_>) -> PyResult<Option<(u64, usize, usize)>> {
        let got = py.detach(|| {
            self.loader
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
                .and_then(StagedLoader::next_batch)
        });
        match got {
            None => Ok(None),
            Some(r) => {
                let s = r.py()?;
                Ok(Some((s.number, s.slot, s.num_slices)))
            }
        }
    }

    /// Hands batch `number`'s slot back to the workers (nothing once closed).
    fn release(&self, number: u64) -> PyResult<()> {
        match self
            .loader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(l) => l.release(number).py(),
            None => Ok(()),
        }
    }

    /// The number of the batch `next` returns next (None once closed).
    fn position(&self) -> Option<u64> {
        self.loader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(StagedLoader::position)
    }

    /// Stops and joins the workers: none writes into the slots after this returns (call it
    /// before another loader uses the same slots).
    fn close(&self, py: Python<'_>) {
        let taken = self.loader.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(|| drop(taken));
    }
}
