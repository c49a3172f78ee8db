//! Epochs without replacement over windows or whole episodes.

use std::sync::Arc;

use rand::Rng;

use super::*;
use crate::error::{Error, Result};
use crate::index::{SliceIndex, SliceRef};

/// A keyed pseudo-random permutation of `0..n` (4-round Feistel network with cycle walking):
/// O(1) memory whatever `n`, so epochs over hundreds of millions of windows cost nothing to set up.
#[derive(Debug, Clone)]
pub(crate) struct Permutation {
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
        check_sizes(num_slices, index.slice_len, "num_slices", "slice_len")?;
        if index.num_windows() == 0 {
            return Err(Error::argument(
                "index",
                "nothing to sample: the slice index has no window",
            ));
        }
        Ok(())
    }

    fn checked(self) -> Result<Self> {
        if self.batches_per_epoch() == Some(0) {
            return Err(Error::invalid_argument(format!(
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
}
