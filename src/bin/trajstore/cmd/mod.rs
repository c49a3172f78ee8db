//! One module per command, and the arguments several commands share.

pub(crate) mod bench;
pub(crate) mod bench_text;
pub(crate) mod bench_torch;
#[cfg(feature = "ballista")]
pub(crate) mod cluster;
pub(crate) mod demo;
pub(crate) mod export;
pub(crate) mod info;
pub(crate) mod ingest;
#[cfg(feature = "remote")]
pub(crate) mod pull;
#[cfg(feature = "remote")]
pub(crate) mod push;
pub(crate) mod sample;
#[cfg(feature = "sql")]
pub(crate) mod sql;
#[cfg(feature = "remote")]
pub(crate) mod stream;
pub(crate) mod vacuum;
pub(crate) mod verify;

use std::path::PathBuf;

use clap::Args;
use trajstore::WriterOptions;

use crate::output::*;

#[derive(Args)]
pub(crate) struct WriteArgs {
    /// Target segment file size (e.g. 256MiB, 1GiB).
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    segment_size: u64,
    /// Keep at most this many transitions, dropping the oldest segments (FIFO replay).
    #[arg(long)]
    max_transitions: Option<u64>,
    /// Keep only the newest N versions and delete files no kept version uses (an older version
    /// goes once the version that replaced it is --retention-grace old).
    #[arg(long, value_name = "N")]
    keep_versions: Option<usize>,
    /// How long a replaced version's files stay for readers that opened it (e.g. 0s, 10m).
    #[arg(long, value_name = "AGE", default_value = "10m", value_parser = parse_duration)]
    retention_grace: std::time::Duration,
}

impl WriteArgs {
    fn options(&self) -> WriterOptions {
        let mut o = WriterOptions::default().with_segment_bytes(self.segment_size);
        o.batch_bytes = o.batch_bytes.min(self.segment_size);
        if let Some(m) = self.max_transitions {
            o = o.with_max_transitions(m);
        }
        if let Some(k) = self.keep_versions {
            o = o.with_keep_versions(k);
        }
        o.with_retention_grace(self.retention_grace)
    }
}

#[derive(Args)]
pub(crate) struct VersionArgs {
    /// Dataset directory, or a URL (s3://BUCKET/PREFIX; see `trajstore pull --help`).
    dataset: PathBuf,
    /// Read this version instead of the newest.
    #[arg(long)]
    version: Option<u64>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct SliceArgs {
    /// Dataset directory, or a URL (s3://BUCKET/PREFIX; see `trajstore pull --help`).
    pub(crate) dataset: PathBuf,
    /// Steps per slice (at least 1).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    slice_len: u32,
    /// Slices per batch (at least 1). A batch (slices x steps x bytes per step of the columns)
    /// must fit in half of the memory of this machine or its cgroup (TRAJSTORE_MAX_BATCH_BYTES
    /// sets another limit).
    #[arg(long, default_value_t = 256, value_parser = at_least_one)]
    num_slices: usize,
    /// strict (windows inside episodes), pad (may run past the end, masked) or span:LEFT:RIGHT.
    #[arg(long, default_value = "strict")]
    policy: trajstore::BoundaryPolicy,
    /// windows (uniform over windows) or episodes (uniform over episodes, TorchRL's semantics).
    #[arg(long, default_value = "windows")]
    weighting: trajstore::Weighting,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Columns to gather.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "observation,action,reward"
    )]
    columns: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Restrict sampling to the episodes this SQL query returns (a query with an `episode_id`
    /// column), e.g. "SELECT episode_id FROM episodes ORDER BY episode_return DESC LIMIT 10".
    #[arg(long, value_name = "SQL")]
    episodes: Option<String>,
    /// Pixel observations (frame columns): each step holds its last K frames, [K, H, W], built
    /// from frames stored once and decoded by the gather (4 for DQN-style Atari agents).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=64))]
    frame_stack: Option<u32>,
    /// What a frame stack holds before an episode's first frame: repeat (that frame, as
    /// gymnasium's FrameStackObservation) or zeros (as dopamine's replay buffer).
    #[arg(long, default_value = "repeat", requires = "frame_stack")]
    frame_pad: trajstore::StackPad,
    /// Frame stacks along the last axis, [H, W, K] (as dopamine and Stable-Baselines3 give
    /// them; [H, W, K*C] for color frames) instead of [K, H, W].
    #[arg(long, requires = "frame_stack")]
    channels_last: bool,
    /// Gather each slice's window of L+K-1 frames, [L+K-1, H, W], of which step j's stack is
    /// frames j..j+K, instead of L written-out stacks: a quarter of the bytes at K=4 (TorchRL's
    /// unfold view; a tensor's [L, K, H, W] stacks are a strided view of it). Stack-first only.
    #[arg(long, requires = "frame_stack", conflicts_with = "channels_last")]
    frame_window: bool,
    /// Keep up to SIZE of decoded frames in memory (e.g. 2GiB): the frame columns' frames (all
    /// of them where they fit, else the first ones) are decoded once, in parallel, when the
    /// sampler starts, and copied afterwards instead of decoded (about twice as fast on Atari
    /// frames). It costs the memory of raw frames, as TorchRL's in-memory storages do; without
    /// it every gathered frame is decoded. Not with --follow, nor in `stream` (object storage).
    #[arg(long, value_name = "SIZE", value_parser = crate::output::parse_size)]
    frame_cache: Option<u64>,
}

