//! Slice indexes: for one (slice length, [`BoundaryPolicy`]), the valid window starts of every
//! episode as prefix sums over episodes, so that a window is found by number in O(log E) and
//! an episode is drawn in proportion to its windows without scanning transitions.

use crate::error::{Error, Result};
use crate::index::EpisodeIndex;

/// Which windows of an episode a slice may cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BoundaryPolicy {
    /// Only windows fully inside an episode; episodes shorter than the slice are never sampled.
    Strict,
    /// Windows may run past the episode's end (the padded steps are masked out). Every step of
    /// every episode can start a slice.
    Pad,
    /// Windows may start up to `left` steps before the episode's start and end up to `right`
    /// steps after its end; overhanging steps are masked out. Both are capped at `slice_len - 1`
    /// so that every window holds at least one step of its episode.
    Span {
        /// Maximum steps before step 0.
        left: u32,
        /// Maximum steps after the last step.
        right: u32,
    },
}

impl BoundaryPolicy {
    /// `(left, right)` overhangs allowed for slices of `slice_len`.
    pub fn overhang(&self, slice_len: u32) -> (u64, u64) {
        match *self {
            BoundaryPolicy::Strict => (0, 0),
            BoundaryPolicy::Pad => (0, slice_len.saturating_sub(1) as u64),
            // A window must keep at least one step of its episode.
            BoundaryPolicy::Span { left, right } => {
                let most = slice_len.saturating_sub(1);
                (left.min(most) as u64, right.min(most) as u64)
            }
        }
    }
}

impl std::fmt::Display for BoundaryPolicy {
    /// The form [`BoundaryPolicy::from_str`](std::str::FromStr) reads: `strict`, `pad`,
    /// `span:LEFT:RIGHT`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Strict => f.write_str("strict"),
            Self::Pad => f.write_str("pad"),
            Self::Span { left, right } => write!(f, "span:{left}:{right}"),
        }
    }
}

impl std::str::FromStr for BoundaryPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "strict" => Ok(Self::Strict),
            "pad" => Ok(Self::Pad),
            _ => {
                let bad = || {
                    Error::argument(
                        "policy",
                        format!("boundary policy `{s}`: use strict, pad or span:LEFT:RIGHT"),
                    )
                };
                let rest = s.strip_prefix("span:").ok_or_else(bad)?;
                let (l, r) = rest.split_once(':').ok_or_else(bad)?;
                Ok(Self::Span {
                    left: l.parse().map_err(|_| bad())?,
                    right: r.parse().map_err(|_| bad())?,
                })
            }
        }
    }
}

/// Valid window starts of every episode for one (slice length, policy): prefix sums over
/// episodes, O(episodes) memory (8 bytes each), built in O(episodes) from the episode index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceIndex {
    pub(crate) slice_len: u32,
    pub(crate) policy: BoundaryPolicy,
    left: u64,
    right: u64,
    /// `prefix[i]` = windows of episodes `0..i`; `prefix.len() == episodes + 1`.
    prefix: Vec<u64>,
}

impl SliceIndex {
    /// Builds the index of `slice_len`-step windows under `policy`. O(episodes).
    pub fn build(episodes: &EpisodeIndex, slice_len: u32, policy: BoundaryPolicy) -> Result<Self> {
        if slice_len == 0 {
            return Err(Error::argument(
                "slice_len",
                "the slice length must be at least 1",
            ));
        }
        let (left, right) = policy.overhang(slice_len);
        let mut idx = SliceIndex {
            slice_len,
            policy,
            left,
            right,
            prefix: Vec::with_capacity(episodes.len() + 1),
        };
        idx.prefix.push(0);
        idx.push(episodes.lengths());
        Ok(idx)
    }

    fn windows_of(&self, len: u64) -> u64 {
        len.saturating_add(self.left + self.right + 1)
            .saturating_sub(self.slice_len as u64)
    }

    fn push(&mut self, lengths: &[u64]) {
        let mut acc = *self.prefix.last().expect("prefix starts with 0");
        for &l in lengths {
            acc = acc.saturating_add(self.windows_of(l));
            self.prefix.push(acc);
        }
    }

    /// This index for a snapshot whose episode index is `episodes`, given that this one was built
    /// for a snapshot with `dropped` fewer leading episodes (retention) and fewer trailing ones:
    /// O(new episodes + kept episodes) copying, no recomputation of kept episodes.
    pub fn extended(&self, episodes: &EpisodeIndex, dropped: usize) -> Self {
        let base = self.prefix[dropped.min(self.prefix.len() - 1)];
        let kept = &self.prefix[dropped.min(self.prefix.len() - 1)..];
        let mut prefix = Vec::with_capacity(episodes.len() + 1);
        prefix.extend(kept.iter().map(|p| p - base));
        let mut idx = SliceIndex {
            prefix,
            ..self.clone_header()
        };
        let have = idx.prefix.len() - 1;
        idx.push(&episodes.lengths()[have..]);
        idx
    }

    fn clone_header(&self) -> Self {
        SliceIndex {
            slice_len: self.slice_len,
            policy: self.policy,
            left: self.left,
            right: self.right,
            prefix: vec![],
        }
    }

    /// Slice length.
    pub fn slice_len(&self) -> u32 {
        self.slice_len
    }
    /// Boundary policy.
    pub fn policy(&self) -> BoundaryPolicy {
        self.policy
    }
    /// Total number of windows.
    pub fn num_windows(&self) -> u64 {
        *self.prefix.last().expect("non-empty")
    }
    /// Number of episodes indexed.
    pub fn num_episodes(&self) -> usize {
        self.prefix.len() - 1
    }
    /// Windows of episode position `e`.
    pub fn windows(&self, e: usize) -> u64 {
        self.prefix[e + 1] - self.prefix[e]
    }
    /// First window number of episode position `e`.
    pub fn first_window(&self, e: usize) -> u64 {
        self.prefix[e]
    }
    /// The window numbered `w` (`0..num_windows()`): (episode position, start step). The start is
    /// negative when the window overhangs the episode's start. O(log E).
    pub fn window(&self, w: u64) -> (usize, i64) {
        let e = self.prefix.partition_point(|&p| p <= w) - 1;
        (e, self.start_in(e, w - self.prefix[e]))
    }
    /// Start step of the `k`-th window of episode `e`.
    pub fn start_in(&self, _e: usize, k: u64) -> i64 {
        k as i64 - self.left as i64
    }
}

/// One slice of a plan: `len` steps of the episode at position `episode` of the snapshot's
/// episode index, starting at step `start` (negative or running past the end under padding
/// policies; those steps are masked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceRef {
    /// Episode position in the episode index (its id is `first_id + episode`).
    pub episode: u32,
    /// First step of the window.
    pub start: i64,
    /// Number of steps of the window (the batch's slice length).
    pub len: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse() {
        assert_eq!(
            "strict".parse::<BoundaryPolicy>().unwrap(),
            BoundaryPolicy::Strict
        );
        assert_eq!(
            "span:2:3".parse::<BoundaryPolicy>().unwrap(),
            BoundaryPolicy::Span { left: 2, right: 3 }
        );
        assert!("sideways".parse::<BoundaryPolicy>().is_err());
    }
}
