//! Loaders: `BatchLoader` hands out batches gathered by background workers as DLPack buffers
//! (CPU tensors or NumPy arrays over the batch's own memory, recycled when freed); `SlotLoader`
//! has the workers gather into a ring of caller-owned buffers (pinned staging tensors that the
//! Python side copies to a GPU). Both start from a `Plan` (its `BatchSource`) at any batch number,
//! and release the GIL while they wait.

use std::any::Any;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use trajstore::{Batch, GatherInto, Loader, Recycler, StagedLoader, StagingSlot, StreamLoader};

use crate::dlpack::{Buffer, DlType};
use crate::errors::{IntoPyResult, argument};
use crate::plan::Plan;

/// The largest batch a loader accepts, in bytes (`TRAJSTORE_MAX_BATCH_BYTES`).
#[pyfunction]
pub fn max_batch_bytes() -> u64 {
    trajstore::sample::max_batch_bytes()
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

/// The loader behind a `BatchLoader`: of local datasets, or of a stream through its cache.
enum Inner {
    Local(Loader),
    Stream(Box<StreamLoader>),
}

impl Inner {
    fn position(&self) -> u64 {
        match self {
            Inner::Local(l) => l.position(),
            Inner::Stream(s) => StreamLoader::position(s),
        }
    }

    fn next_batch(&mut self) -> Option<trajstore::Result<Batch>> {
        match self {
            Inner::Local(l) => l.next_batch().map(Ok),
            Inner::Stream(s) => StreamLoader::next_batch(s),
        }
    }
}

/// Batches gathered by background workers into their own memory, handed out as DLPack
/// buffers.
#[pyclass(frozen, module = "trajstore._native")]
pub struct BatchLoader {
    loader: Mutex<Option<Inner>>,
    recycler: Recycler,
    plan: Py<Plan>,
    /// The process that started the workers (see [`check_process`]).
    pid: u32,
}

/// What a loader says when it is used in a process forked from the one that created it (a
/// `DataLoader` with `num_workers > 0`, `os.fork`): its worker threads were not copied into the
/// child, so waiting for their batches would hang forever.
pub(crate) fn check_process(pid: u32) -> PyResult<()> {
    let here = std::process::id();
    if here == pid {
        return Ok(());
    }
    Err(argument(
        "loader",
        format!(
            "this loader was created in process {pid} and is used in process {here}, forked \
             from it (a torch DataLoader with num_workers > 0, or os.fork): its worker threads \
             do not exist here. A trajstore loader has its own workers: pass it to \
             DataLoader(loader, batch_size=None, num_workers=0), or create the loader in the \
             child process"
        ),
    ))
}

/// Takes the loader out of `slot` and drops it (joining its workers) in the process `pid` that
/// made it; in a forked child, leaks it instead (joining workers that do not exist in the child
/// would hang).
fn release<T>(pid: u32, slot: &Mutex<Option<T>>) {
    let inner = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    if std::process::id() == pid {
        drop(inner);
    } else {
        std::mem::forget(inner);
    }
}

impl Drop for BatchLoader {
    fn drop(&mut self) {
        release(self.pid, &self.loader);
    }
}

#[pymethods]
impl BatchLoader {
    /// Starts workers producing batches `start ..` (`count` of them; None: endless, or to the
    /// end of the epoch of an epoch sampler).
    #[new]
    #[pyo3(signature = (plan, start, count=None))]
    fn new(py: Python<'_>, plan: Py<Plan>, start: u64, count: Option<u64>) -> PyResult<Self> {
        let p = plan.get();
        let opts = p.options(start, count);
        let loader = py
            .detach(|| {
                if p.source.is_streamed() {
                    StreamLoader::new(&p.source, opts).map(|s| Inner::Stream(Box::new(s)))
                } else {
                    Loader::new(&p.source, opts).map(Inner::Local)
                }
            })
            .py()?;
        let recycler = match &loader {
            Inner::Local(l) => l.recycler(),
            Inner::Stream(s) => s.recycler(),
        };
        Ok(Self {
            recycler,
            loader: Mutex::new(Some(loader)),
            plan,
            pid: std::process::id(),
        })
    }

    /// The number of the batch `next` returns next (None once closed).
    fn position(&self) -> Option<u64> {
        self.loader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(Inner::position)
    }

    /// Stops and joins the workers (batches handed out stay valid). `next` then returns None.
    fn close(&self, py: Python<'_>) {
        py.detach(|| release(self.pid, &self.loader));
    }

    /// What a streaming loader downloaded and holds (`trajstore::StreamStats` as JSON); None
    /// for a loader of local datasets, or once closed.
    fn stream_stats(&self) -> Option<String> {
        match self
            .loader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()?
        {
            Inner::Stream(s) => serde_json::to_string(&s.stats()).ok(),
            Inner::Local(_) => None,
        }
    }

    /// The next batch as `(number, num_slices, buffers)`: one buffer per column `[B, L, ...]`,
    /// then mask, is_first, is_last, terminated, truncated, slice_end (`[B, L]` bool), then
    /// episode_id and start_step (`[B]` int64). None at the end.
    fn next(&self, py: Python<'_>) -> PyResult<Option<(u64, usize, Vec<Buffer>)>> {
        check_process(self.pid)?;
        let got = py.detach(|| {
            let mut g = self.loader.lock().unwrap_or_else(|e| e.into_inner());
            let l = g.as_mut()?;
            let k = l.position();
            l.next_batch().map(|b| (k, b))
        });
        let Some((k, batch)) = got else {
            return Ok(None);
        };
        // A stream's download that failed (a damaged or missing object, a store that cannot
        // be reached): the error names the object.
        let mut batch = batch.py()?;
        let (b, l) = (batch.num_slices as i64, batch.slice_len as i64);
        // Raw pointers first (from `&mut`), then the batch moves into its owner; its heap buffers
        // do not move with it.
        let mut views: Vec<View> = Vec::new();
        for (c, meta) in batch.columns.iter_mut().zip(&self.plan.get().columns) {
            let mut shape = vec![b, l];
            shape.extend(&meta.shape);
            debug_assert_eq!(c.data.len(), b as usize * c.slice_bytes(l as usize));
            // A frame window ([B, L + K - 1, ...frame], bytes): the [B, L, K, ...frame] stacks
            // are a view whose step and frame axes both advance one frame.
            let strides = (c.lead > 0).then(|| {
                let frame = c.row_bytes() as i64;
                let mut strides = vec![(l + c.lead as i64) * frame, frame, frame];
                let mut inner: Vec<i64> = meta.shape[1..]
                    .iter()
                    .rev()
                    .scan(1i64, |acc, &d| {
                        let s = *acc;
                        *acc *= d;
                        Some(s)
                    })
                    .collect();
                inner.reverse();
                strides.extend(inner);
                strides
            });
            views.push((c.data.as_mut_ptr(), shape, meta.dtype, strides));
        }
        for plane in batch.flag_planes_mut() {
            views.push((plane.as_mut_ptr(), vec![b, l], DlType::BOOL, None));
        }
        views.push((
            batch.episode_id.as_mut_ptr() as *mut u8,
            vec![b],
            DlType::I64,
            None,
        ));
        views.push((
            batch.start_step.as_mut_ptr() as *mut u8,
            vec![b],
            DlType::I64,
            None,
        ));
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(BatchOwner {
            batch: Some(batch),
            recycler: self.recycler.clone(),
        });
        let buffers = views
            .into_iter()
            // SAFETY: each pointer addresses a buffer of the batch that `owner` holds, sized by
            // the gather to `B * L * step` (columns; a frame window's `B * (L + K - 1) * frame`,
            // whose strided view's last element is at `(B - 1) * (L + K - 1) * frame + (L - 1) *
            // frame + (K - 1) * frame + frame - 1`, inside it), `B * L` (flag bytes, 0 or 1,
            // valid bools) or `B` (ids, starts); nothing touches the batch again until `owner`
            // is dropped, which happens after the last exported tensor is freed.
            .map(|(p, shape, dt, strides)| unsafe {
                let buf = Buffer::new(owner.clone(), p, shape, dt);
                match strides {
                    Some(s) => buf.with_strides(s),
                    None => buf,
                }
            })
            .collect();
        Ok(Some((k, b as usize, buffers)))
    }
}

/// One exported tensor of a batch: address, shape, element type, and strides in elements where
/// it is not compact row-major (a frame window's overlapping stacks).
type View = (*mut u8, Vec<i64>, DlType, Option<Vec<i64>>);

/// Caller-owned destinations of one batch: raw addresses and byte lengths, kept valid by the
/// Python objects the `SlotLoader` holds.
struct PtrSlot {
    columns: Vec<(usize, usize)>,
    flags: [(usize, usize); 6],
    episode_id: (usize, usize),
    start_step: (usize, usize),
    /// The columns held as one row per slice (see `Gatherer::gather_into_with_tails`).
    tails: Option<Vec<bool>>,
}

/// # Safety
/// `p` must address `n` writable bytes, aligned for `T`, that nothing else accesses while the
/// slice lives.
unsafe fn region<'a, T>((p, n): (usize, usize)) -> &'a mut [T] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(p as *mut T, n / std::mem::size_of::<T>()) }
}