impl SliceArgs {
    /// The frame stack `--frame-stack` and `--frame-pad` ask for.
    pub(crate) fn frame_stack(&self) -> anyhow::Result<Option<trajstore::FrameStack>> {
        Ok(match self.frame_stack {
            Some(k) => Some(
                trajstore::FrameStack::new(k as usize)?
                    .with_pad(self.frame_pad)
                    .with_channels_last(self.channels_last)
                    .with_window(self.frame_window),
            ),
            // --frame-cache alone: one frame per step, [H, W], cached (0: no cache).
            None => (self.frame_cache > Some(0)).then(trajstore::FrameStack::unstacked),
        }
        .map(|st| st.with_cache(self.frame_cache.unwrap_or(0))))
    }

    /// `spec` with the frame stack of `--frame-stack`, if any.
    pub(crate) fn stacked(
        &self,
        spec: trajstore::LoaderSpec,
    ) -> anyhow::Result<trajstore::LoaderSpec> {
        Ok(match self.frame_stack()? {
            Some(st) => spec.with_frame_stack(st),
            None => spec,
        })
    }

    /// The gatherer of `--columns` over `snap`, frames stacked as asked.
    pub(crate) fn gatherer(
        &self,
        snap: &trajstore::Snapshot,
    ) -> anyhow::Result<trajstore::Gatherer> {
        let cols: Vec<&str> = self.columns.iter().map(String::as_str).collect();
        Ok(trajstore::Gatherer::with_frame_stack(
            snap,
            &cols,
            self.frame_stack()?,
        )?)
    }
}

/// Refuses a batch of `--num-slices` slices of `--slice-len` steps of `gatherer`'s columns that
/// would not fit in memory ([`trajstore::sample::max_batch_bytes`]), naming the option, before
/// anything is sampled or allocated.
pub(crate) fn check_batch_size(
    gatherer: &trajstore::Gatherer,
    a: &SliceArgs,
) -> anyhow::Result<()> {
    match gatherer.batch_bytes(a.num_slices, a.slice_len as usize) {
        Ok(_) => Ok(()),
        Err(trajstore::Error::InvalidArgument {
            argument: Some(arg),
            reason,
        }) => Err(anyhow::anyhow!("--{}: {reason}", arg.replace('_', "-"))),
        Err(e) => Err(e.into()),
    }
}

/// A count that must be at least 1 (`--num-slices`).
pub(crate) fn at_least_one(s: &str) -> std::result::Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("`{s}` is not a count: {e}")),
    }
}
