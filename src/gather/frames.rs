//! Frame columns in the gather: pixel observations stored one compressed frame per step
//! ([`crate::frames`]) are decoded by the gather workers straight into the batch's buffer, and
//! stacked there.
//!
//! With a [`FrameStack`] of `K`, step `t` of a slice holds frames `t-K+1 ..= t` of its episode
//! (`[K, H, W]` or `[K, H, W, C]` per step); before the episode's first frame the stack repeats
//! that frame ([`StackPad::Repeat`], gymnasium's `FrameStackObservation`) or holds zeros
//! ([`StackPad::Zeros`], dopamine's replay buffer). `next_observation` is the stack ending at
//! frame `t+1`: the last step's newest frame is the episode's stored final frame, or zeros when
//! the source had none (DQN Replay stores no frame after a terminal step).
//!
//! With [`FrameStack::channels_last`] a step is `[H, W, K]` (or `[H, W, K·C]`, the K frames'
//! channels concatenated oldest first, as Stable-Baselines3's `VecFrameStack` and dopamine's
//! replay buffer give them): the stacks are built as above in a worker's scratch buffer and
//! interleaved into the batch.
//!
//! With [`FrameStack::window`] the stacks are not written out: a slice's frame column holds its
//! window, the `L + K - 1` frames its `L` steps' stacks are made of, `[L + K - 1, H, W]`, and step
//! `j`'s stack is rows `j .. j + K` of it (contiguous `[K, H, W]`; a strided view
//! `[L, K, H, W]` over the window for tensors). A batch then holds `(L + K - 1) / (L K)` of the
//! bytes of the written-out stacks (a quarter at `K = 4` and long slices), and the gather writes
//! that much less. Rows no valid step's stack holds (the padding of a short or overhanging slice)
//! are zeros, so a padded step's stack may hold frames of the valid steps next to it: its mask is
//! what says it is padding.
//!
//! Each distinct frame of a slice is decoded once, into the first place it appears in the
//! destination (its "canonical" slot); every other slot that holds it is a copy of that slot
//! (7 KB `memcpy`s are far cheaper than decoding again). When the same gather also produces the
//! observation, `next_observation` copies every frame but the one after the window from it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::frames::{FrameColumn, FrameDecoder};
use crate::store::Segment;

pub(super) use super::frame_cache::located;
use super::frame_cache::{self, FrameCache};
use super::simd;

/// The most frames a [`FrameStack`] may hold.
pub const MAX_FRAME_STACK: usize = 64;

/// What a frame stack holds before an episode's first frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StackPad {
    /// The episode's first frame, repeated (gymnasium's `FrameStackObservation` default).
    #[default]
    Repeat,
    /// Zeros (dopamine's replay buffer, whose padding transitions are all-zero frames).
    Zeros,
}

impl std::str::FromStr for StackPad {
    type Err = Error;
    /// `repeat` or `zeros`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "repeat" => Ok(Self::Repeat),
            "zeros" => Ok(Self::Zeros),
            other => Err(Error::argument(
                "frame_pad",
                format!("`{other}`: use repeat (the episode's first frame) or zeros"),
            )),
        }
    }
}

impl std::fmt::Display for StackPad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Repeat => "repeat",
            Self::Zeros => "zeros",
        })
    }
}

/// Stacks of the last `frames` frames per step of every frame column gathered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FrameStack {
    /// Frames per stack (K).
    pub frames: usize,
    /// What precedes an episode's first frame.
    pub pad: StackPad,
    /// `[H, W, K]` (`[H, W, K·C]` for color frames) per step instead of `[K, H, W]`.
    pub channels_last: bool,
    /// Each slice's window of `L + K - 1` frames instead of `L` written-out stacks (see the
    /// module's documentation and [`crate::gather::BatchColumn::lead`]).
    pub window: bool,
    /// Bytes of decoded frames kept in memory (0: none); see [`FrameStack::with_cache`].
    pub cache: u64,
    /// One frame per step without a stack axis ([`FrameStack::unstacked`]).
    pub(crate) unstacked: bool,
}

impl FrameStack {
    /// Frames before each slice's step 0 in a batch: `K - 1` for a window, else 0.
    pub(crate) fn lead(&self) -> usize {
        if self.window { self.frames - 1 } else { 0 }
    }

