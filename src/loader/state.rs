//! Loader states: what a preempted training run saves to continue its batch stream exactly.
//!
//! Plans are pure functions of (seed, batch number), so a stream's position is one number; the
//! rest of a state is what must match for that number to mean the same batches again: the
//! dataset (its id and the version's fingerprint), the version, the sampler's options, the
//! rank and world size, the mix's parts, and a prioritized sampler's priorities. Nothing about
//! workers, prefetch or read-ahead is in it: they change how fast batches come, never which.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sample::{SamplerKind, SamplerSpec};
use crate::store::Snapshot;

/// The `format` of every loader state.
pub const STATE_FORMAT: &str = "trajstore.loader_state";
/// The version of the state's layout this build writes and reads.
pub const STATE_VERSION: u32 = 1;
pub use crate::format::DATASET_ID_PROPERTY;
const MAGIC: &[u8; 8] = b"TSLOADST";
/// The largest batch number a loader starts at or a state holds (2^48: at ten thousand batches
/// a second, 890 years). Beyond it, numbers derived from it (global batch numbers across ranks,
/// the end of an iteration) could overflow.
pub const MAX_BATCH_NUMBER: u64 = 1 << 48;
/// The most ranks a loader state describes.
pub const MAX_WORLD_SIZE: u64 = 1 << 20;

/// Where a loader is in its stream, and what it must be resumed with (see the module docs).
/// Small: a few hundred bytes of JSON, plus, for a prioritized sampler, its priorities.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LoaderState {
    /// Always [`STATE_FORMAT`].
    pub format: String,
    /// [`STATE_VERSION`] of the build that wrote it.
    pub state_version: u32,
    /// This rank's number of the next batch (what [`super::LoaderOptions::start`] takes).
    pub next_batch: u64,
    /// The epoch of the next batch, for samplers without replacement.
    pub epoch: Option<u64>,
    /// This rank.
    pub rank: u64,
    /// The number of ranks.
    pub world_size: u64,
    /// Slices per batch.
    pub num_slices: usize,
    /// Steps per slice.
    pub slice_len: u32,
    /// One entry per dataset (two or more for a mix).
    pub parts: Vec<PartState>,
    /// Where the iteration the state was taken in ends (`start + max_batches`, or the end of
    /// an epoch), when it was taken inside one: a loader resumed from it yields the rest of that
    /// iteration, not a whole new one (as torchdata's `StatefulDataLoader` does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration_end: Option<u64>,
}

/// One dataset of a [`LoaderState`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PartState {
    /// The dataset's id ([`DATASET_ID_PROPERTY`]), absent for datasets created before ids.
    pub dataset_id: Option<String>,
    /// The version the next batch is planned from.
    pub version: u64,
    /// A hash of that version's segments (ids and checksums).
    pub fingerprint: String,
    /// Whether the loader followed this dataset's new versions.
    pub follow: bool,
    /// Slices of every batch drawn from this dataset.
    pub slices: usize,
    /// The sampler's options (`None` only in states of versions before loaders were made from
    /// sampler specs alone; such a state is checked without them).
    pub sampler: Option<SamplerState>,
    /// A prioritized sampler's priorities ([`crate::PrioritizedSampler::save_priorities`]).
    #[serde(skip)]
    pub priorities: Option<Arc<Vec<u8>>>,
}

/// The options of a sampler that decide its batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SamplerState {
    /// The sampler.
    pub kind: SamplerKind,
    /// Boundary policy.
    pub policy: String,
    /// Weighting of the uniform sampler.
    pub weighting: String,
    /// Seed.
    pub seed: u64,
    /// Priority exponent (prioritized only).
    pub alpha: Option<f64>,
    /// `drop_last` (epochs only).
    pub drop_last: Option<bool>,
    /// The episode subset: its size and a hash of its ids (uniform only).
    pub episodes: Option<String>,
}

impl SamplerState {
    pub(crate) fn of(spec: &SamplerSpec) -> Self {
        let epoch = matches!(spec.kind, SamplerKind::Epoch | SamplerKind::EpochEpisodes);
        Self {
            kind: spec.kind,
            policy: spec.policy.to_string(),
            weighting: spec.weighting.to_string(),
            seed: spec.seed,
            alpha: (spec.kind == SamplerKind::Prioritized).then_some(spec.alpha),
            drop_last: epoch.then_some(spec.drop_last),
            episodes: spec.episode_ids.as_ref().map(|ids| {
                let mut h = Fnv::default();
                ids.iter().for_each(|id| h.write(&id.to_le_bytes()));
                format!("{} ids, fnv1a64:{:016x}", ids.len(), h.0)
            }),
        }
    }

