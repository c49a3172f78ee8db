//! dopamine's DQN Replay layout (the DQN Replay Dataset, and any `OutOfGraphReplayBuffer.save`):
//! a `replay_logs/` directory of gzipped `.npy` files per checkpoint `N`,
//! `$store$_{observation,action,reward,terminal}_ckpt.N.gz`, `add_count_ckpt.N.gz` and
//! `invalid_range_ckpt.N.gz`, ingested into a dataset whose observation is a frame column.
//!
//! Each checkpoint is a circular buffer of `capacity` entries that holds the `add_count` entries
//! ever added, the newest `capacity` of them: entry `g` (in add order) is at index
//! `g % capacity`, so the oldest one is at `add_count % capacity` once the buffer wrapped.
//! Before every episode's first step dopamine adds `stack_size - 1` all-zero transitions (zero
//! frame, action 0, reward 0, terminal 0): they are not steps and are dropped (and checked to be
//! zero: anything else is an error that names the checkpoint and index, usually a wrong
//! `stack_size`). Episode ends are the `terminal` flags (what the dataset records; the pickled
//! `episode_end_indices` of newer dopamine is not read). Checkpoints are read in order of `N`;
//! the entries of checkpoint `N + 1` that checkpoint `N` already held are skipped, so an episode
//! runs across checkpoints; where entries are missing between two checkpoints (or before the
//! first one, when its buffer had wrapped), the episode in progress is ended as truncated and
//! the entries up to the next episode start are skipped. The last episode is truncated.
//! Terminal steps have no stored final frame (dopamine never stores the frame after a terminal
//! step): their `final_observation` is null.
//!
//! Memory: one checkpoint's `action`, `reward` and `terminal` (9 bytes per entry) and the raw
//! frames of one episode; frames are streamed from the gzip stream, which is inflated twice when
//! the buffer wrapped (oldest half first), never held whole (a real checkpoint is 1M frames,
//! 7 GB raw).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch, UInt8Array};
use arrow::datatypes::{DataType, Field};
use flate2::read::MultiGzDecoder;

use super::npy::{Loc, parse_header, preamble};
use crate::error::{Error, Result};
use crate::frames::FrameCodec;
use crate::ingest::{SOURCE_PROPERTY, Target};
use crate::schema::TransitionSchema;
use crate::store::writer::{DatasetWriter, EpisodeEnd, WriterOptions};

/// The prefix dopamine gives the files of its stored arrays.
pub const STORE_PREFIX: &str = "$store$_";

/// How to read a DQN Replay directory.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DqnOptions {
    /// The agent's `stack_size` (4 in the DQN Replay Dataset): dopamine put `stack_size - 1`
    /// zero transitions before every episode. It is not saved in the checkpoint.
    pub stack_size: usize,
    /// How the frames are stored (default `zstd-dict`).
    pub frame_codec: FrameCodec,
    /// The frames' zstd level where the ingest creates the dataset (see
    /// [`crate::ingest::IngestOptions::frame_level`]).
    pub frame_level: Option<i32>,
    /// Only these checkpoints (default: every one in the directory, in order).
    pub checkpoints: Option<Vec<u64>>,
}

impl Default for DqnOptions {
    fn default() -> Self {
        DqnOptions {
            stack_size: 4,
            frame_codec: FrameCodec::ZstdDict,
            frame_level: None,
            checkpoints: None,
        }
    }
}

/// What a DQN Replay ingest did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DqnReport {
    /// Steps stored.
    pub rows: u64,
    /// Episodes stored.
    pub episodes: u64,
    /// The dataset version after the commit.
    pub version: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// The checkpoints read, in order.
    pub checkpoints: Vec<u64>,
    /// Zero padding entries dropped.
    pub padding: u64,
    /// Entries skipped because their episode's start was not in the data (before the first
    /// checkpoint, or in a gap between checkpoints).
    pub skipped: u64,
    /// Entries of a checkpoint that the previous checkpoint already held.
    pub overlap: u64,
}