    /// Stacks of `frames` frames (1 ..= [`MAX_FRAME_STACK`]), padded by repeating the first.
    pub fn new(frames: usize) -> Result<Self> {
        if !(1..=MAX_FRAME_STACK).contains(&frames) {
            return Err(Error::argument(
                "frame_stack",
                format!("a stack of {frames} frames: use 1 to {MAX_FRAME_STACK}"),
            ));
        }
        Ok(Self {
            frames,
            pad: StackPad::Repeat,
            channels_last: false,
            window: false,
            cache: 0,
            unstacked: false,
        })
    }
    /// One frame per step, `[H, W]` as without a stack (no stack axis, unlike `new(1)`'s
    /// `[1, H, W]`): the options of frame columns, such as [`FrameStack::with_cache`], without
    /// stacking.
    pub fn unstacked() -> Self {
        Self {
            unstacked: true,
            ..Self::new(1).expect("1 frame")
        }
    }
    /// Gathers each slice's window of frames (`[L + K - 1, H, W]`), of which step `j`'s stack
    /// is rows `j .. j + K`, instead of writing out `L` stacks of `K` frames: a quarter of the
    /// bytes at `K = 4`. Stack-first only: a window with [`FrameStack::channels_last`] is an
    /// [`Error::InvalidArgument`] when a gatherer is made (a tensor's channels-last stacks are a
    /// `permute` of the window's view).
    pub fn with_window(mut self, window: bool) -> Self {
        self.window = window;
        self
    }
    /// Keeps up to `bytes` of decoded frames in memory: each gathered frame column's first
    /// frames (all of them where they fit) are decoded once, in parallel, when the gatherer is
    /// made, and copied from there afterwards instead of decoded (a `memcpy`, about half the
    /// time of a decode on Atari frames). For data that is sampled far more often than it is
    /// opened, in memory that the decoded frames fit (as raw frames do in TorchRL's storages).
    /// Gatherers of one snapshot with the same budget share one cache (in a mix, each dataset
    /// has its own, of this budget); a loader that follows new versions or streams from object
    /// storage refuses one. Under uniform sampling the share of frames served from memory is
    /// the share cached, whichever frames they are. A frame that does not decode is an error
    /// when the gatherer is made. 0 (the default) keeps none.
    pub fn with_cache(mut self, bytes: u64) -> Self {
        self.cache = bytes;
        self
    }
    /// Sets the padding before an episode's first frame.
    pub fn with_pad(mut self, pad: StackPad) -> Self {
        self.pad = pad;
        self
    }
    /// Stacks along the last axis: `[H, W, K]` per step (`[H, W, K·C]` for `[H, W, C]` frames,
    /// each frame's channels together, oldest frame first).
    pub fn with_channels_last(mut self, channels_last: bool) -> Self {
        self.channels_last = channels_last;
        self
    }

    /// The shape of one step's stack of frames of `frame` (`[H, W]` or `[H, W, C]`).
    pub fn shape(&self, frame: &[usize]) -> Vec<usize> {
        let mut shape = frame.to_vec();
        if self.unstacked {
            return shape;
        }
        if !self.channels_last {
            shape.insert(0, self.frames);
        } else if shape.len() >= 3 {
            *shape.last_mut().expect("three axes") *= self.frames;
        } else {
            shape.push(self.frames);
        }
        shape
    }
}

/// One gathered frame column: the stored column, whether this is `next_observation` (the stack
/// one frame later), the stack, and a pool of workers' decoders (one zstd context each, taken
/// by a worker for one slice and handed back; see [`Decoders`]).
pub(crate) struct FrameSource {
    column: Arc<FrameColumn>,
    pub(crate) next: bool,
    pub(super) stack: usize,
    pub(super) pad: StackPad,
    channels_last: bool,
    /// Windows (`[L + K - 1, ...frame]` per slice) instead of stacks.
    pub(crate) window: bool,
    /// Frames left to the device to decode: the gather writes a window's table of stored frames
    /// ([`FrameSource::table_window`]) and the frames' stored bytes, not the decoded frames.
    pub(crate) stored: bool,
    decoders: Decoders,
    /// Decoded frames of the column kept in memory ([`FrameStack::with_cache`]).
    pub(super) cache: Option<Arc<FrameCache>>,
}