impl StagingSlot for PtrSlot {
    fn dest(&mut self) -> GatherInto<'_> {
        // SAFETY: `SlotLoader::new` checked every region (non-null, sized for a batch, the
        // per-slice ones 8-byte aligned); the Python tensors owning them are kept alive by the
        // loader (dropped after its workers are joined); the staged loader hands a slot to one
        // worker at a time, and only while the consumer holds none of it.
        unsafe {
            GatherInto {
                columns: self.columns.iter().map(|&r| region(r)).collect(),
                flags: self.flags.map(|r| region(r)),
                episode_id: region(self.episode_id),
                start_step: region(self.start_step),
            }
        }
    }

    fn tails(&self) -> Option<Vec<bool>> {
        self.tails.clone()
    }
}

/// Workers gather into a ring of caller-owned slots (pinned staging tensors); the caller copies
/// a slot out and releases it.
#[pyclass(frozen, module = "trajstore._native")]
pub struct SlotLoader {
    // Dropped first: stops and joins the workers before the memory they write goes.
    loader: Mutex<Option<StagedLoader>>,
    _keep: Py<PyAny>,
    /// The process that started the workers (see [`check_process`]).
    pid: u32,
}

impl Drop for SlotLoader {
    fn drop(&mut self) {
        release(self.pid, &self.loader);
    }
}

