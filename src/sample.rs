//! Samplers: turn a batch number into an index plan (which episode, which steps) using cached
//! indexes, never scanning transitions.
//!
//! Every sampler is a pure function of `(seed, batch number)`: [`Sampler::plan`] takes `&self`,
//! so any number of loader workers can share one sampler and the stream of batches is the same
//! whatever the worker count. Slice samplers cost O(B) per batch (an alias table over episodes,
//! then a uniform window inside the episode); window lookups by number are O(log E) binary
//! searches over prefix sums. Nothing depends on the number of transitions.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};
use crate::index::EpisodeIndex;

/// Which windows of an episode a slice may cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BoundaryPolicy {
    /// Only windows fully inside an episode; episodes shorter than the slice are never sampled.
    Strict,
    /// Windows may run past the episode's end (the padded steps are masked out). Every step of
    /// every episode can start a slice.
    Pad,
    /// Windows may start up to `left` steps before the episode's start and end up to `right`
    /// steps after its end; overhanging steps are masked out. Both are capped at `slice_len - 1`
    /// so that every window holds at least one step of its episode.
    Span {
        /// Maximum steps before step 0.
        left: u32,
        /// Maximum steps after the last step.
        right: u32,
    },
}

impl BoundaryPolicy {
    /// `(left, right)` overhangs allowed for slices of `slice_len`.
    pub fn overhang(&self, slice_len: u32) -> (u64, u64) {
        match *self {
            BoundaryPolicy::Strict => (0, 0),
            BoundaryPolicy::Pad => (0, slice_len.saturating_sub(1) as u64),
            // A window must keep at least one step of its episode.
            BoundaryPolicy::Span { left, right } => {
                let most = slice_len.saturating_sub(1);
                (left.min(most) as u64, right.min(most) as u64)
            }
        }
    }
}

impl std::str::FromStr for BoundaryPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "strict" => Ok(Self::Strict),
            "pad" => Ok(Self::Pad),
            _ => {
                let bad = || {
                    Error::InvalidArgument(format!(
                        "boundary policy `{s}`: use strict, pad or span:LEFT:RIGHT"
                    ))
                };
                let rest = s.strip_prefix("span:").ok_or_else(bad)?;
                let (l, r) = rest.split_once(':').ok_or_else(bad)?;
                Ok(Self::Span {
                    left: l.parse().map_err(|_| bad())?,
                    right: r.parse().map_err(|_| bad())?,
                })
            }
        }
    }
}

/// Valid window starts of every episode for one (slice length, policy): prefix sums over
/// episodes, O(episodes) memory (8 bytes each), built in O(episodes) from the episode index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceIndex {
    slice_len: u32,
    policy: BoundaryPolicy,
    left: u64,
    right: u64,
    /// `prefix[i]` = windows of episodes `0..i`; `prefix.len() == episodes + 1`.
    prefix: Vec<u64>,
}

impl SliceIndex {
    /// Builds the index of `slice_len`-step windows under `policy`. O(episodes).
    pub fn build(episodes: &EpisodeIndex, slice_len: u32, policy: BoundaryPolicy) -> Result<Self> {
        if slice_len == 0 {
            return Err(Error::InvalidArgument(
                "slice length must be at least 1".into(),
            ));
        }
        let (left, right) = policy.overhang(slice_len);
        let mut idx = SliceIndex {
            slice_len,
            policy,
            left,
            right,
            prefix: Vec::with_capacity(episodes.len() + 1),
        };
        idx.prefix.push(0);
        idx.push(episodes.lengths());
        Ok(idx)
    }

    fn windows_of(&self, len: u64) -> u64 {
        (len + self.left + self.right + 1).saturating_sub(self.slice_len as u64)
    }

    fn push(&mut self, lengths: &[u64]) {
        let mut acc = *self.prefix.last().expect("prefix starts with 0");
        for &l in lengths {
            acc += self.windows_of(l);
            self.prefix.push(acc);
        }
    }

