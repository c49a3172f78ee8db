//! Streaming reads of a dataset in object storage through a bounded local cache.
//!
//! [`Stream::open`] fetches only the version's catalog (manifest and episode tables). A
//! [`StreamLoader`], made like every loader from a [`super::BatchSource`] (of a
//! [`super::LoaderSpec::streamed`]), then fetches each transition file on first use into the rank's cache
//! directory (`<mirror>/_stream/rank-<r>/`), keeps at most its share of
//! [`crate::remote::StreamOptions::cache_limit`] (the node's limit over
//! [`crate::remote::StreamOptions::ranks_per_node`]) on disk (downloads in progress included; the
//! episode tables, O(episodes), are kept beside it), hard-links a file that another rank of the
//! node holds instead of downloading it, evicts the least recently used segment that no window in use pins, and
//! starts the downloads of the windows the loader will need next while the current one is
//! sampled.
//!
//! **Windows and rounds.** Batches are numbered per rank and grouped into rounds. In each round
//! the version's segments (those with at least one slice) are shuffled by `(seed, round)` and
//! dealt to the `world_size` ranks (each segment to the rank with the fewest slices so far), so
//! that ranks hold disjoint shares that together cover the version: N ranks download the
//! dataset once per round in total, not N times. A rank cuts its share, in the shuffled order,
//! into **windows** of at most a third of the cache (the batches in flight read at most two
//! windows, and the next one downloads meanwhile) and serves the round's batches window after
//! window; every window serves at least [`WINDOW_BATCHES`] batches (16: the most a streaming
//! loader keeps in flight, `workers + prefetch`):
//!
//! - Uniform sampling ([`crate::SamplerKind::Uniform`], with replacement): a round has
//!   `R = max(ceil(reuse × transitions / (world_size × B × L)), m × n)` batches per rank, where
//!   `m` = [`WINDOW_BATCHES`] and `n` is the most windows any rank has that round: the same for
//!   every rank, so that data-parallel steps stay in lockstep. Window `w` gets `m` batches plus a
//!   share of the other `R - m × n_rank` proportional to its slices `S_w` (rounded at the
//!   boundaries), and each of its batches draws its `B` slices
//!   independently, uniformly over `w`'s slices (or as [`crate::Weighting`] says, inside `w`).
//!   So, when `R` is set by `reuse` (`m × n` is the smaller), every slice of the rank's share has,
//!   over a round, the same expected number of draws up to the `m` batches each window gets
//!   whatever its size, as under uniform sampling of the whole share; but the slices of one batch all come from one
//!   window: batches are correlated within a window, as with Mosaic's shuffle blocks. Over ranks
//!   and rounds every slice of the version is equally likely.
//! - Epoch sampling ([`crate::SamplerKind::Epoch`], without replacement): a round is an epoch; window `w` yields
//!   `floor(S_w / B)` batches that visit its slices once in a shuffled order (none if that is
//!   fewer than `m`), and every rank stops at the shortest rank's epoch (the slices past it, at
//!   most a few windows' worth, are skipped that epoch, and the next epoch deals segments
//!   differently).
//!
//! With one rank and a cache at least the version's transition files, nothing rotates: the
//! loader samples the whole version exactly as a local dataset's sampler with the same seed
//! does, batch for batch.
//!
//! Everything is a pure function of the seed, the rank, the world size and the batch number:
//! the number of loader workers changes nothing.
//!
//! **Following** (one rank): a [`StreamLoader`] is a sequence of runs, one per version; a
//! following loader ends each run at a round boundary, reads the store's newest manifest, and
//! continues on a newer version from that batch (the version's *base*), sampled with a seed
//! derived from the base. Then everything is a pure function of the seed, the (version, base)
//! pairs and the batch number ([`super::BatchSource::stream_cursor`]).
//!
//! With an episode subset or weights (uniform sampling), what rounds deal and windows are
//! apportioned by is each segment's share of the draws instead of its slices (`subset.rs`): a
//! segment that holds no episode of the subset is never downloaded.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Serialize;

use super::{BatchSource, Lane, LoaderOptions, Pipeline, Recycler, StreamFollow, check_in_flight};
use crate::error::{Error, Result};
use crate::gather::{Batch, FrameStack, Gatherer};
use crate::index::{EpisodeIndex, SliceIndex, SliceRef};
use crate::remote::Stream;
use crate::sample::{EpochSampler, Sampler, SamplerKind, SamplerSpec, SliceSampler};
use crate::store::Snapshot;
use crate::store::manifest::Manifest;