/// The `replay_logs/` directory of `input` (`input` itself, or its `replay_logs/` child).
pub fn replay_logs(input: &Path) -> PathBuf {
    let child = input.join("replay_logs");
    if child.is_dir() {
        child
    } else {
        input.to_path_buf()
    }
}

/// Whether `input` is (or holds) a DQN Replay directory: `$store$_observation_ckpt.N.gz` files.
pub fn is_dqn(input: &Path) -> bool {
    input.is_dir() && checkpoints(&replay_logs(input)).is_ok_and(|c| !c.is_empty())
}

/// The checkpoint numbers of `dir`, ascending.
pub fn checkpoints(dir: &Path) -> Result<Vec<u64>> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let name = e.map_err(|e| Error::io(dir, e))?.file_name();
        let n = name
            .to_str()
            .and_then(|n| n.strip_prefix(&format!("{STORE_PREFIX}observation_ckpt.")))
            .and_then(|n| n.strip_suffix(".gz"))
            .and_then(|n| n.parse::<u64>().ok());
        out.extend(n);
    }
    out.sort_unstable();
    Ok(out)
}

fn file(dir: &Path, name: &str, n: u64) -> PathBuf {
    dir.join(format!("{name}_ckpt.{n}.gz"))
}

/// A gzipped `.npy` stream: header parsed, positioned at the data.
struct NpyGz {
    reader: MultiGzDecoder<BufReader<File>>,
    shape: Vec<usize>,
    dtype: DataType,
    size: usize,
    loc: Loc,
}

impl NpyGz {
    fn open(path: &Path) -> Result<Self> {
        let loc = Loc::file(path);
        let f = File::open(path).map_err(|e| Error::io(path, e))?;
        let mut reader = MultiGzDecoder::new(BufReader::with_capacity(1 << 20, f));
        let mut head = [0u8; 12];
        read_exact(&mut reader, &mut head[..10], &loc)?;
        let k = if head[6] >= 2 && &head[..6] == b"\x93NUMPY" {
            read_exact(&mut reader, &mut head[10..], &loc)?;
            12
        } else {
            10
        };
        let (pre, len) = preamble(&head[..k], &loc)?;
        if len > 1 << 20 {
            return Err(loc.data("a .npy header over 1 MiB"));
        }
        let mut text = vec![0u8; len];
        read_exact(&mut reader, &mut text, &loc)?;
        let h = parse_header(&text, pre + len, &loc)?;
        Ok(NpyGz {
            reader,
            shape: h.shape,
            dtype: h.dtype.arrow,
            size: h.dtype.size,
            loc,
        })
    }

    /// The whole data of a small array, as i64 / f64 values.
    fn values(mut self) -> Result<Vec<f64>> {
        let len = checked_product(&self.shape)
            .and_then(|n| n.checked_mul(self.size))
            .ok_or_else(|| {
                self.loc
                    .data(format!("shape {:?} is too large", self.shape))
            })?;
        // Grown as the data inflates, never to the size the header claims: a damaged header
        // costs no allocation.
        let mut bytes = Vec::new();
        (&mut self.reader)
            .take(len as u64)
            .read_to_end(&mut bytes)
            .map_err(|e| self.loc.data(format!("does not inflate: {e}")))?;
        if bytes.len() != len {
            return Err(self.loc.data(format!(
                "truncated: {} of the {len} bytes of shape {:?} (the gzip stream ends early)",
                bytes.len(),
                self.shape
            )));
        }
        // To the end, so that gzip's CRC-32 in the trailer is checked.
        let rest = std::io::copy(&mut self.reader, &mut std::io::sink())
            .map_err(|e| self.loc.data(format!("does not inflate: {e}")))?;
        if rest != 0 {
            return Err(self
                .loc
                .data(format!("{rest} bytes after the array's data")));
        }
        let chunks = bytes.chunks_exact(self.size);
        Ok(match (&self.dtype, self.size) {
            (DataType::Boolean | DataType::UInt8, 1) => chunks.map(|c| c[0] as f64).collect(),
            (DataType::Int8, 1) => chunks.map(|c| c[0] as i8 as f64).collect(),
            (DataType::Int32, 4) => chunks
                .map(|c| i32::from_le_bytes(c.try_into().expect("4")) as f64)
                .collect(),
            (DataType::Int64, 8) => chunks
                .map(|c| i64::from_le_bytes(c.try_into().expect("8")) as f64)
                .collect(),
            (DataType::UInt32, 4) => chunks
                .map(|c| u32::from_le_bytes(c.try_into().expect("4")) as f64)
                .collect(),
            (DataType::Float32, 4) => chunks
                .map(|c| f32::from_le_bytes(c.try_into().expect("4")) as f64)
                .collect(),
            (DataType::Float64, 8) => chunks
                .map(|c| f64::from_le_bytes(c.try_into().expect("8")))
                .collect(),
            (dt, _) => return Err(self.loc.schema(format!("unsupported dtype {dt}"))),
        })
    }
}