/// The decoders of one frame column, in shards: a thread takes from, and gives back to, the
/// shard of its own number, so that the workers of a many-core machine do not all lock one
/// mutex twice per slice (a 32 x (4-stack) batch is 32 slices; 15 workers of the H200's host
/// delivered 29,000 such batches a second, nearly two million locks of one mutex). A shard's
/// lock is then almost always uncontended and its cache line stays with its thread. A thread
/// whose shard is empty takes an idle decoder from another shard before it makes one, so that
/// there are no more decoders than threads ever decoded at once (each holds a zstd context
/// and the dictionary's tables), however many threads come and go.
struct Decoders {
    shards: Box<[Shard]>,
}

/// One shard of [`Decoders`], on a cache line of its own.
#[repr(align(128))]
struct Shard(Mutex<Vec<Worker>>);

impl Decoders {
    fn new(first: Worker) -> Self {
        let n = std::thread::available_parallelism()
            .map_or(8, |n| n.get())
            .clamp(1, 128)
            * 2;
        let shards: Box<[Shard]> = (0..n).map(|_| Shard(Mutex::new(Vec::new()))).collect();
        shards[thread_number() % n]
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(first);
        Self { shards }
    }

    /// The shard of the calling thread, and an idle decoder: its shard's, else another shard's
    /// that is not locked at the moment.
    fn take(&self) -> (&Mutex<Vec<Worker>>, Option<Worker>) {
        let n = self.shards.len();
        let own = thread_number() % n;
        let pool = &self.shards[own].0;
        let mut d = pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        for i in (1..n).map(|i| (own + i) % n) {
            if d.is_some() {
                break;
            }
            if let Ok(mut other) = self.shards[i].0.try_lock() {
                d = other.pop();
            }
        }
        (pool, d)
    }
}

/// A number for the calling thread, fixed for its life (threads numbered as they first ask).
fn thread_number() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static NUMBER: usize = NEXT.fetch_add(1, Ordering::Relaxed));
    NUMBER.with(|n| *n)
}

/// What a worker holds for one slice: a decoder, and for channels-last stacks the scratch
/// buffer the stacks are built in before they are interleaved (kept, so that it is allocated
/// once per worker, not per slice).
struct Worker {
    decoder: FrameDecoder,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for FrameSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameSource")
            .field("column", &self.column.name)
            .field("next", &self.next)
            .field("stack", &self.stack)
            .field("pad", &self.pad)
            .field("channels_last", &self.channels_last)
            .field("window", &self.window)
            .finish()
    }
}

/// A worker's decoder taken from a pool, handed back when dropped.
struct Pooled<'a> {
    pool: &'a Mutex<Vec<Worker>>,
    decoder: Option<Worker>,
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.decoder.take() {
            self.pool.lock().unwrap_or_else(|e| e.into_inner()).push(d);
        }
    }
}

impl FrameSource {
    /// The source of frame column `column`, stacked by `stack` (None: one frame per step).
    /// Makes one decoder now, so that a bad dictionary is an error here, not in a worker.
    pub(crate) fn new(
        column: Arc<FrameColumn>,
        next: bool,
        stack: Option<FrameStack>,
    ) -> Result<Self> {
        let first = Worker {
            decoder: column.decoder()?,
            scratch: Vec::new(),
        };
        let stack = stack.unwrap_or_else(FrameStack::unstacked);
        if stack.window && stack.channels_last && stack.frames > 1 {
            return Err(Error::argument(
                "frame_window",
                "a frame window gives stack-first views ([K, H, W] per step); for channels-last \
                 stacks permute the view, or gather written-out stacks without the window",
            ));
        }
        Ok(Self {
            column,
            next,
            stack: stack.frames,
            pad: stack.pad,
            channels_last: stack.channels_last && stack.frames > 1,
            window: stack.lead() > 0,
            stored: false,
            decoders: Decoders::new(first),
            cache: None,
        })
    }

