//! A seeded synthetic dataset generator, used by `trajstore demo`, tests and benches: D4RL-shaped
//! vector observations, or Atari-like image observations.
//!
//! Episode lengths follow an exponential distribution with the given mean, clamped to
//! `[min(10, mean), 4 * mean]` (the same law as `../shared/peers/torchrl_slice_bench.py`).
//! Half the episodes end terminated, half truncated. The same spec always gives the same bytes,
//! whatever the number of threads: every episode draws from its own RNG, seeded by the spec's
//! seed and the episode's index.
//!
//! **Vector observations** (a shape of one dimension, `[d]`): random walks, actions uniform in
//! `[-1, 1]` (or in `0..act_dim`), rewards a smooth function of both. As `uint8`, the walk is
//! quantized to `128 + 40 x` (clamped).
//!
//! **Image observations** (a shape of two dimensions or more, row-major `[H, W, C...]`): frames of
//! a small Breakout-like game drawn over a per-episode background of random bricks: a ball
//! bounces in the frame, a paddle at the bottom moves with the actions, and the reward is `+1`
//! when the ball bounces off the paddle, `-1` when it reaches the bottom beside it, `0`
//! otherwise. The `C` values of a pixel (the product of the dimensions after the second) are a
//! frame stack, oldest first, as in DQN's Atari replay (`84,84,4`): channel `c` of step `t` is
//! the scene of step `t - (C - 1) + c`, the first frame repeated before the episode starts, so
//! that `next_observation` shares `C - 1` frames with `observation`. Pixels are `uint8`, or their
//! value / 255 as `float32`. Drawing is a copy of the background and two small rectangles per
//! step: generation runs at memory speed.
//!
//! **Frame columns** ([`SynthSpec::frame_schema`], [`SynthSpec::write_frames`], `trajstore demo
//! --frames`): one 84×84 grayscale `uint8` frame per step, stored as a `zstd-dict` frame column
//! (the dataset keeps each frame once; a loader stacks them). The frames compress like a game's:
//! a static dark background inside a bright border, a paddle at the bottom that sweeps left and
//! right and a ball that bounces off the walls, their positions functions of the step and of the
//! episode (phases and speeds drawn from the episode's RNG). `obs_shape` and `obs_dtype` are
//! ignored. The discrete action is the paddle's move (0: stays, 2: right, 3: left), the first
//! value of a continuous one its direction; the reward is `+1` when the ball comes down onto the
//! paddle, `-1` when it comes down beside it, `0` otherwise.

use std::str::FromStr;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, UInt8Array,
};
use arrow::datatypes::{DataType, Field};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, StandardNormal};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::format::col;
use crate::frames::FrameCodec;
use crate::schema::{TransitionSchema, value_bytes};
use crate::store::writer::{DatasetWriter, EpisodeEnd};

/// Element type of generated observations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ObsDtype {
    /// `float32` (vectors: the random walk; images: pixel / 255).
    #[default]
    Float32,
    /// `uint8` (images: pixels; vectors: the quantized random walk).
    UInt8,
}

impl ObsDtype {
    /// The Arrow type of one element.
    pub fn data_type(self) -> DataType {
        match self {
            ObsDtype::Float32 => DataType::Float32,
            ObsDtype::UInt8 => DataType::UInt8,
        }
    }
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            ObsDtype::Float32 => 4,
            ObsDtype::UInt8 => 1,
        }
    }
    /// The name in the manifest grammar (`float32`, `uint8`).
    pub fn name(self) -> &'static str {
        match self {
            ObsDtype::Float32 => "float32",
            ObsDtype::UInt8 => "uint8",
        }
    }
}

impl std::fmt::Display for ObsDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ObsDtype {
    type Err = Error;
    /// `float32` (or `f32`) and `uint8` (or `u8`), case-insensitive.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "float32" | "f32" => Ok(ObsDtype::Float32),
            "uint8" | "u8" => Ok(ObsDtype::UInt8),
            _ => Err(Error::argument(
                "obs_dtype",
                format!("`{s}` is not an observation type (float32, uint8)"),
            )),
        }
    }
}

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    /// Total transitions.
    pub transitions: u64,
    /// Shape of one observation, row-major: `[d]` for vectors, `[H, W, C...]` for images (see
    /// the module documentation). Every dimension must be positive.
    pub obs_shape: Vec<usize>,
    /// Element type of observations.
    pub obs_dtype: ObsDtype,
    /// Action dimension (ignored when `discrete_actions` is set).
    pub act_dim: usize,
    /// Discrete actions in `0..act_dim` (stored as int64) instead of continuous ones.
    pub discrete_actions: bool,
    /// Mean episode length.
    pub mean_episode_len: f64,
    /// Seed of every random draw.
    pub seed: u64,
}