mod cache;
pub(crate) mod columns;
mod loader;
pub(crate) mod mixed;
mod runs;
mod schedule;
mod subset;

pub(crate) use columns::{batch_bytes, column_step_bytes, describe_columns, leads, tail_columns};
pub use loader::StreamLoader;
pub(crate) use runs::Runs;

use columns::step_bytes;

use cache::{Cache, CachedFile, Pins};
use schedule::StreamSampling;
use schedule::{Schedule, ScheduleSpec, SegmentCost, Window, mix};

/// The fewest batches a window serves, and the most batches a streaming loader keeps in flight
/// (`workers + prefetch`): a constant, so that the schedule (and every batch) is the same
/// whatever the loader's workers, and a restart with other workers continues exactly.
pub const WINDOW_BATCHES: u64 = 16;

/// What a [`StreamLoader`] downloaded and held.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamStats {
    /// Transition files downloaded completely.
    pub files_downloaded: u64,
    /// Bytes downloaded (resumed downloads count only their new bytes).
    pub bytes_downloaded: u64,
    /// Bytes already on disk that were checked (CRC-32C) and reused, not fetched: what
    /// interrupted downloads had left, files kept by an earlier loader of this cache, and files
    /// taken from another rank of the node.
    pub bytes_resumed: u64,
    /// Complete files evicted to make room.
    pub files_evicted: u64,
    /// Files taken from the cache of another rank of the node (hard links), not downloaded.
    pub files_shared: u64,
    /// Bytes in the cache now.
    pub cache_bytes: u64,
    /// The most bytes the cache held.
    pub peak_cache_bytes: u64,
    /// The rank's limit (the node's limit shared by its ranks).
    pub cache_limit: u64,
    /// Windows opened (rotations).
    pub windows_opened: u64,
    /// Seconds loader workers spent waiting for downloads.
    pub wait_seconds: f64,
}

impl StreamStats {
    /// These counters and `later`'s together (a later run of the same loader): sums, the
    /// highest peak, and `later`'s current cache size and limit.
    fn plus(self, later: &StreamStats) -> StreamStats {
        StreamStats {
            files_downloaded: self.files_downloaded + later.files_downloaded,
            bytes_downloaded: self.bytes_downloaded + later.bytes_downloaded,
            bytes_resumed: self.bytes_resumed + later.bytes_resumed,
            files_evicted: self.files_evicted + later.files_evicted,
            files_shared: self.files_shared + later.files_shared,
            cache_bytes: later.cache_bytes,
            peak_cache_bytes: self.peak_cache_bytes.max(later.peak_cache_bytes),
            cache_limit: later.cache_limit,
            windows_opened: self.windows_opened + later.windows_opened,
            wait_seconds: self.wait_seconds + later.wait_seconds,
        }
    }
}

/// What a streamed [`BatchSource`] holds: the stream, its sampler, columns and rank, whether
/// its loaders follow new versions, and (shared by every loader of the source) the version
/// they read and the batch number where it began.
pub(crate) struct StreamPlan {
    pub(crate) stream: Stream,
    pub(crate) sampler: SamplerSpec,
    pub(crate) columns: Vec<String>,
    pub(crate) rank_world: (u64, u64),
    pub(crate) frame_stack: Option<FrameStack>,
    pub(crate) follow: Option<StreamFollow>,
    pub(crate) cursor: Mutex<Cursor>,
}

/// The version a following stream reads, and its first batch (batch `k` of the loader is batch
/// `k - base` of that version's schedule).
#[derive(Clone)]
pub(crate) struct Cursor {
    pub(crate) stream: Stream,
    pub(crate) base: u64,
}