    /// This index for a snapshot whose episode index is `episodes`, given that this one was built
    /// for a snapshot with `dropped` fewer leading episodes (retention) and fewer trailing ones:
    /// O(new episodes + kept episodes) copying, no recomputation of kept episodes.
    pub fn extended(&self, episodes: &EpisodeIndex, dropped: usize) -> Self {
        let base = self.prefix[dropped.min(self.prefix.len() - 1)];
        let kept = &self.prefix[dropped.min(self.prefix.len() - 1)..];
        let mut prefix = Vec::with_capacity(episodes.len() + 1);
        prefix.extend(kept.iter().map(|p| p - base));
        let mut idx = SliceIndex {
            prefix,
            ..self.clone_header()
        };
        let have = idx.prefix.len() - 1;
        idx.push(&episodes.lengths()[have..]);
        idx
    }

    fn clone_header(&self) -> Self {
        SliceIndex {
            slice_len: self.slice_len,
            policy: self.policy,
            left: self.left,
            right: self.right,
            prefix: vec![],
        }
    }

    /// Slice length.
    pub fn slice_len(&self) -> u32 {
        self.slice_len
    }
    /// Boundary policy.
    pub fn policy(&self) -> BoundaryPolicy {
        self.policy
    }
    /// Total number of windows.
    pub fn num_windows(&self) -> u64 {
        *self.prefix.last().expect("non-empty")
    }
    /// Number of episodes indexed.
    pub fn num_episodes(&self) -> usize {
        self.prefix.len() - 1
    }
    /// Windows of episode position `e`.
    pub fn windows(&self, e: usize) -> u64 {
        self.prefix[e + 1] - self.prefix[e]
    }
    /// First window number of episode position `e`.
    pub fn first_window(&self, e: usize) -> u64 {
        self.prefix[e]
    }
    /// The window numbered `w` (`0..num_windows()`): (episode position, start step). The start is
    /// negative when the window overhangs the episode's start. O(log E).
    pub fn window(&self, w: u64) -> (usize, i64) {
        let e = self.prefix.partition_point(|&p| p <= w) - 1;
        (e, self.start_in(e, w - self.prefix[e]))
    }
    /// Start step of the `k`-th window of episode `e`.
    pub fn start_in(&self, _e: usize, k: u64) -> i64 {
        k as i64 - self.left as i64
    }
}

/// One slice of a plan: `len` steps of the episode at position `episode` of the snapshot's
/// episode index, starting at step `start` (negative or running past the end under padding
/// policies; those steps are masked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceRef {
    /// Episode position in the episode index (its id is `first_id + episode`).
    pub episode: u32,
    /// First step of the window.
    pub start: i64,
    /// Number of steps of the window (the batch's slice length).
    pub len: u32,
}

/// Something that turns batch numbers into plans.
pub trait Sampler: Send + Sync {
    /// Fills `out` with the slices of batch number `batch` (cleared first). Deterministic:
    /// the same sampler and batch number always give the same plan.
    fn plan(&self, batch: u64, out: &mut Vec<SliceRef>);
    /// Steps per slice of the batches this sampler plans (the padded length for whole episodes).
    fn slice_len(&self) -> u32;
    /// Slices per batch (B); a plan never holds more, and holds fewer only at the end of an
    /// epoch without `drop_last`.
    fn num_slices(&self) -> usize;
    /// Number of batches per epoch for samplers without replacement, `None` for endless ones.
    fn batches_per_epoch(&self) -> Option<u64> {
        None
    }
}

/// How a slice sampler picks episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weighting {
    /// Uniform over all valid windows: an episode is picked in proportion to its number of
    /// windows (each transition-window equally likely). The default.
    #[default]
    Windows,
    /// Uniform over episodes that have at least one window, then uniform over its windows
    /// (TorchRL `SliceSampler` semantics).
    Episodes,
}

/// Walker/Vose alias table: O(n) to build, O(1) per draw with one 64-bit random number and one
/// 8-byte entry read (a single cache line), so drawing stays cheap when the table is larger than
/// the CPU caches.
#[derive(Debug, Clone)]
struct AliasTable {
    /// Per entry: keep-probability scaled to 2^32, and the alias.
    entries: Vec<(u32, u32)>,
    /// Positions the table's entries stand for (`None`: entry `i` is position `i`).
    items: Option<Vec<u32>>,
}

