//! A sampler described by data ([`SamplerSpec`]) rather than built by hand: what a loader
//! rebuilds on every new version of a dataset it follows, what a mix builds once per part, and
//! what a loader state records and checks on resume.

use serde::{Deserialize, Serialize};

use super::*;
use crate::error::{Error, Result};

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
/// weighting, seed, `alpha` (prioritized), `drop_last` (epochs), and an episode subset or
/// per-episode weights (uniform). The one description of a sampler: loaders build theirs from
/// it ([`SamplerSpec::build`]), a loader state records it, and [`SliceSampler::try_new`] takes it
/// for a slice index built by hand.
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
    /// A weight per episode position, multiplying the weighting; 0 excludes an episode (uniform
    /// sampler only).
    pub episode_weights: Option<Vec<f64>>,
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
            episode_weights: None,
        }
    }
    /// [`SamplerKind::Uniform`]: `num_slices` slices of `slice_len` steps with replacement.
    pub fn uniform(slice_len: u32, num_slices: usize) -> Self {
        Self::new(SamplerKind::Uniform, slice_len, num_slices)
    }
    /// A sampler of `kind` from a total `batch_size` (transitions) and a slice length:
    /// `batch_size / slice_len` slices, an error when the one does not divide the other.
    pub fn from_batch_size(kind: SamplerKind, batch_size: usize, slice_len: u32) -> Result<Self> {
        if slice_len == 0 {
            return Err(Error::argument(
                "slice_len",
                "the slice length must be at least 1",
            ));
        }
        if !batch_size.is_multiple_of(slice_len as usize) {
            return Err(Error::argument(
                "batch_size",
                format!(
                    "batch size {batch_size} is not a multiple of the slice length {slice_len}"
                ),
            ));
        }
        let spec = Self::new(kind, slice_len, batch_size / slice_len as usize);
        spec.validate()?;
        Ok(spec)
    }
    /// Checks the sizes: at least one slice of at least one step, and a batch that fits
    /// [`max_batch_bytes`] (counting its plan and flags; the gathered columns come on top, and
    /// [`crate::Gatherer::gather`] checks them). Every sampler built from a spec calls it.
    pub fn validate(&self) -> Result<()> {
        check_sizes(self.num_slices, self.slice_len, "num_slices", "slice_len")
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
    /// Weights a uniform sampler's episodes (by position in the episode index).
    pub fn with_episode_weights(mut self, w: Vec<f64>) -> Self {
        self.episode_weights = Some(w);
        self
    }

    /// Whether the sampler is endless (with replacement); epochs are not.
    pub fn is_endless(&self) -> bool {
        !matches!(self.kind, SamplerKind::Epoch | SamplerKind::EpochEpisodes)
    }
}