impl StreamPlan {
    /// Checks what a stream can sample: sizes, a uniform or epoch sampler, no episode subsets
    /// or weights.
    pub(crate) fn new(
        stream: Stream,
        sampler: SamplerSpec,
        columns: Vec<String>,
        (rank_world, frame_stack, follow): ((u64, u64), Option<FrameStack>, Option<StreamFollow>),
    ) -> Result<Self> {
        sampler.validate()?;
        stream_sampling(sampler.kind)?;
        if follow == Some(StreamFollow::Look) && rank_world.1 > 1 {
            return Err(Error::argument(
                "follow",
                format!(
                    "following a stream's new versions by itself needs one rank, not {}: each \
                     rank would decide on its own when to move to a new version, and ranks must \
                     agree on every round's version to draw disjoint shares in step (from Python, \
                     torch.distributed makes them agree; from Rust, LoaderSpec::follow_by_caller)",
                    rank_world.1
                ),
            ));
        }
        if follow.is_some() && sampler.episode_weights.is_some() {
            return Err(Error::argument(
                "episode_weights",
                "episode weights are per episode of one version: a following stream takes an \
                 episode subset by ids instead",
            ));
        }
        sampler.check_subset()?;
        let cols: Vec<&str> = columns.iter().map(String::as_str).collect();
        step_bytes(stream.catalog(), &cols, frame_stack)?;
        Ok(Self {
            cursor: Mutex::new(Cursor {
                stream: stream.clone(),
                base: 0,
            }),
            stream,
            sampler,
            columns,
            rank_world,
            frame_stack,
            follow,
        })
    }
}

/// The stream schedule of a sampler kind: uniform (with replacement) or epoch (without).
fn stream_sampling(kind: SamplerKind) -> Result<StreamSampling> {
    match kind {
        SamplerKind::Uniform => Ok(StreamSampling::Uniform),
        SamplerKind::Epoch => Ok(StreamSampling::Epoch),
        other => Err(Error::argument(
            "sampler",
            format!(
                "a streaming loader samples uniform or epoch, not '{}' (pull the dataset to \
                 use it locally)",
                other.name()
            ),
        )),
    }
}

/// One window, resident and mapped.
struct View {
    window: Window,
    sampler: Box<dyn Sampler>,
    gatherer: Gatherer,
    _pins: Pins,
}

type Slot = Arc<Mutex<Option<Arc<View>>>>;

struct Shared {
    cache: Cache,
    schedule: Schedule,
    mirror: PathBuf,
    manifest: Manifest,
    rank_dir: String,
    columns: Vec<String>,
    frame_stack: Option<FrameStack>,
    slice: SamplerSpec,
    /// With an episode subset or weights: the version's episodes, and each one's factor (its
    /// weight, 0 outside the subset), for the windows' samplers.
    factors: Option<(EpisodeIndex, Vec<f64>)>,
    sampling: StreamSampling,
    views: Mutex<HashMap<(u64, usize), Slot>>,
    /// The consumer's next batch, for the prefetcher.
    position: Mutex<u64>,
    moved: Condvar,
    stop: AtomicBool,
    ahead: u64,
    /// One past the last batch, if the loader ends.
    end: Option<u64>,
    wait_nanos: AtomicU64,
    windows_opened: AtomicU64,
}

/// What a streaming loader's workers make of each planned batch: per worker, a function of the
/// loader's batch number (the version's batch plus its base), the window's gatherer and the
/// batch's plan. A host [`Batch`] for a [`StreamLoader`]; a filled staging slot for a
/// [`super::StagedLoader`]; a device batch for the `torch` loader.
pub(crate) type Sink<T> = Arc<dyn Fn() -> Produce<T> + Send + Sync>;

/// One worker's half of a [`Sink`].
pub(crate) type Produce<T> = Box<dyn FnMut(u64, &Gatherer, &[SliceRef]) -> Result<T> + Send>;

/// The sink of a [`StreamLoader`]: gathers into a batch of `pool` (or a new one).
pub(crate) fn batch_sink(pool: Recycler) -> Sink<Batch> {
    Arc::new(move || {
        let pool = pool.clone();
        Box::new(move |_k: u64, gatherer: &Gatherer, plan: &[SliceRef]| {
            let mut batch = pool.take();
            gatherer.gather(plan, &mut batch)?;
            Ok(batch)
        })
    })
}