/// The product of `dims`, `None` on overflow (a damaged header).
fn checked_product(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

fn read_exact(r: &mut impl Read, buf: &mut [u8], loc: &Loc) -> Result<()> {
    r.read_exact(buf).map_err(|e| {
        loc.data(match e.kind() {
            std::io::ErrorKind::UnexpectedEof => "truncated (the gzip stream ends early)".into(),
            _ => format!("does not inflate: {e}"),
        })
    })
}

/// Where the reading of the entries is.
enum State {
    /// Dropping `n` more padding entries, then an episode starts.
    Padding(usize),
    /// In an episode.
    Episode,
    /// Skipping entries until a terminal one (an episode whose start is not in the data).
    Skipping,
}

/// The episode being assembled, raw.
#[derive(Default)]
struct Episode {
    frames: Vec<u8>,
    actions: Vec<i64>,
    rewards: Vec<f32>,
}

struct Run<'a> {
    writer: &'a mut DatasetWriter,
    frame_len: usize,
    stack: usize,
    state: State,
    ep: Episode,
    report: DqnReport,
}

impl Run<'_> {
    fn emit(&mut self, terminated: bool) -> Result<()> {
        let ep = std::mem::take(&mut self.ep);
        let n = ep.actions.len();
        if n == 0 {
            return Ok(());
        }
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        let obs = FixedSizeListArray::try_new(
            item,
            self.frame_len as i32,
            Arc::new(UInt8Array::from(ep.frames)),
            None,
        )?;
        let batch = RecordBatch::try_from_iter([
            ("observation", Arc::new(obs) as _),
            ("action", Arc::new(Int64Array::from(ep.actions)) as _),
            ("reward", Arc::new(Float32Array::from(ep.rewards)) as _),
        ])?;
        let end = if terminated {
            EpisodeEnd::terminated()
        } else {
            EpisodeEnd::truncated()
        };
        self.writer.append_episode(&batch, end)?;
        self.report.rows += n as u64;
        self.report.episodes += 1;
        Ok(())
    }

    fn after_terminal(&self) -> State {
        match self.stack - 1 {
            0 => State::Episode,
            n => State::Padding(n),
        }
    }

    /// One entry, in add order.
    fn entry(&mut self, frame: &[u8], action: f64, reward: f64, terminal: bool) -> Result<bool> {
        match self.state {
            State::Padding(n) => {
                if frame.iter().any(|&b| b != 0) || action != 0.0 || reward != 0.0 || terminal {
                    return Ok(false);
                }
                self.report.padding += 1;
                self.state = if n == 1 {
                    State::Episode
                } else {
                    State::Padding(n - 1)
                };
            }
            State::Episode => {
                self.ep.frames.extend_from_slice(frame);
                self.ep.actions.push(action as i64);
                self.ep.rewards.push(reward as f32);
                if terminal {
                    self.emit(true)?;
                    self.state = self.after_terminal();
                }
            }
            State::Skipping => {
                self.report.skipped += 1;
                if terminal {
                    self.state = self.after_terminal();
                }
            }
        }
        Ok(true)
    }
}

