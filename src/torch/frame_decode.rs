//! Frames decoded by the device (issue 35, part 5): a zstd decoder of our own
//! (`frame_decode.cu`, written from RFC 8878) that a GPU runs one thread per frame, so that a
//! batch crosses PCIe as its stored frames (tens of bytes each) instead of decoded ones (7 KB
//! for an 84 × 84 Atari frame). nvCOMP's zstd, the obvious library, cannot decode frames
//! compressed with a dictionary (the default codec, `zstd-dict`, half the bytes of `zstd`), and
//! its library alone is 25 MB.
//!
//! The same source runs on the CPU (`frames_host.cc`), where the tests hold it to libzstd's
//! output, frame for frame, and to named errors on damaged frames.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use tch::{Device, Kind, Tensor};

use super::kernel::{CudaKernel, DecodeLaunch};
use super::layout::{Layout, Slot};
use crate::error::{Error, Result};
use crate::frames::{FrameCodec, FrameColumn};
use crate::gather::Gatherer;

unsafe extern "C" {
    fn trajstore_zstd_dict_size() -> u64;
    fn trajstore_zstd_dict_load(src: *const u8, len: i64, out: *mut c_void) -> c_int;
    #[cfg(test)]
    fn trajstore_zstd_decode_lanes(
        src: *const u8,
        len: i64,
        out: *mut u8,
        cap: i64,
        dict: *const c_void,
        content: *const u8,
        lanes: c_int,
    ) -> i64;
    #[cfg(test)]
    fn trajstore_zstd_decode_host(
        src: *const u8,
        len: i64,
        out: *mut u8,
        cap: i64,
        dict: *const c_void,
        content: *const u8,
    ) -> i64;
    fn trajstore_decode_frames_host(
        comp: *const u8,
        frames: *const i64,
        first: i64,
        end: i64,
        codec: c_int,
        dict: *const c_void,
        content: *const u8,
        out: *mut u8,
        frame_len: i64,
    ) -> c_int;
}

#[cfg(test)]
/// What a negative return of the decoder means (`TS_E_*` in `frame_decode.cu`).
fn decode_error(code: i64) -> &'static str {
    match code {
        -1 => "not a valid zstd frame",
        -2 => "the frame ends early",
        -3 => "it decodes to more bytes than the frame's shape",
        -4 => "it needs another dictionary than the column's",
        _ => "an unsupported zstd feature",
    }
}

/// A column's decoding parameters as the kernel takes them: the codec (0 none, 1 zstd with or
/// without a dictionary), the prepared dictionary (`ts_zstd_dict`, plain bytes: a device copies
/// it as it is) and the dictionary's content.
pub(crate) struct DeviceFrames {
    pub(crate) codec: c_int,
    /// The prepared dictionary, 8-byte aligned (empty without one).
    pub(crate) dict: Vec<u64>,
    /// The dictionary's content: the history every frame's matches may reach back into.
    pub(crate) content: Vec<u8>,
    pub(crate) frame_len: usize,
}

impl DeviceFrames {
    /// Prepares column `column` for the device decoder; an unusable dictionary is
    /// [`Error::InvalidData`] naming the column.
    pub(crate) fn new(column: &FrameColumn) -> Result<Self> {
        let frame_len = column.spec.frame_len();
        let (codec, dict, content) = match (column.spec.codec, column.dictionary.as_deref()) {
            (FrameCodec::None, _) => (0, Vec::new(), Vec::new()),
            (FrameCodec::Zstd, _) => (1, Vec::new(), Vec::new()),
            (FrameCodec::ZstdDict, None) => {
                return Err(
                    Error::invalid_data("a zstd-dict column without its dictionary")
                        .in_column(&column.name),
                );
            }
            (FrameCodec::ZstdDict, Some(d)) => {
                // SAFETY: a size query.
                let words = unsafe { trajstore_zstd_dict_size() }.div_ceil(8) as usize;
                let mut prepared = vec![0u64; words];
                // SAFETY: `d` is readable for its length; `prepared` holds
                // trajstore_zstd_dict_size() bytes, 8-byte aligned as the struct needs.
                let r = unsafe {
                    trajstore_zstd_dict_load(
                        d.as_ptr(),
                        d.len() as i64,
                        prepared.as_mut_ptr().cast(),
                    )
                };
                if r != 0 {
                    return Err(Error::invalid_data(
                        "the column's zstd dictionary is damaged (the device decoder cannot read \
                         its entropy tables)",
                    )
                    .in_column(&column.name));
                }
                let offset = content_offset(&prepared);
                (1, prepared, d[offset..].to_vec())
            }
        };
        Ok(Self {
            codec,
            dict,
            content,
            frame_len,
        })
    }

