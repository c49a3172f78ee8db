//! Samplers: turn a batch number into an index plan (which episode, which steps) using cached
//! indexes, never scanning transitions.
//!
//! Every sampler is a pure function of `(seed, batch number)`: [`Sampler::plan`] takes `&self`,
//! so any number of loader workers can share one sampler and the stream of batches is the same
//! whatever the worker count. Slice samplers cost O(B) per batch (an alias table over episodes,
//! then a uniform window inside the episode); window lookups by number are O(log E) binary
//! searches over prefix sums. Nothing depends on the number of transitions.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};
use crate::format::human_bytes;
use crate::store::Snapshot;

mod episode;
mod epoch;
mod mix;
mod prioritized;
mod slice;
mod spec;

pub use crate::index::{BoundaryPolicy, SliceRef};
pub use episode::EpisodeSampler;
pub use epoch::EpochSampler;
pub use mix::{MAX_PARTS, MixSampler, mix_counts};
pub use prioritized::PrioritizedSampler;
pub use slice::SliceSampler;
pub use spec::{SamplerKind, SamplerSpec};

/// Something that turns batch numbers into plans.
pub trait Sampler: Send + Sync {
    /// Fills `out` with the slices of batch number `batch` (cleared first). Deterministic:
    /// the same sampler and batch number always give the same plan.
    fn plan(&self, batch: u64, out: &mut Vec<SliceRef>);
    /// Steps per slice of the batches this sampler plans (the padded length for whole episodes).
    fn slice_len(&self) -> u32;
    /// Slices per batch (B); a plan never holds more, and holds fewer only at the end of an
    /// epoch without `drop_last`.
    fn num_slices(&self) -> usize;
    /// Number of batches per epoch for samplers without replacement, `None` for endless ones.
    fn batches_per_epoch(&self) -> Option<u64> {
        None
    }
}

/// How a slice sampler picks episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weighting {
    /// Uniform over all valid windows: an episode is picked in proportion to its number of
    /// windows (each transition-window equally likely). The default.
    #[default]
    Windows,
    /// Uniform over episodes that have at least one window, then uniform over its windows
    /// (TorchRL `SliceSampler` semantics).
    Episodes,
}

impl std::str::FromStr for Weighting {
    type Err = Error;
    /// `windows` or `episodes` (the names `--weighting` and the Python package take).
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "windows" => Ok(Self::Windows),
            "episodes" => Ok(Self::Episodes),
            other => Err(Error::argument(
                "weighting",
                format!("`{other}`: use windows or episodes"),
            )),
        }
    }
}

impl std::fmt::Display for Weighting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Windows => "windows",
            Self::Episodes => "episodes",
        })
    }
}

/// Walker/Vose alias table: O(n) to build, O(1) per draw with one 64-bit random number and one
/// 8-byte entry read (a single cache line), so drawing stays cheap when the table is larger than
/// the CPU caches.
#[derive(Debug, Clone)]
pub(crate) struct AliasTable {
    /// Per entry: keep-probability scaled to 2^32, and the alias.
    entries: Vec<(u32, u32)>,
    /// Positions the table's entries stand for (`None`: entry `i` is position `i`).
    items: Option<Vec<u32>>,
}

impl AliasTable {
    fn new(items: Option<Vec<u32>>, weights: &[f64]) -> Result<Self> {
        let n = weights.len();
        let total: f64 = weights.iter().sum();
        if n == 0 || total <= 0.0 || !total.is_finite() || u32::try_from(n).is_err() {
            return Err(Error::invalid_argument(
                "nothing to sample: every episode has zero weight or no valid window",
            ));
        }
        let mut prob: Vec<f64> = weights.iter().map(|w| w * n as f64 / total).collect();
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| prob[i] < 1.0);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            alias[s] = l as u32;
            prob[l] -= 1.0 - prob[s];
            if prob[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        for i in large.into_iter().chain(small) {
            prob[i] = 1.0;
        }
        let scale = |p: f64| {
            if p >= 1.0 {
                u32::MAX
            } else {
                (p * 4_294_967_296.0) as u32
            }
        };
        Ok(Self {
            entries: prob
                .iter()
                .zip(&alias)
                .map(|(&p, &a)| (scale(p), a))
                .collect(),
            items,
        })
    }

