//! Slices drawn with replacement: uniform over windows or over episodes, optionally weighted per episode.

use std::sync::Arc;

use rand::Rng;

use super::*;
use crate::error::{Error, Result};
use crate::index::{EpisodeIndex, SliceIndex, SliceRef};

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
    /// The sampler `opts` describes (its kind, `alpha` and `drop_last` are not used) over
    /// `index`, a slice index of `opts`'s length and policy (see [`crate::Snapshot::slice_index`]
    /// for the cached one; [`SamplerSpec::build`] does all this from a snapshot). Cost O(1), or
    /// O(E) when weights or a subset need an alias table.
    pub fn try_new(
        index: Arc<SliceIndex>,
        episodes: &EpisodeIndex,
        opts: &SamplerSpec,
    ) -> Result<Self> {
        opts.validate()?;
        if index.slice_len != opts.slice_len || index.policy != opts.policy {
            return Err(Error::invalid_argument(
                "slice index does not match the options",
            ));
        }
        let n = index.num_episodes();
        let mut allowed: Option<Vec<bool>> = None;
        if let Some(ids) = &opts.episode_ids {
            let mut a = vec![false; n];
            for &id in ids {
                let pos = episodes.position(id).filter(|&p| p < n);
                match pos {
                    Some(p) => a[p] = true,
                    None => {
                        return Err(Error::argument(
                            "episode_ids",
                            format!("episode id {id} is not in this snapshot"),
                        ));
                    }
                }
            }
            allowed = Some(a);
        }
        if let Some(w) = &opts.episode_weights
            && w.len() != n
        {
            return Err(Error::argument(
                "episode_weights",
                format!("{} episode weights for {n} episodes", w.len()),
            ));
        }
        let plain = opts.weighting == Weighting::Windows
            && opts.episode_weights.is_none()
            && allowed.is_none();
        let pick = if plain {
            if index.num_windows() == 0 {
                return Err(Error::invalid_argument(format!(
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
                    return Err(Error::argument(
                        "episode_weights",
                        format!("episode weight {w} at position {e}: must be a finite number >= 0"),
                    ));
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
