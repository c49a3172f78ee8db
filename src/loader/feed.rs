//! What loader workers plan and gather from: a sequence of generations, each a sampler and a
//! gatherer over fixed versions of one dataset or of a mix, valid from a batch number on.
//!
//! A fixed loader has one generation. A loader that follows a dataset gets a new generation
//! whenever a background thread finds a newer committed version: [`Snapshot::refresh`] maps only
//! the new segments and extends the cached indexes, the part's sampler is rebuilt over them, and
//! the generation is published to start at the first batch number no worker has planned yet.
//! So every batch is planned and gathered from one generation (never a mix of versions), the
//! versions only move forward in batch order, and the segments a batch in flight reads stay
//! mapped until the generation is dropped (a segment that retention unlinks meanwhile stays
//! readable through its mapping: unlinking never truncates a mapped file, so no SIGBUS).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use super::spec::{Follow, LoaderSpec};
use super::state::{self, LoaderState, PartState, SamplerState};
use crate::error::{Error, Result};
use crate::gather::{FrameStack, Gatherer, ReadAhead};
use crate::sample::{BuiltSampler, MixSampler, PrioritizedSampler, Sampler, SamplerSpec};
use crate::store::Snapshot;

/// One dataset of a generation.
#[derive(Clone)]
pub(crate) struct GenPart {
    pub(crate) snapshot: Snapshot,
    pub(crate) built: BuiltSampler,
    pub(crate) gatherer: Arc<Gatherer>,
}

/// A sampler and gatherer valid from batch `from` on.
pub(crate) struct Generation {
    pub(crate) from: u64,
    pub(crate) sampler: Arc<dyn Sampler>,
    pub(crate) gatherer: Arc<Gatherer>,
    pub(crate) parts: Vec<GenPart>,
}

/// How one part was asked for.
struct PartDesc {
    spec: SamplerSpec,
    follow: Option<Follow>,
    slices: usize,
}

#[derive(Default)]
struct Gens {
    list: Vec<Arc<Generation>>,
    /// One past the highest batch number a worker has asked a generation for.
    high: u64,
}

/// What following has done, for `stats()` and tests.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct FollowStats {
    /// New generations published.
    pub refreshes: u64,
    /// Refreshes that failed and were retried at the next period (the last error is kept).
    pub failures: u64,
    /// The last failure, in words.
    pub last_error: Option<String>,
    /// Seconds the follow thread spent moving to new versions (reading manifests, mapping new
    /// segments, extending indexes, building samplers and gatherers): CPU taken beside the
    /// workers.
    pub refresh_seconds: f64,
}

pub(crate) struct Feed {
    gens: Mutex<Gens>,
    parts: Vec<PartDesc>,
    columns: Vec<String>,
    read_ahead: ReadAhead,
    frame_stack: Option<FrameStack>,
    rank_world: (u64, u64),
    /// The consumer's position: generations ending at or before it are dropped.
    consumed: AtomicU64,
    stats: Mutex<FollowStats>,
    stop: (Mutex<bool>, Condvar),
    /// The state this feed was opened at, if any (checked against it, priorities restored).
    resumed: Option<Arc<LoaderState>>,
}

impl Feed {
    fn new(
        parts: Vec<PartDesc>,
        columns: Vec<String>,
        (ra, frame_stack): (ReadAhead, Option<FrameStack>),
        rank_world: (u64, u64),
        g: Generation,
    ) -> Arc<Self> {
        Arc::new(Self {
            gens: Mutex::new(Gens {
                list: vec![Arc::new(g)],
                high: 0,
            }),
            parts,
            columns,
            read_ahead: ra,
            frame_stack,
            rank_world,
            consumed: AtomicU64::new(0),
            stats: Mutex::default(),
            stop: (Mutex::new(false), Condvar::new()),
            resumed: None,
        })
    }

    /// The state this feed was opened at, if any.
    pub(crate) fn resumed(&self) -> Option<&LoaderState> {
        self.resumed.as_deref()
    }

    /// The rank and world size of the batches planned.
    pub(crate) fn rank_world(&self) -> (u64, u64) {
        self.rank_world
    }

    /// How workers read the pages of upcoming batches ahead.
    pub(crate) fn read_ahead(&self) -> ReadAhead {
        self.read_ahead
    }