#[pymethods]
impl SlotLoader {
    /// `slots`: per slot, `(address, bytes)` of each column, the six flag planes, episode_id and
    /// start_step, in the order of `columns()`; `keep`: the object owning that memory (kept
    /// alive as long as the loader). `tails`: per column, whether the slots hold it as one row
    /// per slice (`[B, ...]`: a derived next_observation, which the caller derives on the
    /// device; only columns `Plan.tail_columns()` marks).
    #[new]
    #[pyo3(signature = (plan, start, count, slots, keep, tails=None))]
    fn new(
        py: Python<'_>,
        plan: Py<Plan>,
        start: u64,
        count: Option<u64>,
        slots: Vec<Vec<(usize, usize)>>,
        keep: Py<PyAny>,
        tails: Option<Vec<bool>>,
    ) -> PyResult<Self> {
        let p = plan.get();
        let (b, l) = (p.num_slices_(), p.slice_len_());
        let c = p.columns.len();
        if let Some(t) = &tails {
            let can = p.source.tail_columns();
            if t.len() != c || t.iter().zip(&can).any(|(&t, &c)| t && !c) {
                return Err(argument(
                    "tails",
                    format!("{t:?}: only the columns tail_columns() marks ({can:?})"),
                ));
            }
        }
        let tail = |j: usize| tails.as_ref().is_some_and(|t| t[j]);
        let need: Vec<usize> = p
            .columns
            .iter()
            .enumerate()
            .map(|(j, col)| match tail(j) {
                true => b * trajstore::gather::tail_bytes(col.step_bytes, col.lead),
                false => b * col.slice_bytes(l),
            })
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
            let mut flags = [(0, 0); 6];
            flags.copy_from_slice(&regions[c..c + 6]);
            staged.push(Box::new(PtrSlot {
                columns: regions[..c].to_vec(),
                flags,
                episode_id: regions[c + 6],
                start_step: regions[c + 7],
                tails: tails.clone(),
            }));
        }
        let opts = p.options(start, count);
        let loader = py
            .detach(|| StagedLoader::new(&p.source, opts, staged))
            .py()?;
        Ok(Self {
            loader: Mutex::new(Some(loader)),
            _keep: keep,
            pid: std::process::id(),
        })
    }

    /// The next batch as `(number, slot, num_slices)`, None at the end. Every batch up to
    /// `number - slots` must have been released.
    fn next(&self, py: Python<'_>) -> PyResult<Option<(u64, usize, usize)>> {
        check_process(self.pid)?;
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
        py.detach(|| release(self.pid, &self.loader));
    }

    /// What a streaming loader downloaded and holds (`trajstore::StreamStats` as JSON); None
    /// for a loader of local datasets, or once closed.
    fn stream_stats(&self) -> Option<String> {
        let g = self.loader.lock().unwrap_or_else(|e| e.into_inner());
        serde_json::to_string(&g.as_ref()?.stream_stats()?).ok()
    }
}