    #[inline]
    fn draw(&self, rng: &mut impl Rng) -> u32 {
        let r: u64 = rng.random();
        // Lemire's multiply-shift maps the high half to an entry; the low half is the coin.
        let i = (((r >> 32) * self.entries.len() as u64) >> 32) as usize;
        let (keep, alias) = self.entries[i];
        let j = if (r as u32) < keep || keep == u32::MAX {
            i as u32
        } else {
            alias
        };
        match &self.items {
            Some(items) => items[j as usize],
            None => j,
        }
    }
}

/// The per-batch random generator: a pure function of (seed, batch).
pub fn batch_rng(seed: u64, batch: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(seed ^ mix(batch.wrapping_add(0x632b_e59b_d9b4_e019))))
}

/// SplitMix64 finaliser.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Environment variable that sets [`max_batch_bytes`] (a number of bytes), e.g. to allow a batch
/// larger than half of the machine's memory.
pub const MAX_BATCH_BYTES_ENV: &str = "TRAJSTORE_MAX_BATCH_BYTES";

/// The largest batch, in bytes, that samplers, [`crate::Gatherer::gather`] and
/// [`crate::Loader`] accept: half of the memory this process may use (the smaller of the
/// machine's `MemTotal` in `/proc/meminfo` and the memory limit of the process's own cgroup, v2
/// `memory.max` or v1 `memory.limit_in_bytes`, as a container, Slurm job or systemd unit sets
/// it), or 64 GiB where neither can be read; [`MAX_BATCH_BYTES_ENV`] overrides it. Read once per
/// process.
///
/// A batch's bytes are `num_slices × slice_len × (bytes per step of the gathered columns + 6
/// flag bytes)` plus 32 bytes per slice (its plan entry, episode id and start step); a request
/// above the limit, or whose count overflows, is an [`Error::InvalidArgument`] instead of an
/// allocation that aborts the process.
pub fn max_batch_bytes() -> u64 {
    batch_limit().0
}

/// [`max_batch_bytes`] and where it comes from, in words.
fn batch_limit() -> (u64, &'static str) {
    static LIMIT: std::sync::OnceLock<(u64, &'static str)> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        if let Some(v) = std::env::var(MAX_BATCH_BYTES_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            return (v, "set by TRAJSTORE_MAX_BATCH_BYTES");
        }
        let mem_total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                let kb = m.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
                kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
            })
            .map(|kb| kb.saturating_mul(1024));
        let cgroup = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|c| cgroup_limit(&c, std::path::Path::new("/sys/fs/cgroup")));
        let half = "half of the memory of this machine or its cgroup; TRAJSTORE_MAX_BATCH_BYTES \
                    sets another";
        match (mem_total, cgroup) {
            (Some(a), Some(b)) => (a.min(b) / 2, half),
            (Some(a), None) | (None, Some(a)) => (a / 2, half),
            (None, None) => (
                64 << 30,
                "this machine's memory is unknown; TRAJSTORE_MAX_BATCH_BYTES sets another",
            ),
        }
    })
}