    fn dict_ptr(&self) -> *const c_void {
        if self.dict.is_empty() {
            std::ptr::null()
        } else {
            self.dict.as_ptr().cast()
        }
    }

    /// Decodes one stored frame into `out` (`frame_len` bytes) on this thread, with the
    /// device's code: what the tests compare with libzstd.
    #[cfg(test)]
    pub(crate) fn decode_one(&self, frame: &[u8], out: &mut [u8]) -> Result<()> {
        if out.len() != self.frame_len {
            return Err(Error::argument("out", "a buffer of one frame's bytes"));
        }
        let got = if self.codec == 0 {
            if frame.len() == out.len() {
                out.copy_from_slice(frame);
                frame.len() as i64
            } else {
                -3
            }
        } else {
            // SAFETY: `frame` and `out` are valid for their lengths; the prepared dictionary and
            // its content are this struct's.
            unsafe {
                trajstore_zstd_decode_host(
                    frame.as_ptr(),
                    frame.len() as i64,
                    out.as_mut_ptr(),
                    out.len() as i64,
                    self.dict_ptr(),
                    self.content.as_ptr(),
                )
            }
        };
        self.decoded(got, frame.len())
    }

    /// What the decoder's return `got` for a frame of `stored` bytes means.
    #[cfg(test)]
    fn decoded(&self, got: i64, stored: usize) -> Result<()> {
        match got {
            n if n == self.frame_len as i64 => Ok(()),
            n if n >= 0 => Err(Error::invalid_data(format!(
                "a frame decodes to {n} bytes, the shape holds {}",
                self.frame_len
            ))),
            -100 => Err(Error::invalid_data("the lanes disagree")),
            code => Err(Error::invalid_data(format!(
                "a frame of {stored} bytes does not decode: {}",
                decode_error(code)
            ))),
        }
    }

    /// Decodes one stored frame as a warp of `lanes` lanes does on a GPU (a thread a lane,
    /// `__syncwarp` a barrier of them): what the tests hold to libzstd. Lanes that disagree are
    /// an error.
    #[cfg(test)]
    pub(crate) fn decode_lanes(&self, frame: &[u8], out: &mut [u8], lanes: usize) -> Result<()> {
        // SAFETY: as decode_one; each lane writes only `out`.
        let got = unsafe {
            trajstore_zstd_decode_lanes(
                frame.as_ptr(),
                frame.len() as i64,
                out.as_mut_ptr(),
                out.len() as i64,
                self.dict_ptr(),
                self.content.as_ptr(),
                lanes as c_int,
            )
        };
        self.decoded(got, frame.len())
    }

    /// Runs the kernel's CPU copy over a batch: `frames` is `[n, 3]` (offset in `comp`, length
    /// or -1 for zeros, offset in `out`). Returns how many frames failed.
    ///
    /// # Safety
    /// Every frame's source range lies in `comp` and its destination (`frame_len` bytes) in
    /// `out`.
    pub(crate) unsafe fn decode_batch_host(
        &self,
        comp: &[u8],
        frames: &[i64],
        out: &mut [u8],
    ) -> usize {
        use rayon::prelude::*;
        let n = frames.len() / 3;
        let (comp_at, out_at) = (comp.as_ptr() as usize, out.as_mut_ptr() as usize);
        let (dict, content) = (self.dict_ptr() as usize, self.content.as_ptr() as usize);
        let chunk = |c: usize| {
            let (first, end) = (c * 256, ((c + 1) * 256).min(n));
            // SAFETY: the caller's contract; chunks write disjoint frames of `out`.
            unsafe {
                trajstore_decode_frames_host(
                    comp_at as *const u8,
                    frames.as_ptr(),
                    first as i64,
                    end as i64,
                    self.codec,
                    dict as *const c_void,
                    content as *const u8,
                    out_at as *mut u8,
                    self.frame_len as i64,
                ) as usize
            }
        };
        match n.div_ceil(256) {
            0 | 1 => chunk(0),
            k => (0..k).into_par_iter().map(chunk).sum(),
        }
    }
}

