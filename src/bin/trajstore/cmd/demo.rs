//! `trajstore demo`: a seeded synthetic dataset.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{HumanBytes, HumanCount, ProgressBar};
use serde_json::json;
use trajstore::Dataset;
use trajstore::synth::{ObsDtype, SynthSpec};

use super::info::*;
use super::sample::*;
use super::*;
use crate::output::*;

#[derive(Args)]
#[command(after_help = "Examples:\n  \
trajstore demo                  # 1M D4RL-shaped transitions: 17 float32 observations, 6 actions\n  \
trajstore demo atari.trajstore --obs-shape 84,84,4 --obs-dtype uint8 --discrete --act-dim 4 \\\n      \
--transitions 200000 --mean-episode-len 500\n      \
# Atari-like (DQN replay): 84x84 uint8 frames in stacks of 4, 28 KB per transition\n  \
trajstore demo pixels.trajstore --frames --discrete --act-dim 4 --transitions 200000\n      \
# pixels as a frame column: one 84x84 uint8 frame per step, zstd with a trained dictionary\n      \
# (about 100 B per frame); sample with --frame-stack 4")]
pub(crate) struct DemoArgs {
    /// Dataset directory to write. An existing dataset is refused unless --append or --overwrite
    /// says what to do with it.
    #[arg(default_value = "demo.trajstore")]
    dataset: PathBuf,
    /// Number of transitions.
    #[arg(long, default_value_t = 1_000_000)]
    transitions: u64,
    /// Observation dimension: vector observations, the shorthand of --obs-shape D (default 17).
    #[arg(long, value_name = "D", conflicts_with = "obs_shape")]
    obs_dim: Option<usize>,
    /// Observation shape, comma-separated positive dimensions. One dimension: vectors (random
    /// walks); two or more, [H, W, C...]: image frames of a small Breakout-like game, the C
    /// values of a pixel a frame stack (84,84,4 is Atari's DQN-replay layout).
    #[arg(long, value_name = "DIMS", value_parser = parse_shape)]
    obs_shape: Option<Shape>,
    /// Observation element type: float32 or uint8 (images: pixels, or pixel / 255 as float32).
    #[arg(long, value_name = "TYPE", default_value = "float32")]
    obs_dtype: ObsDtype,
    /// Pixel observations as a frame column (README "Pixel observations"): one 84x84 grayscale
    /// uint8 frame per step (a game's: a static background inside a border, a moving paddle and
    /// a bouncing ball, their positions depending on the step and the episode), each stored once,
    /// compressed with zstd and a dictionary trained on the first frames (codec zstd-dict), with
    /// each episode's final frame. Loaders stack frames (--frame-stack K).
    #[arg(long, conflicts_with_all = ["obs_dim", "obs_shape", "obs_dtype"])]
    frames: bool,
    /// Action dimension (number of actions with --discrete).
    #[arg(long, default_value_t = 6)]
    act_dim: usize,
    /// Discrete actions (int64) instead of continuous ones.
    #[arg(long)]
    discrete: bool,
    /// Mean episode length (lengths are exponential, clamped to [10, 4 * mean]).
    #[arg(long, default_value_t = 1000.0)]
    mean_episode_len: f64,
    /// Seed: the same arguments always produce the same bytes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Append to an existing dataset.
    #[arg(long, conflicts_with = "overwrite")]
    append: bool,
    /// Write a new version of an existing dataset that holds only the demo's transitions. Nothing
    /// is deleted: older versions stay readable (`--version N`) until retention removes them.
    #[arg(long)]
    overwrite: bool,
    /// Commit every N episodes, as a live collector would (default: once at the end).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    commit_every: Option<u64>,
    #[command(flatten)]
    write: WriteArgs,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

/// An observation shape (one value to clap, not a list of values).
#[derive(Clone, Debug)]
struct Shape(Vec<usize>);

/// `84,84,4` (or `84x84x4`) as `[84, 84, 4]`: positive dimensions.
fn parse_shape(s: &str) -> std::result::Result<Shape, String> {
    let dims = s
        .split([',', 'x'])
        .map(|d| match d.trim().parse::<usize>() {
            Ok(0) => Err(format!("`{s}`: dimensions must be positive")),
            Ok(n) => Ok(n),
            Err(_) => Err(format!(
                "`{s}` is not a shape: give positive dimensions separated by commas, e.g. 84,84,4"
            )),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(Shape(dims))
}

pub(crate) fn run(a: DemoArgs) -> Result<()> {
    let obs_shape = match (&a.obs_shape, a.obs_dim) {
        (Some(shape), _) => shape.0.clone(),
        (None, d) => vec![d.unwrap_or(17)],
    };
    let spec = SynthSpec {
        transitions: a.transitions,
        obs_shape,
        obs_dtype: a.obs_dtype,
        act_dim: a.act_dim,
        discrete_actions: a.discrete,
        mean_episode_len: a.mean_episode_len,
        seed: a.seed,
    };
    if a.transitions == 0 || spec.obs_len() == 0 || a.act_dim == 0 {
        bail!("--transitions, --obs-dim and --act-dim must be positive");
    }
    let schema = if a.frames {
        spec.frame_schema()?
    } else {
        spec.schema()?
    };
    // Bytes of one transition as stored (columns, without validity bitmaps); a frame raw.
    let transition_bytes = schema.row_bytes()
        + if a.frames {
            (trajstore::synth::FRAME_SIDE * trajstore::synth::FRAME_SIDE) as f64
        } else {
            0.0
        };
    // An empty directory is as good as none.
    let exists = a.dataset.exists()
        && std::fs::read_dir(&a.dataset).map_or(true, |mut d| d.next().is_some());
    let ds = if exists {
        if !a.dataset.join(trajstore::format::VERSIONS_DIR).is_dir() {
            bail!(
                "{} exists and is not a trajstore dataset; refusing to write into it",
                a.dataset.display()
            );
        }
        if !a.append && !a.overwrite {
            bail!(
                "{} is already a dataset; give --append to add the demo's transitions to it, or \
                 --overwrite to write a new version holding only them (older versions stay \
                 readable), or choose another directory",
                a.dataset.display()
            );
        }
        Dataset::open(&a.dataset)
            .with_context(|| format!("cannot open dataset {}", a.dataset.display()))?
    } else {
        Dataset::create(&a.dataset, &schema)?
    };
    let start = Instant::now();
    let mut writer = ds.writer(a.write.options())?;
    if writer.schema() != &schema {
        bail!(
            "the dataset's schema differs from the demo's (check --obs-dim/--obs-shape/--obs-dtype/\
             --act-dim/--discrete/--frames); write the demo to another directory"
        );
    }
    if a.overwrite {
        writer.replace();
    }
    writer.set_property("source", format!("trajstore demo (seed {})", a.seed));
    let pb = if a.json {
        ProgressBar::hidden()
    } else {
        progress(a.transitions, "writing")
    };
    let commit_every = a.commit_every.map(|n| n as usize);
    let written = if a.frames {
        spec.write_frames(&mut writer, commit_every, |n| pb.inc(n))
    } else {
        spec.write(&mut writer, commit_every, |n| pb.inc(n))
    };
    let version = written.map_err(|e| {
        pb.abandon();
        let kept = ds.versions().ok().and_then(|v| v.last().copied());
        anyhow::Error::new(e).context(match kept {
            Some(v) => {
                format!("the demo stopped; the dataset keeps version {v}, committed before")
            }
            None => "the demo stopped".to_string(),
        })
    })?;
    drop(writer);
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let snap = ds.snapshot()?;
    if a.json {
        let mut v = info_json(&snap.catalog(), &a.dataset.display().to_string());
        v["write_seconds"] = json!(secs);
        v["transition_bytes"] = json!(transition_bytes);
        v["write_transitions_per_second"] = json!(a.transitions as f64 / secs);
        v["write_bytes_per_second"] = json!(transition_bytes * a.transitions as f64 / secs);
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!(
            "wrote {} transitions ({} each) in {:.2} s ({}/s, {}/s) -> version {version}\n",
            HumanCount(a.transitions),
            HumanBytes(transition_bytes.round() as u64),
            secs,
            HumanCount((a.transitions as f64 / secs) as u64),
            HumanBytes(
                (snap.bytes_on_disk() as f64 * a.transitions as f64
                    / snap.num_transitions().max(1) as f64
                    / secs) as u64
            ),
        );
        emit(&render_info(
            &snap.catalog(),
            &a.dataset.display().to_string(),
            12,
        ));
        // The sample takes 100 batches of 256 x 64 transitions: seconds of copying for images.
        let small = !a.frames && transition_bytes * 256.0 * 64.0 <= (64 << 20) as f64;
        if small && let Ok(text) = demo_sample(&snap) {
            emit(&text);
        }
        let d = a.dataset.display();
        let sql = if cfg!(feature = "sql") {
            format!(
                "\n  trajstore sql {d} \"SELECT episode_id, length, episode_return FROM episodes ORDER BY episode_return DESC LIMIT 5\""
            )
        } else {
            String::new()
        };
        if a.frames {
            outln!(
                "\nnext:\n  trajstore info {d}\n  trajstore sample {d} --frame-stack 4 --slice-len 1 --num-slices 32\n  trajstore bench {d} --frame-stack 4 --slice-len 64 --num-slices 256{sql}\n  trajstore verify {d}"
            );
        } else {
            outln!(
                "\nnext:\n  trajstore sample {d} --slice-len 64 --num-slices 8\n  trajstore bench {d}{bench}{sql}\n  trajstore verify {d}",
                bench = if small {
                    ""
                } else {
                    " --num-slices 32 --slice-len 16"
                }
            );
        }
    }
    Ok(())
}