/// The memory limit of the cgroup `proc_self_cgroup` (the text of `/proc/self/cgroup`) names,
/// under the cgroup filesystem mounted at `root`: v2's `memory.max` (line `0::/path`) or v1's
/// `memory.limit_in_bytes` (line `N:memory:/path`, or a line naming `memory` among others),
/// the smaller where both are set. Where the named directory is not there (a container that
/// mounts its own cgroup as the hierarchy's root, while `/proc/self/cgroup` names the host's
/// path), the hierarchy root's file. None where neither sets one (`max`, or v1's "unlimited",
/// which is near 2^63).
fn cgroup_limit(proc_self_cgroup: &str, root: &std::path::Path) -> Option<u64> {
    let read = |path: std::path::PathBuf| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&v| v < 1 << 62)
    };
    let mut limit: Option<u64> = None;
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (base, file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        let dir = base.join(path.trim_start_matches('/'));
        let found = read(if dir.is_dir() { dir } else { base }.join(file));
        limit = match (limit, found) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    limit
}

/// Flag bytes per step of a gathered batch (mask, is_first, is_last, terminated, truncated,
/// slice_end).
pub(crate) const FLAG_BYTES: u64 = 6;

/// Bytes per slice of a planned and gathered batch besides its steps: the plan's [`SliceRef`]
/// and the batch's episode id and start step.
pub(crate) const SLICE_BYTES: u64 = std::mem::size_of::<SliceRef>() as u64 + 16;

/// The bytes of a batch of `num_slices` slices of `slice_len` steps of `step_bytes` column bytes
/// each, plus `slice_extra` column bytes per slice (the rows before step 0 of frame windows),
/// (see [`max_batch_bytes`]), checked against the limit. Errors name `argument` when given,
/// else `num_slices` when even one-step slices would not fit, else `slice_len`.
pub(crate) fn batch_bytes(
    num_slices: usize,
    slice_len: u64,
    (step_bytes, slice_extra): (u64, u64),
    argument: Option<&str>,
) -> Result<u64> {
    let (limit, why) = batch_limit();
    let cost = |len: u64| {
        let slice = len
            .checked_mul(step_bytes.checked_add(FLAG_BYTES)?)?
            .checked_add(slice_extra)?
            .checked_add(SLICE_BYTES)?;
        (num_slices as u64).checked_mul(slice)
    };
    match cost(slice_len) {
        Some(bytes) if bytes <= limit => Ok(bytes),
        found => {
            let name = argument.unwrap_or(if cost(1).is_none_or(|b| b > limit) {
                "num_slices"
            } else {
                "slice_len"
            });
            let size = match found {
                Some(b) => format!("takes {}", human_bytes(b)),
                None => "overflows a 64-bit byte count".into(),
            };
            Err(Error::argument(
                name,
                format!(
                    "a batch of {num_slices} slices of {slice_len} steps ({} bytes per step) \
                     {size}, more than the limit of {} ({why})",
                    step_bytes.saturating_add(FLAG_BYTES),
                    human_bytes(limit)
                ),
            ))
        }
    }
}

/// At least one slice (named `slices_arg` in errors) of at least one step (`len_arg`), and a
/// plan with its flags within [`max_batch_bytes`]: the check of every sampler's sizes.
pub(crate) fn check_sizes(
    num_slices: usize,
    slice_len: u32,
    slices_arg: &str,
    len_arg: &str,
) -> Result<()> {
    if num_slices == 0 {
        return Err(Error::argument(slices_arg, "must be at least 1"));
    }
    if slice_len == 0 {
        return Err(Error::argument(len_arg, "must be at least 1"));
    }
    batch_bytes(num_slices, slice_len as u64, (0, 0), None).map_err(|e| match e {
        Error::InvalidArgument {
            argument: Some(a),
            reason,
        } => Error::argument(
            if a == "num_slices" {
                slices_arg
            } else {
                len_arg
            },
            reason,
        ),
        e => e,
    })?;
    Ok(())
}

