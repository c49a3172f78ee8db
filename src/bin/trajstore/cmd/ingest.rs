//! `trajstore ingest`: an offline-RL dataset or a live Arrow IPC stream into a dataset.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::HumanCount;
use serde_json::json;

use super::*;

#[derive(Clone, Copy, clap::ValueEnum)]
enum IngestFormat {
    Parquet,
    Numpy,
    Torchrl,
    Hdf5,
    Arrow,
    /// dopamine's DQN Replay layout (a `replay_logs/` directory of `$store$_*_ckpt.N.gz`).
    Dqn,
    /// RLDS / TensorFlow Datasets (dataset_info.json, features.json, *.tfrecord-* shards).
    Rlds,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ConventionArg {
    /// Every row is a transition; episodes from flags or ids (they may continue from one .npz
    /// shard into the next).
    Rows,
    /// OGBench (recognised from its keys observations, actions, terminals): `terminals` marks
    /// each trajectory's last row, which is the state after its last step (stored as the final
    /// observation, so next_observation matches ogbench.load_dataset); episodes end truncated;
    /// *-val.npz files of a directory are left out.
    Ogbench,
    /// One episode per file with T + 1 observations and T actions (recognised from those
    /// lengths; Procgen-style dumps): the last observation is the final next_observation.
    EpisodeFiles,
}

impl From<ConventionArg> for trajstore::ingest::Convention {
    fn from(c: ConventionArg) -> Self {
        match c {
            ConventionArg::Rows => Self::Rows,
            ConventionArg::Ogbench => Self::Ogbench,
            ConventionArg::EpisodeFiles => Self::EpisodeFiles,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CodecArg {
    /// zstd with a 16 KiB dictionary trained on the first frames (about 85x smaller on Atari).
    #[value(name = "zstd-dict")]
    ZstdDict,
    /// zstd, each frame alone.
    Zstd,
    /// The raw bytes.
    None,
}

impl From<CodecArg> for trajstore::frames::FrameCodec {
    fn from(c: CodecArg) -> Self {
        match c {
            CodecArg::ZstdDict => Self::ZstdDict,
            CodecArg::Zstd => Self::Zstd,
            CodecArg::None => Self::None,
        }
    }
}

impl From<IngestFormat> for trajstore::ingest::InputFormat {
    fn from(f: IngestFormat) -> Self {
        match f {
            IngestFormat::Parquet => Self::Parquet,
            IngestFormat::Numpy => Self::Numpy,
            IngestFormat::Torchrl => Self::TorchRl,
            IngestFormat::Hdf5 => Self::Hdf5,
            IngestFormat::Arrow => Self::Arrow,
            IngestFormat::Dqn => unreachable!("DQN Replay is ingested by its own path"),
            IngestFormat::Rlds => unreachable!("RLDS is ingested by its own path"),
        }
    }
}

#[derive(Args)]
pub(crate) struct IngestArgs {
    /// Input: a Parquet file or a directory of Parquet shards, a NumPy .npz archive, a directory
    /// of .npy files or of .npz shards (one dataset, files in natural name order: ep_2 before
    /// ep_10), a D4RL HDF5 file or Minari dataset directory, an Arrow IPC file (.arrow,
    /// .feather), a TorchRL replay buffer directory written by rb.dumps(), a DQN Replay
    /// directory (dopamine's replay_logs/, or the run directory holding it), or an RLDS /
    /// TFDS dataset directory (dataset_info.json, features.json and *.tfrecord-* shards).
    input: PathBuf,
    /// Input format (default: from the extension, else the file's first bytes).
    #[arg(long, value_enum)]
    format: Option<IngestFormat>,
    /// Dataset directory (created if it does not exist, appended to otherwise).
    dataset: PathBuf,
    /// How .npz rows make transitions (default: recognised from the arrays' names and lengths,
    /// else rows); the output says which was used.
    #[arg(long, value_enum, value_name = "CONVENTION")]
    convention: Option<ConventionArg>,
    /// Column holding episode ids (rows of one episode must be contiguous).
    #[arg(long, value_name = "NAME")]
    episode_col: Option<String>,
    /// Per-row terminal flag; an episode ends where terminated or truncated is set (D4RL).
    #[arg(long, value_name = "NAME")]
    terminated_col: Option<String>,
    /// Per-row time-limit flag (D4RL `timeouts`).
    #[arg(long, value_name = "NAME")]
    truncated_col: Option<String>,
    /// Observation column (fixed-size list or list of numbers).
    #[arg(long, default_value = "observation", value_name = "NAME")]
    observation_col: String,
    /// Build the observation from several scalar columns instead, e.g. `x,y,vx,vy`.
    #[arg(long, value_delimiter = ',', value_name = "A,B,..")]
    observation_cols: Vec<String>,
    /// Action column (list of floats, or an integer column for discrete actions).
    #[arg(long, default_value = "action", value_name = "NAME")]
    action_col: String,
    /// Build the action from several scalar columns instead.
    #[arg(long, value_delimiter = ',', value_name = "A,B,..")]
    action_cols: Vec<String>,
    /// Reward column (cast to float32).
    #[arg(long, default_value = "reward", value_name = "NAME")]
    reward_col: String,
    /// The data has no reward (demonstrations): store 0.0 for every transition.
    #[arg(long, conflicts_with = "reward_col")]
    no_reward: bool,
    /// Store this column as next_observation (default: derived from the next row).
    #[arg(long, value_name = "NAME")]
    next_observation_col: Option<String>,
    /// Columns to leave out (other columns are kept as user columns).
    #[arg(long, value_delimiter = ',', value_name = "A,B,..")]
    drop_cols: Vec<String>,
    /// Stream input (`-` or an Arrow IPC stream file): commit once N new episodes have ended
    /// (checked after each record batch), so readers see them while the stream is still open.
    #[arg(long, value_name = "N")]
    commit_every: Option<u64>,
    /// Stream input: commit when S seconds have passed since the last commit and new episodes
    /// have arrived (checked as record batches arrive).
    #[arg(long, value_name = "S")]
    commit_secs: Option<f64>,
    /// How image observations are stored: uint8 [H, W] or [H, W, C] observations (and DQN
    /// Replay frames) become a frame column, one compressed frame per step, never stacked and
    /// never stored twice for next_observation. Camera images (columns of PNG/JPEG bytes such
    /// as LeRobot's image features, RLDS images, LeRobot videos) become frame columns too.
    #[arg(long, value_enum, default_value = "zstd-dict", value_name = "CODEC")]
    frame_codec: CodecArg,
    /// The zstd level of a new dataset's frame columns (1 to 22; default 5). On real Atari
    /// frames 5 stored 7-12% fewer bytes than 3 and decoded 16-25% faster, for 1.5x the ingest
    /// time; levels above 5 gained little and 19 compresses 25x slower. An existing dataset
    /// keeps the level it was created with.
    #[arg(long, value_name = "LEVEL", value_parser = clap::value_parser!(i32).range(1..=22))]
    frame_level: Option<i32>,
    /// Keep uint8 image observations (and decoded camera images) as plain tensor columns (no
    /// frame column).
    #[arg(long)]
    keep_tensor: bool,
    /// The observations are stacks of the last K frames (uint8 [H, W, K] channels last, as
    /// Atari's 84x84x4, or [K, H, W] / [K, H, W, C] channels first; oldest frame first): store
    /// one frame per step, the newest of each stack, so that each frame is stored once. Checked:
    /// within an episode each stack must continue the previous one (its frames 0..K-1 are the
    /// previous stack's 1..K), and an episode's first stack must start with K-1 copies of its
    /// newest frame (gymnasium) or zeros (dopamine); the error names the first input row where
    /// they do not. Train with `--frame-stack K` (sample, bench, stream) or `frame_stack=K`
    /// (Python) to get the stacks back.
    #[arg(long, value_name = "K")]
    unstack: Option<usize>,
    /// DQN Replay: the agent's frame stack size; dopamine put stack_size - 1 zero transitions
    /// before each episode, which are dropped (checked to be zero).
    #[arg(long, default_value_t = 4, value_name = "K")]
    stack_size: usize,
    /// DQN Replay: ingest only these checkpoints (default: all, in order).
    #[arg(long, value_delimiter = ',', value_name = "N,N,..")]
    checkpoints: Vec<u64>,
    /// RLDS: ingest only these splits, in this order (default: all, in dataset_info.json's).
    #[arg(long, value_delimiter = ',', value_name = "SPLIT,..")]
    splits: Vec<String>,
    #[command(flatten)]
    write: WriteArgs,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

impl From<&IngestArgs> for trajstore::ingest::IngestOptions {
    fn from(a: &IngestArgs) -> Self {
        let mut o = Self::default();
        o.episode_col.clone_from(&a.episode_col);
        o.terminated_col.clone_from(&a.terminated_col);
        o.truncated_col.clone_from(&a.truncated_col);
        o.observation_col.clone_from(&a.observation_col);
        o.observation_cols.clone_from(&a.observation_cols);
        o.action_col.clone_from(&a.action_col);
        o.action_cols.clone_from(&a.action_cols);
        o.reward_col.clone_from(&a.reward_col);
        o.no_reward = a.no_reward;
        o.next_observation_col.clone_from(&a.next_observation_col);
        o.drop_cols.clone_from(&a.drop_cols);
        o.frame_codec = (!a.keep_tensor).then(|| a.frame_codec.into());
        o.frame_level = a.frame_level;
        o.unstack = a.unstack;
        o.convention = a.convention.map(Into::into);
        match crate::output::TerminalBar::on_terminal(!a.json) {
            Some(bar) => o.with_progress(bar),
            None => o,
        }
    }
}

pub(crate) fn run(a: IngestArgs) -> Result<()> {
    use trajstore::ingest::{IngestOptions, InputFormat};
    let stdin = a.input.as_os_str() == "-";
    let dqn = matches!(a.format, Some(IngestFormat::Dqn))
        || (a.format.is_none() && !stdin && trajstore::ingest::is_dqn(&a.input));
    if dqn {
        return run_dqn(&a);
    }
    let rlds = matches!(a.format, Some(IngestFormat::Rlds))
        || (a.format.is_none() && !stdin && trajstore::ingest::is_rlds(&a.input));
    if rlds {
        return run_rlds(&a);
    }
    let format = match a.format {
        Some(f) => f.into(),
        None if stdin => InputFormat::Arrow,
        None => InputFormat::detect(&a.input)?,
    };
    if stdin && format != InputFormat::Arrow {
        bail!("`-` reads an Arrow IPC stream from stdin; --format must be arrow");
    }
    let policy = trajstore::ingest::CommitPolicy {
        episodes: a.commit_every,
        interval: match a.commit_secs {
            Some(s) if !(s.is_finite() && s > 0.0) => bail!("--commit-secs must be positive"),
            s => s.map(std::time::Duration::from_secs_f64),
        },
    };
    if a.commit_every == Some(0) {
        bail!("--commit-every must be at least 1");
    }
    let streamed = stdin
        || (format == InputFormat::Arrow
            && trajstore::ingest::is_arrow_stream(&a.input).unwrap_or(false));
    if policy != Default::default() && !streamed {
        bail!(
            "--commit-every and --commit-secs apply to streams (`-` or an Arrow IPC stream file); \
             a file is committed once, whole"
        );
    }
    let o = IngestOptions::from(&a);
    let report = if streamed {
        let (name, input): (PathBuf, Box<dyn std::io::Read>) = if stdin {
            ("stdin".into(), Box::new(std::io::stdin().lock()))
        } else {
            let f = std::fs::File::open(&a.input)
                .with_context(|| format!("cannot open {}", a.input.display()))?;
            let name = std::fs::canonicalize(&a.input).unwrap_or_else(|_| a.input.clone());
            (name, Box::new(f))
        };
        trajstore::ingest::ingest_stream(input, &name, &a.dataset, &o, a.write.options(), policy)?
    } else {
        trajstore::ingest::ingest(&a.input, format, &a.dataset, &o, a.write.options())?
    };
    if a.json {
        outln!("{}", report.to_json());
    } else {
        if let Some(c) = &report.convention {
            let how = if c.recognised { " (recognised)" } else { "" };
            let left = match c.left_out.len() {
                0 => String::new(),
                n => format!(", {n} left out (*-val.npz: OGBench's validation split)"),
            };
            outln!(
                "convention {}{how}; {} .npz file(s) read{left}",
                c.convention,
                c.files
            );
        }
        outln!("episodes from {}", report.boundaries);
        for (stored, input) in &report.columns {
            outln!("  {stored} <- {input}");
        }
        outln!(
            "ingested {} transitions in {} episodes in {:.2} s ({}/s) -> {} version {}",
            HumanCount(report.rows),
            HumanCount(report.episodes),
            report.seconds,
            HumanCount((report.rows as f64 / report.seconds.max(1e-9)) as u64),
            a.dataset.display(),
            report.version
        );
    }
    Ok(())
}

fn run_dqn(a: &IngestArgs) -> Result<()> {
    if a.keep_tensor {
        bail!("--keep-tensor: DQN Replay frames are always stored as a frame column");
    }
    if a.unstack.is_some() {
        bail!(
            "--unstack: DQN Replay stores single frames already (its stack size is --stack-size)"
        );
    }
    let mut o = trajstore::ingest::DqnOptions::default();
    o.stack_size = a.stack_size;
    o.frame_codec = a.frame_codec.into();
    o.frame_level = a.frame_level;
    o.checkpoints = (!a.checkpoints.is_empty()).then(|| a.checkpoints.clone());
    let r = trajstore::ingest::ingest_dqn(&a.input, &a.dataset, &o, a.write.options())?;
    if a.json {
        outln!(
            "{}",
            serde_json::to_string(&json!({
                "rows": r.rows, "episodes": r.episodes, "version": r.version, "seconds": r.seconds,
                "checkpoints": r.checkpoints, "padding": r.padding, "skipped": r.skipped,
                "overlap": r.overlap,
            }))?
        );
    } else {
        outln!(
            "DQN Replay checkpoints {:?}: {} steps in {} episodes ({} padding entries dropped, \
             {} skipped before an episode start, {} already read) in {:.2} s -> {} version {}",
            r.checkpoints,
            HumanCount(r.rows),
            HumanCount(r.episodes),
            HumanCount(r.padding),
            HumanCount(r.skipped),
            HumanCount(r.overlap),
            r.seconds,
            a.dataset.display(),
            r.version
        );
    }
    Ok(())
}

fn run_rlds(a: &IngestArgs) -> Result<()> {
    let defaults = trajstore::ingest::IngestOptions::default();
    let unsupported = [
        ("--episode-col", a.episode_col.is_some()),
        ("--terminated-col", a.terminated_col.is_some()),
        ("--truncated-col", a.truncated_col.is_some()),
        ("--observation-cols", !a.observation_cols.is_empty()),
        ("--action-col", a.action_col != defaults.action_col),
        ("--action-cols", !a.action_cols.is_empty()),
        ("--reward-col", a.reward_col != defaults.reward_col),
        ("--no-reward", a.no_reward),
        ("--next-observation-col", a.next_observation_col.is_some()),
        ("--unstack", a.unstack.is_some()),
    ];
    if let Some((flag, _)) = unsupported.iter().find(|(_, set)| *set) {
        bail!(
            "{flag}: an RLDS dataset's episodes, flags, action and reward are its steps' own \
             (--observation-col, --drop-cols, --splits, --frame-codec, --frame-level and \
             --keep-tensor apply)"
        );
    }
    let mut o = trajstore::ingest::RldsOptions::default();
    o.frame_codec = (!a.keep_tensor).then(|| a.frame_codec.into());
    o.frame_level = a.frame_level;
    o.splits = (!a.splits.is_empty()).then(|| a.splits.clone());
    o.observation =
        (a.observation_col != defaults.observation_col).then(|| a.observation_col.clone());
    o.drop.clone_from(&a.drop_cols);
    let r = trajstore::ingest::ingest_rlds(&a.input, &a.dataset, &o, a.write.options())?;
    if a.json {
        outln!("{}", r.to_json());
    } else {
        outln!("episodes from {}", r.boundaries);
        for (stored, input) in &r.columns {
            outln!("  {stored} <- {input}");
        }
        for s in &r.skipped {
            outln!("  not stored: {s}");
        }
        outln!(
            "ingested {} transitions in {} episodes ({} of one step, not stored) from splits {} \
             ({} shards) in {:.2} s ({}/s) -> {} version {}",
            HumanCount(r.rows),
            HumanCount(r.episodes),
            HumanCount(r.empty_episodes),
            r.splits.join(", "),
            r.shards,
            r.seconds,
            HumanCount((r.rows as f64 / r.seconds.max(1e-9)) as u64),
            a.dataset.display(),
            r.version
        );
    }
    Ok(())
}
