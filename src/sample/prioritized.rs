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
