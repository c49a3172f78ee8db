//! Pixel frames: the codecs of a frame column (format v1, `schemas/FORMAT.md` section 3.1).
//!
//! A frame column stores one image per row (`uint8`, `[H, W]` grayscale or `[H, W, C]` color,
//! row-major) as one compressed blob in an Arrow `LargeBinary` column. This module is the codec
//! layer under it and knows nothing of files: what a column's field metadata says
//! ([`FrameSpec`], [`DictionaryRef`]), compressing frames ([`FrameEncoder`]), training the
//! dictionary of the `zstd-dict` codec ([`train_dictionary`]), and decoding one frame straight
//! into a caller's buffer ([`FrameDecoder`]) with no allocation per frame, a damaged frame being
//! an [`Error::InvalidData`] naming the column, never a panic.
//!
//! Codecs ([`FrameCodec`]): `zstd-dict` (zstd with a dictionary trained from the dataset's first
//! frames and stored in the dataset), `zstd` (each frame alone) and `none` (the raw bytes).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The zstd level frames are compressed at unless told otherwise. Level 5 (zstd's `lazy2`
/// search) against 3 (`dfast`), on 60,000 real Pong frames with a 16 KiB dictionary: 14% fewer
/// bytes and 25% faster decoding (fewer, longer matches), for compression at 1.8x the CPU time
/// (about 115k frames/s a core; ingest compresses on every core). Levels above 5 gained neither.
pub const DEFAULT_LEVEL: i32 = 5;
/// Checks a zstd level asked for by a user (`--frame-level`, `frame_level=`): 1 to 22, else an
/// [`Error::InvalidArgument`] of `frame_level`.
pub fn check_level(level: i32) -> Result<()> {
    if (1..=22).contains(&level) {
        Ok(())
    } else {
        Err(Error::argument(
            "frame_level",
            format!("zstd level {level}: use 1 to 22"),
        ))
    }
}

/// The size of a trained dictionary (16 KiB: the size measured in issue 32).
pub const DEFAULT_DICTIONARY_BYTES: usize = 16 << 10;
/// How many frames the dictionary is trained on (the first frames the writer is given).
pub const DEFAULT_TRAINING_FRAMES: usize = 4096;
/// The only element type of a frame.
pub const FRAME_DTYPE: &str = "uint8";
/// The magic number every zstd dictionary starts with (little-endian `0xEC30A437`).
const DICT_MAGIC: [u8; 4] = [0x37, 0xA4, 0x30, 0xEC];

/// How each frame of a column is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FrameCodec {
    /// zstd with a dictionary trained from the data at ingest (the default).
    #[serde(rename = "zstd-dict")]
    ZstdDict,
    /// zstd, each frame alone.
    #[serde(rename = "zstd")]
    Zstd,
    /// The raw bytes (for frames that do not compress).
    #[serde(rename = "none")]
    None,
}

impl FrameCodec {
    /// The name in metadata and on the command line: `zstd-dict`, `zstd` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameCodec::ZstdDict => "zstd-dict",
            FrameCodec::Zstd => "zstd",
            FrameCodec::None => "none",
        }
    }
}

impl std::fmt::Display for FrameCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FrameCodec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "zstd-dict" => Ok(FrameCodec::ZstdDict),
            "zstd" => Ok(FrameCodec::Zstd),
            "none" => Ok(FrameCodec::None),
            _ => Err(Error::argument(
                "frame_codec",
                format!("unknown frame codec `{s}` (one of zstd-dict, zstd, none)"),
            )),
        }
    }
}

/// Where a column's dictionary lives and what it must be: `path` relative to the dataset root
/// (`dictionaries/<crc32c>.zdict`), its size and CRC-32C.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DictionaryRef {
    /// Path relative to the dataset root.
    pub path: String,
    /// Size of the file in bytes.
    pub bytes: u64,
    /// CRC-32C of the file, `crc32c:` + 8 lowercase hex digits (also its name: content-addressed).
    pub checksum: String,
}

/// What a frame column's metadata says: codec, frame shape, element type and dictionary. It is
/// the JSON value of the field metadata key `trajstore:frame` and the `frame` object of the
/// column in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameSpec {
    /// How each frame is stored.
    pub codec: FrameCodec,
    /// `[H, W]` or `[H, W, C]`, row-major.
    pub shape: Vec<usize>,
    /// Always `uint8`.
    pub dtype: String,
    /// The zstd level frames are written at (readers ignore it).
    #[serde(default = "default_level")]
    pub level: i32,
    /// The dictionary of a `zstd-dict` column; absent until the writer trained it (a column
    /// with rows always has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dictionary: Option<DictionaryRef>,
}

