//! Which segments a rank streams in each round, how its share is cut into windows that fit the
//! cache, and which of the rank's batches each window serves. Pure arithmetic over the
//! manifest's segment sizes and slice counts: every rank computes every rank's share, so shares
//! are disjoint without any coordination.

use std::sync::{Arc, Mutex};

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};
use crate::format::human_bytes;

/// How a streamed dataset is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamSampling {
    /// With replacement. Each batch is drawn uniformly over the slices of the window of
    /// segments resident when it is made, and each window gets batches in proportion to its
    /// slices; see [`super::StreamOptions`] for the resulting distribution.
    #[default]
    Uniform,
    /// Without replacement: per round (an epoch), every slice of the rank's share once, window
    /// after window, each window's slices in a shuffled order.
    Epoch,
}

impl std::str::FromStr for StreamSampling {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "uniform" => Ok(Self::Uniform),
            "epoch" => Ok(Self::Epoch),
            other => Err(Error::argument(
                "sampling",
                format!("`{other}`: use uniform or epoch"),
            )),
        }
    }
}

/// What the schedule needs to know of one segment of the version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentCost {
    /// Size of its transition file.
    pub bytes: u64,
    /// Transitions.
    pub rows: u64,
    /// Slices (valid windows) of the sampled length in its episodes.
    pub slices: u64,
}

/// Segments resident together and the batches of one round they serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Window {
    /// The round (an epoch for [`StreamSampling::Epoch`]).
    pub round: u64,
    /// Position among the rank's windows of the round.
    pub index: usize,
    /// Manifest positions of its segments, ascending.
    pub segments: Vec<usize>,
    /// Bytes of their transition files.
    pub bytes: u64,
    /// Their slices.
    pub slices: u64,
    /// The rank's batch number of its first batch.
    pub first: u64,
    /// Its number of batches (0: the window is skipped).
    pub batches: u64,
}

/// The rank's windows of one round.
#[derive(Debug)]
pub(crate) struct Round {
    pub first: u64,
    pub windows: Vec<Window>,
}

impl Round {
    fn end(&self) -> u64 {
        self.windows
            .last()
            .map_or(self.first, |w| w.first + w.batches)
    }
}

/// Parameters of a [`Schedule`].
#[derive(Debug, Clone)]
pub(crate) struct ScheduleSpec {
    pub cache_limit: u64,
    pub rank: u64,
    pub world: u64,
    pub seed: u64,
    pub sampling: StreamSampling,
    /// Slices per batch (B).
    pub num_slices: u64,
    /// Steps per slice (L).
    pub slice_len: u64,
    /// Uniform sampling: draws per transition per round, on average.
    pub reuse: f64,
    /// The fewest batches a window serves (`WINDOW_BATCHES`, at least the loader's workers plus its prefetch depth), so
    /// that the batches in flight touch at most two windows.
    pub min_batches: u64,
}

/// The rank's stream of windows (see the module docs).
#[derive(Debug)]
pub(crate) struct Schedule {
    segs: Vec<SegmentCost>,
    live: Vec<usize>,
    spec: ScheduleSpec,
    budget: u64,
    /// The whole version fits the cache of the only rank: one window, never rotated.
    whole: bool,
    /// Uniform sampling: batches per round before stretching.
    round_len: u64,
    rounds: Mutex<Rounds>,
}

/// The first batch of every round computed so far (plus one past the last), and recent rounds.
#[derive(Debug, Default)]
struct Rounds {
    starts: Vec<u64>,
    recent: Vec<Arc<Round>>,
}

