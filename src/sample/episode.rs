//! Whole episodes, padded to the longest one of the batch.

use rand::Rng;

use super::*;
use crate::error::{Error, Result};
use crate::index::{EpisodeIndex, SliceRef};

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
    pub fn try_new(
        episodes: &EpisodeIndex,
        num_episodes: usize,
        max_len: u32,
        seed: u64,
    ) -> Result<Self> {
        check_sizes(num_episodes, max_len, "num_episodes", "max_len")?;
        if episodes.is_empty() {
            return Err(Error::argument(
                "episodes",
                "nothing to sample: the index has no episode",
            ));
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