/// The batches of one version of a stream, numbered from 0 (see the module docs): the workers,
/// the prefetcher and the cache of a [`StreamLoader`] until it moves to a newer version.
/// Dropping it stops its workers and prefetcher; downloads in flight are resumed by the next
/// run over the same rank's cache.
pub(crate) struct Run<T: Send + 'static> {
    pipeline: Pipeline<Result<T>>,
    shared: Arc<Shared>,
    prefetcher: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Run<T> {
    /// Starts the batches of `stream` (a version of `plan`'s dataset, begun at the loader's
    /// batch `base`), sampled with `seed`, from its batch `opts.start` (default 0), made by
    /// `sink`. It ends at `max_batches`, at the end of the epoch it starts in (epoch sampling),
    /// or with `round_end`, at the end of the round it starts in (a following loader then looks
    /// for a newer version); else never.
    pub(crate) fn start(
        plan: &StreamPlan,
        (stream, base): (&Stream, u64),
        seed: u64,
        opts: LoaderOptions,
        round_end: bool,
        sink: &Sink<T>,
    ) -> Result<Self> {
        let mut slice = plan.sampler.clone();
        slice.seed = seed;
        let (stream, slice, columns) = (&stream.0, &slice, &plan.columns);
        let (rank, world_size) = plan.rank_world;
        let sampling = stream_sampling(slice.kind)?;
        let in_flight = (opts.workers.max(1) + opts.prefetch.max(1)) as u64;
        if in_flight > WINDOW_BATCHES {
            return Err(Error::argument(
                "prefetch",
                format!(
                    "workers + prefetch = {in_flight}: a streaming loader keeps at most \
                     {WINDOW_BATCHES} batches in flight (every window serves at least that many \
                     batches, whatever the workers, so that a restart with other workers draws \
                     the same batches); lower workers or prefetch"
                ),
            ));
        }
        let start = opts.start.unwrap_or(0);
        let catalog = &stream.catalog;
        let manifest = catalog.manifest().clone();
        // Slices per segment, from the episode tables alone.
        let tables = catalog.episode_tables();
        let first_id = manifest
            .segments
            .first()
            .map_or(manifest.next_episode_id, |s| s.first_episode_id);
        let index = EpisodeIndex::from_segments(first_id, tables.iter().map(|t| t.spans()));
        let slices = SliceIndex::build(&index, slice.slice_len, slice.policy)?;
        let factors = subset::episode_factors(slice, &index)?;
        let masses = subset::segment_masses(slice, &slices, &index, factors.as_deref(), tables)?;
        let mut at = 0usize;
        let costs: Vec<SegmentCost> = manifest
            .segments
            .iter()
            .zip(tables)
            .enumerate()
            .map(|(i, (e, t))| {
                let n = t.spans().1.len();
                let end = |p: usize| {
                    if p >= slices.num_episodes() {
                        slices.num_windows()
                    } else {
                        slices.first_window(p)
                    }
                };
                let c = SegmentCost {
                    bytes: e.bytes,
                    rows: e.rows,
                    slices: masses.as_ref().map_or(end(at + n) - end(at), |m| m[i]),
                };
                at += n;
                c
            })
            .collect();
        let schedule = Schedule::new(
            costs,
            ScheduleSpec {
                cache_limit: stream.rank_cache_limit(),
                rank,
                world: world_size,
                seed: slice.seed,
                sampling,
                num_slices: slice.num_slices as u64,
                slice_len: slice.slice_len as u64,
                reuse: stream.options.reuse,
                min_batches: WINDOW_BATCHES,
            },
        )?;
        let files: Vec<CachedFile> = stream
            .remote_manifest
            .segments
            .iter()
            .zip(&manifest.segments)
            .map(|(r, l)| CachedFile {
                key: stream.remote.key(&r.path),
                url: stream.remote.url_of(&r.path),
                name: l
                    .path
                    .rsplit('/')
                    .next()
                    .unwrap_or(l.path.as_str())
                    .to_string(),
                bytes: r.bytes,
                checksum: r.checksum.clone(),
            })
            .collect();
        let rank_dir = format!("_stream/rank-{rank}");
        let cache = Cache::open(
            stream.remote.clone(),
            &stream.mirror.join(&rank_dir),
            files,
            stream.rank_cache_limit(),
        )?;
        let round =
            (round_end || sampling == StreamSampling::Epoch).then(|| schedule.round_end(start));
        let end = match (opts.max_batches.map(|n| start.saturating_add(n)), round) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let shared = Arc::new(Shared {
            cache,
            schedule,
            mirror: stream.mirror.clone(),
            manifest,
            rank_dir,
            columns: columns.clone(),
            frame_stack: plan.frame_stack,
            slice: slice.clone(),
            factors: factors.map(|f| (index, f)),
            sampling,
            views: Mutex::new(HashMap::new()),
            position: Mutex::new(start),
            moved: Condvar::new(),
            stop: AtomicBool::new(false),
            ahead: (opts.workers.max(1) + opts.prefetch.max(1)) as u64,
            end,
            wait_nanos: AtomicU64::new(0),
            windows_opened: AtomicU64::new(0),
        });
        let cols: Vec<&str> = columns.iter().map(String::as_str).collect();
        let row_bytes = step_bytes(catalog, &cols, plan.frame_stack)?;
        check_in_flight(
            row_bytes.saturating_mul(slice.num_slices as u64 * slice.slice_len as u64),
            &opts,
        )?;
        let prefetcher = {
            let s = shared.clone();
            std::thread::Builder::new()
                .name("trajstore-prefetch".into())
                .spawn(move || prefetch_loop(&s))
                .map_err(|e| Error::io(&stream.mirror, e))?
        };
        let pipeline =
            // Bursts of 1: the windows' schedule counts on `workers + prefetch` batches ahead.
            Pipeline::start((opts.workers, opts.prefetch, 1), start, end, "stream", || {
                let shared = shared.clone();
                let mut produce = sink();
                let mut plan: Vec<SliceRef> = Vec::new();
                move |k: u64, _: &mut Lane| -> Result<T> {
                    let (w, local) = shared.schedule.locate(k);
                    let view = shared.view(&w)?;
                    let number = if shared.schedule.is_whole() { k } else { local };
                    view.sampler.plan(number, &mut plan);
                    produce(base + k, &view.gatherer, &plan)
                }
            })?;
        Ok(Self {
            pipeline,
            shared,
            prefetcher: Some(prefetcher),
        })
    }

    /// The next batch, blocking until it is ready; `None` at the end.
    pub(crate) fn next_batch(&mut self) -> Option<Result<T>> {
        let item = self.pipeline.next_item()?;
        let pos = self.pipeline.position();
        *self
            .shared
            .position
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = pos;
        self.shared.moved.notify_all();
        // Windows the consumer is past are unmapped (their pins go with them).
        self.shared
            .views
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, slot| match slot.try_lock() {
                Ok(v) => v
                    .as_ref()
                    .is_none_or(|v| v.window.first + v.window.batches > pos),
                // Being opened by a worker (which may be waiting for room that only this
                // consumer's progress frees): kept, never waited for here.
                Err(_) => true,
            });
        Some(item)
    }

    /// The number of the batch [`Run::next_batch`] returns next.
    pub(crate) fn position(&self) -> u64 {
        self.pipeline.position()
    }

    /// Whether batch `k` is the first of a round.
    pub(crate) fn is_round_start(&self, k: u64) -> bool {
        self.shared.schedule.is_round_start(k)
    }

    /// What was downloaded and held so far.
    pub(crate) fn stats(&self) -> StreamStats {
        let c = self.shared.cache.counters();
        StreamStats {
            files_downloaded: c.files_downloaded.load(Relaxed),
            bytes_downloaded: c.bytes_downloaded.load(Relaxed),
            bytes_resumed: c.bytes_resumed.load(Relaxed),
            files_evicted: c.files_evicted.load(Relaxed),
            files_shared: c.files_shared.load(Relaxed),
            cache_bytes: self.shared.cache.used(),
            peak_cache_bytes: c.peak_bytes.load(Relaxed),
            cache_limit: self.shared.cache_limit(),
            windows_opened: self.shared.windows_opened.load(Relaxed),
            wait_seconds: self.shared.wait_nanos.load(Relaxed) as f64 * 1e-9,
        }
    }

    /// The episode ids of the segments that the run's batch `k` is drawn from: its window.
    pub(crate) fn window_episodes(&self, k: u64) -> Vec<std::ops::Range<u64>> {
        let (w, _) = self.shared.schedule.locate(k);
        w.segments
            .iter()
            .map(|&p| {
                let e = &self.shared.manifest.segments[p];
                e.first_episode_id..e.first_episode_id + e.episodes
            })
            .collect()
    }
}