impl AliasTable {
    fn new(items: Option<Vec<u32>>, weights: &[f64]) -> Result<Self> {
        let n = weights.len();
        let total: f64 = weights.iter().sum();
        if n == 0 || total <= 0.0 || !total.is_finite() || u32::try_from(n).is_err() {
            return Err(Error::InvalidArgument(
                "nothing to sample: every episode has zero weight or no valid window".into(),
            ));
        }
        let mut prob: Vec<f64> = weights.iter().map(|w| w * n as f64 / total).collect();
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| prob[i] < 1.0);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            alias[s] = l as u32;
            prob[l] -= 1.0 - prob[s];
            if prob[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        for i in large.into_iter().chain(small) {
            prob[i] = 1.0;
        }
        let scale = |p: f64| {
            if p >= 1.0 {
                u32::MAX
            } else {
                (p * 4_294_967_296.0) as u32
            }
        };
        Ok(Self {
            entries: prob
                .iter()
                .zip(&alias)
                .map(|(&p, &a)| (scale(p), a))
                .collect(),
            items,
        })
    }

    #[inline]
    fn draw(&self, rng: &mut impl Rng) -> u32 {
        let r: u64 = rng.random();
        // Lemire's multiply-shift maps the high half to an entry; the low half is the coin.
        let i = (((r >> 32) * self.entries.len() as u64) >> 32) as usize;
        let (keep, alias) = self.entries[i];
        let j = if (r as u32) < keep || keep == u32::MAX {
            i as u32
        } else {
            alias
        };
        match &self.items {
            Some(items) => items[j as usize],
            None => j,
        }
    }
}

/// The per-batch random generator: a pure function of (seed, batch).
pub fn batch_rng(seed: u64, batch: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(seed ^ mix(batch.wrapping_add(0x632b_e59b_d9b4_e019))))
}

/// SplitMix64 finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Options of a [`SliceSampler`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SliceOptions {
    /// Steps per slice.
    pub slice_len: u32,
    /// Slices per batch.
    pub num_slices: usize,
    /// Boundary policy.
    pub policy: BoundaryPolicy,
    /// How episodes are picked.
    pub weighting: Weighting,
    /// Seed.
    pub seed: u64,
    /// Optional weight per episode position (multiplies the weighting); 0 excludes an episode.
    pub episode_weights: Option<Vec<f64>>,
    /// Optional restriction to these episode ids.
    pub episode_ids: Option<Vec<u64>>,
}

impl SliceOptions {
    /// `num_slices` slices of `slice_len` steps, strict policy, windows weighting, seed 0.
    pub fn new(slice_len: u32, num_slices: usize) -> Self {
        Self {
            slice_len,
            num_slices,
            policy: BoundaryPolicy::Strict,
            weighting: Weighting::Windows,
            seed: 0,
            episode_weights: None,
            episode_ids: None,
        }
    }
    /// From a total `batch_size` (transitions) and a slice length: `batch_size / slice_len` slices.
    pub fn from_batch_size(batch_size: usize, slice_len: u32) -> Result<Self> {
        if slice_len == 0 || !batch_size.is_multiple_of(slice_len as usize) {
            return Err(Error::InvalidArgument(format!(
                "batch size {batch_size} is not a multiple of the slice length {slice_len}"
            )));
        }
        Ok(Self::new(slice_len, batch_size / slice_len as usize))
    }
    /// Sets the boundary policy.
    pub fn with_policy(mut self, p: BoundaryPolicy) -> Self {
        self.policy = p;
        self
    }
    /// Sets the weighting.
    pub fn with_weighting(mut self, w: Weighting) -> Self {
        self.weighting = w;
        self
    }
    /// Sets the seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Weights episodes (by position in the episode index).
    pub fn with_episode_weights(mut self, w: Vec<f64>) -> Self {
        self.episode_weights = Some(w);
        self
    }
    /// Restricts sampling to these episode ids.
    pub fn with_episode_ids(mut self, ids: Vec<u64>) -> Self {
        self.episode_ids = Some(ids);
        self
    }
}