impl Schedule {
    pub(crate) fn new(segs: Vec<SegmentCost>, spec: ScheduleSpec) -> Result<Self> {
        let live: Vec<usize> = (0..segs.len()).filter(|&i| segs[i].slices > 0).collect();
        if live.is_empty() {
            return Err(Error::invalid_argument(format!(
                "no episode of this version has a slice of {} steps",
                spec.slice_len
            )));
        }
        let total: u64 = segs.iter().map(|s| s.bytes).sum();
        let whole = spec.world == 1 && total <= spec.cache_limit;
        // The windows the batches in flight read (two) and the one downloading next.
        let budget = if whole {
            spec.cache_limit
        } else {
            spec.cache_limit / 3
        };
        let largest = live.iter().map(|&i| segs[i].bytes).max().unwrap_or(0);
        if !whole && largest > budget {
            return Err(Error::argument(
                "cache_limit",
                format!(
                    "a cache of {} cannot hold three windows of segments (two being read, one \
                     downloading): the largest segment is {}, so the cache needs at least {} (or \
                     the whole version's {})",
                    human_bytes(spec.cache_limit),
                    human_bytes(largest),
                    human_bytes(largest.saturating_mul(3)),
                    human_bytes(total)
                ),
            ));
        }
        if spec.world > live.len() as u64 {
            return Err(Error::argument(
                "world_size",
                format!(
                    "{} ranks but only {} segments have slices: each rank streams whole segments",
                    spec.world,
                    live.len()
                ),
            ));
        }
        let rows: u64 = live.iter().map(|&i| segs[i].rows).sum();
        let per_batch = (spec.world * spec.num_slices * spec.slice_len).max(1);
        let round_len = ((spec.reuse.max(0.0) * rows as f64) / per_batch as f64)
            .ceil()
            .max(1.0) as u64;
        let schedule = Self {
            segs,
            live,
            spec,
            budget,
            whole,
            round_len,
            rounds: Mutex::new(Rounds {
                starts: vec![0],
                recent: Vec::new(),
            }),
        };
        let first = schedule.build_round(0, 0);
        if first.end() == first.first {
            return Err(Error::argument(
                "cache_limit",
                format!(
                    "no window of at most {} (a third of the cache) holds {} batches of {} slices, \
                     the most a streaming loader keeps in flight: raise the cache limit or lower \
                     the batch size",
                    human_bytes(schedule.budget),
                    schedule.spec.min_batches,
                    schedule.spec.num_slices
                ),
            ));
        }
        Ok(schedule)
    }

    /// Whether the version is one window that never rotates (one rank, cache ≥ version).
    pub(crate) fn is_whole(&self) -> bool {
        self.whole
    }

    /// The cache limit.
    pub(crate) fn cache_limit(&self) -> u64 {
        self.spec.cache_limit
    }

    /// Whether batch `k` is the first batch of a round.
    pub(crate) fn is_round_start(&self, k: u64) -> bool {
        self.round_of(k).first == k
    }

    /// One past the rank's last batch of the round that batch `k` falls in.
    pub(crate) fn round_end(&self, k: u64) -> u64 {
        self.round_of(k).end()
    }

    /// The window of the rank's batch `k` and `k`'s number within it, or `None` past the end of
    /// the rounds that can be computed (never, in practice).
    pub(crate) fn locate(&self, k: u64) -> (Window, u64) {
        let round = self.round_of(k);
        // `new` checked that rounds have batches; a round without would map to its first window.
        let w = round
            .windows
            .iter()
            .rfind(|w| w.first <= k && w.batches > 0)
            .unwrap_or(&round.windows[0]);
        (w.clone(), k.saturating_sub(w.first))
    }

    /// The window after `w` that has batches (possibly in the next round).
    pub(crate) fn next_window(&self, w: &Window) -> Window {
        let end = w.first + w.batches;
        self.locate(end).0
    }