    /// Leaves this source's frames to a device to decode (a window's only): see
    /// [`FrameSource::table_window`].
    #[cfg(feature = "torch")]
    pub(crate) fn set_stored(&mut self) -> Result<()> {
        if !self.window {
            return Err(Error::argument(
                "device_decode",
                "frames are decoded on the device for a frame window only (LoaderSpec::\
                 with_frame_stack(FrameStack::new(K)?.with_window(true)), CLI --frame-window)",
            ));
        }
        self.stored = true;
        Ok(())
    }

    /// The stored column.
    #[cfg(feature = "torch")]
    pub(crate) fn column(&self) -> &Arc<FrameColumn> {
        &self.column
    }

    /// Bytes of one decoded frame.
    pub(crate) fn frame_len(&self) -> usize {
        self.column.spec.frame_len()
    }

    /// The stored column's name.
    pub(crate) fn name(&self) -> &str {
        &self.column.name
    }

    fn decoder(&self) -> Result<Pooled<'_>> {
        let (pool, d) = self.decoders.take();
        let d = match d {
            Some(d) => d,
            None => Worker {
                decoder: self.column.decoder()?,
                scratch: Vec::new(),
            },
        };
        Ok(Pooled {
            pool,
            decoder: Some(d),
        })
    }

    /// The byte offset, in the valid part of a slice's destination, of the slot where frame `u`
    /// is decoded: stacks of steps whose newest frames are `ea, ea + 1, ...`.
    fn canonical(&self, u: usize, ea: usize) -> usize {
        let (f, k) = (self.frame_len(), self.stack);
        if u >= ea {
            (u - ea) * k * f + (k - 1) * f
        } else {
            (k - 1 - (ea - u)) * f
        }
    }

    /// Writes steps `a .. b` of one episode into `dst` (`b - a` steps of `K` frames each): the
    /// episode has `len` steps, its step 0 is row `row0` of `seg`, and it is row `table_row` of
    /// the segment's episode table. `obs`, for `next_observation` only: the same steps of the
    /// observation, gathered with the same stack just before (frames are copied from it rather
    /// than decoded again).
    /// A frame that does not decode is an [`Error::InvalidData`] naming the column, the
    /// segment file (relative to the dataset) and the episode.
    pub(crate) fn fill(
        &self,
        seg: &Segment,
        row0: u64,
        table_row: usize,
        steps: (usize, usize, usize),
        dst: &mut [u8],
        obs: Option<&[u8]>,
    ) -> Result<()> {
        self.fill_frames(seg, row0, table_row, steps, dst, obs)
            .map_err(|e| located(e, seg, table_row, self.name()))
    }

    fn fill_frames(
        &self,
        seg: &Segment,
        row0: u64,
        table_row: usize,
        steps: (usize, usize, usize),
        dst: &mut [u8],
        obs: Option<&[u8]>,
    ) -> Result<()> {
        let mut worker = self.decoder()?;
        let worker = worker.decoder.as_mut().expect("taken");
        if !self.channels_last {
            return self.fill_stacked(seg, row0, table_row, steps, dst, obs, &mut worker.decoder);
        }
        let (f, k) = (self.frame_len(), self.stack);
        let (n, c) = (steps.1 - steps.0, self.channels());
        let block = k * f;
        debug_assert_eq!(dst.len(), n * block);
        if n == 0 {
            return Ok(());
        }
        let scratch = &mut worker.scratch;
        match obs {
            // Step j's next stack is step j + 1's stack; the last step's is the observation's
            // last stack shifted by one frame, with the frame after the window added.
            Some(o) if self.next => {
                dst[..(n - 1) * block].copy_from_slice(&o[block..n * block]);
                scratch.resize(f, 0);
                let after = steps.1;
                self.decode_frame(
                    seg,
                    row0,
                    table_row,
                    steps.2,
                    after,
                    scratch,
                    &mut worker.decoder,
                )?;
                let last = &o[(n - 1) * block..n * block];
                shift_in(last, scratch, &mut dst[(n - 1) * block..], k, c);
            }
            _ => {
                scratch.resize(n * block, 0);
                self.fill_stacked(
                    seg,
                    row0,
                    table_row,
                    steps,
                    scratch,
                    None,
                    &mut worker.decoder,
                )?;
                for (from, to) in scratch.chunks_exact(block).zip(dst.chunks_exact_mut(block)) {
                    interleave(from, to, k, c);
                }
            }
        }
        Ok(())
    }

    /// Frames before each slice's step 0 in its window: `K - 1` for a window, else 0.
    pub(crate) fn lead(&self) -> usize {
        if self.window { self.stack - 1 } else { 0 }
    }

    /// Writes one slice's window into `dst` (`rows` frames, `rows = L + K - 1`): row `p` holds
    /// frame `start + shift - (K - 1) + p` of the episode (`shift` 1 for `next_observation`),
    /// where `start` is the slice's first step (negative where it overhangs the episode's
    /// start). Only the rows that the stacks of the valid steps `a .. b` hold are written; the
    /// others are zeros. `obs`, for `next_observation` only: the observation's window of the
    /// same slice, whose row `p + 1` is this window's row `p`. Errors as [`FrameSource::fill`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fill_window(
        &self,
        seg: &Segment,
        row0: u64,
        table_row: usize,
        (a, b, len): (usize, usize, usize),
        start: i64,
        dst: &mut [u8],
        obs: Option<&[u8]>,
    ) -> Result<()> {
        self.window_frames(seg, row0, table_row, (a, b, len), start, dst, obs)
            .map_err(|e| located(e, seg, table_row, self.name()))
    }

    /// The frame after the last valid step `b - 1` of steps `(a, b, len)` of an episode (frame
    /// `b`, or its stored final frame where `b == len`) into `dst`, one frame: the tail of a
    /// windowed `next_observation` ([`crate::CompactInto`]).
    pub(crate) fn fill_after(
        &self,
        seg: &Segment,
        row0: u64,
        table_row: usize,
        (_, b, len): (usize, usize, usize),
        dst: &mut [u8],
    ) -> Result<()> {
        let mut worker = self.decoder()?;
        let dec = &mut worker.decoder.as_mut().expect("taken").decoder;
        self.decode_frame(seg, row0, table_row, len, b, dst, dec)
            .map_err(|e| located(e, seg, table_row, self.name()))
    }

    #[allow(clippy::too_many_arguments)]
    fn window_frames(
        &self,
        seg: &Segment,
        row0: u64,
        table_row: usize,
        (a, b, len): (usize, usize, usize),
        start: i64,
        dst: &mut [u8],
        obs: Option<&[u8]>,
    ) -> Result<()> {
        let (f, k) = (self.frame_len(), self.stack);
        let rows = dst.len() / f;
        debug_assert_eq!(dst.len(), rows * f);
        if b <= a {
            dst.fill(0);
            return Ok(());
        }
        let shift = self.next as i64;
        let u0 = start + shift - (k as i64 - 1);
        // Frames lo ..= hi are held by the valid steps' stacks: rows p_lo ..= p_hi.
        let (lo, hi) = (a as i64 + shift - (k as i64 - 1), b as i64 - 1 + shift);
        let (p_lo, p_hi) = ((lo - u0) as usize, (hi - u0) as usize);
        debug_assert!(p_hi < rows);
        dst[..p_lo * f].fill(0);
        dst[(p_hi + 1) * f..].fill(0);
        let mut worker = self.decoder()?;
        let dec = &mut worker.decoder.as_mut().expect("taken").decoder;
        let row = |p: usize| p * f..(p + 1) * f;
        if let Some(o) = obs.filter(|_| self.next) {
            // Rows of frames before `b` are the observation window's, one row later.
            dst[p_lo * f..p_hi * f].copy_from_slice(&o[(p_lo + 1) * f..(p_hi + 1) * f]);
            return self.decode_frame(seg, row0, table_row, len, b, &mut dst[row(p_hi)], dec);
        }
        // Stored frames, decoded from one run; then the frame after the last step, then padding.
        let (s_lo, s_hi) = (lo.max(0) as usize, (hi as usize).min(len.saturating_sub(1)));
        if s_hi >= s_lo {
            let run = seg.frames(self.name(), row0 + s_lo as u64, s_hi - s_lo + 1)?;
            let cached = (
                self.cached(seg),
                dst.len() >= frame_cache::STREAM_SLICE_BYTES,
            );
            for u in s_lo..=s_hi {
                let p = (u as i64 - u0) as usize;
                let stored = || run.frame(u - s_lo);
                frame_cache::frame_into(cached, row0 + u as u64, stored, &mut dst[row(p)], dec)?;
            }
        }
        if hi as usize >= len {
            let p = (len as i64 - u0) as usize;
            self.decode_frame(seg, row0, table_row, len, len, &mut dst[row(p)], dec)?;
        }
        if lo < 0 {
            let p0 = (-u0) as usize; // the row of frame 0, written above
            for p in p_lo..p0 {
                match self.pad {
                    StackPad::Repeat => dst.copy_within(row(p0), p * f),
                    StackPad::Zeros => dst[row(p)].fill(0),
                }
            }
        }
        Ok(())
    }

    /// The decoded frames of `seg`'s first rows that the cache holds (none without a cache).
    fn cached(&self, seg: &Segment) -> &[u8] {
        self.cache.as_deref().map_or(&[], |c| c.rows(seg))
    }

    /// Channels per pixel of a frame (1 for `[H, W]`).
    fn channels(&self) -> usize {
        match self.column.spec.shape.as_slice() {
            [_, _, c, ..] => *c,
            _ => 1,
        }
    }

    /// Decodes frame `u` of an episode of `len` steps into `out`: a stored frame, the stored
    /// final frame after the last step, or zeros where the source stored none.
    #[allow(clippy::too_many_arguments)]
    fn decode_frame(
        &self,
        seg: &Segment,
        row0: u64,
        table_row: usize,
        len: usize,
        u: usize,
        out: &mut [u8],
        dec: &mut FrameDecoder,
    ) -> Result<()> {
        if u < len {
            let row = row0 + u as u64;
            let stored = || seg.frames(self.name(), row, 1).and_then(|r| r.frame(0));
            frame_cache::frame_into((self.cached(seg), false), row, stored, out, dec)
        } else {
            match seg.episode_table().final_frame(table_row) {
                Some(bytes) => dec.decode_into(bytes, out),
                None => {
                    out.fill(0);
                    Ok(())
                }
            }
        }
    }

    /// [`FrameSource::fill`] into stack-first `[K, ...frame]` steps, with `dec`.
    #[allow(clippy::too_many_arguments)]
    fn fill_stacked(
        &self,
        seg: &Segment,
        row0: u64,
        table_row: usize,
        (a, b, len): (usize, usize, usize),
        dst: &mut [u8],
        obs: Option<&[u8]>,
        dec: &mut FrameDecoder,
    ) -> Result<()> {
        let (f, k) = (self.frame_len(), self.stack);
        let n = b - a;
        debug_assert_eq!(dst.len(), n * k * f);
        if n == 0 {
            return Ok(());
        }
        let shift = self.next as usize;
        // The stack of step `t` ends at frame `t + shift`; frames `lo .. eb` appear.
        let (ea, eb) = (a + shift, b + shift);
        let lo = ea.saturating_sub(k - 1);
        let stored_hi = eb.min(len);
        let run = if stored_hi > lo {
            Some(seg.frames(self.name(), row0 + lo as u64, stored_hi - lo)?)
        } else {
            None
        };
        let obs_lo = a.saturating_sub(k - 1);
        // Written-out stacks read their frames back (copies into the other slots): streamed
        // stores, which leave them in memory only, are for frames written once.
        let once = k == 1 && dst.len() >= frame_cache::STREAM_SLICE_BYTES;
        let cached = (self.cached(seg), once);
        for u in lo..eb {
            let at = self.canonical(u, ea);
            let out = &mut dst[at..at + f];
            match obs {
                Some(o) if (obs_lo..b).contains(&u) => {
                    let from = self.canonical(u, a);
                    out.copy_from_slice(&o[from..from + f]);
                }
                _ if u < len => {
                    let run = run.as_ref().expect("stored frames in range");
                    let stored = || run.frame(u - lo);
                    frame_cache::frame_into(cached, row0 + u as u64, stored, out, dec)?;
                }
                _ => self.decode_frame(seg, row0, table_row, len, u, out, dec)?,
            }
        }
        // Every other slot is a copy of its frame's canonical slot (or padding).
        for j in 0..n {
            let e = ea + j;
            for slot in 0..k {
                let at = (j * k + slot) * f;
                let back = k - 1 - slot;
                let from = match (e.checked_sub(back), self.pad) {
                    (Some(u), _) => self.canonical(u, ea),
                    (None, StackPad::Repeat) => self.canonical(0, ea),
                    (None, StackPad::Zeros) => {
                        dst[at..at + f].fill(0);
                        continue;
                    }
                };
                if from != at {
                    dst.copy_within(from..from + f, at);
                }
            }
        }
        Ok(())
    }

    /// The stored bytes of steps `a .. b` of one episode (and the frame after, for
    /// `next_observation`), for read-ahead: one contiguous run. Reads the run's first and last
    /// offset (see [`FrameSource::stored_offsets`]).
    pub(crate) fn stored<'s>(
        &self,
        seg: &'s Segment,
        row0: u64,
        steps: (usize, usize, usize),
    ) -> Option<&'s [u8]> {
        let (lo, hi) = self.stored_rows(steps)?;
        seg.frames(self.name(), row0 + lo as u64, hi - lo)
            .ok()
            .map(|r| r.bytes())
    }

    /// The bytes of the offsets that locate [`FrameSource::stored`]'s run, not read: asked for
    /// first, so that a cold read-ahead waits for one read of offsets per plan, not per slice.
    pub(crate) fn stored_offsets<'s>(
        &self,
        seg: &'s Segment,
        row0: u64,
        steps: (usize, usize, usize),
    ) -> Option<&'s [u8]> {
        let (lo, hi) = self.stored_rows(steps)?;
        seg.frame_offsets_bytes(self.name(), row0 + lo as u64, hi - lo)
    }

    /// The stored rows `lo .. hi` (episode steps) that steps `a .. b` of an episode of `len`
    /// read, `None` if none.
    fn stored_rows(&self, (a, b, len): (usize, usize, usize)) -> Option<(usize, usize)> {
        let lo = (a + self.next as usize).saturating_sub(self.stack - 1);
        let hi = (b + self.next as usize).min(len);
        (hi > lo).then_some((lo, hi))
    }
}