fn default_level() -> i32 {
    DEFAULT_LEVEL
}

impl FrameSpec {
    /// A spec of `codec` for frames of `shape`, checked.
    pub fn new(codec: FrameCodec, shape: &[usize]) -> Result<Self> {
        let spec = FrameSpec {
            codec,
            shape: shape.to_vec(),
            dtype: FRAME_DTYPE.into(),
            level: DEFAULT_LEVEL,
            dictionary: None,
        };
        spec.check("observation")?;
        Ok(spec)
    }

    /// Sets the zstd level (1 to 22).
    pub fn with_level(mut self, level: i32) -> Self {
        self.level = level;
        self
    }

    /// Checks the shape (2 or 3 dimensions, none zero, at most 2^31 bytes), dtype and level.
    pub fn check(&self, column: &str) -> Result<()> {
        let bad = |why: String| Error::schema(column, why);
        if !(2..=3).contains(&self.shape.len()) || self.shape.contains(&0) {
            return Err(bad(format!(
                "frame shape {:?} must be [H, W] or [H, W, C] with no zero dimension",
                self.shape
            )));
        }
        match self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
            Some(n) if n <= i32::MAX as usize => {}
            _ => return Err(bad(format!("frame shape {:?} is too large", self.shape))),
        }
        if self.dtype != FRAME_DTYPE {
            return Err(bad(format!(
                "frame dtype `{}`; frames are {FRAME_DTYPE}",
                self.dtype
            )));
        }
        if !(1..=22).contains(&self.level) {
            return Err(bad(format!("zstd level {} is not in 1..=22", self.level)));
        }
        if self.dictionary.is_some() && self.codec != FrameCodec::ZstdDict {
            return Err(bad(format!("codec {} takes no dictionary", self.codec)));
        }
        Ok(())
    }

    /// Bytes of one decoded frame (`H * W * C`).
    pub fn frame_len(&self) -> usize {
        self.shape.iter().product()
    }

    /// The JSON of the `trajstore:frame` field metadata key.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a frame spec serialises")
    }

    /// Parses and checks the `trajstore:frame` JSON of column `column`.
    pub fn from_json(column: &str, json: &str) -> Result<Self> {
        let spec: FrameSpec = serde_json::from_str(json)
            .map_err(|e| Error::schema(column, format!("invalid trajstore:frame metadata: {e}")))?;
        spec.check(column)?;
        Ok(spec)
    }
}

/// A frame column ready to decode: its spec and, for `zstd-dict`, the dictionary's bytes (read
/// and checked once when the snapshot was opened, shared by every decoder).
#[derive(Debug, Clone, PartialEq)]
pub struct FrameColumn {
    /// The column's name.
    pub name: String,
    /// What its metadata says.
    pub spec: FrameSpec,
    /// The dictionary of a `zstd-dict` column.
    pub dictionary: Option<Arc<[u8]>>,
}

impl FrameColumn {
    /// A decoder for one worker: make it once, decode many frames with it.
    pub fn decoder(&self) -> Result<FrameDecoder> {
        FrameDecoder::new(&self.name, &self.spec, self.dictionary.as_deref())
    }
}

/// The stored frames of consecutive rows, zero-copy from the mapped segment: the `LargeBinary`
/// column's offsets (one more than the rows) and its values buffer. Rows of one episode are one
/// run of contiguous bytes ([`FrameRun::bytes`], what a read-ahead asks for).
#[derive(Debug, Clone, Copy)]
pub struct FrameRun<'a> {
    offsets: &'a [i64],
    values: &'a [u8],
}

impl<'a> FrameRun<'a> {
    /// A run over `offsets` (rows + 1 of them) into `values`.
    pub fn new(offsets: &'a [i64], values: &'a [u8]) -> Self {
        FrameRun { offsets, values }
    }
    /// Number of frames.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }
    /// Whether the run holds no frame.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The stored bytes of frame `i` (0-based in the run). Offsets out of order or outside the
    /// values (a damaged file) are [`Error::InvalidData`]; `i` out of range too.
    pub fn frame(&self, i: usize) -> Result<&'a [u8]> {
        let (a, b) = match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => (a, b),
            _ => {
                return Err(Error::argument(
                    "i",
                    format!("frame {i} of a run of {}", self.len()),
                ));
            }
        };
        usize::try_from(a)
            .ok()
            .zip(usize::try_from(b).ok())
            .filter(|(a, b)| a <= b)
            .and_then(|(a, b)| self.values.get(a..b))
            .ok_or_else(|| {
                Error::invalid_data(format!(
                    "frame offsets {a}..{b} outside the {} bytes of frames",
                    self.values.len()
                ))
            })
    }
    /// All the run's stored bytes (empty when its offsets are damaged).
    pub fn bytes(&self) -> &'a [u8] {
        let (Some(&a), Some(&b)) = (self.offsets.first(), self.offsets.last()) else {
            return &[];
        };
        usize::try_from(a)
            .ok()
            .zip(usize::try_from(b).ok())
            .and_then(|(a, b)| self.values.get(a..b))
            .unwrap_or(&[])
    }
}