/// Refuses, as an [`Error::InvalidArgument`] naming `argument`, a structure of `bytes` (`None`:
/// its size overflows) larger than [`max_batch_bytes`]; `what` says what it is.
pub(crate) fn check_memory(argument: &str, what: &str, bytes: Option<u64>) -> Result<()> {
    let (limit, why) = batch_limit();
    match bytes {
        Some(b) if b <= limit => Ok(()),
        b => Err(Error::argument(
            argument,
            format!(
                "{what} would take {}, more than the limit of {} ({why})",
                b.map_or("more than 16 EiB".into(), human_bytes),
                human_bytes(limit)
            ),
        )),
    }
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
    /// Checks an episode subset and episode weights: for the uniform sampler only, and a subset
    /// that is not empty.
    pub(crate) fn check_subset(&self) -> Result<()> {
        if self.episode_ids.is_some() && self.kind != SamplerKind::Uniform {
            return Err(Error::argument(
                "episodes",
                format!(
                    "an episode subset is supported by sampler='uniform' only, not '{}'",
                    self.kind.name()
                ),
            ));
        }
        if self.episode_weights.is_some() && self.kind != SamplerKind::Uniform {
            return Err(Error::argument(
                "episode_weights",
                format!(
                    "episode weights are supported by sampler='uniform' only, not '{}'",
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
        Ok(())
    }

    /// Builds the sampler over `snap`, with its cached slice index (O(episodes) the first time
    /// for a slice length and policy, free after, extended rather than rebuilt by
    /// [`Snapshot::refresh`]).
    pub fn build(&self, snap: &Snapshot) -> Result<BuiltSampler> {
        self.check_subset()?;
        let index = || -> Result<Arc<crate::index::SliceIndex>> {
            self.validate()?;
            snap.slice_index(self.slice_len, self.policy)
        };
        let (b, seed) = (self.num_slices, self.seed);
        let mut prioritized = None;
        let sampler: Arc<dyn Sampler> = match self.kind {
            SamplerKind::Uniform => {
                Arc::new(SliceSampler::try_new(index()?, snap.episodes(), self)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alias_table_matches_weights() {
        let t = AliasTable::new(Some(vec![10, 20, 30]), &[1.0, 2.0, 7.0]).unwrap();
        let mut rng = batch_rng(0, 0);
        let mut c = [0usize; 3];
        for _ in 0..100_000 {
            c[(t.draw(&mut rng) / 10 - 1) as usize] += 1;
        }
        for (got, p) in c.iter().zip([0.1, 0.2, 0.7]) {
            assert!((*got as f64 / 1e5 - p).abs() < 0.01, "{c:?}");
        }
        assert!(AliasTable::new(None, &[]).is_err());
        assert!(AliasTable::new(None, &[0.0, 0.0]).is_err());
    }

    #[test]
    fn the_batch_limit_reads_the_process_cgroup_v1_and_v2() {
        let root = tempfile::tempdir().unwrap();
        let put = |path: &str, v: &str| {
            let p = root.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        };
        put("job/memory.max", "4294967296\n");
        put("memory/slurm/job_7/memory.limit_in_bytes", "2147483648\n");
        put("memory/free/memory.limit_in_bytes", "9223372036854771712\n");
        put("open/memory.max", "max\n");
        let at = |text: &str| cgroup_limit(text, root.path());
        assert_eq!(at("0::/job\n"), Some(4 << 30));
        assert_eq!(
            at("4:memory:/slurm/job_7\n1:cpu,cpuacct:/\n"),
            Some(2 << 30)
        );
        assert_eq!(at("3:cpuacct,memory:/slurm/job_7\n"), Some(2 << 30));
        // Both hierarchies (a hybrid host): the smaller.
        assert_eq!(at("4:memory:/slurm/job_7\n0::/job\n"), Some(2 << 30));
        // Unlimited, or no memory controller: no limit.
        assert_eq!(at("4:memory:/free\n0::/open\n2:cpu:/x\ngarbage\n"), None);
        // A path this mount does not have (a container's own cgroup mounted as the root): the
        // hierarchy root's limit, or none where the root sets none.
        assert_eq!(at("0::/docker/abc\n"), None);
        put("memory.max", "1073741824\n");
        assert_eq!(at("0::/docker/abc\n"), Some(1 << 30));
    }
}
