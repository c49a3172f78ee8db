//! Prioritized replay over the windows of a slice index.

use std::sync::Arc;

use rand::Rng;

use super::*;
use crate::error::{Error, Result};
use crate::index::{SliceIndex, SliceRef};

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

/// The first bytes of saved priorities ([`PrioritizedSampler::save_priorities`]).
const PRIORITIES_MAGIC: &[u8; 8] = b"TSPRIO01";

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
    pub fn try_new(
        index: Arc<SliceIndex>,
        num_slices: usize,
        alpha: f64,
        seed: u64,
    ) -> Result<Self> {
        check_sizes(num_slices, index.slice_len, "num_slices", "slice_len")?;
        if index.num_windows() == 0 {
            return Err(Error::argument(
                "index",
                "nothing to sample: the slice index has no window",
            ));
        }
        if !(alpha >= 0.0 && alpha.is_finite()) {
            return Err(Error::argument(
                "alpha",
                format!("alpha {alpha} must be a finite number >= 0"),
            ));
        }
        let n = usize::try_from(index.num_windows())
            .map_err(|_| Error::argument("index", "too many windows for a sum tree"))?;
        // 2 × (n rounded up to a power of two) nodes of 8 bytes.
        let tree_bytes = n
            .checked_next_power_of_two()
            .and_then(|cap| (cap as u64).checked_mul(16));
        check_memory("index", &format!("a sum tree over {n} windows"), tree_bytes)?;
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
            return Err(Error::invalid_argument(format!(
                "{} priorities for {} windows: as many priorities as windows are needed",
                priorities.len(),
                windows.len()
            )));
        }
        if let Some((w, p)) = windows
            .iter()
            .zip(priorities)
            .find(|&(&w, &p)| w >= self.index.num_windows() || !(p >= 0.0 && p.is_finite()))
        {
            return Err(if *w >= self.index.num_windows() {
                Error::argument(
                    "windows",
                    format!(
                        "window {w} out of range (the index has {} windows)",
                        self.index.num_windows()
                    ),
                )
            } else {
                Error::argument(
                    "priorities",
                    format!(
                        "priority {p} (of window {w}) out of range: it must be a finite number >= 0"
                    ),
                )
            });
        }
        let mut tree = self.tree.write().unwrap_or_else(|e| e.into_inner());
        for (&w, &p) in windows.iter().zip(priorities) {
            tree.set(w as usize, p.powf(self.alpha));
        }
        Ok(())
    }

    /// The priorities of every window as the sampler holds them (`p^alpha`), in a compact
    /// binary form (runs of equal values; raw values when that is smaller) that
    /// [`PrioritizedSampler::restore_priorities`] takes back exactly: what a loader state saves.
    pub fn save_priorities(&self) -> Vec<u8> {
        let tree = self.tree.read().unwrap_or_else(|e| e.into_inner());
        let n = self.index.num_windows() as usize;
        let leaves = &tree.nodes[tree.cap..tree.cap + n];
        let runs = 1 + leaves
            .windows(2)
            .filter(|w| w[0].to_bits() != w[1].to_bits())
            .count();
        let mut out = Vec::with_capacity(16 + 16 * runs.min(n));
        out.extend_from_slice(PRIORITIES_MAGIC);
        out.extend_from_slice(&(n as u64).to_le_bytes());
        if 16 * runs < 8 * n {
            out.push(1);
            let mut i = 0;
            while i < n {
                let v = leaves[i];
                let j = i + leaves[i..]
                    .iter()
                    .take_while(|x| x.to_bits() == v.to_bits())
                    .count();
                out.extend_from_slice(&((j - i) as u64).to_le_bytes());
                out.extend_from_slice(&v.to_le_bytes());
                i = j;
            }
        } else {
            out.push(0);
            for v in leaves {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// Restores priorities saved by [`PrioritizedSampler::save_priorities`] of a sampler over
    /// the same windows: afterwards this sampler plans exactly the batches the saved one would.
    /// Refuses, as [`Error::InvalidArgument`] about `priorities`, bytes that are not saved
    /// priorities, a different number of windows, or values that are not finite and >= 0.
    pub fn restore_priorities(&self, bytes: &[u8]) -> Result<()> {
        let bad = |why: String| Error::argument("priorities", why);
        let n = self.index.num_windows() as usize;
        let body = bytes
            .strip_prefix(PRIORITIES_MAGIC)
            .filter(|b| b.len() >= 9)
            .ok_or_else(|| {
                bad("these bytes are not saved priorities of a trajstore loader".into())
            })?;
        let saved = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
        if saved != n as u64 {
            return Err(bad(format!(
                "the saved priorities are of {saved} windows, this sampler has {n}: they belong \
                 to another version of the dataset or another slice length"
            )));
        }
        let words = |b: &[u8]| -> Vec<u64> {
            b.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect()
        };
        let rest = &body[9..];
        if rest.len() % 8 != 0 {
            return Err(bad("the saved priorities are truncated".into()));
        }
        let mut leaves = Vec::with_capacity(n);
        match body[8] {
            0 => leaves.extend(words(rest).into_iter().map(f64::from_bits)),
            1 => {
                let w = words(rest);
                if w.len() % 2 != 0 {
                    return Err(bad("the saved priorities are truncated".into()));
                }
                for pair in w.chunks_exact(2) {
                    let run = usize::try_from(pair[0]).unwrap_or(usize::MAX);
                    if run > n - leaves.len() {
                        return Err(bad(
                            "the saved priorities hold more windows than they say".into()
                        ));
                    }
                    leaves.extend(std::iter::repeat_n(f64::from_bits(pair[1]), run));
                }
            }
            k => return Err(bad(format!("unknown encoding {k} of saved priorities"))),
        }
        if leaves.len() != n {
            return Err(bad(format!(
                "the saved priorities hold {} windows of {n}",
                leaves.len()
            )));
        }
        if let Some(v) = leaves.iter().find(|v| !(**v >= 0.0 && v.is_finite())) {
            return Err(bad(format!(
                "a saved priority is {v}, not a finite number >= 0"
            )));
        }
        let mut tree = self.tree.write().unwrap_or_else(|e| e.into_inner());
        let cap = tree.cap;
        tree.nodes[cap..cap + n].copy_from_slice(&leaves);
        for i in (1..cap).rev() {
            tree.nodes[i] = tree.nodes[2 * i] + tree.nodes[2 * i + 1];
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
mod tests {
    use super::*;
    use crate::index::EpisodeIndex;

    fn index(lens: &[u64], l: u32) -> Arc<SliceIndex> {
        let starts: Vec<u64> = lens
            .iter()
            .scan(0, |r, &n| Some(std::mem::replace(r, *r + n)))
            .collect();
        let episodes = EpisodeIndex::from_segments(0, [(&starts[..], lens)]);
        Arc::new(SliceIndex::build(&episodes, l, BoundaryPolicy::Strict).unwrap())
    }

    #[test]
    fn saved_priorities_restore_the_same_plans() {
        let idx = index(&[50, 30, 40], 10);
        let a = PrioritizedSampler::try_new(idx.clone(), 16, 0.7, 9).unwrap();
        let windows: Vec<u64> = (0..idx.num_windows()).step_by(3).collect();
        let prios: Vec<f64> = windows.iter().map(|&w| 0.1 + (w % 7) as f64).collect();
        a.update_priorities(&windows, &prios).unwrap();
        let b = PrioritizedSampler::try_new(idx.clone(), 16, 0.7, 9).unwrap();
        let saved = a.save_priorities();
        b.restore_priorities(&saved).unwrap();
        let (mut pa, mut pb) = (vec![], vec![]);
        for k in 0..50 {
            a.plan(k, &mut pa);
            b.plan(k, &mut pb);
            assert_eq!(pa, pb);
        }
        // Runs: untouched priorities compress to one run.
        let fresh = PrioritizedSampler::try_new(idx.clone(), 16, 0.7, 9).unwrap();
        assert!(fresh.save_priorities().len() < 64);
        b.restore_priorities(&fresh.save_priorities()).unwrap();
        let other = PrioritizedSampler::try_new(index(&[50], 10), 16, 0.7, 9).unwrap();
        let e = other.restore_priorities(&saved).unwrap_err().to_string();
        assert!(e.contains("windows"), "{e}");
        assert!(b.restore_priorities(b"nonsense").is_err());
        assert!(b.restore_priorities(&saved[..saved.len() - 3]).is_err());
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
        let s = PrioritizedSampler::try_new(idx, 100, 1.0, 3).unwrap();
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