/// Compresses frames of one column. Holds one zstd compression context (with the dictionary
/// loaded once) and reuses it for every frame.
pub struct FrameEncoder {
    codec: FrameCodec,
    frame_len: usize,
    ctx: Option<zstd::bulk::Compressor<'static>>,
}

impl std::fmt::Debug for FrameEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameEncoder")
            .field("codec", &self.codec)
            .field("frame_len", &self.frame_len)
            .finish_non_exhaustive()
    }
}

fn zstd_error(what: &str, e: std::io::Error) -> Error {
    Error::invalid_data(format!("{what}: {e}"))
}

impl FrameEncoder {
    /// An encoder for `spec`'s frames; `dictionary` is required for `zstd-dict` (and ignored by
    /// the other codecs).
    pub fn new(spec: &FrameSpec, dictionary: Option<&[u8]>) -> Result<Self> {
        let ctx = match (spec.codec, dictionary) {
            (FrameCodec::None, _) => None,
            (FrameCodec::Zstd, _) => Some(
                zstd::bulk::Compressor::new(spec.level)
                    .map_err(|e| zstd_error("zstd compressor", e))?,
            ),
            (FrameCodec::ZstdDict, Some(d)) => Some(
                zstd::bulk::Compressor::with_dictionary(spec.level, d)
                    .map_err(|e| zstd_error("zstd dictionary", e))?,
            ),
            (FrameCodec::ZstdDict, None) => {
                return Err(Error::argument(
                    "dictionary",
                    "the zstd-dict codec needs its dictionary",
                ));
            }
        };
        Ok(FrameEncoder {
            codec: spec.codec,
            frame_len: spec.frame_len(),
            ctx,
        })
    }

    /// Appends the encoding of one raw frame (exactly the frame's size) to `out`; returns the
    /// bytes appended.
    pub fn encode_into(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Result<usize> {
        if raw.len() != self.frame_len {
            return Err(Error::invalid_data(format!(
                "a frame of {} bytes where the shape holds {}",
                raw.len(),
                self.frame_len
            )));
        }
        let Some(ctx) = self.ctx.as_mut() else {
            out.extend_from_slice(raw);
            return Ok(raw.len());
        };
        let start = out.len();
        out.reserve(zstd::zstd_safe::compress_bound(raw.len()));
        // Compress into the capacity reserved above, after what `out` already holds (a cursor
        // at its end: zstd's WriteBuf of a plain Vec would write from its start).
        let mut cursor = std::io::Cursor::new(&mut *out);
        cursor.set_position(start as u64);
        ctx.compress_to_buffer(raw, &mut cursor)
            .map_err(|e| zstd_error("zstd compression", e))?;
        Ok(out.len() - start)
    }
}

/// Decodes the frames of one column into caller buffers. Make one per worker thread
/// ([`FrameColumn::decoder`]): it holds one zstd decompression context with the dictionary
/// loaded once, and [`FrameDecoder::decode_into`] allocates nothing.
pub struct FrameDecoder {
    column: String,
    codec: FrameCodec,
    frame_len: usize,
    ctx: Option<zstd::bulk::Decompressor<'static>>,
}

impl std::fmt::Debug for FrameDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameDecoder")
            .field("column", &self.column)
            .field("codec", &self.codec)
            .field("frame_len", &self.frame_len)
            .finish_non_exhaustive()
    }
}

impl FrameDecoder {
    /// A decoder of column `column`'s frames; `dictionary` is required for `zstd-dict`.
    pub fn new(column: &str, spec: &FrameSpec, dictionary: Option<&[u8]>) -> Result<Self> {
        let bad = |e: std::io::Error| zstd_error("zstd decompressor", e).in_column(column);
        let ctx = match (spec.codec, dictionary) {
            (FrameCodec::None, _) => None,
            (FrameCodec::Zstd, _) => Some(zstd::bulk::Decompressor::new().map_err(bad)?),
            (FrameCodec::ZstdDict, Some(d)) => {
                Some(zstd::bulk::Decompressor::with_dictionary(d).map_err(bad)?)
            }
            (FrameCodec::ZstdDict, None) => {
                return Err(
                    Error::invalid_data("a zstd-dict column without its dictionary")
                        .in_column(column),
                );
            }
        };
        Ok(FrameDecoder {
            column: column.to_string(),
            codec: spec.codec,
            frame_len: spec.frame_len(),
            ctx,
        })
    }