    /// The first option that differs from `other`'s, as `name: ours vs theirs`.
    fn difference(&self, other: &Self) -> Option<String> {
        let fields: [(&str, String, String); 7] = [
            ("sampler", self.kind.name().into(), other.kind.name().into()),
            ("policy", self.policy.clone(), other.policy.clone()),
            ("weighting", self.weighting.clone(), other.weighting.clone()),
            ("seed", self.seed.to_string(), other.seed.to_string()),
            (
                "alpha",
                format!("{:?}", self.alpha),
                format!("{:?}", other.alpha),
            ),
            (
                "drop_last",
                format!("{:?}", self.drop_last),
                format!("{:?}", other.drop_last),
            ),
            (
                "episodes",
                format!("{:?}", self.episodes),
                format!("{:?}", other.episodes),
            ),
        ];
        fields
            .into_iter()
            .find(|(_, a, b)| a != b)
            .map(|(n, a, b)| format!("{n}: the state has {a}, this loader {b}"))
    }
}

/// FNV-1a, 64 bits: a stable hash (unlike `std`'s) for fingerprints.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The fingerprint of `snap`'s version: a hash of its segments' ids and checksums.
pub(crate) fn fingerprint(snap: &Snapshot) -> String {
    let mut h = Fnv::default();
    for s in &snap.manifest().segments {
        h.write(&s.id.to_le_bytes());
        h.write(s.checksum.as_bytes());
        h.write(s.episodes_checksum.as_bytes());
    }
    format!("fnv1a64:{:016x}", h.0)
}

/// The id of `snap`'s dataset, when it has one.
pub(crate) fn dataset_id(snap: &Snapshot) -> Option<String> {
    snap.manifest().properties.get(DATASET_ID_PROPERTY).cloned()
}

