//! Video files (feature `video`): the camera streams of LeRobot datasets, read frame-accurately
//! into RGB frames. A codec layer that knows nothing of datasets, like [`crate::frames`].
//!
//! - [`mp4`]: a minimal MP4 demuxer (the video track's samples, key frames and presentation
//!   times in the stream's own time base, FFmpeg's edit-list semantics);
//! - AV1 through libdav1d (`av1`), H.264 through OpenH264 (`h264`);
//! - [`yuv`]: `yuv420p` → RGB, bit-exact with FFmpeg's swscale on x86-64 (what PyAV's
//!   `to_ndarray(format="rgb24")`, and so LeRobot's decoders, give).
//!
//! An ingest calls [`VideoFile::sample_at`] (the frame nearest a timestamp, within a tolerance)
//! and [`VideoFile::decode`] (those frames, decoded from the key frame before the first of
//! them). A damaged file or a timestamp with no frame is an [`Error::InvalidData`] that names
//! the file (the caller adds the camera and episode), never a panic.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};

mod av1;
mod h264;
pub mod mp4;
pub mod yuv;

pub use mp4::{Codec, Track};
pub use yuv::{ColourSpace, YuvToRgb};

/// A decoded picture: 8-bit 4:2:0 planes, tightly packed (chroma `ceil(w/2)` by `ceil(h/2)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picture {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// Luma plane.
    pub y: Vec<u8>,
    /// Cb plane.
    pub u: Vec<u8>,
    /// Cr plane.
    pub v: Vec<u8>,
    /// The stream's colour description.
    pub colour: ColourSpace,
    /// The decode-order index of the sample it was decoded from (-1: not known yet).
    tag: i64,
}

impl Picture {
    /// The `yuv420p` planes one after the other (what PyAV's `frame.to_ndarray()` gives for an
    /// even-sized `yuv420p` frame, `[H * 3 / 2, W]`).
    pub fn planes(&self) -> Vec<u8> {
        [&self.y[..], &self.u[..], &self.v[..]].concat()
    }

    /// Converts to RGB (`H * W * 3` bytes, row-major) into `out`.
    pub fn to_rgb(&self, out: &mut [u8]) -> Result<()> {
        let cw = self.width.div_ceil(2);
        YuvToRgb::new(self.colour)?.convert(
            (self.width, self.height),
            (&self.y, self.width),
            (&self.u, cw),
            (&self.v, cw),
            out,
        );
        Ok(())
    }
}

/// Runs a decoder call that may panic on malformed bytes; a panic becomes an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    crate::guard::quietly(f).unwrap_or_else(|_| {
        Err(Error::invalid_data(format!(
            "the decoder failed on a damaged {what}"
        )))
    })
}

enum Decoder {
    Av1(av1::Av1Decoder),
    H264(Box<h264::H264Decoder>),
}

/// An open MP4 video file: its track, read on demand.
pub struct VideoFile {
    track: Track,
    file: File,
    /// Sample indices in presentation order.
    by_pts: Vec<usize>,
}

impl VideoFile {
    /// Opens `path` and reads its sample table (not its frames).
    pub fn open(path: &Path) -> Result<Self> {
        let track = Track::open(path)?;
        if track.codec == Codec::Hevc {
            return Err(Error::invalid_data(
                "HEVC video: trajstore decodes AV1 (LeRobot's default) and H.264",
            )
            .in_input(path.display()));
        }
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let mut by_pts: Vec<usize> = (0..track.samples.len()).collect();
        by_pts.sort_by_key(|&i| (track.samples[i].pts, i));
        Ok(VideoFile {
            track,
            file,
            by_pts,
        })
    }

    /// The track: codec, size, time base, samples.
    pub fn track(&self) -> &Track {
        &self.track
    }

    /// How many frames are presented at times in `[from - tolerance, to - tolerance)`
    /// (seconds): the frames of an episode that LeRobot's writer put at `from .. to`.
    pub fn frames_between(&self, from: f64, to: f64, tolerance: f64) -> usize {
        let t = &self.track;
        self.by_pts
            .iter()
            .filter(|&&i| {
                let s = t.seconds(t.samples[i].pts);
                s >= from - tolerance && s < to - tolerance
            })
            .count()
    }