/// A feed gatherer's twin that leaves frame windows to the device
/// ([`Gatherer::with_stored_frames`]), and per column the decoding parameters of a stored one.
#[derive(Clone)]
pub(crate) struct Twin {
    feed: Arc<Gatherer>,
    pub(crate) stored: Arc<Gatherer>,
    pub(crate) frames: Arc<Vec<Option<DeviceFrames>>>,
}

/// A loader's device decode, shared by its workers: the twins of the feed's gatherers (one per
/// dataset version; the last two are kept).
#[derive(Default)]
pub(crate) struct DeviceDecode {
    twins: Mutex<Vec<Twin>>,
    /// Bytes the workers' copies carried, and the batches.
    shipped: std::sync::atomic::AtomicU64,
    batches: std::sync::atomic::AtomicU64,
}

impl DeviceDecode {
    /// Counts one batch's copy of `bytes`.
    pub(crate) fn shipped(&self, bytes: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.shipped.fetch_add(bytes, Relaxed);
        self.batches.fetch_add(1, Relaxed);
    }

    /// The mean bytes of a batch's copy so far (None before the first).
    pub(crate) fn mean_shipped(&self) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let n = self.batches.load(Relaxed);
        (n > 0).then(|| self.shipped.load(Relaxed) / n)
    }

    /// The twin of `feed` (made by the first worker that gathers from it).
    pub(crate) fn twin(&self, feed: &Arc<Gatherer>) -> Result<Twin> {
        let mut twins = self.twins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = twins.iter().find(|t| Arc::ptr_eq(&t.feed, feed)) {
            return Ok(t.clone());
        }
        let stored = Arc::new(feed.with_stored_frames()?);
        let frames = stored
            .stored_frame_columns()
            .iter()
            .map(|c| c.as_deref().map(DeviceFrames::new).transpose())
            .collect::<Result<Vec<_>>>()?;
        let twin = Twin {
            feed: feed.clone(),
            stored,
            frames: Arc::new(frames),
        };
        if twins.len() >= 2 {
            twins.remove(0);
        }
        twins.push(twin.clone());
        Ok(twin)
    }
}

/// Check the device's count of frames that did not decode after a worker's first batch and then
/// every this many batches (a read of it waits for the device).
const CHECK_EVERY: u64 = 64;

/// A twin's decoding parameters, and per stored column its dictionary and content on the device.
type Uploaded = (
    Arc<Vec<Option<DeviceFrames>>>,
    Vec<Option<(Tensor, Tensor)>>,
);

/// One worker's side of the device decode: the device copies of the current twin's
/// dictionaries and the count of frames that did not decode.
pub(crate) struct WorkerDecode {
    /// A warp a frame on CUDA (the default), or a thread.
    warp: bool,
    /// The twin of the feed gatherer this worker gathered from last.
    twin: Option<Twin>,
    on: Option<Uploaded>,
    errors: Option<Tensor>,
    batches: u64,
}

impl WorkerDecode {
    pub(crate) fn new(per_thread: bool) -> Self {
        Self {
            warp: !per_thread,
            twin: None,
            on: None,
            errors: None,
            batches: 0,
        }
    }

    /// The twin of `feed`: the one this worker used last while the feed's gatherer is the same
    /// (every batch of a dataset version), else `shared`'s.
    pub(crate) fn twin(&mut self, shared: &DeviceDecode, feed: &Arc<Gatherer>) -> Result<Twin> {
        match &self.twin {
            Some(t) if Arc::ptr_eq(&t.feed, feed) => Ok(t.clone()),
            _ => {
                let t = shared.twin(feed)?;
                self.twin = Some(t.clone());
                Ok(t)
            }
        }
    }

