//! Indexes over a snapshot's episodes, built from episode tables only (never from transitions):
//! where each episode lives ([`EpisodeIndex`]) and, per slice length and boundary policy, which
//! windows may be sampled ([`SliceIndex`]). Both are O(episodes) and are extended, not rebuilt,
//! when a snapshot refreshes.
//!
//! This module depends on [`crate::format`] only: the store owns and caches the indexes of its
//! snapshots, and the samplers read them.

mod episode;
mod slice;

pub use episode::{EpisodeIndex, EpisodeLocation};
pub use slice::{BoundaryPolicy, SliceIndex, SliceRef};
