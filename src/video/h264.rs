//! H.264 through OpenH264 (the `openh264` crate, which builds Cisco's decoder from its bundled
//! source: nothing to install). MP4 samples (length-prefixed NAL units, `avcC`) become an
//! Annex B byte stream. H.264 decoding is exact by the standard, so a conformant decoder gives
//! FFmpeg's planes; OpenH264 decodes the High profile streams libx264 writes (checked on the
//! fixtures), though Cisco documents only Constrained Baseline.
//!
//! The colour description comes from the SPS's VUI (`video_full_range_flag`,
//! `matrix_coefficients`), as FFmpeg's decoder sets it on frames.

use openh264::decoder::Decoder;
use openh264::formats::YUVSource;

use super::Picture;
use super::yuv::ColourSpace;
use crate::error::{Error, Result};

const START: [u8; 4] = [0, 0, 0, 1];

/// An OpenH264 decoder fed from MP4 samples.
pub(super) struct H264Decoder {
    dec: Decoder,
    /// Bytes of each NAL unit's length prefix (1, 2 or 4).
    nal_len: usize,
    colour: ColourSpace,
    /// The SPS and PPS of `avcC`, already decoded.
    params: Vec<Vec<u8>>,
    /// They as an Annex B stream.
    prefix: Vec<u8>,
    /// Samples decoded since the decoder was made.
    decoded: usize,
    annexb: Vec<u8>,
}

/// A decoder that has decoded `prefix` (the parameter sets).
fn fresh(prefix: &[u8]) -> Result<Decoder> {
    let mut dec = Decoder::new().map_err(failed)?;
    super::guarded("H.264 parameter sets", || {
        dec.decode(prefix).map(|_| ()).map_err(failed)
    })?;
    Ok(dec)
}

fn failed(what: impl std::fmt::Display) -> Error {
    Error::invalid_data(format!("H.264 decoding failed: {what}"))
}

impl H264Decoder {
    /// A decoder for the stream of `avcc` (the `avcC` payload): its SPS and PPS are decoded
    /// first.
    pub(super) fn new(avcc: &[u8]) -> Result<Self> {
        let bad = |why: &str| Error::invalid_data(format!("damaged `avcC`: {why}"));
        if avcc.len() < 7 || avcc[0] != 1 {
            return Err(bad("not an AVCDecoderConfigurationRecord of version 1"));
        }
        let nal_len = (avcc[4] & 3) as usize + 1;
        if nal_len == 3 {
            return Err(bad("NAL length size 3"));
        }
        let mut at = 5;
        let mut prefix = vec![];
        let mut params = vec![];
        let mut colour = ColourSpace::default();
        for round in 0..2 {
            let count = *avcc.get(at).ok_or_else(|| bad("ends early"))? as usize;
            let count = if round == 0 { count & 0x1f } else { count };
            at += 1;
            for _ in 0..count {
                let n = avcc
                    .get(at..at + 2)
                    .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
                    .ok_or_else(|| bad("ends early"))?;
                let nal = avcc
                    .get(at + 2..at + 2 + n)
                    .ok_or_else(|| bad("ends early"))?;
                if round == 0
                    && let Some(c) = sps_colour(nal)
                {
                    colour = c;
                }
                prefix.extend_from_slice(&START);
                prefix.extend_from_slice(nal);
                params.push(nal.to_vec());
                at += 2 + n;
            }
        }
        Ok(H264Decoder {
            dec: fresh(&prefix)?,
            nal_len,
            colour,
            params,
            prefix,
            decoded: 0,
            annexb: vec![],
        })
    }

    /// Decodes one sample; a picture that comes out is pushed to `out` (tagged -1: OpenH264
    /// gives no input timestamp back; the caller assigns pictures in presentation order).
    pub(super) fn decode(&mut self, sample: &[u8], out: &mut Vec<Picture>) -> Result<()> {
        self.annexb.clear();
        let mut idr = false;
        let mut at = 0;
        while at < sample.len() {
            let head = sample
                .get(at..at + self.nal_len)
                .ok_or_else(|| failed("a sample ends inside a NAL length"))?;
            let n = head.iter().fold(0usize, |n, &b| (n << 8) | b as usize);
            let nal = sample
                .get(at + self.nal_len..at + self.nal_len + n)
                .ok_or_else(|| failed("a NAL unit runs past the end of its sample"))?;
            at += self.nal_len + n;
            // libx264 repeats the SPS and PPS in band at each episode's first frame (LeRobot's
            // MP4s are episodes concatenated); given again mid-stream, OpenH264 fails on the
            // next P frame. The ones `avcC` gave are left out; a new one is passed on.
            let kind = nal.first().map_or(0, |b| b & 0x1f);
            idr |= kind == 5;
            if (kind == 7 || kind == 8) && self.params.iter().any(|p| p == nal) {
                continue;
            }
            self.annexb.extend_from_slice(&START);
            self.annexb.extend_from_slice(nal);
        }
        if idr && self.decoded > 0 {
            // Nothing after an IDR picture refers to anything before it: a new decoder. One
            // decoder for a long run fails (OpenH264 2.6 runs out of pictures after 8 frames of
            // LeRobot's `g=2` streams, `dsOutOfMemory`), one per IDR picture does not.
            self.flush(out)?;
            self.dec = fresh(&self.prefix)?;
            self.decoded = 0;
        }
        self.decoded += 1;
        let colour = self.colour;
        let (dec, data) = (&mut self.dec, &self.annexb);
        let picture = super::guarded("H.264 sample", || {
            dec.decode(data)
                .map_err(failed)?
                .map(|yuv| copy_picture(&yuv, colour))
                .transpose()
        })?;
        out.extend(picture);
        Ok(())
    }