/// Samples `num_slices` windows per batch, with replacement.
pub struct SliceSampler {
    index: Arc<SliceIndex>,
    num_slices: usize,
    seed: u64,
    /// Alias table over episode positions; a uniform window inside the drawn episode follows.
    pick: AliasTable,
}

impl std::fmt::Debug for SliceSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceSampler")
            .field("slice_len", &self.index.slice_len)
            .field("num_slices", &self.num_slices)
            .finish_non_exhaustive()
    }
}

impl SliceSampler {
    /// A sampler over `index` (see [`crate::Snapshot::slice_index`] for the cached one).
    /// Cost O(1), or O(E) when weights or a subset need an alias table.
    pub fn new(
        index: Arc<SliceIndex>,
        episodes: &EpisodeIndex,
        opts: &SliceOptions,
    ) -> Result<Self> {
        if opts.num_slices == 0 {
            return Err(Error::InvalidArgument(
                "num_slices must be at least 1".into(),
            ));
        }
        if index.slice_len != opts.slice_len || index.policy != opts.policy {
            return Err(Error::InvalidArgument(
                "slice index does not match the options".into(),
            ));
        }
        let n = index.num_episodes();
        let mut allowed: Option<Vec<bool>> = None;
        if let Some(ids) = &opts.episode_ids {
            let mut a = vec![false; n];
            for &id in ids {
                let pos = id
                    .checked_sub(episodes.first_id())
                    .map(|p| p as usize)
                    .filter(|&p| p < n);
                match pos {
                    Some(p) => a[p] = true,
                    None => {
                        return Err(Error::InvalidArgument(format!(
                            "episode id {id} is not in this snapshot"
                        )));
                    }
                }
            }
            allowed = Some(a);
        }
        if let Some(w) = &opts.episode_weights
            && w.len() != n
        {
            return Err(Error::InvalidArgument(format!(
                "{} episode weights for {n} episodes",
                w.len()
            )));
        }
        let plain = opts.weighting == Weighting::Windows
            && opts.episode_weights.is_none()
            && allowed.is_none();
        let pick = if plain {
            if index.num_windows() == 0 {
                return Err(Error::InvalidArgument(format!(
                    "no episode has a window of {} steps under {:?}",
                    opts.slice_len, opts.policy
                )));
            }
            let weights: Vec<f64> = (0..n).map(|e| index.windows(e) as f64).collect();
            AliasTable::new(None, &weights)?
        } else {
            let mut items = vec![];
            let mut weights = vec![];
            for e in 0..n {
                let windows = index.windows(e);
                if windows == 0 || allowed.as_ref().is_some_and(|a| !a[e]) {
                    continue;
                }
                let base = match opts.weighting {
                    Weighting::Windows => windows as f64,
                    Weighting::Episodes => 1.0,
                };
                let w = opts.episode_weights.as_ref().map_or(1.0, |w| w[e]);
                if !(w >= 0.0 && w.is_finite()) {
                    return Err(Error::InvalidArgument(format!(
                        "episode weight {w} at position {e}"
                    )));
                }
                if w > 0.0 {
                    items.push(e as u32);
                    weights.push(base * w);
                }
            }
            AliasTable::new(Some(items), &weights)?
        };
        Ok(Self {
            index,
            num_slices: opts.num_slices,
            seed: opts.seed,
            pick,
        })
    }

    /// Slices per batch.
    pub fn num_slices(&self) -> usize {
        self.num_slices
    }
}

impl Sampler for SliceSampler {
    fn plan(&self, batch: u64, out: &mut Vec<SliceRef>) {
        out.clear();
        let mut rng = batch_rng(self.seed, batch);
        let len = self.index.slice_len;
        for _ in 0..self.num_slices {
            let e = self.pick.draw(&mut rng) as usize;
            let start = self
                .index
                .start_in(e, rng.random_range(0..self.index.windows(e)));
            out.push(SliceRef {
                episode: e as u32,
                start,
                len,
            });
        }
    }
    fn num_slices(&self) -> usize {
        self.num_slices
    }
    fn slice_len(&self) -> u32 {
        self.index.slice_len
    }
}

