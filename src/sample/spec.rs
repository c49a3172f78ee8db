//! A sampler described by data ([`SamplerSpec`]) rather than built by hand: what a loader
//! rebuilds on every new version of a dataset it follows, what a mix builds once per part, and
//! what a loader state records and checks on resume.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::*;
use crate::error::{Error, Result};
use crate::store::Snapshot;

/// Which sampler a [`SamplerSpec`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplerKind {
    /// [`SliceSampler`]: slices with replacement, weighted by `weighting`, optionally restricted
    /// to some episodes.
    Uniform,
    /// [`EpochSampler::windows`]: every window once per epoch.
    Epoch,
    /// [`EpochSampler::episodes`]: every episode once per epoch, one random window of each.
    EpochEpisodes,
    /// [`EpisodeSampler`]: whole episodes, padded to `slice_len`.
    Episodes,
    /// [`PrioritizedSampler`]: windows in proportion to their priority to the power `alpha`.
    Prioritized,
}

impl SamplerKind {
    /// The name the CLI and the Python package use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Uniform => "uniform",
            Self::Epoch => "epoch",
            Self::EpochEpisodes => "epoch_episodes",
            Self::Episodes => "episodes",
            Self::Prioritized => "prioritized",
        }
    }
}

impl std::str::FromStr for SamplerKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "uniform" => Self::Uniform,
            "epoch" => Self::Epoch,
            "epoch_episodes" => Self::EpochEpisodes,
            "episodes" => Self::Episodes,
            "prioritized" => Self::Prioritized,
            other => {
                return Err(Error::argument(
                    "sampler",
                    format!(
                        "unknown sampler `{other}`: use uniform, epoch, epoch_episodes, episodes \
                         or prioritized"
                    ),
                ));
            }
        })
    }
}

/// Everything that decides which batches a sampler plans: kind, sizes, boundary policy,
/// weighting, seed, `alpha` (prioritized), `drop_last` (epochs) and an episode subset (uniform).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SamplerSpec {
    /// The sampler.
    pub kind: SamplerKind,
    /// Steps per slice (the padded length for whole episodes).
    pub slice_len: u32,
    /// Slices per batch.
    pub num_slices: usize,
    /// Boundary policy of the windows (not used by whole episodes).
    pub policy: BoundaryPolicy,
    /// How the uniform sampler picks episodes.
    pub weighting: Weighting,
    /// Seed.
    pub seed: u64,
    /// Priority exponent of the prioritized sampler.
    pub alpha: f64,
    /// Whether an epoch drops its last, short batch.
    pub drop_last: bool,
    /// Only these episode ids (uniform sampler only).
    pub episode_ids: Option<Vec<u64>>,
}

/// A built sampler, and the prioritized sampler behind it when it is one (whose priorities a
/// training loop updates and a loader state saves).
#[derive(Clone)]
pub struct BuiltSampler {
    /// The sampler.
    pub sampler: Arc<dyn Sampler>,
    /// The same sampler when it is prioritized.
    pub prioritized: Option<Arc<PrioritizedSampler>>,
}

impl SamplerSpec {
    /// A sampler of `kind` drawing `num_slices` slices of `slice_len` steps: strict policy,
    /// windows weighting, seed 0, `alpha` 0.6, no `drop_last`, every episode.
    pub fn new(kind: SamplerKind, slice_len: u32, num_slices: usize) -> Self {
        Self {
            kind,
            slice_len,
            num_slices,
            policy: BoundaryPolicy::Strict,
            weighting: Weighting::Windows,
            seed: 0,
            alpha: 0.6,
            drop_last: false,
            episode_ids: None,
        }
    }
    /// Sets the seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
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
    /// Sets the priority exponent.
    pub fn with_alpha(mut self, alpha: f64) -> Self {
        self.alpha = alpha;
        self
    }
    /// Sets `drop_last`.
    pub fn with_drop_last(mut self, d: bool) -> Self {
        self.drop_last = d;
        self
    }
    /// Restricts a uniform sampler to these episode ids.
    pub fn with_episode_ids(mut self, ids: Vec<u64>) -> Self {
        self.episode_ids = Some(ids);
        self
    }

    /// Whether the sampler is endless (with replacement); epochs are not.
    pub fn is_endless(&self) -> bool {
        !matches!(self.kind, SamplerKind::Epoch | SamplerKind::EpochEpisodes)
    }

    /// Builds the sampler over `snap`, with its cached slice index (O(episodes) the first time
    /// for a slice length and policy, free after, extended rather than rebuilt by
    /// [`Snapshot::refresh`]).
    pub fn build(&self, snap: &Snapshot) -> Result<BuiltSampler> {
        if self.episode_ids.is_some() && self.kind != SamplerKind::Uniform {
            return Err(Error::argument(
                "episodes",
                format!(
                    "an episode subset is supported by sampler='uniform' only, not '{}'",
                    self.kind.name()
                ),
            ));
        }
        if self.episode_ids.as_ref().is_some_and(|i| i.is_empty()) {
            return Err(Error::argument(
                "episodes",
                "the episode subset is empty: there is nothing to sample",
            ));
        }
        let index = || -> Result<Arc<crate::index::SliceIndex>> {
            SliceOptions::new(self.slice_len, self.num_slices).validate()?;
            snap.slice_index(self.slice_len, self.policy)
        };
        let (b, seed) = (self.num_slices, self.seed);
        let mut prioritized = None;
        let sampler: Arc<dyn Sampler> = match self.kind {
            SamplerKind::Uniform => {
                let mut o = SliceOptions::new(self.slice_len, b)
                    .with_policy(self.policy)
                    .with_weighting(self.weighting)
                    .with_seed(seed);
                o.episode_ids = self.episode_ids.clone();
                o.validate()?;
                Arc::new(SliceSampler::try_new(index()?, snap.episodes(), &o)?)
            }
            SamplerKind::Epoch => {
                Arc::new(EpochSampler::windows(index()?, b, seed, self.drop_last)?)
            }
            SamplerKind::EpochEpisodes => {
                Arc::new(EpochSampler::episodes(index()?, b, seed, self.drop_last)?)
            }
            SamplerKind::Episodes => Arc::new(EpisodeSampler::try_new(
                snap.episodes(),
                b,
                self.slice_len,
                seed,
            )?),
            SamplerKind::Prioritized => {
                let p = Arc::new(PrioritizedSampler::try_new(index()?, b, self.alpha, seed)?);
                prioritized = Some(p.clone());
                p
            }
        };
        Ok(BuiltSampler {
            sampler,
            prioritized,
        })
    }
}