/// One step's stack, `[K, P, C]` in `from` (K frames of P pixels of C channels), written
/// pixel-major as `[P, K, C]` into `to`.
fn interleave(from: &[u8], to: &mut [u8], k: usize, c: usize) {
    let frame = from.len() / k;
    let pixels = frame / c;
    if (k, c) == (4, 1) {
        let (f0, rest) = from.split_at(frame);
        let (f1, rest) = rest.split_at(frame);
        let (f2, f3) = rest.split_at(frame);
        let done = simd::interleave4(f0, f1, f2, f3, to);
        for p in done..frame {
            to[4 * p..4 * p + 4].copy_from_slice(&[f0[p], f1[p], f2[p], f3[p]]);
        }
        return;
    }
    if c == 1 {
        for (p, px) in to.chunks_exact_mut(k).enumerate().take(pixels) {
            for (s, v) in px.iter_mut().enumerate() {
                *v = from[s * frame + p];
            }
        }
        return;
    }
    for (p, px) in to.chunks_exact_mut(k * c).enumerate().take(pixels) {
        for (s, v) in px.chunks_exact_mut(c).enumerate() {
            let at = s * frame + p * c;
            v.copy_from_slice(&from[at..at + c]);
        }
    }
}

/// A channels-last stack one frame later: `old` (`[P, K, C]`) with its oldest frame dropped and
/// the frame `new` (`[P, C]`) added as the newest, into `to`.
fn shift_in(old: &[u8], new: &[u8], to: &mut [u8], k: usize, c: usize) {
    let done = if (k, c) == (4, 1) {
        simd::shift_in4(old, new, to)
    } else {
        0
    };
    let px = k * c;
    for p in done..new.len() / c {
        let (o, t) = (&old[p * px..(p + 1) * px], &mut to[p * px..(p + 1) * px]);
        t[..px - c].copy_from_slice(&o[c..]);
        t[px - c..].copy_from_slice(&new[p * c..(p + 1) * c]);
    }
}