/// A keyed pseudo-random permutation of `0..n` (4-round Feistel network with cycle walking):
/// O(1) memory whatever `n`, so epochs over hundreds of millions of windows cost nothing to set up.
#[derive(Debug, Clone)]
struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Permutation {
    fn new(n: u64, seed: u64) -> Self {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let k0 = mix(seed);
        Self {
            n,
            half_bits,
            keys: [k0, mix(k0 ^ 1), mix(k0 ^ 2), mix(k0 ^ 3)],
        }
    }
    fn apply(&self, mut x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        loop {
            let (mut l, mut r) = (x >> self.half_bits, x & mask);
            for k in self.keys {
                (l, r) = (r, l ^ (mix(r ^ k) & mask));
            }
            x = (l << self.half_bits) | r;
            if x < self.n {
                return x;
            }
        }
    }
}

/// Epochs without replacement: every window (or, with `whole_episodes`, every episode) is visited
/// exactly once per epoch, in a shuffled order that changes every epoch.
pub struct EpochSampler {
    index: Arc<SliceIndex>,
    num_slices: usize,
    seed: u64,
    drop_last: bool,
    /// Episode positions to visit, or `None` for every window.
    episodes: Option<Vec<u32>>,
}

impl EpochSampler {
    /// Visits every window of `index` once per epoch.
    pub fn windows(
        index: Arc<SliceIndex>,
        num_slices: usize,
        seed: u64,
        drop_last: bool,
    ) -> Result<Self> {
        Self::check(&index, num_slices)?;
        Self {
            index,
            num_slices,
            seed,
            drop_last,
            episodes: None,
        }
        .checked()
    }

    /// Visits every episode with at least one window once per epoch, taking one random window of
    /// each (a different one every epoch).
    pub fn episodes(
        index: Arc<SliceIndex>,
        num_slices: usize,
        seed: u64,
        drop_last: bool,
    ) -> Result<Self> {
        Self::check(&index, num_slices)?;
        let eps = (0..index.num_episodes() as u32)
            .filter(|&e| index.windows(e as usize) > 0)
            .collect();
        Self {
            index,
            num_slices,
            seed,
            drop_last,
            episodes: Some(eps),
        }
        .checked()
    }

    fn check(index: &SliceIndex, num_slices: usize) -> Result<()> {
        if num_slices == 0 || index.num_windows() == 0 {
            return Err(Error::InvalidArgument(
                "nothing to sample (no window, or num_slices = 0)".into(),
            ));
        }
        Ok(())
    }

    fn checked(self) -> Result<Self> {
        if self.batches_per_epoch() == Some(0) {
            return Err(Error::InvalidArgument(format!(
                "drop_last with {} items and batches of {}: an epoch has no full batch",
                self.items(),
                self.num_slices
            )));
        }
        Ok(self)
    }

    fn items(&self) -> u64 {
        self.episodes
            .as_ref()
            .map_or(self.index.num_windows(), |e| e.len() as u64)
    }
}

impl Sampler for EpochSampler {
    fn plan(&self, batch: u64, out: &mut Vec<SliceRef>) {
        out.clear();
        let items = self.items();
        let per_epoch = self.batches_per_epoch().expect("epochs");
        let (epoch, k) = (batch / per_epoch, batch % per_epoch);
        let perm = Permutation::new(items, self.seed ^ mix(epoch));
        let from = k * self.num_slices as u64;
        let to = (from + self.num_slices as u64).min(items);
        let mut rng = batch_rng(self.seed, batch);
        for i in from..to {
            let x = perm.apply(i);
            let (e, start) = match &self.episodes {
                None => self.index.window(x),
                Some(eps) => {
                    let e = eps[x as usize] as usize;
                    (
                        e,
                        self.index
                            .start_in(e, rng.random_range(0..self.index.windows(e))),
                    )
                }
            };
            out.push(SliceRef {
                episode: e as u32,
                start,
                len: self.index.slice_len,
            });
        }
    }
    fn num_slices(&self) -> usize {
        self.num_slices
    }
    fn slice_len(&self) -> u32 {
        self.index.slice_len
    }
    fn batches_per_epoch(&self) -> Option<u64> {
        let (items, b) = (self.items(), self.num_slices as u64);
        Some(if self.drop_last {
            items / b
        } else {
            items.div_ceil(b)
        })
    }
}