impl LoaderState {
    /// The state as bytes: magic, the JSON header, then each part's priorities (what
    /// [`LoaderState::from_bytes`] reads; a file a checkpoint can hold as is).
    pub fn to_bytes(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("a loader state serialises");
        let mut out = Vec::with_capacity(json.len() + 32);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&json);
        for p in &self.parts {
            let b = p.priorities.as_deref().map_or(&[][..], |v| v.as_slice());
            out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend_from_slice(b);
        }
        out
    }

    /// Reads [`LoaderState::to_bytes`]; anything else is an [`Error::InvalidArgument`] about
    /// `state`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad =
            |why: &str| Error::argument("state", format!("not a trajstore loader state: {why}"));
        let mut rest = bytes
            .strip_prefix(MAGIC)
            .ok_or_else(|| bad("wrong magic bytes"))?;
        let mut take = |n: usize| -> Result<&[u8]> {
            if rest.len() < n {
                return Err(bad("truncated"));
            }
            let (a, b) = rest.split_at(n);
            rest = b;
            Ok(a)
        };
        let len = |b: &[u8]| usize::try_from(u64::from_le_bytes(b.try_into().expect("8"))).ok();
        let n = len(take(8)?).ok_or_else(|| bad("truncated"))?;
        let mut state = Self::from_json(std::str::from_utf8(take(n)?).map_err(|_| bad("header"))?)?;
        for p in &mut state.parts {
            let n = len(take(8)?).ok_or_else(|| bad("truncated"))?;
            let b = take(n)?;
            p.priorities = (!b.is_empty()).then(|| Arc::new(b.to_vec()));
        }
        Ok(state)
    }

    /// The state without priorities as JSON (what Python's `state_dict` shows).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a loader state serialises")
    }

    /// Reads [`LoaderState::to_json`], checking the format and version.
    pub fn from_json(json: &str) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| Error::argument("state", format!("not a loader state: {e}")))?;
        if v.get("format").and_then(|f| f.as_str()) != Some(STATE_FORMAT) {
            return Err(Error::argument(
                "state",
                format!("not a loader state (its format is not `{STATE_FORMAT}`)"),
            ));
        }
        let version = v.get("state_version").and_then(|f| f.as_u64()).unwrap_or(0);
        if version != STATE_VERSION as u64 {
            return Err(Error::argument(
                "state",
                format!(
                    "a loader state of layout version {version}; this build of trajstore reads \
                     version {STATE_VERSION}"
                ),
            ));
        }
        let state: Self = serde_json::from_value(v)
            .map_err(|e| Error::argument("state", format!("a damaged loader state: {e}")))?;
        state.check_ranges()?;
        Ok(state)
    }

    /// Refuses a state whose fields are out of their ranges or inconsistent with each other
    /// (a hand-edited or damaged state), before it is compared with any loader.
    fn check_ranges(&self) -> Result<()> {
        let bad = |why: String| {
            Err(Error::argument(
                "state",
                format!("a damaged loader state: {why}"),
            ))
        };
        if self.next_batch > MAX_BATCH_NUMBER {
            return bad(format!(
                "next_batch {} is beyond the largest batch number, {MAX_BATCH_NUMBER}",
                self.next_batch
            ));
        }
        if self.world_size == 0 || self.world_size > MAX_WORLD_SIZE {
            return bad(format!(
                "world_size {} is not in 1..={MAX_WORLD_SIZE}",
                self.world_size
            ));
        }
        if self.rank >= self.world_size {
            return bad(format!(
                "rank {} is not in 0..{}",
                self.rank, self.world_size
            ));
        }
        if let Some(e) = self.iteration_end
            && !(self.next_batch..=MAX_BATCH_NUMBER).contains(&e)
        {
            return bad(format!(
                "iteration_end {e} is not in next_batch {}..={MAX_BATCH_NUMBER}",
                self.next_batch
            ));
        }
        if self.epoch.is_some_and(|e| e > self.next_batch) {
            return bad(format!(
                "epoch {:?} is past batch {} (an epoch has at least one batch)",
                self.epoch, self.next_batch
            ));
        }
        if self.num_slices == 0 || self.slice_len == 0 {
            return bad(format!(
                "batches of {} slices of {} steps",
                self.num_slices, self.slice_len
            ));
        }
        if self.parts.is_empty() {
            return bad("it has no dataset (`parts` is empty)".into());
        }
        let slices = self
            .parts
            .iter()
            .try_fold(0usize, |a, p| a.checked_add(p.slices));
        if slices != Some(self.num_slices) {
            return bad(format!(
                "its datasets' slices ({}) do not add up to num_slices {}",
                self.parts
                    .iter()
                    .map(|p| p.slices.to_string())
                    .collect::<Vec<_>>()
                    .join(" + "),
                self.num_slices
            ));
        }
        for (i, p) in self.parts.iter().enumerate() {
            let hex = p.fingerprint.strip_prefix("fnv1a64:");
            if !hex.is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit())) {
                return bad(format!(
                    "part {i}'s fingerprint `{}` is not `fnv1a64:` and 16 hex digits",
                    p.fingerprint
                ));
            }
            if let Some(a) = p.sampler.as_ref().and_then(|s| s.alpha)
                && !(a.is_finite() && a >= 0.0)
            {
                return bad(format!("part {i}'s alpha {a} is not a finite number >= 0"));
            }
        }
        Ok(())
    }

    /// Refuses to resume `self` on a loader described by `fresh` (the state the loader would
    /// have at its start): another dataset, another rank or world size, other sampler options
    /// or another mix. `snapshots` are the loader's part snapshots at the state's versions.
    pub(crate) fn check_resumable(
        &self,
        fresh: &LoaderState,
        snapshots: &[Snapshot],
    ) -> Result<()> {
        let refuse = |why: String| Err(Error::argument("state", format!("cannot resume: {why}")));
        // A state built by hand (not read by `from_json`/`from_bytes`) is checked here too.
        self.check_ranges()?;
        if (self.rank, self.world_size) != (fresh.rank, fresh.world_size) {
            return refuse(format!(
                "the state is of rank {} of {}, this loader is rank {} of {}",
                self.rank, self.world_size, fresh.rank, fresh.world_size
            ));
        }
        if self.parts.len() != fresh.parts.len() {
            return refuse(format!(
                "the state mixes {} dataset(s), this loader {}",
                self.parts.len(),
                fresh.parts.len()
            ));
        }
        if (self.num_slices, self.slice_len) != (fresh.num_slices, fresh.slice_len) {
            return refuse(format!(
                "the state's batches are {} slices of {} steps, this loader's {} of {}",
                self.num_slices, self.slice_len, fresh.num_slices, fresh.slice_len
            ));
        }
        for (i, ((s, f), snap)) in self
            .parts
            .iter()
            .zip(&fresh.parts)
            .zip(snapshots)
            .enumerate()
        {
            let which = if self.parts.len() > 1 {
                format!("dataset {i} of the mix")
            } else {
                "the dataset".into()
            };
            if let (Some(a), Some(b)) = (&s.dataset_id, &f.dataset_id)
                && a != b
            {
                return refuse(format!(
                    "the state is of another dataset (id {a}) than {which} (id {b}, at {})",
                    snap.path().display()
                ));
            }
            if snap.version() == s.version && fingerprint(snap) != s.fingerprint {
                return refuse(format!(
                    "the state is of another dataset: version {} of {which} ({}) is not the \
                     version it was taken on",
                    s.version,
                    snap.path().display()
                ));
            }
            if s.slices != f.slices {
                return refuse(format!(
                    "{which} gives {} slices per batch in the state, {} in this loader (other \
                     weights)",
                    s.slices, f.slices
                ));
            }
            if s.dataset_id.is_none()
                && snap.version() == s.version
                && let Some(id) = dataset_id(snap)
            {
                return refuse(format!(
                    "the state has no dataset_id for {which}, whose version {} has id {id}: a \
                     state missing what identifies its dataset cannot be checked",
                    s.version
                ));
            }
            match (&s.sampler, &f.sampler) {
                (Some(a), Some(b)) => {
                    if let Some(d) = a.difference(b) {
                        return refuse(format!("{which}'s sampler differs, {d}"));
                    }
                }
                (None, Some(b)) => {
                    return refuse(format!(
                        "the state has no sampler options for {which} (this loader's: {} with \
                         seed {}); without them it cannot be checked that the batches are the \
                         same",
                        b.kind.name(),
                        b.seed
                    ));
                }
                // A sampler built by hand has no options to compare.
                (_, None) => {}
            }
        }
        if self.epoch != fresh.epoch {
            return refuse(format!(
                "the state says batch {} is in epoch {:?}; this loader's epochs put it in {:?} \
                 (another epoch length: other data, batch size or world size)",
                self.next_batch, self.epoch, fresh.epoch
            ));
        }
        Ok(())
    }
}
