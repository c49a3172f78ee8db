//! A seeded synthetic D4RL-shaped dataset generator, used by `trajstore demo`, tests and benches.
//!
//! Episode lengths follow an exponential distribution with the given mean, clamped to
//! `[min(10, mean), 4 * mean]` (the same law as `../shared/peers/torchrl_slice_bench.py`).
//! Observations are random walks, actions uniform in `[-1, 1]`, rewards a smooth function of both;
//! half the episodes end terminated, half truncated. The same spec always gives the same bytes,
//! whatever the number of threads.

use std::sync::Arc;

use arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, StandardNormal};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::format::col;
use crate::schema::TransitionSchema;
use crate::store::writer::{DatasetWriter, EpisodeEnd};

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    /// Total transitions.
    pub transitions: u64,
    /// Observation dimension.
    pub obs_dim: usize,
    /// Action dimension (ignored when `discrete_actions` is set).
    pub act_dim: usize,
    /// Discrete actions in `0..act_dim` (stored as int64) instead of continuous ones.
    pub discrete_actions: bool,
    /// Mean episode length.
    pub mean_episode_len: f64,
    /// Seed of every random draw.
    pub seed: u64,
}

impl Default for SynthSpec {
    fn default() -> Self {
        Self {
            transitions: 1_000_000,
            obs_dim: 17,
            act_dim: 6,
            discrete_actions: false,
            mean_episode_len: 1000.0,
            seed: 0,
        }
    }
}

impl SynthSpec {
    /// The schema of the generated data.
    pub fn schema(&self) -> Result<TransitionSchema> {
        let b = TransitionSchema::builder(&[self.obs_dim], self.act_dim.max(1));
        if self.discrete_actions {
            b.discrete_action()
        } else {
            b
        }
        .build()
    }

    /// Episode lengths, in order, summing to `transitions`.
    pub fn episode_lengths(&self) -> Result<Vec<u64>> {
        if self.mean_episode_len < 1.0 || !self.mean_episode_len.is_finite() {
            return Err(Error::argument(
                "mean_episode_len",
                format!(
                    "mean episode length {} must be a finite number >= 1",
                    self.mean_episode_len
                ),
            ));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let exp = Exp::new(1.0 / self.mean_episode_len).expect("positive rate");
        let (lo, hi) = (self.mean_episode_len.min(10.0), 4.0 * self.mean_episode_len);
        let mut out = vec![];
        let mut total = 0u64;
        while total < self.transitions {
            let l: f64 = exp.sample(&mut rng);
            let l = l.clamp(lo, hi) as u64;
            let l = l.max(1).min(self.transitions - total);
            out.push(l);
            total += l;
        }
        Ok(out)
    }

    /// Episode number `index` (0-based within this spec) of `len` steps.
    pub fn episode(&self, index: u64, len: u64) -> (RecordBatch, EpisodeEnd) {
        let mut rng =
            ChaCha8Rng::seed_from_u64(self.seed ^ 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(index + 1));
        let (n, d) = (len as usize, self.obs_dim);
        let mut obs = Vec::with_capacity((n + 1) * d);
        for _ in 0..d {
            obs.push(rng.sample::<f32, _>(StandardNormal));
        }
        for t in 0..n {
            for k in 0..d {
                let prev = obs[t * d + k];
                obs.push(0.98 * prev + 0.1 * rng.sample::<f32, _>(StandardNormal));
            }
        }
        let final_obs: Vec<f32> = obs.split_off(n * d);
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let fsl = |v: Vec<f32>, w: usize| -> ArrayRef {
            Arc::new(FixedSizeListArray::new(
                item.clone(),
                w as i32,
                Arc::new(Float32Array::from(v)),
                None,
            ))
        };
        let (action, reward): (ArrayRef, Vec<f32>) = if self.discrete_actions {
            let a: Vec<i64> = (0..n)
                .map(|_| rng.random_range(0..self.act_dim.max(1) as i64))
                .collect();
            let r = (0..n)
                .map(|t| if a[t] == 0 { 1.0 } else { -obs[t * d].abs() })
                .collect();
            (Arc::new(Int64Array::from(a)), r)
        } else {
            let m = self.act_dim;
            let a: Vec<f32> = (0..n * m).map(|_| rng.random_range(-1.0..1.0f32)).collect();
            let r = (0..n)
                .map(|t| {
                    let o = &obs[t * d..(t + 1) * d];
                    let act = &a[t * m..(t + 1) * m];
                    1.0 - 0.1 * o.iter().map(|x| x * x).sum::<f32>() / d as f32
                        - 0.05 * act.iter().map(|x| x * x).sum::<f32>()
                })
                .collect();
            (fsl(a, m), r)
        };
        let batch = RecordBatch::try_from_iter([
            (col::OBSERVATION, fsl(obs, d)),
            (col::ACTION, action),
            (
                col::REWARD,
                Arc::new(Float32Array::from(reward)) as ArrayRef,
            ),
        ])
        .expect("consistent columns");
        let end = if rng.random_bool(0.5) {
            EpisodeEnd::terminated()
        } else {
            EpisodeEnd::truncated()
        };
        (batch, end.with_final_observation(fsl(final_obs, d)))
    }

    /// Appends the whole dataset to `writer`, generating episodes in parallel and appending them
    /// in order. Commits every `commit_every` episodes if given (as a live collector would), and
    /// once at the end. `on_rows` is called with the rows appended (for progress bars).
    pub fn write(
        &self,
        writer: &mut DatasetWriter,
        commit_every: Option<usize>,
        on_rows: impl Fn(u64),
    ) -> Result<u64> {
        let lens = self.episode_lengths()?;
        let chunk = rayon::current_num_threads() * 16;
        let mut index = 0u64;
        let mut since_commit = 0usize;
        for group in lens.chunks(chunk) {
            let start = index;
            let episodes: Vec<_> = group
                .par_iter()
                .enumerate()
                .map(|(i, &l)| self.episode(start + i as u64, l))
                .collect();
            for (batch, end) in episodes {
                writer.append_episode(&batch, end)?;
                on_rows(batch.num_rows() as u64);
                since_commit += 1;
                if commit_every.is_some_and(|c| since_commit >= c) {
                    writer.commit()?;
                    since_commit = 0;
                }
            }
            index += group.len() as u64;
        }
        writer.commit()
    }
}