/// Whole episodes, uniformly (with replacement), padded to `max_len` steps (longer episodes
/// are cut to their first `max_len` steps).
pub struct EpisodeSampler {
    eligible: Vec<u32>,
    num_episodes: usize,
    max_len: u32,
    seed: u64,
}

impl EpisodeSampler {
    /// Samples `num_episodes` whole episodes per batch, padded (or cut) to `max_len` steps.
    pub fn new(
        episodes: &EpisodeIndex,
        num_episodes: usize,
        max_len: u32,
        seed: u64,
    ) -> Result<Self> {
        if episodes.is_empty() || num_episodes == 0 || max_len == 0 {
            return Err(Error::InvalidArgument("nothing to sample".into()));
        }
        Ok(Self {
            eligible: (0..episodes.len() as u32).collect(),
            num_episodes,
            max_len,
            seed,
        })
    }
}

impl Sampler for EpisodeSampler {
    fn plan(&self, batch: u64, out: &mut Vec<SliceRef>) {
        out.clear();
        let mut rng = batch_rng(self.seed, batch);
        for _ in 0..self.num_episodes {
            let e = self.eligible[rng.random_range(0..self.eligible.len())];
            out.push(SliceRef {
                episode: e,
                start: 0,
                len: self.max_len,
            });
        }
    }
    fn num_slices(&self) -> usize {
        self.num_episodes
    }
    fn slice_len(&self) -> u32 {
        self.max_len
    }
}

