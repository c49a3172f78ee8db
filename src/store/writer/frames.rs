//! The writer's frame column: encodes the raw `uint8` frames of appended episodes into the
//! `LargeBinary` column (one compressed frame per row, in parallel for episodes of over 4 MiB of frames), and, for
//! the `zstd-dict` codec, holds the first episodes back until it has enough frames to train the
//! dictionary, writes the dictionary into the dataset, then encodes them.
//!
//! Training set: the first [`training_frames`] frames this dataset's writer is given (whole
//! episodes are held until they add up to that many, or until the commit, whichever comes
//! first). The dictionary is trained once, at the dataset's first commit with frames, and every
//! later writer reuses it (it is in the manifest's column). Where zstd cannot train one (too few
//! or too small frames), or where frames of 64 KiB or more (cameras) lose under 3% of their
//! plain-zstd bytes to the dictionary on the training frames, the column falls back to the
//! `zstd` codec, recorded in the manifest.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, LargeBinaryArray, RecordBatch};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::UInt8Type;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::frames::{
    DEFAULT_DICTIONARY_BYTES, DEFAULT_TRAINING_FRAMES, DictionaryRef, FrameCodec, FrameEncoder,
    FrameSpec, train_dictionary,
};
use crate::store::dictionary::{read_dictionary, write_dictionary};

/// Raw bytes of an episode's frames above which they are encoded on the rayon pool.
const PARALLEL_BYTES: usize = 4 << 20;
/// Raw bytes of frames one rayon task encodes (whole frames; at least one).
const TASK_BYTES: usize = 1 << 20;
/// Bytes of raw frames the dictionary is trained on, at most. zstd's trainer costs about 40 ms
/// per MB of samples (one core) and gains nothing past ~2,000 Atari frames (14 MB: 91 B per
/// Pong frame against 90 B from 4,096); a camera's 230 KB frames gain nothing from a 16 KiB
/// dictionary at all (see `dictionary_pays`).
const TRAINING_BYTES: usize = 16 << 20;
/// Frames compressed with and without a trained dictionary to see whether it pays.
const CHECK_FRAMES: usize = 32;
/// Frames of at least this many bytes keep a trained dictionary only where it pays (smaller
/// frames are what zstd dictionaries are for, and the codec asked for is kept).
const CHECKED_FRAME_BYTES: usize = 64 << 10;
/// The dictionary is kept when it saves at least this fraction of the bytes on `CHECK_FRAMES`.
const MIN_DICTIONARY_GAIN: f64 = 0.03;

/// How many frames of `frame_len` bytes the dictionary is trained on: up to
/// [`DEFAULT_TRAINING_FRAMES`], fewer for large frames (at most 16 MiB held), at least 16.
pub fn training_frames(frame_len: usize) -> usize {
    (TRAINING_BYTES / frame_len.max(1)).clamp(16, DEFAULT_TRAINING_FRAMES)
}

/// Whether `dict` makes `samples` (every `step`-th of them, [`CHECK_FRAMES`] at most) at least
/// [`MIN_DICTIONARY_GAIN`] smaller than plain zstd at the same level. Large frames of camera
/// noise gain nothing, and a dictionary then only costs each decode its tables.
fn dictionary_pays(spec: &FrameSpec, dict: &[u8], samples: &[&[u8]]) -> Result<bool> {
    let plain = FrameSpec {
        codec: FrameCodec::Zstd,
        dictionary: None,
        ..spec.clone()
    };
    let mut with = FrameEncoder::new(spec, Some(dict))?;
    let mut without = FrameEncoder::new(&plain, None)?;
    let step = samples.len().div_ceil(CHECK_FRAMES).max(1);
    let (mut a, mut b, mut out) = (0usize, 0usize, Vec::new());
    for f in samples.iter().step_by(step) {
        out.clear();
        a += with.encode_into(f, &mut out)?;
        out.clear();
        b += without.encode_into(f, &mut out)?;
    }
    Ok((a as f64) <= (b as f64) * (1.0 - MIN_DICTIONARY_GAIN))
}

/// An episode held back until the dictionary exists: its payload (input schema, raw frames),
/// end flags and raw final frame.
pub(super) struct Held {
    pub(super) columns: Vec<ArrayRef>,
    pub(super) terminated: bool,
    pub(super) truncated: bool,
    pub(super) final_frame: Option<ArrayRef>,
}

/// One frame column's state in a writer (the episodes held back for training are the
/// writer's: every frame column of a dataset trains on the same first episodes).
pub(super) struct FrameWriter {
    /// The column's name.
    pub(super) name: String,
    /// Its index among the writer's input columns.
    pub(super) column: usize,
    spec: FrameSpec,
    dictionary: Option<Arc<[u8]>>,
    encoder: Option<FrameEncoder>,
}