/// Reads checkpoint `n` of `dir`: the entries at global positions `[from, add_count)` (those not
/// already read), oldest first.
fn checkpoint(run: &mut Run<'_>, dir: &Path, n: u64, done: Option<u64>) -> Result<u64> {
    let small = |name: &str| NpyGz::open(&file(dir, &format!("{STORE_PREFIX}{name}"), n))?.values();
    let add_count = NpyGz::open(&file(dir, "add_count", n))?.values()?;
    let add_count = match add_count.as_slice() {
        [a] if *a >= 0.0 => *a as u64,
        _ => {
            return Err(
                Error::invalid_data("add_count is not one non-negative integer")
                    .in_input(file(dir, "add_count", n).display()),
            );
        }
    };
    let obs_path = file(dir, &format!("{STORE_PREFIX}observation"), n);
    let obs = NpyGz::open(&obs_path)?;
    if obs.dtype != DataType::UInt8 || obs.shape.len() < 3 || obs.shape[0] == 0 {
        return Err(obs.loc.schema(format!(
            "observation must be uint8 [capacity, H, W] or [capacity, H, W, C], found {} {:?}",
            obs.dtype, obs.shape
        )));
    }
    let capacity = obs.shape[0];
    if checked_product(&obs.shape[1..]) != Some(run.frame_len) {
        return Err(obs.loc.schema(format!(
            "frames of shape {:?}, the dataset's hold {} bytes",
            &obs.shape[1..],
            run.frame_len
        )));
    }
    let (actions, rewards, terminals) = (small("action")?, small("reward")?, small("terminal")?);
    for (name, v) in [
        ("action", &actions),
        ("reward", &rewards),
        ("terminal", &terminals),
    ] {
        if v.len() != capacity {
            return Err(Error::invalid_data(format!(
                "{} entries, the observation buffer has {capacity}",
                v.len()
            ))
            .in_input(file(dir, &format!("{STORE_PREFIX}{name}"), n).display()));
        }
    }
    let oldest = add_count.saturating_sub(capacity as u64);
    let from = match done {
        Some(d) if d >= oldest => {
            run.report.overlap += d.min(add_count) - oldest;
            d.min(add_count)
        }
        Some(_) | None => {
            // Entries are missing before `oldest`: the episode in progress (if any) is cut,
            // and entries up to the next episode start are skipped. A buffer that never
            // wrapped starts with the first episode's padding.
            if matches!(run.state, State::Episode) {
                run.emit(false)?;
            }
            run.state = if oldest == 0 && done.is_none() {
                run.after_terminal()
            } else {
                State::Skipping
            };
            oldest
        }
    };
    // Global positions [from, add_count) are indices from % C .. in one or two ranges.
    let cap = capacity as u64;
    let (a, len) = ((from % cap) as usize, (add_count - from) as usize);
    let mut ranges = vec![(a, (a + len).min(capacity))];
    if a + len > capacity {
        ranges.push((0, a + len - capacity));
    }
    let mut obs = Some(obs);
    let mut frame = vec![0u8; run.frame_len];
    for (pass, (lo, hi)) in ranges.into_iter().enumerate() {
        // The stream is read from its start: reopened for a second range.
        let mut s = match obs.take() {
            Some(s) => s,
            None => NpyGz::open(&obs_path)?,
        };
        let skip = lo as u64 * run.frame_len as u64;
        let copied = std::io::copy(&mut (&mut s.reader).take(skip), &mut std::io::sink())
            .map_err(|e| s.loc.data(format!("does not inflate: {e}")))?;
        if copied != skip {
            return Err(s.loc.data("truncated (the gzip stream ends early)"));
        }
        for i in lo..hi {
            read_exact(&mut s.reader, &mut frame, &s.loc)?;
            let ok = run.entry(&frame, actions[i], rewards[i], terminals[i] != 0.0)?;
            if !ok {
                return Err(s.loc.data(format!(
                    "entry {i} of checkpoint {n} should be dopamine's zero padding before an \
                     episode (stack_size {}; is that the agent's?)",
                    run.stack
                )));
            }
        }
        if pass == 0 {
            // Inflate to the end once: gzip's CRC-32 and length, in its trailer, are checked
            // only there (a flipped bit can inflate to other frames without a deflate error).
            std::io::copy(&mut s.reader, &mut std::io::sink())
                .map_err(|e| s.loc.data(format!("does not inflate: {e}")))?;
        }
    }
    Ok(add_count)
}