    /// The round that batch `k` falls in. Rounds have lengths of their own (uniform rounds are
    /// stretched so that every window has `min_batches`, epochs end with the shortest rank):
    /// their first batches are kept (8 bytes per round) and the last few rounds are cached.
    fn round_of(&self, k: u64) -> Arc<Round> {
        let mut c = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let r = c.starts.partition_point(|&f| f <= k).saturating_sub(1);
            if r + 1 < c.starts.len() {
                let first = c.starts[r];
                if let Some(found) = c.recent.iter().find(|x| x.first == first) {
                    return found.clone();
                }
                let round = Arc::new(self.build_round(r as u64, first));
                if c.recent.len() >= 4 {
                    c.recent.remove(0);
                }
                c.recent.push(round.clone());
                return round;
            }
            // Extend the known rounds by one.
            let r = c.starts.len() - 1;
            let first = c.starts[r];
            let round = Arc::new(self.build_round(r as u64, first));
            let end = round.end().max(first + 1);
            c.starts.push(end);
            if c.recent.len() >= 4 {
                c.recent.remove(0);
            }
            c.recent.push(round);
        }
    }

    /// Every rank's share of round `r`, in the round's order: segments shuffled by (seed, r),
    /// then each to the rank with the fewest slices so far.
    fn shares(&self, r: u64) -> Vec<Vec<usize>> {
        let mut order = self.live.clone();
        if !self.whole {
            let mut rng = ChaCha8Rng::seed_from_u64(mix(self.spec.seed ^ mix(r.wrapping_add(1))));
            order.shuffle(&mut rng);
        }
        let world = self.spec.world as usize;
        let mut load = vec![0u64; world];
        let mut shares = vec![Vec::new(); world];
        for p in order {
            let rank = (0..world).min_by_key(|&i| (load[i], i)).unwrap_or(0);
            load[rank] += self.segs[p].slices;
            shares[rank].push(p);
        }
        shares
    }

    /// `share` cut into windows of at most the budget, in order.
    fn pack(&self, share: &[usize]) -> Vec<Vec<usize>> {
        let mut out: Vec<Vec<usize>> = Vec::new();
        let mut bytes = 0u64;
        for &p in share {
            let b = self.segs[p].bytes;
            if out.is_empty() || bytes + b > self.budget {
                out.push(Vec::new());
                bytes = 0;
            }
            bytes += b;
            out.last_mut().expect("pushed").push(p);
        }
        out
    }

    fn build_round(&self, r: u64, first: u64) -> Round {
        let mut windows: Vec<Window> = if self.whole {
            vec![(0..self.segs.len()).collect()]
        } else {
            self.pack(&self.shares(r)[self.spec.rank as usize])
        }
        .into_iter()
        .enumerate()
        .map(|(index, mut segments)| {
            segments.sort_unstable();
            Window {
                round: r,
                index,
                bytes: segments.iter().map(|&p| self.segs[p].bytes).sum(),
                slices: segments.iter().map(|&p| self.segs[p].slices).sum(),
                segments,
                first: 0,
                batches: 0,
            }
        })
        .collect();
        let b = self.spec.num_slices.max(1);
        match self.spec.sampling {
            StreamSampling::Uniform => {
                // Every rank's round has the same length: `min_batches` per window of the rank
                // with the most windows, or the reuse's length if longer; each window gets
                // `min_batches`, and the rest in proportion to its slices.
                let most = if self.whole {
                    1
                } else {
                    self.shares(r)
                        .iter()
                        .map(|s| self.pack(s).len() as u64)
                        .max()
                        .unwrap_or(1)
                };
                let m = self.spec.min_batches;
                let len = self.round_len.max(m * most);
                let n = windows.len() as u64;
                let spare = len - m * n;
                let total: u64 = windows.iter().map(|w| w.slices).sum::<u64>().max(1);
                let at = |c: u64| (spare as u128 * c as u128 / total as u128) as u64;
                let (mut before, mut next) = (0u64, first);
                for (j, w) in windows.iter_mut().enumerate() {
                    w.first = next;
                    let extra = at(before + w.slices) - at(before);
                    before += w.slices;
                    w.batches = m + extra;
                    next += w.batches;
                    if j + 1 == n as usize {
                        // Rounding leaves the last window what is missing to `len`.
                        w.batches += first + len - next;
                        next = first + len;
                    }
                }
            }
            StreamSampling::Epoch => {
                // A window yields floor(slices / B) batches, or none when that is fewer than
                // `min_batches` (too few to fill the loader's pipeline). Every rank stops at the
                // shortest rank's epoch, so that ranks stay in step; a rank whose cut would leave
                // its last window fewer than `min_batches` gives them to the window before
                // (whose sampler then starts its next pass: a few slices repeat, as
                // `DistributedSampler` pads).
                let min = if self.whole { 0 } else { self.spec.min_batches };
                let full = |slices: u64| Some(slices / b).filter(|&n| n >= min).unwrap_or(0);
                let len = if self.whole {
                    full(windows[0].slices)
                } else {
                    self.shares(r)
                        .iter()
                        .map(|s| {
                            self.pack(s)
                                .iter()
                                .map(|w| full(w.iter().map(|&p| self.segs[p].slices).sum()))
                                .sum::<u64>()
                        })
                        .min()
                        .unwrap_or(0)
                };
                let (mut next, mut last) = (first, None::<usize>);
                for j in 0..windows.len() {
                    let mut take = full(windows[j].slices).min(first + len - next);
                    if take > 0 && take < min {
                        if let Some(p) = last {
                            windows[p].batches += take;
                            next += take;
                        }
                        take = 0;
                    }
                    windows[j].first = next;
                    windows[j].batches = take;
                    next += take;
                    if take > 0 {
                        last = Some(j);
                    }
                }
            }
        }
        Round { first, windows }
    }

    /// Batches of round `r` for this rank (uniform: the same every round).
    #[cfg(test)]
    fn round_batches(&self, r: u64) -> u64 {
        let mut first = 0;
        for i in 0..r {
            first = self.build_round(i, first).end();
        }
        let round = self.build_round(r, first);
        round.end() - round.first
    }
}