impl<T: Send + 'static> Drop for Run<T> {
    fn drop(&mut self) {
        // Set under the lock the prefetcher checks it under, so that the wake-up below cannot
        // fall between its check and its wait (it would then wait forever, and the join too).
        {
            let _p = self
                .shared
                .position
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.stop.store(true, Relaxed);
        }
        self.shared.moved.notify_all();
        if let Some(h) = self.prefetcher.take() {
            let _ = h.join();
        }
    }
}

impl Shared {
    fn cache_limit(&self) -> u64 {
        self.schedule.cache_limit()
    }

    /// The view of `w`, opening it (and waiting for its downloads) on first use.
    fn view(&self, w: &Window) -> Result<Arc<View>> {
        let key = if self.schedule.is_whole() {
            (0, 0)
        } else {
            (w.round, w.index)
        };
        let slot = self
            .views
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default()
            .clone();
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = slot.as_ref() {
            return Ok(v.clone());
        }
        let pins = self.cache.pin(&w.segments, w.first);
        let t = Instant::now();
        self.cache.wait(&pins)?;
        self.wait_nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        let entries = w
            .segments
            .iter()
            .map(|&p| {
                let mut e = self.manifest.segments[p].clone();
                let name = self.cache.path(p);
                let name = name
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                e.path = format!("{}/{name}", self.rank_dir);
                e
            })
            .collect();
        let snap = Snapshot::partial(&self.mirror, &self.manifest, entries)?;
        let cols: Vec<&str> = self.columns.iter().map(String::as_str).collect();
        let gatherer = Gatherer::with_frame_stack(&snap, &cols, self.frame_stack)?;
        let index = snap.slice_index(self.slice.slice_len, self.slice.policy)?;
        let whole = self.schedule.is_whole();
        let seed = if whole {
            self.slice.seed
        } else {
            mix(self.slice.seed ^ mix(w.round) ^ mix((w.index as u64 + 1) << 32))
        };
        let sampler: Box<dyn Sampler> = match self.sampling {
            StreamSampling::Uniform => {
                let mut o = self.slice.clone();
                o.seed = seed;
                o.episode_ids = None;
                if let Some((version, factors)) = &self.factors {
                    // The window's episodes, by their ids, with their factors in the version.
                    let eps = snap.episodes();
                    o.episode_weights = Some(
                        (0..eps.len())
                            .map(|q| {
                                version
                                    .position(eps.get(q).episode_id)
                                    .map_or(0.0, |p| factors[p])
                            })
                            .collect(),
                    );
                }
                Box::new(SliceSampler::try_new(index, snap.episodes(), &o)?)
            }
            StreamSampling::Epoch => Box::new(EpochSampler::windows(
                index,
                self.slice.num_slices,
                seed,
                true,
            )?),
        };
        self.windows_opened.fetch_add(1, Relaxed);
        let view = Arc::new(View {
            window: w.clone(),
            sampler,
            gatherer,
            _pins: pins,
        });
        *slot = Some(view.clone());
        Ok(view)
    }
}