    /// `slot` (filled by `twin`'s gatherer, on the device after its copy or on the host) with
    /// each stored column decoded into a new tensor where the slot lies, in place of its table.
    pub(crate) fn decode(&mut self, twin: &Twin, slot: &Slot, layout: &Layout) -> Result<Slot> {
        let device = slot.meta.device();
        let arena = slot
            .arena
            .as_ref()
            .ok_or_else(|| Error::argument("slot", "a slot without its arena"))?;
        let mut columns: Vec<Tensor> = slot.columns.iter().map(Tensor::shallow_clone).collect();
        let stale = !matches!(&self.on, Some((f, _)) if Arc::ptr_eq(f, &twin.frames));
        if stale && device != Device::Cpu {
            let copies = twin
                .frames
                .iter()
                .map(|f| {
                    f.as_ref()
                        .map(|f| -> Result<(Tensor, Tensor)> {
                            let dict: &[u8] = bytemuck_u8(&f.dict);
                            let upload = |b: &[u8]| -> Result<Tensor> {
                                Ok(Tensor::f_from_slice(if b.is_empty() { &[0u8] } else { b })?
                                    .f_to_device(device)?)
                            };
                            Ok((upload(dict)?, upload(&f.content)?))
                        })
                        .transpose()
                })
                .collect::<Result<Vec<_>>>()?;
            self.on = Some((twin.frames.clone(), copies));
        }
        for (i, f) in twin.frames.iter().enumerate() {
            let Some(f) = f else { continue };
            let name = &layout.columns[i].0;
            let table = &slot.columns[i];
            let n = table.numel() / 3;
            let out = Tensor::f_empty(layout.decoded_shape(i).as_slice(), (Kind::Uint8, device))?;
            if device == Device::Cpu {
                // SAFETY: the slot's tensors are contiguous CPU tensors this worker owns; the
                // table was written by the gather, whose rows name ranges of the arena's used
                // bytes and frames of `out`.
                let failed = unsafe {
                    let table = std::slice::from_raw_parts(table.data_ptr() as *const i64, n * 3);
                    let comp = std::slice::from_raw_parts(
                        arena.data_ptr() as *const u8,
                        slot.arena_used.min(arena.numel()),
                    );
                    let dst =
                        std::slice::from_raw_parts_mut(out.data_ptr() as *mut u8, out.numel());
                    f.decode_batch_host(comp, table, dst)
                };
                if failed > 0 {
                    return Err(not_decoded(failed, name));
                }
            } else {
                let Device::Cuda(ordinal) = device else {
                    return Err(Error::argument(
                        "device",
                        "frames are decoded on CUDA or the CPU",
                    ));
                };
                let kernel = CudaKernel::cached(ordinal)?;
                let errors = match &self.errors {
                    Some(e) => e.shallow_clone(),
                    None => {
                        let e = Tensor::f_zeros([1], (Kind::Int, device))?;
                        self.errors = Some(e.shallow_clone());
                        e
                    }
                };
                let (dict, content) = self
                    .on
                    .as_ref()
                    .and_then(|(_, c)| c[i].as_ref())
                    .expect("uploaded above");
                let launch = DecodeLaunch {
                    comp: arena.data_ptr() as u64,
                    table: table.data_ptr() as u64,
                    n,
                    codec: f.codec,
                    dict: if f.dict.is_empty() {
                        0
                    } else {
                        dict.data_ptr() as u64
                    },
                    content: content.data_ptr() as u64,
                    out: out.data_ptr() as u64,
                    frame_len: f.frame_len,
                    errors: errors.data_ptr() as u64,
                    warp: self.warp,
                };
                // SAFETY: every address is a tensor on this device held until the launch has
                // run (the caching allocator reuses freed memory in stream order, after it).
                unsafe { kernel.decode(&launch)? };
                self.batches += 1;
                if self.batches == 1 || self.batches.is_multiple_of(CHECK_EVERY) {
                    let failed = errors.f_int64_value(&[0])?;
                    if failed > 0 {
                        return Err(not_decoded(failed as usize, name));
                    }
                }
            }
            columns[i] = out;
        }
        Ok(Slot {
            columns,
            flags: slot.flags.shallow_clone(),
            meta: slot.meta.shallow_clone(),
            packed: None,
            arena: None,
            arena_used: 0,
        })
    }
}