    /// The feed of `spec`; with a state to resume, each part at the version the state was
    /// taken on (a following part at its newest version when that one is gone), the state
    /// checked against the loader and a prioritized sampler's priorities restored.
    pub(crate) fn open(spec: LoaderSpec) -> Result<Arc<Self>> {
        let LoaderSpec {
            parts,
            columns,
            num_slices,
            rank,
            world_size,
            read_ahead,
            resume,
            frame_stack,
            ..
        } = spec;
        let rank_world = (rank, world_size);
        if parts.is_empty() {
            return Err(Error::argument(
                "parts",
                "a loader needs at least one dataset",
            ));
        }
        let weights: Vec<f64> = parts.iter().map(|p| p.weight).collect();
        let counts = if parts.len() == 1 {
            vec![num_slices.unwrap_or(parts[0].sampler.num_slices)]
        } else {
            crate::sample::mix_counts(&weights, num_slices.unwrap_or(parts[0].sampler.num_slices))?
        };
        let mut descs = Vec::new();
        let mut snaps = Vec::new();
        for (i, (p, &n)) in parts.into_iter().zip(&counts).enumerate() {
            let mut s = p.sampler;
            s.num_slices = n;
            if let Some(f) = &p.follow {
                f.check()?;
            }
            if p.follow.is_some() && !s.is_endless() {
                return Err(Error::argument(
                    "follow",
                    format!(
                        "an epoch ({}) over a dataset that grows while it runs is not defined: \
                         follow with an endless sampler (uniform, episodes)",
                        s.kind.name()
                    ),
                ));
            }
            if p.follow.is_some() && s.kind == crate::sample::SamplerKind::Prioritized {
                return Err(Error::argument(
                    "follow",
                    "a prioritized sampler cannot follow a growing dataset yet (its priorities \
                     are per window of one version): follow with sampler='uniform'",
                ));
            }
            let mut snap = p.snapshot;
            if let Some(part) = resume.as_ref().and_then(|r| r.parts.get(i))
                && snap.version() != part.version
            {
                match crate::store::Dataset::open(snap.path())?.snapshot_at(part.version) {
                    Ok(at) => snap = at,
                    Err(_) if p.follow.is_some() => {}
                    Err(e) => {
                        return Err(Error::argument(
                            "state",
                            format!(
                                "cannot resume: the state was taken on version {} of {}, which \
                                 cannot be opened ({e}); a loader resumes on the version its \
                                 state was taken on unless it follows the dataset",
                                part.version,
                                snap.path().display()
                            ),
                        ));
                    }
                }
            }
            descs.push(PartDesc {
                spec: s,
                follow: p.follow,
                slices: n,
            });
            snaps.push(snap);
        }
        let feed_parts = snaps
            .iter()
            .zip(&descs)
            .map(|(snap, d)| build_part(snap, &d.spec, &columns, (read_ahead, frame_stack)))
            .collect::<Result<Vec<_>>>()?;
        let g = assemble(0, feed_parts, &counts)?;
        let mut feed = Self::new(descs, columns, (read_ahead, frame_stack), rank_world, g);
        if let Some(state) = resume {
            let fresh = feed.state(state.next_batch, false);
            state.check_resumable(&fresh, &snaps)?;
            let g = feed.first();
            for (i, (p, part)) in state.parts.iter().zip(&g.parts).enumerate() {
                match (&p.priorities, &part.built.prioritized) {
                    (Some(bytes), Some(sampler)) if part.snapshot.version() == p.version => {
                        sampler.restore_priorities(bytes)?
                    }
                    (Some(_), _) => {
                        return Err(Error::argument(
                            "state",
                            format!(
                                "cannot resume: part {i} has saved priorities for another version"
                            ),
                        ));
                    }
                    (None, Some(_)) if part.snapshot.version() == p.version => {
                        return Err(Error::argument(
                            "state",
                            format!(
                                "cannot resume: part {i}'s prioritized sampler draws by its \
                                 priorities, and the state has none (keep the `priorities` of \
                                 state_dict(), or use LoaderState::to_bytes, not to_json)"
                            ),
                        ));
                    }
                    _ => {}
                }
            }
            Arc::get_mut(&mut feed).expect("not shared yet").resumed = Some(state);
        }
        if feed.parts.iter().any(|p| p.follow.is_some()) {
            let weak = Arc::downgrade(&feed);
            std::thread::Builder::new()
                .name("trajstore-follow".into())
                .spawn(move || follow_loop(weak))
                .map_err(|e| {
                    Error::invalid_argument(format!("cannot start the follow thread: {e}"))
                })?;
        }
        Ok(feed)
    }

