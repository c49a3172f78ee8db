//! Episode subsets and weights on a stream: the factor each episode of the version gets, and
//! each segment's share of the draws, which the schedule deals and apportions instead of slices
//! (so that a segment holding no episode of a subset is never downloaded).

use crate::error::{Error, Result};
use crate::index::{EpisodeIndex, SliceIndex};
use crate::sample::{SamplerKind, SamplerSpec, Weighting};

/// Per episode of the version (by position), the factor that `spec`'s subset and weights give
/// it (its weight; 0 outside the subset), or `None` when it has neither. Ids and weights are
/// checked as a local sampler checks them, against the version.
pub(super) fn episode_factors(
    spec: &SamplerSpec,
    episodes: &EpisodeIndex,
) -> Result<Option<Vec<f64>>> {
    if spec.episode_ids.is_none() && spec.episode_weights.is_none() {
        return Ok(None);
    }
    let n = episodes.len();
    let mut factors = match &spec.episode_weights {
        Some(w) if w.len() != n => {
            return Err(Error::argument(
                "episode_weights",
                format!(
                    "{} episode weights for the {n} episodes of the version",
                    w.len()
                ),
            ));
        }
        Some(w) => {
            if let Some((e, x)) = w
                .iter()
                .enumerate()
                .find(|(_, x)| !(x.is_finite() && **x >= 0.0))
            {
                return Err(Error::argument(
                    "episode_weights",
                    format!("episode weight {x} at position {e}: must be a finite number >= 0"),
                ));
            }
            w.clone()
        }
        None => vec![1.0; n],
    };
    if let Some(ids) = &spec.episode_ids {
        let mut keep = vec![false; n];
        for &id in ids {
            match episodes.position(id) {
                Some(p) => keep[p] = true,
                None => {
                    return Err(Error::argument(
                        "episode_ids",
                        format!("episode id {id} is not in this version"),
                    ));
                }
            }
        }
        for (f, k) in factors.iter_mut().zip(keep) {
            if !k {
                *f = 0.0;
            }
        }
    }
    Ok(Some(factors))
}

/// What the schedule deals and apportions per segment when draws are not uniform over slices
/// (episode weighting, a subset, weights): the segment's share of the draws, `Σ base × factor`
/// over its episodes (`base` is an episode's slices, or 1 per episode with a slice under
/// [`Weighting::Episodes`]), scaled so that the version's total is its number of slices,
/// and at least 1 where positive. A segment of mass 0 is never downloaded. `None`: slices.
pub(super) fn segment_masses(
    spec: &SamplerSpec,
    slices: &SliceIndex,
    episodes: &EpisodeIndex,
    factors: Option<&[f64]>,
    tables: &[crate::store::EpisodeTable],
) -> Result<Option<Vec<u64>>> {
    if spec.kind != SamplerKind::Uniform
        || (factors.is_none() && spec.weighting == Weighting::Windows)
    {
        return Ok(None);
    }
    let per_episode = |e: usize| -> f64 {
        let w = slices.windows(e);
        let base = match spec.weighting {
            Weighting::Windows => w as f64,
            Weighting::Episodes => (w > 0) as u8 as f64,
        };
        base * factors.map_or(1.0, |f| f[e])
    };
    let mut at = 0usize;
    let raw: Vec<f64> = tables
        .iter()
        .map(|t| {
            let n = t.spans().1.len().min(episodes.len() - at);
            let m = (at..at + n).map(per_episode).sum();
            at += n;
            m
        })
        .collect();
    let total: f64 = raw.iter().sum();
    if total.is_nan() || total <= 0.0 {
        return Err(Error::invalid_argument(format!(
            "no episode of the subset has a slice of {} steps",
            spec.slice_len
        )));
    }
    let scale = slices.num_windows() as f64 / total;
    Ok(Some(
        raw.iter()
            .map(|&m| {
                if m > 0.0 {
                    ((m * scale).round() as u64).max(1)
                } else {
                    0
                }
            })
            .collect(),
    ))
}