/// Uniform single transitions: slices of length 1 over every step.
pub fn transition_sampler(
    index: Arc<SliceIndex>,
    episodes: &EpisodeIndex,
    batch_size: usize,
    seed: u64,
) -> Result<SliceSampler> {
    if index.slice_len != 1 {
        return Err(Error::InvalidArgument(
            "transition sampling needs a slice index of length 1".into(),
        ));
    }
    SliceSampler::new(
        index,
        episodes,
        &SliceOptions::new(1, batch_size).with_seed(seed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_bijection() {
        for n in [1u64, 2, 3, 7, 64, 1000, 4097] {
            let p = Permutation::new(n, 42);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let x = p.apply(i) as usize;
                assert!(!seen[x]);
                seen[x] = true;
            }
        }
        let a: Vec<u64> = (0..10)
            .map(|i| Permutation::new(1000, 1).apply(i))
            .collect();
        let b: Vec<u64> = (0..10)
            .map(|i| Permutation::new(1000, 2).apply(i))
            .collect();
        assert_ne!(a, b);
    }

    #[test]
    fn alias_table_matches_weights() {
        let t = AliasTable::new(Some(vec![10, 20, 30]), &[1.0, 2.0, 7.0]).unwrap();
        let mut rng = batch_rng(0, 0);
        let mut c = [0usize; 3];
        for _ in 0..100_000 {
            c[(t.draw(&mut rng) / 10 - 1) as usize] += 1;
        }
        for (got, p) in c.iter().zip([0.1, 0.2, 0.7]) {
            assert!((*got as f64 / 1e5 - p).abs() < 0.01, "{c:?}");
        }
        assert!(AliasTable::new(None, &[]).is_err());
        assert!(AliasTable::new(None, &[0.0, 0.0]).is_err());
    }

    #[test]
    fn policies_parse() {
        assert_eq!(
            "strict".parse::<BoundaryPolicy>().unwrap(),
            BoundaryPolicy::Strict
        );
        assert_eq!(
            "span:2:3".parse::<BoundaryPolicy>().unwrap(),
            BoundaryPolicy::Span { left: 2, right: 3 }
        );
        assert!("sideways".parse::<BoundaryPolicy>().is_err());
    }
}

/// A sum tree over `n` leaves: O(log n) update and prefix search, 16 bytes per leaf (rounded up
/// to a power of two).
#[derive(Debug, Clone)]
struct SumTree {
    cap: usize,
    nodes: Vec<f64>,
}

impl SumTree {
    fn new(n: usize, value: f64) -> Self {
        let cap = n.next_power_of_two().max(1);
        let mut nodes = vec![0.0; 2 * cap];
        nodes[cap..cap + n].fill(value);
        for i in (1..cap).rev() {
            nodes[i] = nodes[2 * i] + nodes[2 * i + 1];
        }
        Self { cap, nodes }
    }
    fn total(&self) -> f64 {
        self.nodes[1]
    }
    fn get(&self, i: usize) -> f64 {
        self.nodes[self.cap + i]
    }
    fn set(&mut self, i: usize, v: f64) {
        let mut k = self.cap + i;
        self.nodes[k] = v;
        while k > 1 {
            k /= 2;
            self.nodes[k] = self.nodes[2 * k] + self.nodes[2 * k + 1];
        }
    }
    /// The leaf where the prefix sum first exceeds `u` (`0 <= u < total`).
    fn find(&self, mut u: f64) -> usize {
        let mut k = 1;
        while k < self.cap {
            let left = self.nodes[2 * k];
            if u < left || self.nodes[2 * k + 1] <= 0.0 {
                k *= 2;
            } else {
                u -= left;
                k = 2 * k + 1;
            }
        }
        k - self.cap
    }
}

/// Prioritized replay over the windows of a [`SliceIndex`] (Schaul et al., 2016): window `w` is
/// drawn with probability `p_w^alpha / sum p^alpha`, stratified over the batch; every window starts
/// at priority 1. Memory: a sum tree of 16 bytes per window (rounded up to a
/// power of two), so this is meant for datasets of up to tens of millions of windows.
pub struct PrioritizedSampler {
    index: Arc<SliceIndex>,
    num_slices: usize,
    seed: u64,
    alpha: f64,
    tree: std::sync::RwLock<SumTree>,
}

impl PrioritizedSampler {
    /// All windows start with priority 1.
    pub fn new(index: Arc<SliceIndex>, num_slices: usize, alpha: f64, seed: u64) -> Result<Self> {
        if index.num_windows() == 0 || num_slices == 0 {
            return Err(Error::InvalidArgument(
                "nothing to sample (no window, or num_slices = 0)".into(),
            ));
        }
        if !(alpha >= 0.0 && alpha.is_finite()) {
            return Err(Error::InvalidArgument(format!(
                "alpha {alpha} must be a finite number >= 0"
            )));
        }
        let n = usize::try_from(index.num_windows())
            .map_err(|_| Error::InvalidArgument("too many windows for a sum tree".into()))?;
        Ok(Self {
            tree: std::sync::RwLock::new(SumTree::new(n, 1.0)),
            index,
            num_slices,
            seed,
            alpha,
        })
    }

    /// The window number of a planned slice (what [`PrioritizedSampler::update_priorities`] takes).
    pub fn window_of(&self, s: &SliceRef) -> u64 {
        let (left, _) = self.index.policy.overhang(self.index.slice_len);
        self.index.first_window(s.episode as usize) + (s.start + left as i64) as u64
    }

    /// Sets the priorities (e.g. TD errors, made positive) of `windows`.
    pub fn update_priorities(&self, windows: &[u64], priorities: &[f64]) -> Result<()> {
        if windows.len() != priorities.len() {
            return Err(Error::InvalidArgument(
                "as many priorities as windows are needed".into(),
            ));
        }
        if let Some((w, p)) = windows
            .iter()
            .zip(priorities)
            .find(|&(&w, &p)| w >= self.index.num_windows() || !(p >= 0.0 && p.is_finite()))
        {
            return Err(Error::InvalidArgument(format!(
                "window {w} / priority {p} out of range"
            )));
        }
        let mut tree = self.tree.write().unwrap_or_else(|e| e.into_inner());
        for (&w, &p) in windows.iter().zip(priorities) {
            tree.set(w as usize, p.powf(self.alpha));
        }
        Ok(())
    }

    /// Importance-sampling weights `(N * P(w))^-beta`, normalised by the largest weight possible
    /// (that of the least likely window present in `windows`), written to `out`.
    pub fn importance_weights(&self, windows: &[u64], beta: f64, out: &mut Vec<f64>) {
        let tree = self.tree.read().unwrap_or_else(|e| e.into_inner());
        let n = self.index.num_windows() as f64;
        let total = tree.total();
        out.clear();
        out.extend(
            windows
                .iter()
                .map(|&w| (n * tree.get(w as usize) / total).powf(-beta)),
        );
        let max = out.iter().copied().fold(0.0, f64::max);
        if max > 0.0 {
            out.iter_mut().for_each(|x| *x /= max);
        }
    }
}

impl Sampler for PrioritizedSampler {
    fn plan(&self, batch: u64, out: &mut Vec<SliceRef>) {
        out.clear();
        let mut rng = batch_rng(self.seed, batch);
        let tree = self.tree.read().unwrap_or_else(|e| e.into_inner());
        let total = tree.total();
        let b = self.num_slices;
        for i in 0..b {
            let u = if total > 0.0 {
                ((i as f64 + rng.random::<f64>()) * total / b as f64)
                    .min(total * (1.0 - f64::EPSILON))
            } else {
                0.0
            };
            let w = if total > 0.0 {
                tree.find(u) as u64
            } else {
                rng.random_range(0..self.index.num_windows())
            };
            let (e, start) = self.index.window(w.min(self.index.num_windows() - 1));
            out.push(SliceRef {
                episode: e as u32,
                start,
                len: self.index.slice_len,
            });
        }
    }
    fn num_slices(&self) -> usize {
        self.num_slices
    }
    fn slice_len(&self) -> u32 {
        self.index.slice_len
    }
}

#[cfg(test)]
mod prioritized_tests {
    use super::*;

    fn index(lens: &[u64], l: u32) -> Arc<SliceIndex> {
        let mut prefix = vec![0u64];
        for &x in lens {
            prefix.push(prefix.last().unwrap() + (x + 1).saturating_sub(l as u64));
        }
        Arc::new(SliceIndex {
            slice_len: l,
            policy: BoundaryPolicy::Strict,
            left: 0,
            right: 0,
            prefix,
        })
    }

    #[test]
    fn sum_tree_finds_prefixes() {
        let mut t = SumTree::new(5, 1.0);
        assert_eq!(t.total(), 5.0);
        t.set(2, 3.0);
        assert_eq!(t.total(), 7.0);
        assert_eq!(t.find(0.5), 0);
        assert_eq!(t.find(2.5), 2);
        assert_eq!(t.find(4.99), 2);
        assert_eq!(t.find(5.0), 3);
        assert_eq!(t.find(6.99), 4);
    }

    #[test]
    fn prioritized_frequencies_follow_priorities() {
        let idx = index(&[10, 10], 10); // two windows: one per episode
        let s = PrioritizedSampler::new(idx, 100, 1.0, 3).unwrap();
        s.update_priorities(&[0, 1], &[1.0, 3.0]).unwrap();
        let mut plan = vec![];
        let mut counts = [0usize; 2];
        for k in 0..200 {
            s.plan(k, &mut plan);
            for r in &plan {
                counts[s.window_of(r) as usize] += 1;
            }
        }
        let frac = counts[1] as f64 / 20_000.0;
        assert!((frac - 0.75).abs() < 0.01, "{counts:?}");
        let mut w = vec![];
        s.importance_weights(&[0, 1], 1.0, &mut w);
        // P = (0.25, 0.75): weights ∝ (1/(2*0.25), 1/(2*0.75)) = (2, 2/3), normalised to (1, 1/3).
        assert!(
            (w[0] - 1.0).abs() < 1e-12 && (w[1] - 1.0 / 3.0).abs() < 1e-12,
            "{w:?}"
        );
        assert!(s.update_priorities(&[5], &[1.0]).is_err());
        assert!(s.update_priorities(&[0], &[f64::NAN]).is_err());
    }
}