/// Keeps the windows of the batches workers may make next, and the window after them, pinned
/// and queued for download, in order of need.
fn prefetch_loop(s: &Shared) {
    let mut held: Vec<((u64, usize), Pins)> = Vec::new();
    let mut pos = u64::MAX;
    loop {
        {
            let mut p = s.position.lock().unwrap_or_else(|e| e.into_inner());
            while *p == pos && !s.stop.load(Relaxed) {
                p = s.moved.wait(p).unwrap_or_else(|e| e.into_inner());
            }
            if s.stop.load(Relaxed) {
                return;
            }
            pos = *p;
        }
        let mut wanted = Vec::new();
        let (mut w, _) = s.schedule.locate(pos);
        // Nothing past the loader's end is fetched.
        while s.end.is_none_or(|e| w.first < e) {
            let beyond = w.first >= pos + s.ahead;
            wanted.push(w.clone());
            if beyond || s.schedule.is_whole() {
                break;
            }
            w = s.schedule.next_window(&w);
        }
        let mut next = Vec::with_capacity(wanted.len());
        for w in wanted {
            let key = (w.round, w.index);
            match held.iter().position(|(k, _)| *k == key) {
                Some(i) => next.push(held.swap_remove(i)),
                None => next.push((key, s.cache.pin(&w.segments, w.first))),
            }
        }
        // Pins of windows no longer wanted go only now, after the new ones were taken.
        held = next;
    }
}