    /// The generation batch `k` is planned from (the last one starting at or before `k`).
    pub(crate) fn generation(&self, k: u64) -> Arc<Generation> {
        let mut g = self.gens.lock().unwrap_or_else(|e| e.into_inner());
        g.high = g.high.max(k.saturating_add(1));
        g.list
            .iter()
            .rev()
            .find(|x| x.from <= k)
            .unwrap_or(&g.list[0])
            .clone()
    }

    /// The generation batch `k` would be planned from, without claiming `k`.
    pub(crate) fn peek(&self, k: u64) -> Arc<Generation> {
        let g = self.gens.lock().unwrap_or_else(|e| e.into_inner());
        g.list
            .iter()
            .rev()
            .find(|x| x.from <= k)
            .unwrap_or(&g.list[0])
            .clone()
    }

    /// The first generation (sizes, columns, epochs: the same in all).
    pub(crate) fn first(&self) -> Arc<Generation> {
        self.gens.lock().unwrap_or_else(|e| e.into_inner()).list[0].clone()
    }

    /// Whether a part follows new versions.
    pub(crate) fn follows(&self) -> bool {
        self.parts.iter().any(|p| p.follow.is_some())
    }

    /// Records that the consumer is at batch `position`.
    pub(crate) fn consumed(&self, position: u64) {
        self.consumed.store(position, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> FollowStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The versions batch `k` is planned from, one per part.
    pub(crate) fn versions(&self, k: u64) -> Vec<u64> {
        self.peek(k)
            .parts
            .iter()
            .map(|p| p.snapshot.version())
            .collect()
    }

    /// The prioritized samplers of the generation of batch `k`, one entry per part.
    pub(crate) fn prioritized(&self, k: u64) -> Vec<Option<Arc<PrioritizedSampler>>> {
        self.peek(k)
            .parts
            .iter()
            .map(|p| p.built.prioritized.clone())
            .collect()
    }

    /// The state of a loader whose next batch is `next` (with `priorities`: saved from the
    /// prioritized samplers of that batch's generation).
    pub(crate) fn state(&self, next: u64, with_priorities: bool) -> LoaderState {
        let (rank, world_size) = self.rank_world;
        let g = self.peek(next);
        let per_epoch = g.sampler.batches_per_epoch();
        LoaderState {
            format: state::STATE_FORMAT.into(),
            state_version: state::STATE_VERSION,
            next_batch: next,
            epoch: per_epoch.map(|per| next / per.div_ceil(world_size).max(1)),
            rank,
            world_size,
            num_slices: g.sampler.num_slices(),
            slice_len: g.sampler.slice_len(),
            parts: g
                .parts
                .iter()
                .zip(&self.parts)
                .map(|(p, d)| PartState {
                    dataset_id: state::dataset_id(&p.snapshot),
                    version: p.snapshot.version(),
                    fingerprint: state::fingerprint(&p.snapshot),
                    follow: d.follow.is_some(),
                    slices: d.slices,
                    sampler: Some(SamplerState::of(&d.spec)),
                    priorities: with_priorities.then_some(()).and(
                        p.built
                            .prioritized
                            .as_ref()
                            .map(|s| Arc::new(s.save_priorities())),
                    ),
                })
                .collect(),
            iteration_end: None,
        }
    }

    /// Moves each following part whose period has come to its newest version; publishes a
    /// generation when one changed. Returns whether it did.
    fn refresh(&self, due: &[bool]) -> Result<bool> {
        let last = self
            .gens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .list
            .last()
            .cloned();
        let last = last.expect("a generation");
        let mut parts = last.parts.clone();
        let mut changed = false;
        for (i, part) in parts.iter_mut().enumerate() {
            if !due[i] {
                continue;
            }
            let mut snap = part.snapshot.clone();
            if snap.refresh()? {
                *part = build_part(
                    &snap,
                    &self.parts[i].spec,
                    &self.columns,
                    (self.read_ahead, self.frame_stack),
                )?;
                changed = true;
            }
        }
        if !changed {
            return Ok(false);
        }
        let counts: Vec<usize> = self.parts.iter().map(|p| p.slices).collect();
        let mut gens = self.gens.lock().unwrap_or_else(|e| e.into_inner());
        let g = assemble(gens.high, parts, &counts)?;
        gens.list.push(Arc::new(g));
        // Generations that end at or before the consumer's position are done with.
        let consumed = self.consumed.load(Ordering::Relaxed);
        while gens.list.len() > 1 && gens.list[1].from <= consumed {
            gens.list.remove(0);
        }
        Ok(true)
    }
}

impl Drop for Feed {
    /// Stops the follow thread (it holds no reference between its looks, and exits at its next
    /// wake-up, within 10 ms).
    fn drop(&mut self) {
        *self.stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.stop.1.notify_all();
    }
}

fn build_part(
    snap: &Snapshot,
    spec: &SamplerSpec,
    columns: &[String],
    (ra, stack): (ReadAhead, Option<FrameStack>),
) -> Result<GenPart> {
    let names: Vec<&str> = columns.iter().map(String::as_str).collect();
    let gatherer = Gatherer::with_frame_stack(snap, &names, stack)?;
    gatherer.set_read_ahead(ra);
    Ok(GenPart {
        snapshot: snap.clone(),
        built: spec.build(snap)?,
        gatherer: Arc::new(gatherer),
    })
}

/// One generation from its parts: the part itself, or a mix of them.
fn assemble(from: u64, parts: Vec<GenPart>, counts: &[usize]) -> Result<Generation> {
    let (sampler, gatherer): (Arc<dyn Sampler>, Arc<Gatherer>) = if parts.len() == 1 {
        (parts[0].built.sampler.clone(), parts[0].gatherer.clone())
    } else {
        (
            Arc::new(MixSampler::try_new(
                parts.iter().map(|p| p.built.sampler.clone()).collect(),
            )?),
            Arc::new(Gatherer::mixed(
                parts.iter().map(|p| p.gatherer.clone()).collect(),
                counts,
            )?),
        )
    };
    Ok(Generation {
        from,
        sampler,
        gatherer,
        parts,
    })
}

/// The follow thread: wakes every 10 ms (or at the stop), refreshes the parts whose period
/// (time or batches since their last refresh) has come.
fn follow_loop(feed: Weak<Feed>) {
    let Some(f) = feed.upgrade() else { return };
    let follows: Vec<Option<Follow>> = f.parts.iter().map(|p| p.follow).collect();
    let mut last: Vec<(Instant, u64)> = vec![(Instant::now(), 0); follows.len()];
    drop(f);
    loop {
        let Some(f) = feed.upgrade() else { return };
        {
            let stopped = f.stop.0.lock().unwrap_or_else(|e| e.into_inner());
            let (stopped, _) = f
                .stop
                .1
                .wait_timeout(stopped, Duration::from_millis(10))
                .unwrap_or_else(|e| e.into_inner());
            if *stopped {
                return;
            }
        }
        let consumed = f.consumed.load(Ordering::Relaxed);
        let due: Vec<bool> = follows
            .iter()
            .zip(&last)
            .map(|(fo, (t, b))| {
                fo.is_some_and(|fo| {
                    fo.every.is_some_and(|d| t.elapsed() >= d)
                        || fo.every_batches.is_some_and(|n| consumed >= b + n)
                })
            })
            .collect();
        if !due.contains(&true) {
            continue;
        }
        let t = Instant::now();
        match f.refresh(&due) {
            Ok(changed) => {
                if changed {
                    let mut s = f.stats.lock().unwrap_or_else(|e| e.into_inner());
                    s.refreshes += 1;
                    s.refresh_seconds += t.elapsed().as_secs_f64();
                }
            }
            Err(e) => {
                // A segment removed between reading a manifest and mapping it (retention by a
                // writer), a manifest being replaced: the next period reads the newest again.
                let mut s = f.stats.lock().unwrap_or_else(|e| e.into_inner());
                s.failures += 1;
                s.last_error = Some(e.to_string());
            }
        }
        for (l, d) in last.iter_mut().zip(&due) {
            if *d {
                *l = (Instant::now(), consumed);
            }
        }
    }
}