impl Default for SynthSpec {
    fn default() -> Self {
        Self {
            transitions: 1_000_000,
            obs_shape: vec![17],
            obs_dtype: ObsDtype::Float32,
            act_dim: 6,
            discrete_actions: false,
            mean_episode_len: 1000.0,
            seed: 0,
        }
    }
}

/// [`SynthSpec::write`] generates episodes in groups of at most this many bytes (or one
/// episode), so that image episodes do not pile up in memory.
const GROUP_BYTES: usize = 128 << 20;

/// Side of the square grayscale frames of [`SynthSpec::write_frames`].
pub const FRAME_SIDE: usize = 84;

impl SynthSpec {
    /// The defaults with vector observations of `dim` values (`obs_shape: vec![dim]`).
    pub fn with_obs_dim(mut self, dim: usize) -> Self {
        self.obs_shape = vec![dim];
        self
    }

    /// Number of values in one observation.
    pub fn obs_len(&self) -> usize {
        self.obs_shape.iter().product()
    }

    /// Whether observations are images (a shape of two dimensions or more).
    pub fn is_image(&self) -> bool {
        self.obs_shape.len() >= 2
    }

    /// The schema of the generated data.
    pub fn schema(&self) -> Result<TransitionSchema> {
        let b = TransitionSchema::builder(&self.obs_shape, self.act_dim.max(1))
            .observation(self.obs_dtype.data_type(), &self.obs_shape);
        if self.discrete_actions {
            b.discrete_action()
        } else {
            b
        }
        .build()
    }

    /// The schema of [`SynthSpec::write_frames`]: the observation a `zstd-dict` frame column of
    /// `[84, 84]` `uint8` frames, the action as in [`SynthSpec::schema`].
    pub fn frame_schema(&self) -> Result<TransitionSchema> {
        let b = TransitionSchema::builder(&[1], self.act_dim.max(1))
            .frames(FrameCodec::ZstdDict, &[FRAME_SIDE, FRAME_SIDE]);
        if self.discrete_actions {
            b.discrete_action()
        } else {
            b
        }
        .build()
    }

