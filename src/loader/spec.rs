//! What a loader samples, described by data: one dataset or a mix of several, each with the
//! options of its sampler and whether the loader follows its new versions.

use std::sync::Arc;
use std::time::Duration;

use super::state::LoaderState;
use crate::gather::{FrameStack, ReadAhead};
#[cfg(feature = "remote")]
use crate::remote::Stream;
use crate::sample::SamplerSpec;
use crate::store::Snapshot;

/// How often a loader that follows a dataset looks for a newer committed version (whichever
/// comes first). A look that finds none costs one `stat`-sized directory read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Follow {
    /// Look after this much time.
    pub every: Option<Duration>,
    /// Look after this many batches consumed.
    pub every_batches: Option<u64>,
}

/// The longest period [`Follow::every`] may have: a day (a loader that looks less often does
/// not follow in any useful sense, and longer periods overflow deadlines).
pub const MAX_FOLLOW_PERIOD: Duration = Duration::from_secs(86_400);

impl Follow {
    /// Looks every `secs` seconds: a number in (0, [`MAX_FOLLOW_PERIOD`]], else
    /// [`crate::Error::InvalidArgument`] about `argument`.
    pub fn every_secs(argument: &str, secs: f64) -> crate::Result<Self> {
        if !(secs.is_finite() && secs > 0.0 && secs <= MAX_FOLLOW_PERIOD.as_secs_f64()) {
            return Err(crate::Error::argument(
                argument,
                format!(
                    "follow every {secs} seconds: a period of more than 0 and at most {} \
                     seconds (a day)",
                    MAX_FOLLOW_PERIOD.as_secs()
                ),
            ));
        }
        Ok(Self::every(Duration::from_secs_f64(secs)))
    }