impl FrameWriter {
    /// The state for `spec` (read from the newest manifest; its dictionary, when it has one, is
    /// read and checked).
    pub(super) fn open(
        root: &Path,
        manifest: &Path,
        name: &str,
        column: usize,
        spec: &FrameSpec,
    ) -> Result<Self> {
        let dictionary = match &spec.dictionary {
            Some(r) => Some(read_dictionary(root, manifest, r)?),
            None => None,
        };
        let encoder = match spec.codec {
            FrameCodec::ZstdDict if dictionary.is_none() => None,
            _ => Some(FrameEncoder::new(spec, dictionary.as_deref())?),
        };
        Ok(FrameWriter {
            name: name.to_string(),
            column,
            spec: spec.clone(),
            dictionary,
            encoder,
        })
    }

    /// Whether episodes are held back for training.
    pub(super) fn training(&self) -> bool {
        self.encoder.is_none()
    }

    /// Whether `frames` held frames are enough to train this column's dictionary.
    pub(super) fn enough(&self, frames: usize) -> bool {
        frames >= training_frames(self.spec.frame_len())
    }

    /// Trains the dictionary on the column's frames in `held` (the first [`training_frames`])
    /// and writes it under `root`. Returns the dictionary's reference, or `None` when zstd could
    /// not train one (the column then uses plain `zstd`). The caller encodes the held episodes.
    pub(super) fn train(&mut self, root: &Path, held: &[Held]) -> Result<Option<DictionaryRef>> {
        let len = self.spec.frame_len();
        let limit = training_frames(len);
        let mut samples: Vec<&[u8]> = Vec::with_capacity(limit);
        'episodes: for h in held {
            let raw = raw_bytes(&h.columns[self.column])?;
            for frame in raw.chunks_exact(len) {
                if samples.len() == limit {
                    break 'episodes;
                }
                samples.push(frame);
            }
        }
        let mut trained = train_dictionary(&samples, DEFAULT_DICTIONARY_BYTES).ok();
        if let Some(dict) = trained.as_ref().filter(|_| len >= CHECKED_FRAME_BYTES) {
            let spec = FrameSpec {
                dictionary: None,
                ..self.spec.clone()
            };
            if !dictionary_pays(&spec, dict, &samples)? {
                trained = None;
            }
        }
        let reference = match trained {
            Some(dict) => {
                let r = write_dictionary(root, &dict)?;
                self.spec.dictionary = Some(r.clone());
                self.dictionary = Some(dict.into());
                Some(r)
            }
            None => {
                self.spec.codec = FrameCodec::Zstd;
                None
            }
        };
        self.encoder = Some(FrameEncoder::new(&self.spec, self.dictionary.as_deref())?);
        Ok(reference)
    }

    /// Encodes a raw `uint8` tensor column (a fixed-size list of the frame's size per row) into
    /// the stored `LargeBinary` column, one encoded frame per row.
    pub(super) fn encode(&mut self, raw: &ArrayRef) -> Result<ArrayRef> {
        let len = self.spec.frame_len();
        let bytes = raw_bytes(raw)?;
        let rows = raw.len();
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0i64);
        let mut values = Vec::new();
        if rows >= 2 && bytes.len() >= PARALLEL_BYTES {
            let (spec, dict) = (&self.spec, self.dictionary.as_deref());
            let parts = bytes
                .par_chunks(len * (TASK_BYTES / len.max(1)).max(1))
                .map_init(
                    || FrameEncoder::new(spec, dict),
                    |enc, chunk| {
                        let enc = enc
                            .as_mut()
                            .map_err(|e| Error::invalid_data(e.to_string()))?;
                        let mut out = Vec::new();
                        let mut sizes = Vec::with_capacity(chunk.len() / len);
                        for f in chunk.chunks_exact(len) {
                            sizes.push(enc.encode_into(f, &mut out)? as i64);
                        }
                        Ok((out, sizes))
                    },
                )
                .collect::<Result<Vec<_>>>()?;
            for (out, sizes) in parts {
                values.extend_from_slice(&out);
                for s in sizes {
                    offsets.push(offsets.last().expect("one") + s);
                }
            }
        } else {
            let enc = self.encoder.as_mut().expect("encode after training");
            for f in bytes.chunks_exact(len) {
                let n = enc.encode_into(f, &mut values)?;
                offsets.push(offsets.last().expect("one") + n as i64);
            }
        }
        Ok(Arc::new(LargeBinaryArray::new(
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            Buffer::from_vec(values),
            None,
        )))
    }
}

/// The raw bytes of a non-null `FixedSizeList<uint8>` column (what the writer conformed the
/// input to), rows after rows.
fn raw_bytes(raw: &ArrayRef) -> Result<&[u8]> {
    let list = raw
        .as_fixed_size_list_opt()
        .ok_or_else(|| Error::invalid_data("frames must be a fixed-size list of uint8"))?;
    let values = list
        .values()
        .as_primitive_opt::<UInt8Type>()
        .ok_or_else(|| Error::invalid_data("frames must be uint8"))?;
    Ok(values.values())
}

/// The bytes of frame column values in `batch`'s column `i` (0 for another type): what the
/// writer counts against its batch and segment targets.
pub(super) fn stored_bytes(batch: &RecordBatch, i: usize) -> u64 {
    batch
        .column(i)
        .as_binary_opt::<i64>()
        .map_or(0, |a| (a.value_data().len() + 8 * a.len()) as u64)
}