    /// Episode lengths, in order, summing to `transitions`.
    pub fn episode_lengths(&self) -> Result<Vec<u64>> {
        if self.mean_episode_len < 1.0 || !self.mean_episode_len.is_finite() {
            return Err(Error::argument(
                "mean_episode_len",
                format!(
                    "mean episode length {} must be a finite number >= 1",
                    self.mean_episode_len
                ),
            ));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let exp = Exp::new(1.0 / self.mean_episode_len).expect("positive rate");
        let (lo, hi) = (self.mean_episode_len.min(10.0), 4.0 * self.mean_episode_len);
        let mut out = vec![];
        let mut total = 0u64;
        while total < self.transitions {
            let l: f64 = exp.sample(&mut rng);
            let l = l.clamp(lo, hi) as u64;
            let l = l.max(1).min(self.transitions - total);
            out.push(l);
            total += l;
        }
        Ok(out)
    }

    /// Episode number `index` (0-based within this spec) of `len` steps. The batch has the
    /// columns `observation`, `action` and `reward`; the end carries the `final_observation`.
    pub fn episode(&self, index: u64, len: u64) -> (RecordBatch, EpisodeEnd) {
        let mut rng =
            ChaCha8Rng::seed_from_u64(self.seed ^ 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(index + 1));
        let n = len as usize;
        let (obs, final_obs, action, reward) = if self.is_image() {
            self.image_episode(&mut rng, n)
        } else {
            self.vector_episode(&mut rng, n)
        };
        episode_of(&mut rng, obs, action, reward, final_obs)
    }

    /// Episode number `index` of `len` steps of [`SynthSpec::write_frames`]: the batch has the
    /// columns `observation` (raw `[84, 84]` `uint8` frames, as a writer of
    /// [`SynthSpec::frame_schema`] takes them), `action` and `reward`; the end carries the final
    /// frame.
    pub fn frame_episode(&self, index: u64, len: u64) -> (RecordBatch, EpisodeEnd) {
        let mut rng =
            ChaCha8Rng::seed_from_u64(self.seed ^ 0x2545_f491_4f6c_dd1du64.wrapping_mul(index + 1));
        let n = len as usize;
        let side = FRAME_SIDE;
        let hw = side * side;
        // Inside the border (2 pixels): [2, 82). Paddle 12 x 3 at rows 76..79, ball 3 x 3.
        let (border, pad_w, pad_h, ball) = (2usize, 12usize, 3usize, 3usize);
        let pad_y = side - border - 2 * pad_h;
        let pad_range = side - 2 * border - pad_w; // x - border in 0..=pad_range
        let (ball_x_range, ball_y_range) = (side - 2 * border - ball, pad_y - border - ball);
        // Triangle wave: s bounced in [0, r].
        let tri = |s: usize, r: usize| {
            let m = s % (2 * r);
            if m <= r { m } else { 2 * r - m }
        };
        let pad_phase = rng.random_range(0..2 * pad_range);
        let pad_speed = rng.random_range(1..=2usize);
        let (bx_phase, by_phase) = (
            rng.random_range(0..2 * ball_x_range),
            rng.random_range(0..2 * ball_y_range),
        );
        let (bx_speed, by_speed) = (rng.random_range(1..=3usize), rng.random_range(1..=3usize));
        let pad_x = |t: usize| border + tri(pad_phase + t * pad_speed, pad_range);
        let ball_xy = |t: usize| {
            (
                border + tri(bx_phase + t * bx_speed, ball_x_range),
                border + tri(by_phase + t * by_speed, ball_y_range),
            )
        };
        let mut background = vec![24u8; hw];
        for y in 0..side {
            for x in 0..side {
                if y < border || y >= side - border || x < border || x >= side - border {
                    background[y * side + x] = 142;
                }
            }
        }
        let mut frames = vec![0u8; (n + 1) * hw];
        frames
            .par_chunks_mut(hw)
            .with_min_len(64)
            .enumerate()
            .for_each(|(t, f)| {
                f.copy_from_slice(&background);
                let px = pad_x(t);
                for y in pad_y..pad_y + pad_h {
                    f[y * side + px..y * side + px + pad_w].fill(200);
                }
                let (bx, by) = ball_xy(t);
                for y in by..by + ball {
                    f[y * side + bx..y * side + bx + ball].fill(255);
                }
            });
        // The paddle's move from step t to t + 1: -1, 0 or 1.
        let dir = |t: usize| (pad_x(t + 1) as i64 - pad_x(t) as i64).signum();
        let reward: Vec<f32> = (0..n)
            .map(|t| {
                let ((bx, by), (_, next_by)) = (ball_xy(t), ball_xy(t + 1));
                // The ball reaches the bottom of its range between t and t + 1.
                if by < next_by && next_by == border + ball_y_range {
                    let px = pad_x(t + 1);
                    if bx + ball > px && bx < px + pad_w {
                        1.0
                    } else {
                        -1.0
                    }
                } else {
                    0.0
                }
            })
            .collect();
        let action: ArrayRef = if self.discrete_actions {
            let k = self.act_dim.max(1) as i64;
            let a: Vec<i64> = (0..n)
                .map(|t| match dir(t) {
                    1 => 2,
                    -1 => 3,
                    _ => 0,
                })
                .map(|a| if a < k { a } else { 0 })
                .collect();
            Arc::new(Int64Array::from(a))
        } else {
            let k = self.act_dim.max(1);
            let mut a: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0f32)).collect();
            for t in 0..n {
                a[t * k] = dir(t) as f32;
            }
            fsl_f32(a, k)
        };
        let final_frame = frames.split_off(n * hw);
        let (obs, final_obs) = (fsl_u8(frames, hw), fsl_u8(final_frame, hw));
        episode_of(&mut rng, obs, action, reward, final_obs)
    }

    /// Random-walk observations (the D4RL-like default; the draws of float32 `[d]` are those of
    /// every earlier version, so their bytes did not change).
    fn vector_episode(&self, rng: &mut ChaCha8Rng, n: usize) -> EpisodeColumns {
        let d = self.obs_len();
        let mut obs = Vec::with_capacity((n + 1) * d);
        for _ in 0..d {
            obs.push(rng.sample::<f32, _>(StandardNormal));
        }
        for t in 0..n {
            for k in 0..d {
                let prev = obs[t * d + k];
                obs.push(0.98 * prev + 0.1 * rng.sample::<f32, _>(StandardNormal));
            }
        }
        let final_obs: Vec<f32> = obs.split_off(n * d);
        let (action, reward): (ArrayRef, Vec<f32>) = if self.discrete_actions {
            let a: Vec<i64> = (0..n)
                .map(|_| rng.random_range(0..self.act_dim.max(1) as i64))
                .collect();
            let r = (0..n)
                .map(|t| if a[t] == 0 { 1.0 } else { -obs[t * d].abs() })
                .collect();
            (Arc::new(Int64Array::from(a)), r)
        } else {
            let m = self.act_dim;
            let a: Vec<f32> = (0..n * m).map(|_| rng.random_range(-1.0..1.0f32)).collect();
            let r = (0..n)
                .map(|t| {
                    let o = &obs[t * d..(t + 1) * d];
                    let act = &a[t * m..(t + 1) * m];
                    1.0 - 0.1 * o.iter().map(|x| x * x).sum::<f32>() / d as f32
                        - 0.05 * act.iter().map(|x| x * x).sum::<f32>()
                })
                .collect();
            (fsl_f32(a, m), r)
        };
        let (obs, final_obs) = match self.obs_dtype {
            ObsDtype::Float32 => (fsl_f32(obs, d), fsl_f32(final_obs, d)),
            ObsDtype::UInt8 => {
                let q = |v: Vec<f32>| -> Vec<u8> {
                    v.into_iter()
                        .map(|x| (128.0 + 40.0 * x).round().clamp(0.0, 255.0) as u8)
                        .collect()
                };
                (fsl_u8(q(obs), d), fsl_u8(q(final_obs), d))
            }
        };
        (obs, final_obs, action, reward)
    }

    /// Frames of the little game of the module documentation.
    fn image_episode(&self, rng: &mut ChaCha8Rng, n: usize) -> EpisodeColumns {
        let (h, w) = (self.obs_shape[0], self.obs_shape[1]);
        let c: usize = self.obs_shape[2..].iter().product();
        let hw = h * w;
        // Background: a dark level, and bricks (tiles of about 1/12 of the frame) in the top
        // third, each present with probability 0.6, of a random brightness.
        let tile_h = (h / 12).max(1);
        let tile_w = (w / 12).max(1);
        let bg: u8 = rng.random_range(0..48);
        let mut base = vec![bg; hw];
        for ty in 0..h.div_ceil(tile_h).div_ceil(3) {
            for tx in 0..w.div_ceil(tile_w) {
                if rng.random_bool(0.6) {
                    let v: u8 = rng.random_range(96..=220);
                    for y in ty * tile_h..((ty + 1) * tile_h).min(h) {
                        // One dark pixel between bricks, where a brick is wider than that.
                        let x0 = tx * tile_w;
                        let x1 = ((tx + 1) * tile_w).min(w) - usize::from(tile_w > 1);
                        base[y * w + x0..y * w + x1.max(x0 + 1)].fill(v);
                    }
                }
            }
        }
        // Ball and paddle, in pixels (positions as f32 so that speeds can be fractional).
        let ball = (h.min(w) / 21).max(1);
        let (pad_w, pad_h) = ((w / 6).max(1), (ball / 2).max(1));
        let pad_y = h.saturating_sub(2 * pad_h);
        let (max_y, max_x) = (h.saturating_sub(ball) as f32, w.saturating_sub(ball) as f32);
        let mut by = rng.random_range(0.0..=max_y / 2.0);
        let mut bx = rng.random_range(0.0..=max_x);
        let speed = (h.min(w) as f32 / 60.0).max(0.5);
        let mut vy = speed * rng.random_range(0.5..1.5f32);
        let mut vx = speed * rng.random_range(-1.5..1.5f32);
        let mut px = rng.random_range(0..=w - pad_w.min(w)) as f32;
        let (action, moves): (ArrayRef, Vec<f32>) = if self.discrete_actions {
            // 0: stay, 1: fire (stay), 2: right, 3: left, more: stay (as Breakout's).
            let a: Vec<i64> = (0..n)
                .map(|_| rng.random_range(0..self.act_dim.max(1) as i64))
                .collect();
            let m = a
                .iter()
                .map(|&a| match a {
                    2 => speed * 2.0,
                    3 => -speed * 2.0,
                    _ => 0.0,
                })
                .collect();
            (Arc::new(Int64Array::from(a)), m)
        } else {
            let k = self.act_dim.max(1);
            let a: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0f32)).collect();
            let m = (0..n).map(|t| a[t * k] * speed * 2.0).collect();
            (fsl_f32(a, k), m)
        };
        // Scene t for t in 0..=n (the last one is the final observation), and the rewards.
        let mut scenes = vec![0u8; (n + 1) * hw];
        let mut reward = Vec::with_capacity(n);
        let rect = |frame: &mut [u8], y0: usize, x0: usize, rh: usize, rw: usize, v: u8| {
            for y in y0.min(h)..(y0 + rh).min(h) {
                frame[y * w + x0.min(w)..y * w + (x0 + rw).min(w)].fill(v);
            }
        };
        for (t, frame) in scenes.chunks_exact_mut(hw).enumerate() {
            frame.copy_from_slice(&base);
            rect(frame, pad_y, px as usize, pad_h, pad_w, 200);
            rect(frame, by as usize, bx as usize, ball, ball, 255);
            if t == n {
                break;
            }
            px = (px + moves[t]).clamp(0.0, (w - pad_w.min(w)) as f32);
            by += vy;
            bx += vx;
            let mut r = 0.0;
            if bx <= 0.0 || bx >= max_x {
                vx = -vx;
                bx = bx.clamp(0.0, max_x);
            }
            if by <= 0.0 {
                vy = -vy;
                by = 0.0;
            } else if by >= (pad_y as f32 - ball as f32).max(0.0) {
                // At the paddle's height: bounce; a hit if the ball overlaps the paddle.
                let hit = bx + ball as f32 > px && bx < px + pad_w as f32;
                r = if hit { 1.0 } else { -1.0 };
                vy = -vy.abs();
                by = (pad_y as f32 - ball as f32).max(0.0);
            }
            reward.push(r);
        }
        // Frame stacks: channel k of step t is scene max(t + k + 1 - c, 0).
        let stack = |t: usize, out: &mut [u8]| {
            if c == 1 {
                out.copy_from_slice(&scenes[t * hw..(t + 1) * hw]);
                return;
            }
            let srcs: Vec<&[u8]> = (0..c)
                .map(|k| {
                    let s = (t + k + 1).saturating_sub(c);
                    &scenes[s * hw..(s + 1) * hw]
                })
                .collect();
            for (p, px) in out.chunks_exact_mut(c).enumerate() {
                for (v, src) in px.iter_mut().zip(&srcs) {
                    *v = src[p];
                }
            }
        };
        let d = hw * c;
        let mut obs = vec![0u8; (n + 1) * d];
        obs.par_chunks_mut(d)
            .with_min_len(64)
            .enumerate()
            .for_each(|(t, out)| stack(t, out));
        let final_obs = obs.split_off(n * d);
        let (obs, final_obs) = match self.obs_dtype {
            ObsDtype::UInt8 => (fsl_u8(obs, d), fsl_u8(final_obs, d)),
            ObsDtype::Float32 => {
                let f =
                    |v: Vec<u8>| -> Vec<f32> { v.into_iter().map(|x| x as f32 / 255.0).collect() };
                (fsl_f32(f(obs), d), fsl_f32(f(final_obs), d))
            }
        };
        (obs, final_obs, action, reward)
    }

    /// Appends the whole dataset to `writer`, generating episodes in parallel and appending them
    /// in order. Commits every `commit_every` episodes if given (as a live collector would), and
    /// once at the end. `on_rows` is called with the rows appended (for progress bars).
    ///
    /// Episodes are generated in groups (of at most 128 MiB, or one episode) on the
    /// current rayon pool, the next group while this thread appends the current one: at most two
    /// groups are in memory.
    pub fn write(
        &self,
        writer: &mut DatasetWriter,
        commit_every: Option<usize>,
        on_rows: impl Fn(u64),
    ) -> Result<u64> {
        self.write_with(&self.schema()?, writer, commit_every, on_rows, |i, l| {
            self.episode(i, l)
        })
    }

    /// [`SynthSpec::write`] of the frame episodes ([`SynthSpec::frame_episode`]) to a writer of
    /// [`SynthSpec::frame_schema`].
    pub fn write_frames(
        &self,
        writer: &mut DatasetWriter,
        commit_every: Option<usize>,
        on_rows: impl Fn(u64),
    ) -> Result<u64> {
        self.write_with(
            &self.frame_schema()?,
            writer,
            commit_every,
            on_rows,
            |i, l| self.frame_episode(i, l),
        )
    }

    fn write_with(
        &self,
        schema: &TransitionSchema,
        writer: &mut DatasetWriter,
        commit_every: Option<usize>,
        on_rows: impl Fn(u64),
        episode: impl Fn(u64, u64) -> (RecordBatch, EpisodeEnd) + Sync,
    ) -> Result<u64> {
        let lens = self.episode_lengths()?;
        // Bytes of a row as generated (frames raw).
        let row_bytes = schema
            .input_schema()
            .fields()
            .iter()
            .map(|f| value_bytes(f.data_type()))
            .sum::<f64>()
            .max(1.0) as usize;
        let max_episodes = rayon::current_num_threads() * 16;
        // (first episode index, lengths) of each group.
        let mut groups = vec![];
        let (mut rest, mut index) = (lens.as_slice(), 0u64);
        while !rest.is_empty() {
            let mut bytes = 0usize;
            let take = rest
                .iter()
                .take(max_episodes)
                .take_while(|&&l| {
                    bytes = bytes.saturating_add(l as usize * row_bytes);
                    bytes <= GROUP_BYTES
                })
                .count()
                .max(1);
            let (group, tail) = rest.split_at(take);
            groups.push((index, group));
            index += take as u64;
            rest = tail;
        }
        let generate = |&(start, group): &(u64, &[u64])| -> Vec<(RecordBatch, EpisodeEnd)> {
            group
                .par_iter()
                .enumerate()
                .map(|(i, &l)| episode(start + i as u64, l))
                .collect()
        };
        let mut since_commit = 0usize;
        let mut current = groups.first().map(generate).unwrap_or_default();
        for k in 0..groups.len() {
            let mut next = None;
            rayon::in_place_scope(|s| {
                if let Some(g) = groups.get(k + 1) {
                    let (next, generate) = (&mut next, &generate);
                    s.spawn(move |_| *next = Some(generate(g)));
                }
                for (batch, end) in current.drain(..) {
                    writer.append_episode(&batch, end)?;
                    on_rows(batch.num_rows() as u64);
                    since_commit += 1;
                    if commit_every.is_some_and(|c| since_commit >= c) {
                        writer.commit()?;
                        since_commit = 0;
                    }
                }
                Ok::<_, Error>(())
            })?;
            current = next.unwrap_or_default();
        }
        writer.commit()
    }
}