/// Ingests the DQN Replay directory `input` (its `replay_logs/`, or the directory itself) into
/// `dataset` (created with a frame column if it does not exist; otherwise appended to, the
/// frame shape must match). Commits once at the end; on error nothing is committed and a
/// dataset this call created is removed.
pub fn ingest_dqn(
    input: &Path,
    dataset: &Path,
    opts: &DqnOptions,
    writer_opts: WriterOptions,
) -> Result<DqnReport> {
    let started = Instant::now();
    if opts.stack_size == 0 {
        return Err(Error::argument("stack_size", "must be at least 1"));
    }
    let dir = replay_logs(input);
    let mut cks = checkpoints(&dir)?;
    if let Some(only) = &opts.checkpoints {
        if let Some(m) = only.iter().find(|c| !cks.contains(c)) {
            return Err(Error::argument(
                "checkpoints",
                format!("{}: no checkpoint {m} (have {cks:?})", dir.display()),
            ));
        }
        cks = only.clone();
        cks.sort_unstable();
    }
    let Some(&first) = cks.first() else {
        return Err(Error::argument(
            "input",
            format!(
                "{}: no {STORE_PREFIX}observation_ckpt.N.gz files (not a DQN Replay directory)",
                dir.display()
            ),
        ));
    };
    let head = NpyGz::open(&file(&dir, &format!("{STORE_PREFIX}observation"), first))?;
    let shape = head.shape.get(1..).unwrap_or(&[]).to_vec();
    // A shape no frame column can hold is the observation file's fault: named with it.
    let schema = TransitionSchema::builder(&[1], 1)
        .frames(opts.frame_codec, &shape)
        .discrete_action()
        .build()
        .map_err(|e| head.loc.data(format!("observation array: {e}")))?;
    drop(head);
    let target = Target::open(dataset, &schema, opts.frame_level)?;
    let result = (|| {
        let mut writer = target.ds.writer(writer_opts)?;
        if writer.schema().frame_spec().map(|f| &f.shape) != Some(&shape) {
            return Err(Error::schema(
                "observation",
                format!("the dataset does not store frames of shape {shape:?}"),
            ));
        }
        let mut run = Run {
            writer: &mut writer,
            frame_len: shape.iter().product(),
            stack: opts.stack_size,
            state: State::Skipping,
            ep: Episode::default(),
            report: DqnReport::default(),
        };
        let mut done = None;
        for &n in &cks {
            done = Some(checkpoint(&mut run, &dir, n, done)?);
            run.report.checkpoints.push(n);
        }
        if matches!(run.state, State::Episode) {
            run.emit(false)?;
        }
        let mut report = run.report;
        let canonical = std::fs::canonicalize(input).unwrap_or_else(|_| input.to_path_buf());
        writer.set_property(SOURCE_PROPERTY, canonical.display().to_string());
        writer.set_property("dqn.stack_size", opts.stack_size.to_string());
        report.version = writer.commit()?;
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    })();
    if result.is_err() {
        target.discard();
    }
    result
}