    /// Bytes of one decoded frame.
    pub fn frame_len(&self) -> usize {
        self.frame_len
    }

    /// Decodes one stored frame into `out`, which must be exactly [`FrameDecoder::frame_len`]
    /// bytes. A frame that does not decode, or decodes to another size, is
    /// [`Error::InvalidData`] naming the column (`out` then holds unspecified bytes).
    pub fn decode_into(&mut self, frame: &[u8], out: &mut [u8]) -> Result<()> {
        if out.len() != self.frame_len {
            return Err(Error::argument(
                "out",
                format!(
                    "a buffer of {} bytes for frames of {}",
                    out.len(),
                    self.frame_len
                ),
            ));
        }
        let n = match self.ctx.as_mut() {
            None if frame.len() == out.len() => {
                out.copy_from_slice(frame);
                frame.len()
            }
            None => frame.len(),
            Some(ctx) => ctx.decompress_to_buffer(frame, out).map_err(|e| {
                Error::invalid_data(format!(
                    "a {} frame of {} bytes does not decode: {e}",
                    self.codec,
                    frame.len()
                ))
                .in_column(&self.column)
            })?,
        };
        if n != self.frame_len {
            return Err(Error::invalid_data(format!(
                "a {} frame decodes to {n} bytes, the shape holds {}",
                self.codec, self.frame_len
            ))
            .in_column(&self.column));
        }
        Ok(())
    }
}

/// Trains a zstd dictionary of at most `max_bytes` on `samples` (raw frames). Fails with
/// [`Error::InvalidData`] when zstd cannot train one (too few or too small samples); the writer
/// then falls back to the `zstd` codec.
pub fn train_dictionary<S: AsRef<[u8]>>(samples: &[S], max_bytes: usize) -> Result<Vec<u8>> {
    let dict = zstd::dict::from_samples(samples, max_bytes)
        .map_err(|e| zstd_error("training the zstd dictionary", e))?;
    check_dictionary(&dict).map_err(Error::invalid_data)?;
    Ok(dict)
}

/// Checks that `bytes` look like a zstd dictionary (magic number, a dictionary id, and zstd
/// accepts it). Returns the reason it does not.
pub fn check_dictionary(bytes: &[u8]) -> std::result::Result<(), String> {
    if bytes.len() < 8 || bytes[..4] != DICT_MAGIC {
        return Err("not a zstd dictionary (bad magic number)".into());
    }
    zstd::bulk::Decompressor::with_dictionary(bytes)
        .map(drop)
        .map_err(|e| format!("zstd rejects the dictionary: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(n: usize, len: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                (0..len)
                    .map(|j| ((j / 7 + i) % 5 * 40 + (j % 84 == i % 84) as usize * 17) as u8)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn every_codec_round_trips_bit_exactly() {
        let raw = frames(200, 84 * 84);
        let dict = train_dictionary(&raw, 4096).unwrap();
        for codec in [FrameCodec::ZstdDict, FrameCodec::Zstd, FrameCodec::None] {
            let spec = FrameSpec::new(codec, &[84, 84]).unwrap();
            let mut enc = FrameEncoder::new(&spec, Some(&dict)).unwrap();
            let mut dec = FrameDecoder::new("observation", &spec, Some(&dict)).unwrap();
            let mut out = vec![0u8; 84 * 84];
            for f in &raw {
                let mut buf = vec![];
                enc.encode_into(f, &mut buf).unwrap();
                dec.decode_into(&buf, &mut out).unwrap();
                assert_eq!(&out, f, "{codec}");
            }
        }
    }

    #[test]
    fn damaged_frames_are_named_errors() {
        let spec = FrameSpec::new(FrameCodec::Zstd, &[8, 8, 3]).unwrap();
        let mut enc = FrameEncoder::new(&spec, None).unwrap();
        let mut buf = vec![];
        enc.encode_into(&[7u8; 192], &mut buf).unwrap();
        let mut dec = FrameDecoder::new("pixels", &spec, None).unwrap();
        let mut out = [0u8; 192];
        for cut in 0..buf.len() {
            let e = dec.decode_into(&buf[..cut], &mut out).unwrap_err();
            assert!(matches!(&e, Error::InvalidData { column: Some(c), .. } if c == "pixels"));
        }
        let small = FrameSpec::new(FrameCodec::Zstd, &[8, 8]).unwrap();
        let mut dec = FrameDecoder::new("pixels", &small, None).unwrap();
        assert!(dec.decode_into(&buf, &mut [0u8; 64]).is_err());
        assert!(check_dictionary(b"not a dictionary").is_err());
    }
}