/// Observation, final observation, action and reward columns of one episode.
type EpisodeColumns = (ArrayRef, ArrayRef, ArrayRef, Vec<f32>);

fn fsl_f32(v: Vec<f32>, w: usize) -> ArrayRef {
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    Arc::new(FixedSizeListArray::new(
        item,
        w as i32,
        Arc::new(Float32Array::from(v)),
        None,
    ))
}

fn fsl_u8(v: Vec<u8>, w: usize) -> ArrayRef {
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    Arc::new(FixedSizeListArray::new(
        item,
        w as i32,
        Arc::new(UInt8Array::from(v)),
        None,
    ))
}

/// One episode's batch (observation, action, reward) and its end: terminated or truncated at
/// random, with its final observation.
fn episode_of(
    rng: &mut impl Rng,
    obs: ArrayRef,
    action: ArrayRef,
    reward: Vec<f32>,
    final_obs: ArrayRef,
) -> (RecordBatch, EpisodeEnd) {
    let batch = RecordBatch::try_from_iter([
        (col::OBSERVATION, obs),
        (col::ACTION, action),
        (
            col::REWARD,
            Arc::new(Float32Array::from(reward)) as ArrayRef,
        ),
    ])
    .expect("consistent columns");
    let end = if rng.random_bool(0.5) {
        EpisodeEnd::terminated()
    } else {
        EpisodeEnd::truncated()
    };
    (batch, end.with_final_observation(final_obs))
}