    /// Drains the pictures still in the decoder.
    pub(super) fn flush(&mut self, out: &mut Vec<Picture>) -> Result<()> {
        let colour = self.colour;
        let dec = &mut self.dec;
        let rest = super::guarded("H.264 flush", || {
            dec.flush_remaining()
                .map_err(failed)?
                .iter()
                .map(|yuv| copy_picture(yuv, colour))
                .collect::<Result<Vec<_>>>()
        })?;
        out.extend(rest);
        Ok(())
    }
}

fn copy_picture(yuv: &impl YUVSource, colour: ColourSpace) -> Result<Picture> {
    let (w, h) = yuv.dimensions();
    let (ys, us, vs) = yuv.strides();
    let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
    let plane = |src: &[u8], stride: usize, pw: usize, ph: usize| -> Result<Vec<u8>> {
        let mut v = Vec::with_capacity(pw * ph);
        for row in 0..ph {
            let r = src
                .get(row * stride..row * stride + pw)
                .ok_or_else(|| failed("a decoded plane is shorter than its size"))?;
            v.extend_from_slice(r);
        }
        Ok(v)
    };
    Ok(Picture {
        width: w,
        height: h,
        y: plane(yuv.y(), ys, w, h)?,
        u: plane(yuv.u(), us, cw, ch)?,
        v: plane(yuv.v(), vs, cw, ch)?,
        colour,
        tag: -1,
    })
}

/// An Exp-Golomb bit reader over a NAL unit's payload (emulation prevention bytes removed).
struct Bits {
    data: Vec<u8>,
    pos: usize,
}

impl Bits {
    fn new(nal: &[u8]) -> Self {
        let mut data = Vec::with_capacity(nal.len());
        let mut zeros = 0;
        for &b in nal {
            if zeros >= 2 && b == 3 {
                zeros = 0;
                continue;
            }
            zeros = if b == 0 { zeros + 1 } else { 0 };
            data.push(b);
        }
        Bits { data, pos: 0 }
    }
    fn bit(&mut self) -> Option<u32> {
        let b = self.data.get(self.pos / 8)?;
        let v = (b >> (7 - self.pos % 8)) & 1;
        self.pos += 1;
        Some(v as u32)
    }
    fn bits(&mut self, n: u32) -> Option<u32> {
        (0..n).try_fold(0u32, |v, _| Some((v << 1) | self.bit()?))
    }
    fn ue(&mut self) -> Option<u32> {
        let mut zeros = 0;
        while self.bit()? == 0 {
            zeros += 1;
            if zeros > 31 {
                return None;
            }
        }
        Some((1u32 << zeros) - 1 + self.bits(zeros)?)
    }
    fn se(&mut self) -> Option<i32> {
        let k = self.ue()?;
        Some(if k % 2 == 1 {
            k.div_ceil(2) as i32
        } else {
            -((k / 2) as i32)
        })
    }
}

/// The colour description of an SPS's VUI, when it has one.
fn sps_colour(nal: &[u8]) -> Option<ColourSpace> {
    let mut b = Bits::new(nal.get(1..)?);
    let profile = b.bits(8)?;
    b.bits(16)?; // constraint flags, level
    b.ue()?; // seq_parameter_set_id
    if matches!(
        profile,
        100 | 110 | 122 | 244 | 44 | 83 | 86 | 118 | 128 | 138 | 139 | 134 | 135
    ) {
        let chroma = b.ue()?;
        if chroma == 3 {
            b.bit()?;
        }
        b.ue()?;
        b.ue()?;
        b.bit()?;
        if b.bit()? == 1 {
            for i in 0..if chroma == 3 { 12 } else { 8 } {
                if b.bit()? == 1 {
                    let size = if i < 6 { 16 } else { 64 };
                    let (mut last, mut next) = (8i32, 8i32);
                    for _ in 0..size {
                        if next != 0 {
                            next = (last + b.se()? + 256) % 256;
                        }
                        last = if next == 0 { last } else { next };
                    }
                }
            }
        }
    }
    b.ue()?; // log2_max_frame_num_minus4
    match b.ue()? {
        0 => {
            b.ue()?;
        }
        1 => {
            b.bit()?;
            b.se()?;
            b.se()?;
            for _ in 0..b.ue()? {
                b.se()?;
            }
        }
        _ => {}
    }
    b.ue()?; // max_num_ref_frames
    b.bit()?;
    b.ue()?;
    b.ue()?;
    if b.bit()? == 0 {
        b.bit()?; // mb_adaptive_frame_field_flag
    }
    b.bit()?; // direct_8x8_inference_flag
    if b.bit()? == 1 {
        for _ in 0..4 {
            b.ue()?;
        }
    }
    if b.bit()? == 0 {
        return None; // no VUI
    }
    if b.bit()? == 1 && b.bits(8)? == 255 {
        b.bits(32)?; // sar
    }
    if b.bit()? == 1 {
        b.bit()?; // overscan_appropriate_flag
    }
    if b.bit()? == 0 {
        return None; // no video_signal_type
    }
    b.bits(3)?; // video_format
    let full_range = b.bit()? == 1;
    let matrix = if b.bit()? == 1 {
        b.bits(16)?; // primaries, transfer
        b.bits(8)? as u8
    } else {
        2
    };
    Some(ColourSpace { matrix, full_range })
}