/// SplitMix64's finaliser.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(n: usize) -> Vec<SegmentCost> {
        (0..n)
            .map(|i| SegmentCost {
                bytes: 100 + (i as u64 % 3) * 10,
                rows: 1000,
                slices: 900 + (i as u64 % 5) * 10,
            })
            .collect()
    }

    fn spec(limit: u64, rank: u64, world: u64, sampling: StreamSampling) -> ScheduleSpec {
        ScheduleSpec {
            cache_limit: limit,
            rank,
            world,
            seed: 7,
            sampling,
            num_slices: 10,
            slice_len: 4,
            reuse: 2.0,
            min_batches: 3,
        }
    }

    #[test]
    fn ranks_take_disjoint_shares_that_cover_every_segment_each_round() {
        for world in [1u64, 2, 3, 4] {
            for sampling in [StreamSampling::Uniform, StreamSampling::Epoch] {
                let scheds: Vec<_> = (0..world)
                    .map(|r| Schedule::new(segs(20), spec(500, r, world, sampling)).unwrap())
                    .collect();
                for round in 0..3u64 {
                    let mut seen = vec![0; 20];
                    for s in &scheds {
                        let first = s.round_of(round * s.round_len).first;
                        let first = if sampling == StreamSampling::Epoch {
                            let mut f = 0;
                            for i in 0..round {
                                f = s.build_round(i, f).end();
                            }
                            f
                        } else {
                            first
                        };
                        for w in &s.build_round(round, first).windows {
                            assert!(w.bytes <= 500 / 3, "a window fits a third of the cache");
                            for &p in &w.segments {
                                seen[p] += 1;
                            }
                        }
                    }
                    assert!(seen.iter().all(|&c| c == 1), "world {world}: {seen:?}");
                }
                // Ranks stay in step: the same number of batches per round.
                let lens: Vec<u64> = scheds.iter().map(|s| s.round_batches(1)).collect();
                assert!(lens.windows(2).all(|p| p[0] == p[1]), "{lens:?}");
            }
        }
    }

    #[test]
    fn uniform_rounds_give_windows_batches_in_proportion_to_their_slices() {
        let s = Schedule::new(segs(20), spec(500, 0, 1, StreamSampling::Uniform)).unwrap();
        // reuse 2 × 20,000 rows / (10 × 4 per batch) = 1,000 batches per round.
        assert_eq!(s.round_len, 1000);
        let round = s.build_round(3, 3000);
        let total: u64 = round.windows.iter().map(|w| w.slices).sum();
        let spare = 1000 - 3 * round.windows.len() as u64;
        for w in &round.windows {
            let expect = 3.0 + spare as f64 * w.slices as f64 / total as f64;
            assert!((w.batches as f64 - expect).abs() <= 1.0, "{w:?}");
        }
        assert_eq!(round.end(), 4000);
        // Every batch number maps to the window that contains it, across rounds.
        for k in [0u64, 999, 1000, 3999, 123_456] {
            let (w, local) = s.locate(k);
            assert_eq!(w.round, k / 1000);
            assert!(local < w.batches);
            assert_eq!(w.first + local, k);
        }
        let (w, _) = s.locate(999);
        assert_eq!(
            s.next_window(&w).round,
            1,
            "the last window is followed by the next round"
        );
        // Different rounds shuffle differently.
        let a: Vec<_> = s
            .build_round(0, 0)
            .windows
            .into_iter()
            .map(|w| w.segments)
            .collect();
        let b: Vec<_> = s
            .build_round(1, 0)
            .windows
            .into_iter()
            .map(|w| w.segments)
            .collect();
        assert_ne!(a, b);
    }

    #[test]
    fn a_cache_that_holds_the_version_is_one_window_and_too_small_a_cache_is_refused() {
        let s = Schedule::new(segs(20), spec(10_000, 0, 1, StreamSampling::Uniform)).unwrap();
        assert!(s.is_whole());
        let (w, _) = s.locate(5);
        assert_eq!(w.segments, (0..20).collect::<Vec<_>>());
        let e = Schedule::new(segs(20), spec(200, 0, 1, StreamSampling::Uniform)).unwrap_err();
        assert!(e.to_string().contains("at least 360 B"), "{e}");
        let e = Schedule::new(segs(3), spec(10_000, 0, 4, StreamSampling::Uniform)).unwrap_err();
        assert!(e.to_string().contains("4 ranks"), "{e}");
    }

    #[test]
    fn epochs_cover_each_windows_slices_once_up_to_the_shortest_rank() {
        let s = Schedule::new(segs(20), spec(500, 1, 2, StreamSampling::Epoch)).unwrap();
        let r0 = s.build_round(0, 0);
        for w in &r0.windows {
            assert!(w.batches == 0 || w.batches >= 3, "{w:?}");
        }
        let total: u64 = r0.windows.iter().map(|w| w.batches).sum();
        assert!(total <= r0.windows.iter().map(|w| w.slices / 10).sum::<u64>() + 3);
        let (w, local) = s.locate(r0.end());
        assert_eq!((w.round, local), (1, 0));
    }
}