fn not_decoded(failed: usize, column: &str) -> Error {
    Error::invalid_data(format!(
        "{failed} stored frames did not decode on the device (`trajstore verify` names them)"
    ))
    .in_column(column)
}

/// A prepared dictionary's bytes.
fn bytemuck_u8(words: &[u64]) -> &[u8] {
    // SAFETY: u64s are 8 initialised bytes each, and u8 has no alignment.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), words.len() * 8) }
}

/// The content offset recorded in a prepared dictionary: after the id, the four logs and the
/// three repeat offsets (`ts_zstd_dict`'s layout: 4 + 16 + 12 bytes, then an 8-aligned i64).
fn content_offset(prepared: &[u64]) -> usize {
    prepared[4] as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::{FrameSpec, train_dictionary};

    /// Frames like Atari's: a few grey levels in large flat areas, moving objects.
    fn frames(n: usize, h: usize, w: usize, seed: u64) -> Vec<Vec<u8>> {
        (0..n as u64)
            .map(|i| {
                let mut f = vec![87u8; h * w];
                for (k, px) in f.iter_mut().enumerate() {
                    let (y, x) = ((k / w) as u64, (k % w) as u64);
                    if y < 4 || y + 4 >= h as u64 {
                        *px = 236;
                    }
                    if (x + i * 3 + seed) % w as u64 <= 2 && (y + i) % h as u64 <= 10 {
                        *px = 147;
                    }
                    if (x * 7 + y * 13 + i * seed).is_multiple_of(97) {
                        *px = (x ^ y ^ i) as u8;
                    }
                }
                f
            })
            .collect()
    }

    fn column(codec: FrameCodec, shape: &[usize], dict: Option<&[u8]>) -> FrameColumn {
        FrameColumn {
            name: "observation".into(),
            spec: FrameSpec::new(codec, shape).unwrap(),
            dictionary: dict.map(Into::into),
        }
    }

    fn check_level(raw: &[Vec<u8>], dict: Option<&[u8]>, level: i32) {
        check_lanes(raw, dict, level, 1);
    }

    /// [`check_level`] decoding as a warp of `lanes` lanes does (1: as a thread).
    fn check_lanes(raw: &[Vec<u8>], dict: Option<&[u8]>, level: i32, lanes: usize) {
        let shape = [raw[0].len() / 4, 4];
        let codec = if dict.is_some() {
            FrameCodec::ZstdDict
        } else {
            FrameCodec::Zstd
        };
        let dev = DeviceFrames::new(&column(codec, &shape, dict)).unwrap();
        let mut c = match dict {
            Some(d) => zstd::bulk::Compressor::with_dictionary(level, d).unwrap(),
            None => zstd::bulk::Compressor::new(level).unwrap(),
        };
        let mut out = vec![0u8; raw[0].len()];
        for (i, f) in raw.iter().enumerate() {
            let stored = c.compress(f).unwrap();
            out.fill(1);
            match lanes {
                1 => dev.decode_one(&stored, &mut out),
                n => dev.decode_lanes(&stored, &mut out, n),
            }
            .unwrap_or_else(|e| panic!("level {level} frame {i} ({lanes} lanes): {e}"));
            assert!(
                out == *f,
                "level {level}, frame {i} ({lanes} lanes) differs from libzstd's"
            );
        }
    }

    #[test]
    fn the_device_decoder_equals_libzstd_with_and_without_a_dictionary() {
        let raw = frames(300, 84, 84, 5);
        let dict = train_dictionary(&raw[..200], 16 * 1024).unwrap();
        for level in [1, 3, 5, 9, 19] {
            check_level(&raw, Some(&dict), level);
            check_level(&raw, None, level);
        }
        // Color frames larger than a zstd block (128 KiB): several blocks per frame.
        let big = frames(3, 224, 224 * 3, 2);
        check_level(&big, None, 3);
        // Noise (raw blocks, raw literals), constant frames (RLE blocks).
        let mut s = 1u64;
        let next = |s: &mut u64| {
            *s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *s >> 33
        };
        let noise: Vec<Vec<u8>> = (0..5)
            .map(|_| (0..7056).map(|_| next(&mut s) as u8).collect())
            .collect();
        check_level(&noise, None, 3);
        let constant: Vec<Vec<u8>> = (0..5).map(|v| vec![v as u8 * 40; 7056]).collect();
        check_level(&constant, None, 3);
        // Small inputs of literal runs and copies: few sequences, so zstd picks its predefined
        // tables, with literal and match lengths over all their codes.
        let small: Vec<Vec<u8>> = (0..400)
            .map(|_| {
                let mut v: Vec<u8> = Vec::new();
                while v.len() < 1200 {
                    for _ in 0..next(&mut s) % 150 {
                        v.push((next(&mut s) % 251) as u8);
                    }
                    let n = 3 + next(&mut s) as usize % 80;
                    let from = next(&mut s) as usize % v.len().max(1);
                    for k in 0..n.min(v.len()) {
                        v.push(v[from + k % (v.len() - from)]);
                    }
                }
                v.truncate(1200);
                v
            })
            .collect();
        check_level(&small, None, 3);
        check_level(&small, None, 19);
        // Text-like bytes: Huffman literals in four streams, FSE-compressed weights.
        let words = [
            "state", "action", "reward", "episode ", "frame", "\n", "zstd ",
        ];
        let text: Vec<Vec<u8>> = (0..4)
            .map(|i| {
                (0..3000)
                    .flat_map(|k| words[(k * 7 + k / 3 + i) % words.len()].bytes())
                    .take(12_000)
                    .collect()
            })
            .collect();
        for level in [1, 19, 22] {
            check_level(&text, None, level);
        }
    }

    /// The warp decoder: 32 lanes (threads here, `__syncwarp` a barrier) parse each frame alike
    /// and share its copies; the frames equal libzstd's, and on damaged frames the lanes agree.
    #[test]
    fn the_warp_decoder_equals_libzstd_and_its_lanes_agree() {
        let raw = frames(60, 84, 84, 5);
        let dict = train_dictionary(&raw[..40], 16 * 1024).unwrap();
        for lanes in [32, 3] {
            check_lanes(&raw, Some(&dict), 5, lanes);
            check_lanes(&raw[..20], None, 1, lanes);
            check_lanes(&frames(2, 224, 224 * 3, 2), None, 3, lanes);
            let constant: Vec<Vec<u8>> = (0..3).map(|v| vec![v as u8 * 40; 7056]).collect();
            check_lanes(&constant, None, 3, lanes);
        }
        let dev = DeviceFrames::new(&column(FrameCodec::ZstdDict, &[84, 84], Some(&dict))).unwrap();
        let stored = zstd::bulk::Compressor::with_dictionary(5, &dict)
            .unwrap()
            .compress(&raw[3])
            .unwrap();
        let mut out = vec![0u8; 84 * 84];
        for i in (0..stored.len() * 8).step_by(3) {
            let mut bad = stored.clone();
            bad[i / 8] ^= 1 << (i % 8);
            let (one, warp) = (
                dev.decode_one(&bad, &mut out).is_ok(),
                dev.decode_lanes(&bad, &mut out, 32),
            );
            assert!(
                !matches!(&warp, Err(e) if e.to_string().contains("disagree")),
                "bit {i}"
            );
            assert_eq!(one, warp.is_ok(), "bit {i}: a thread and a warp differ");
        }
    }

    #[test]
    fn the_device_decoder_refuses_damaged_frames_without_reading_out_of_bounds() {
        let raw = frames(60, 84, 84, 1);
        let dict = train_dictionary(&raw, 8 * 1024).unwrap();
        let dev = DeviceFrames::new(&column(FrameCodec::ZstdDict, &[84, 84], Some(&dict))).unwrap();
        let mut c = zstd::bulk::Compressor::with_dictionary(5, &dict).unwrap();
        let stored = c.compress(&raw[7]).unwrap();
        let mut out = vec![0u8; 84 * 84];
        for cut in 0..stored.len() {
            let e = dev.decode_one(&stored[..cut], &mut out).unwrap_err();
            assert!(matches!(e, Error::InvalidData { .. }), "{e}");
        }
        // Every single-bit flip, beside libzstd on the same bytes: never a fault (the decoder
        // was also run under AddressSanitizer while it was written), the same bytes where both
        // decode, and an error wherever libzstd finds one.
        let mut reference = zstd::bulk::Decompressor::with_dictionary(&dict).unwrap();
        let mut theirs = vec![0u8; 84 * 84];
        let (mut both_refuse, mut both_decode) = (0, 0);
        for i in 0..stored.len() * 8 {
            let mut bad = stored.clone();
            bad[i / 8] ^= 1 << (i % 8);
            let ours = dev.decode_one(&bad, &mut out);
            match reference.decompress_to_buffer(&bad, &mut theirs) {
                Ok(n) if n == theirs.len() && ours.is_ok() => {
                    assert!(out == theirs, "bit {i}: decoded otherwise than libzstd");
                    both_decode += 1;
                }
                _ => {
                    assert!(ours.is_err(), "bit {i}: libzstd refuses what decoded here");
                    both_refuse += 1;
                }
            }
        }
        assert!(
            both_refuse > 0 && both_decode > 0,
            "{both_refuse} {both_decode}"
        );
        // A frame for another dictionary, or without the column's.
        let other = train_dictionary(&frames(60, 84, 84, 9), 8 * 1024).unwrap();
        let foreign = zstd::bulk::Compressor::with_dictionary(5, &other)
            .unwrap()
            .compress(&raw[7])
            .unwrap();
        let e = dev.decode_one(&foreign, &mut out).unwrap_err().to_string();
        assert!(e.contains("another dictionary"), "{e}");
        let plain = DeviceFrames::new(&column(FrameCodec::Zstd, &[84, 84], None)).unwrap();
        let e = plain.decode_one(&stored, &mut out).unwrap_err().to_string();
        assert!(e.contains("another dictionary"), "{e}");
        // A frame larger than the shape.
        let e = plain
            .decode_one(
                &zstd::bulk::compress(&vec![3u8; 84 * 85], 3).unwrap(),
                &mut out,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("more bytes than"), "{e}");
        // A damaged dictionary.
        let mut bad = dict.clone();
        bad[9] ^= 0xff;
        bad[10] ^= 0xff;
        let e = DeviceFrames::new(&column(FrameCodec::ZstdDict, &[84, 84], Some(&bad)));
        assert!(e.is_err());
    }

    #[test]
    fn a_batch_decodes_frames_zeros_and_repeats_where_the_table_says() {
        let raw = frames(4, 84, 84, 3);
        let dev = DeviceFrames::new(&column(FrameCodec::Zstd, &[84, 84], None)).unwrap();
        let mut comp = Vec::new();
        let mut at = Vec::new();
        for f in &raw {
            let s = zstd::bulk::compress(f, 3).unwrap();
            at.push((comp.len() as i64, s.len() as i64));
            comp.extend_from_slice(&s);
        }
        let fl = 84 * 84;
        // Slots: frame 2, zeros, frame 0, frame 0 again, frame 3; then a damaged one.
        let mut table = vec![];
        for (slot, src) in [Some(2), None, Some(0), Some(0), Some(3)]
            .iter()
            .enumerate()
        {
            let (o, l) = src.map_or((0, -1), |s| at[s]);
            table.extend_from_slice(&[o, l, (slot * fl) as i64]);
        }
        let mut out = vec![7u8; 6 * fl];
        // SAFETY: every range lies in `comp` and `out`.
        assert_eq!(unsafe { dev.decode_batch_host(&comp, &table, &mut out) }, 0);
        let zeros = vec![0u8; fl];
        let want: Vec<u8> = [&raw[2][..], &zeros, &raw[0], &raw[0], &raw[3]].concat();
        assert!(out[..5 * fl] == want[..]);
        table.extend_from_slice(&[at[1].0, at[1].1 - 1, (5 * fl) as i64]);
        // SAFETY: as above.
        assert_eq!(unsafe { dev.decode_batch_host(&comp, &table, &mut out) }, 1);
    }
}