    /// The sample presented nearest `time` (seconds), if it is within `tolerance`; otherwise
    /// the error names the time and the nearest frame's.
    pub fn sample_at(&self, time: f64, tolerance: f64) -> Result<usize> {
        let t = &self.track;
        let k = self
            .by_pts
            .partition_point(|&i| t.seconds(t.samples[i].pts) < time);
        let nearest = [k.checked_sub(1), Some(k)]
            .into_iter()
            .flatten()
            .filter_map(|k| self.by_pts.get(k).copied())
            .min_by(|&a, &b| {
                let d = |i: usize| (t.seconds(t.samples[i].pts) - time).abs();
                d(a).total_cmp(&d(b))
            });
        match nearest {
            Some(i) if (t.seconds(t.samples[i].pts) - time).abs() <= tolerance => Ok(i),
            Some(i) => Err(Error::invalid_data(format!(
                "no frame at {time:.6}s (within {tolerance}s): the nearest is at {:.6}s",
                t.seconds(t.samples[i].pts)
            ))
            .in_input(t.path.display())),
            None => Err(Error::invalid_data("the video has no frames").in_input(t.path.display())),
        }
    }

    /// Decodes the pictures of samples `wanted` (decode-order indices, any order, repeats
    /// allowed) and returns them in the same order. Decoding starts at the last key frame at
    /// or before the first of them and runs to the last of them.
    ///
    /// Cost: one decoder; every sample from that key frame to the last wanted one is read and
    /// decoded once (with LeRobot's `g=2`, at most one more than wanted per run).
    pub fn decode(&mut self, wanted: &[usize]) -> Result<Vec<Picture>> {
        let path = self.track.path.clone();
        self.decode_inner(wanted).map_err(|e| match e {
            Error::InvalidData { input: None, .. } => e.in_input(path.display()),
            e => e,
        })
    }

    fn decode_inner(&mut self, wanted: &[usize]) -> Result<Vec<Picture>> {
        let (Some(&lo), Some(&hi)) = (wanted.iter().min(), wanted.iter().max()) else {
            return Ok(vec![]);
        };
        let t = &self.track;
        let start = (0..=lo)
            .rev()
            .find(|&i| t.samples[i].sync)
            .ok_or_else(|| Error::invalid_data(format!("no key frame at or before sample {lo}")))?;
        let mut decoder = match t.codec {
            Codec::Av1 => {
                let mut d = av1::Av1Decoder::new()?;
                if t.config.len() > 4 {
                    // The sequence header of `av1C` (its configOBUs), in case the key frame
                    // decoding starts at does not repeat it. It decodes to no picture.
                    d.decode(&t.config[4..], -1, &mut vec![])?;
                }
                Decoder::Av1(d)
            }
            Codec::H264 => Decoder::H264(Box::new(h264::H264Decoder::new(&t.config)?)),
            Codec::Hevc => unreachable!("refused by open"),
        };
        let mut out = vec![];
        let mut buf = vec![];
        for i in start..=hi {
            t.read_sample(&mut self.file, i, &mut buf)?;
            match &mut decoder {
                Decoder::Av1(d) => d.decode(&buf, i as i64, &mut out)?,
                Decoder::H264(d) => d.decode(&buf, &mut out)?,
            }
        }
        match &mut decoder {
            Decoder::Av1(d) => d.flush(&mut out)?,
            Decoder::H264(d) => {
                d.flush(&mut out)?;
                // OpenH264 gives pictures in presentation order without their samples: the
                // k-th picture is the k-th decoded sample by presentation time.
                let mut decoded: Vec<usize> = (start..=hi).collect();
                decoded.sort_by_key(|&i| (t.samples[i].pts, i));
                if out.len() != decoded.len() {
                    return Err(Error::invalid_data(format!(
                        "H.264: {} pictures from samples {start}..={hi} ({} samples)",
                        out.len(),
                        decoded.len()
                    )));
                }
                for (p, &i) in out.iter_mut().zip(&decoded) {
                    p.tag = i as i64;
                }
            }
        }
        let mut pictures: Vec<Option<Picture>> = vec![None; hi - start + 1];
        for p in out {
            let slot = usize::try_from(p.tag - start as i64)
                .ok()
                .and_then(|k| pictures.get_mut(k));
            match slot {
                Some(s) => *s = Some(p),
                None => {
                    return Err(Error::invalid_data(format!(
                        "a picture of unknown sample {}",
                        p.tag
                    )));
                }
            }
        }
        wanted
            .iter()
            .map(|&i| {
                pictures[i - start]
                    .clone()
                    .ok_or_else(|| Error::invalid_data(format!("sample {i} decoded to no picture")))
            })
            .collect()
    }
}