    /// Refuses a period of zero or longer than [`MAX_FOLLOW_PERIOD`].
    pub(crate) fn check(&self) -> crate::Result<()> {
        match self.every {
            Some(d) if d.is_zero() || d > MAX_FOLLOW_PERIOD => Err(crate::Error::argument(
                "follow",
                format!(
                    "follow every {d:?}: a period of more than 0 and at most {} seconds (a day)",
                    MAX_FOLLOW_PERIOD.as_secs()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Looks every `d`.
    pub fn every(d: Duration) -> Self {
        Self {
            every: Some(d),
            every_batches: None,
        }
    }
    /// Looks every `n` batches consumed.
    pub fn every_batches(n: u64) -> Self {
        Self {
            every: None,
            every_batches: Some(n.max(1)),
        }
    }
}

impl Default for Follow {
    /// Every second.
    fn default() -> Self {
        Self::every(Duration::from_secs(1))
    }
}

/// How a streamed source's loaders move to newer versions ([`LoaderSpec::follow`],
/// [`LoaderSpec::follow_by_caller`]).
#[cfg(feature = "remote")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFollow {
    /// The loader looks for a newer manifest at every round boundary (one rank).
    Look,
    /// The loader stops at every round boundary; the caller sets the next round's version
    /// (the same on every rank) and starts the next loader.
    Caller,
}

/// One dataset of a [`LoaderSpec`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PartSpec {
    /// The snapshot the loader starts from (a state's version replaces it on resume).
    pub snapshot: Snapshot,
    /// Its sampler (in a mix, `num_slices` is set from the weights).
    pub sampler: SamplerSpec,
    /// Its share of every batch in a mix.
    pub weight: f64,
    /// Whether and how often the loader moves to its newest version.
    pub follow: Option<Follow>,
}

/// What a loader's batches are: the gathered columns; one dataset, or several mixed in fixed
/// proportions per batch, each with its sampler and whether it follows new versions; this
/// process's rank among data-parallel ranks; how upcoming batches are read ahead; and the state
/// a run resumes from. [`super::BatchSource::open`] opens it, and every loader is made from that
/// source with its own `new` (`Loader`, `StagedLoader`, `TorchLoader`, `StreamLoader`).
///
/// ```no_run
/// # use trajstore::*;
/// # fn main() -> Result<()> {
/// let offline = trajstore::open("d4rl-hopper")?;
/// let online = trajstore::open("online")?;
/// let uniform = |seed| SamplerSpec::uniform(32, 256).with_seed(seed);
/// // RLPD's symmetric sampling: half of every batch from each, following the online data.
/// let spec = LoaderSpec::new(&["observation", "action", "reward"])
///     .part(offline, uniform(0), 0.5)
///     .part(online, uniform(1), 0.5)
///     .follow(Follow::default());
/// let source = BatchSource::open(spec)?;
/// let mut loader = Loader::new(&source, LoaderOptions::default())?;
/// let batch = loader.next_batch().unwrap();
/// assert_eq!(batch.source.iter().filter(|&&s| s == 1).count(), 128);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LoaderSpec {
    pub(crate) parts: Vec<PartSpec>,
    pub(crate) columns: Vec<String>,
    pub(crate) num_slices: Option<usize>,
    pub(crate) rank: u64,
    pub(crate) world_size: u64,
    pub(crate) read_ahead: ReadAhead,
    pub(crate) resume: Option<Arc<LoaderState>>,
    pub(crate) frame_stack: Option<FrameStack>,
    #[cfg(feature = "remote")]
    pub(crate) streamed: Vec<(Stream, SamplerSpec, f64)>,
    /// Whether and how a streamed dataset's loaders move to its newer versions.
    #[cfg(feature = "remote")]
    pub(crate) stream_follow: Option<StreamFollow>,
}

impl Default for LoaderSpec {
    fn default() -> Self {
        Self {
            parts: Vec::new(),
            columns: Vec::new(),
            num_slices: None,
            rank: 0,
            world_size: 1,
            read_ahead: ReadAhead::Auto,
            resume: None,
            frame_stack: None,
            #[cfg(feature = "remote")]
            streamed: Vec::new(),
            #[cfg(feature = "remote")]
            stream_follow: None,
        }
    }
}

impl LoaderSpec {
    /// Gathers `columns` (any stored column, plus a derived `next_observation`).
    pub fn new(columns: &[&str]) -> Self {
        Self {
            columns: columns.iter().map(|c| c.to_string()).collect(),
            ..Self::default()
        }
    }
    /// One dataset sampled by `sampler`.
    pub fn single(snapshot: Snapshot, sampler: SamplerSpec, columns: &[&str]) -> Self {
        Self::new(columns).part(snapshot, sampler, 1.0)
    }
    /// One dataset in object storage, read through the stream's bounded cache by a
    /// [`super::StreamLoader`] and sampled by `sampler` (uniform or epoch; see
    /// [`super::stream`] for how windows of cached files are sampled).
    #[cfg(feature = "remote")]
    pub fn streamed(stream: Stream, sampler: SamplerSpec, columns: &[&str]) -> Self {
        Self {
            streamed: vec![(stream, sampler, 1.0)],
            ..Self::new(columns)
        }
    }
    /// Adds a dataset in object storage with its share `weight` of every batch: a mix of
    /// streams (after [`LoaderSpec::streamed`], whose weight is 1, or from
    /// [`LoaderSpec::new`]), each read through its own
    /// bounded cache and sampled by its own `sampler` (uniform; its `num_slices` is set to the
    /// part's share, from [`LoaderSpec::with_num_slices`] or the first sampler's). Batch `k`
    /// holds each stream's batch `k` of its share, in part order, as a mix of local datasets
    /// does; no following.
    #[cfg(feature = "remote")]
    pub fn stream_part(mut self, stream: Stream, sampler: SamplerSpec, weight: f64) -> Self {
        self.streamed.push((stream, sampler, weight));
        self
    }
    /// Adds a dataset with its share `weight` of every batch.
    pub fn part(mut self, snapshot: Snapshot, sampler: SamplerSpec, weight: f64) -> Self {
        self.parts.push(PartSpec {
            snapshot,
            sampler,
            weight,
            follow: None,
        });
        self
    }
    /// Follows the last added dataset's new versions. For a streamed dataset
    /// ([`LoaderSpec::streamed`], one rank), the loader looks for a newer version at the end of
    /// every round (see [`super::StreamLoader`]); `f`'s period is not used.
    pub fn follow(mut self, f: Follow) -> Self {
        #[cfg(feature = "remote")]
        if !self.streamed.is_empty() {
            self.stream_follow = Some(StreamFollow::Look);
        }
        if let Some(p) = self.parts.last_mut() {
            p.follow = Some(f);
        }
        self
    }
    /// A streamed dataset's loaders move to newer versions when the caller says so: a loader
    /// stops at every round boundary (its `next_batch` returns `None` there), the caller decides
    /// the version of the next round, the same on every rank (e.g. rank 0 reads the newest and a
    /// collective broadcasts it), sets it with [`super::BatchSource::set_stream_cursor`] and
    /// starts the next loader at that batch. For data-parallel ranks, which must agree on every
    /// round's version; [`LoaderSpec::follow`] is for one rank.
    #[cfg(feature = "remote")]
    pub fn follow_by_caller(mut self) -> Self {
        if !self.streamed.is_empty() {
            self.stream_follow = Some(StreamFollow::Caller);
        }
        self
    }
    /// Slices per batch of a mix (default: the first part's `num_slices`); the parts' counts
    /// are this split by the weights, exactly the same in every batch.
    pub fn with_num_slices(mut self, n: usize) -> Self {
        self.num_slices = Some(n);
        self
    }
    /// This process is `rank` of `world_size` data-parallel ranks (default 0 of 1): ranks draw
    /// disjoint streams of batches (batch `k` of rank `r` is the sampler's batch
    /// [`super::global_batch`]).
    pub fn with_rank(mut self, rank: u64, world_size: u64) -> Self {
        self.rank = rank;
        self.world_size = world_size;
        self
    }
    /// Whether each worker asks the kernel for the pages of the batch it gathers next while it
    /// copies the current one (`madvise(WILLNEED)`), so that data not in the page cache
    /// (datasets larger than RAM, cold starts) arrives with many reads in flight.
    /// [`ReadAhead::Auto`] (default) does it while the gatherer finds data missing from memory
    /// and costs nothing on data in memory.
    pub fn with_read_ahead(mut self, mode: ReadAhead) -> Self {
        self.read_ahead = mode;
        self
    }
    /// Stacks the frames of frame columns (pixel observations, and a `next_observation` of
    /// them): each step holds its last `K` frames, `[K, H, W]` (or `[K, H, W, C]`), built by the
    /// gather from frames stored once (see [`FrameStack`] for the padding before an episode's
    /// first frame). Every loader of the source gives the same stacks.
    pub fn with_frame_stack(mut self, stack: FrameStack) -> Self {
        self.frame_stack = Some(stack);
        self
    }
    /// A frame cache ([`FrameStack::with_cache`]) is filled once, for one snapshot: a spec that
    /// also follows new versions or streams from object storage is an
    /// [`crate::Error::InvalidArgument`] about `frame_cache`.
    pub(crate) fn check_frame_cache(&self) -> crate::Result<()> {
        if self.frame_stack.is_none_or(|s| s.cache == 0) {
            return Ok(());
        }
        #[cfg(feature = "remote")]
        let streamed = !self.streamed.is_empty();
        #[cfg(not(feature = "remote"))]
        let streamed = false;
        let why = match (streamed, self.parts.iter().any(|p| p.follow.is_some())) {
            (true, _) => {
                "a loader that streams from object storage has none (pull the dataset to \
                 cache its frames)"
            }
            (_, true) => "a loader that follows new versions has none (drop one or the other)",
            _ => return Ok(()),
        };
        Err(crate::Error::argument(
            "frame_cache",
            format!("decoded frames are cached once, for one snapshot: {why}"),
        ))
    }
    /// Continues exactly where `state` was taken (`Loader::state`): the source opens each
    /// dataset at the version the state names and checks that the state is of these datasets,
    /// this rank and world size and these sampler options, and restores a prioritized sampler's
    /// priorities. A loader made from it without an explicit
    /// [`super::LoaderOptions::with_start`] yields the batch the interrupted loader would have
    /// returned next, and all that follow, whatever the number of workers before and after
    /// (inside an interrupted iteration, `max_batches` or an epoch, only the rest of it); give
    /// a start to iterate again from another batch.
    pub fn with_resume(mut self, state: LoaderState) -> Self {
        self.resume = Some(Arc::new(state));
        self
    }
}
