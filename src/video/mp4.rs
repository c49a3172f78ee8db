//! A minimal MP4 (ISO BMFF) demuxer: the first video track's sample table, enough to find and
//! read each coded frame of the files LeRobot writes (one video track, AV1 `av01` with `av1C`,
//! H.264 `avc1`/`avc3` with `avcC`, HEVC `hvc1`/`hev1` with `hvcC`; `moov` before or after
//! `mdat`; one edit, optionally after an empty one). Fragmented MP4 (`moof`) is not read.
//!
//! Every offset, size and count is checked against the file: a truncated or damaged file is an
//! [`Error::InvalidData`] naming it, never a panic or an allocation of a size the file claims.
//!
//! Timestamps are those FFmpeg's `mov` demuxer gives (and so PyAV and LeRobot's decoders): the
//! presentation time of sample `i` is `dts(i) + ctts(i)` less the edit's `media_time`, plus the
//! duration of a leading empty edit, in the track's own time base `1 / timescale` (`mdhd`).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The most bytes of a `moov` box this reads (its sample tables; 256 MiB holds tens of millions
/// of samples).
const MAX_MOOV: u64 = 256 << 20;

/// The codec of a video track, from its sample entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// AV1 (`av01`).
    Av1,
    /// H.264 / AVC (`avc1`, `avc3`).
    H264,
    /// H.265 / HEVC (`hvc1`, `hev1`).
    Hevc,
}

impl Codec {
    /// The name FFmpeg gives it: `av1`, `h264`, `hevc`.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Av1 => "av1",
            Codec::H264 => "h264",
            Codec::Hevc => "hevc",
        }
    }
}

/// One coded frame of the track.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Byte offset in the file.
    pub offset: u64,
    /// Size in bytes.
    pub size: u32,
    /// Presentation time in track time-base units (may be negative before the edit).
    pub pts: i64,
    /// A sync sample (key frame): decoding may start here.
    pub sync: bool,
}

/// The colour description of the sample entry's `colr` box (`nclx`), when it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Colour {
    /// `matrix_coefficients` (ISO/IEC 23091-4: 1 BT.709, 5/6 BT.601, 9 BT.2020, 2 unspecified).
    pub matrix: u16,
    /// Full range (`full_range_flag`).
    pub full_range: bool,
}

/// The first video track of an MP4 file.
#[derive(Debug, Clone)]
pub struct Track {
    /// The file.
    pub path: PathBuf,
    /// Its codec.
    pub codec: Codec,
    /// The decoder configuration record (`av1C`, `avcC` or `hvcC` payload).
    pub config: Vec<u8>,
    /// Width and height from the sample entry.
    pub width: u32,
    /// Height from the sample entry.
    pub height: u32,
    /// Time base denominator: a timestamp `t` is `t / timescale` seconds.
    pub timescale: u32,
    /// The samples in decoding order.
    pub samples: Vec<Sample>,
    /// The `colr` (`nclx`) box, when present.
    pub colour: Option<Colour>,
}

/// A box's type and payload range in the file or buffer.
#[derive(Debug, Clone, Copy)]
struct BoxHead {
    kind: [u8; 4],
    /// Payload start and end (after the header).
    start: u64,
    end: u64,
}

impl Track {
    /// Reads the sample table of the first video track of `path`.
    ///
    /// Cost: reads the box headers of the top level and the `moov` box (at most 256 MiB), not
    /// the media data.
    pub fn open(path: &Path) -> Result<Track> {
        let bad = |why: String| Error::invalid_data(why).in_input(path.display());
        let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut pos = 0u64;
        let mut moov = None;
        while pos < len {
            let head = read_head_at(&mut file, pos, len, path)?;
            if &head.kind == b"moov" {
                moov = Some(head);
            }
            pos = head.end;
        }
        let moov =
            moov.ok_or_else(|| bad("no `moov` box: not an MP4 file, or truncated".into()))?;
        let n = moov.end - moov.start;
        if n > MAX_MOOV {
            return Err(bad(format!("a `moov` box of {n} bytes (over {MAX_MOOV})")));
        }
        let mut buf = vec![0u8; n as usize];
        file.seek(SeekFrom::Start(moov.start))
            .and_then(|_| file.read_exact(&mut buf))
            .map_err(|e| Error::io(path, e))?;
        let p = Parser { buf: &buf, path };
        let movie_timescale = p
            .find(0, buf.len(), b"mvhd")?
            .map(|h| p.timescale(h))
            .transpose()?
            .unwrap_or(0);
        for trak in p.children(0, buf.len())? {
            if &trak.kind != b"trak" {
                continue;
            }
            let (s, e) = (trak.start as usize, trak.end as usize);
            let Some(mdia) = p.find(s, e, b"mdia")? else {
                continue;
            };
            let (ms, me) = (mdia.start as usize, mdia.end as usize);
            let is_video = match p.find(ms, me, b"hdlr")? {
                Some(h) => p.bytes(h.start as usize + 8, 4)? == b"vide",
                None => false,
            };
            if !is_video {
                continue;
            }
            let mdhd = p
                .find(ms, me, b"mdhd")?
                .ok_or_else(|| bad("a video track without `mdhd`".into()))?;
            let timescale = p.timescale(mdhd)?;
            if timescale == 0 {
                return Err(bad("the video track's timescale is 0".into()));
            }
            let edit = match p.find(s, e, b"edts")? {
                Some(edts) => p.edit(edts, movie_timescale, timescale)?,
                None => 0,
            };
            let stbl = p
                .path(ms, me, &[b"minf", b"stbl"])?
                .ok_or_else(|| bad("a video track without `stbl`".into()))?;
            let mut track = p.sample_table(stbl, timescale, edit, len)?;
            track.path = path.to_path_buf();
            return Ok(track);
        }
        Err(bad("no video track".into()))
    }

    /// Seconds of a timestamp.
    pub fn seconds(&self, pts: i64) -> f64 {
        pts as f64 / self.timescale as f64
    }

    /// Reads the bytes of sample `i` into `out` (replacing its contents).
    pub fn read_sample(&self, file: &mut File, i: usize, out: &mut Vec<u8>) -> Result<()> {
        let s = self.samples[i];
        out.resize(s.size as usize, 0);
        file.seek(SeekFrom::Start(s.offset))
            .and_then(|_| file.read_exact(out))
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Error::invalid_data(format!(
                    "truncated: sample {i} ends past the end of the file"
                ))
                .in_input(self.path.display()),
                _ => Error::io(&self.path, e),
            })
    }
}

/// Reads the box header at `pos` of a file of `len` bytes.
fn read_head_at(file: &mut File, pos: u64, len: u64, path: &Path) -> Result<BoxHead> {
    let bad = |why: String| Error::invalid_data(why).in_input(path.display());
    let mut h = [0u8; 16];
    let avail = (len - pos).min(16) as usize;
    if avail < 8 {
        return Err(bad(format!(
            "truncated: {avail} bytes at offset {pos} are not a box header"
        )));
    }
    file.seek(SeekFrom::Start(pos))
        .and_then(|_| file.read_exact(&mut h[..avail]))
        .map_err(|e| Error::io(path, e))?;
    let size32 = u32::from_be_bytes(h[0..4].try_into().expect("4"));
    let kind: [u8; 4] = h[4..8].try_into().expect("4");
    let (header, size) = match size32 {
        0 => (8, len - pos),
        1 if avail >= 16 => (16, u64::from_be_bytes(h[8..16].try_into().expect("8"))),
        1 => return Err(bad(format!("truncated: a 64-bit box size at offset {pos}"))),
        n => (8, n as u64),
    };
    if size < header || pos.checked_add(size).is_none_or(|e| e > len) {
        return Err(bad(format!(
            "truncated or damaged: box `{}` at offset {pos} claims {size} bytes, the file has {}",
            String::from_utf8_lossy(&kind),
            len - pos
        )));
    }
    Ok(BoxHead {
        kind,
        start: pos + header,
        end: pos + size,
    })
}

/// Box parsing inside the `moov` buffer.
struct Parser<'a> {
    buf: &'a [u8],
    path: &'a Path,
}

impl Parser<'_> {
    fn bad(&self, why: impl Into<String>) -> Error {
        Error::invalid_data(why).in_input(self.path.display())
    }

    fn bytes(&self, at: usize, n: usize) -> Result<&[u8]> {
        at.checked_add(n)
            .and_then(|e| self.buf.get(at..e))
            .ok_or_else(|| {
                self.bad(format!(
                    "damaged `moov`: {n} bytes at {at} are past its end"
                ))
            })
    }
    fn u8(&self, at: usize) -> Result<u8> {
        Ok(self.bytes(at, 1)?[0])
    }
    fn u16(&self, at: usize) -> Result<u16> {
        Ok(u16::from_be_bytes(
            self.bytes(at, 2)?.try_into().expect("2"),
        ))
    }
    fn u32(&self, at: usize) -> Result<u32> {
        Ok(u32::from_be_bytes(
            self.bytes(at, 4)?.try_into().expect("4"),
        ))
    }
    fn u64(&self, at: usize) -> Result<u64> {
        Ok(u64::from_be_bytes(
            self.bytes(at, 8)?.try_into().expect("8"),
        ))
    }

    /// The boxes in `start..end`.
    fn children(&self, start: usize, end: usize) -> Result<Vec<BoxHead>> {
        let mut out = vec![];
        let mut pos = start;
        while pos + 8 <= end {
            let size32 = self.u32(pos)?;
            let kind: [u8; 4] = self.bytes(pos + 4, 4)?.try_into().expect("4");
            let (header, size) = match size32 {
                0 => (8, (end - pos) as u64),
                1 => (16, self.u64(pos + 8)?),
                n => (8, n as u64),
            };
            if size < header || (pos as u64).saturating_add(size) > end as u64 {
                return Err(self.bad(format!(
                    "damaged `moov`: box `{}` at {pos} claims {size} bytes, {} are left",
                    String::from_utf8_lossy(&kind),
                    end - pos
                )));
            }
            out.push(BoxHead {
                kind,
                start: (pos as u64) + header,
                end: (pos as u64) + size,
            });
            pos += size as usize;
        }
        Ok(out)
    }

    fn find(&self, start: usize, end: usize, kind: &[u8; 4]) -> Result<Option<BoxHead>> {
        Ok(self
            .children(start, end)?
            .into_iter()
            .find(|b| &b.kind == kind))
    }

    fn path(&self, start: usize, end: usize, kinds: &[&[u8; 4]]) -> Result<Option<BoxHead>> {
        let (mut s, mut e) = (start, end);
        let mut found = None;
        for k in kinds {
            match self.find(s, e, k)? {
                Some(b) => {
                    (s, e) = (b.start as usize, b.end as usize);
                    found = Some(b);
                }
                None => return Ok(None),
            }
        }
        Ok(found)
    }

    /// The timescale of an `mvhd` or `mdhd` box.
    fn timescale(&self, b: BoxHead) -> Result<u32> {
        let s = b.start as usize;
        match self.u8(s)? {
            0 => self.u32(s + 12),
            1 => self.u32(s + 20),
            v => Err(self.bad(format!("`mvhd`/`mdhd` version {v}"))),
        }
    }

    /// The shift the edit list applies to presentation times, in track units: minus the first
    /// non-empty edit's `media_time`, plus the duration of a leading empty edit.
    fn edit(&self, edts: BoxHead, movie_ts: u32, track_ts: u32) -> Result<i64> {
        let Some(elst) = self.find(edts.start as usize, edts.end as usize, b"elst")? else {
            return Ok(0);
        };
        let s = elst.start as usize;
        let version = self.u8(s)?;
        let count = self.u32(s + 4)? as usize;
        let entry = if version == 1 { 20 } else { 12 };
        let mut shift = 0i64;
        let mut media = 0;
        for k in 0..count {
            let at = s + 8 + k * entry;
            let (duration, media_time) = if version == 1 {
                (self.u64(at)?, self.u64(at + 8)? as i64)
            } else {
                (self.u32(at)? as u64, self.u32(at + 4)? as i32 as i64)
            };
            if media_time == -1 {
                if media > 0 || movie_ts == 0 {
                    return Err(self.bad("an edit list with an empty edit after a media edit"));
                }
                let d = duration as i128 * track_ts as i128 / movie_ts as i128;
                shift += i64::try_from(d).map_err(|_| self.bad("an empty edit too long"))?;
            } else {
                media += 1;
                if media == 1 {
                    shift -= media_time;
                }
            }
        }
        if media > 1 {
            return Err(self.bad(format!(
                "an edit list of {media} media edits (only one is supported)"
            )));
        }
        Ok(shift)
    }

    /// Reads `stbl`: the sample entry and the sample table.
    fn sample_table(
        &self,
        stbl: BoxHead,
        timescale: u32,
        edit: i64,
        file_len: u64,
    ) -> Result<Track> {
        let (s, e) = (stbl.start as usize, stbl.end as usize);
        let boxes = self.children(s, e)?;
        let get = |k: &[u8; 4]| boxes.iter().find(|b| &b.kind == k).copied();
        let need = |k: &[u8; 4]| {
            get(k).ok_or_else(|| {
                self.bad(format!(
                    "the video track has no `{}` box",
                    String::from_utf8_lossy(k)
                ))
            })
        };
        // Sample entry.
        let stsd = need(b"stsd")?;
        let entries = self.children(stsd.start as usize + 8, stsd.end as usize)?;
        let entry = entries
            .first()
            .ok_or_else(|| self.bad("`stsd` has no sample entry"))?;
        let codec = match &entry.kind {
            b"av01" => Codec::Av1,
            b"avc1" | b"avc3" => Codec::H264,
            b"hvc1" | b"hev1" => Codec::Hevc,
            k => {
                return Err(self.bad(format!(
                    "video codec `{}` (trajstore decodes av01, avc1/avc3)",
                    String::from_utf8_lossy(k)
                )));
            }
        };
        let es = entry.start as usize;
        let width = self.u16(es + 24)? as u32;
        let height = self.u16(es + 26)? as u32;
        let inner = self.children(es + 78, entry.end as usize)?;
        let config_kind: &[u8; 4] = match codec {
            Codec::Av1 => b"av1C",
            Codec::H264 => b"avcC",
            Codec::Hevc => b"hvcC",
        };
        let config = inner
            .iter()
            .find(|b| &b.kind == config_kind)
            .map(|b| self.bytes(b.start as usize, (b.end - b.start) as usize))
            .transpose()?
            .ok_or_else(|| {
                self.bad(format!(
                    "the sample entry has no `{}`",
                    String::from_utf8_lossy(config_kind)
                ))
            })?
            .to_vec();
        let colour = match inner.iter().find(|b| &b.kind == b"colr") {
            Some(b) if self.bytes(b.start as usize, 4)? == b"nclx" => {
                let at = b.start as usize + 4;
                Some(Colour {
                    matrix: self.u16(at + 4)?,
                    full_range: self.u8(at + 6)? & 0x80 != 0,
                })
            }
            _ => None,
        };
        // Sizes.
        let stsz = need(b"stsz")?;
        let at = stsz.start as usize;
        let fixed = self.u32(at + 4)?;
        let n = self.u32(at + 8)? as usize;
        let room = (stsz.end as usize).saturating_sub(at + 12) / 4;
        if fixed == 0 && n > room {
            return Err(self.bad(format!("`stsz` lists {n} samples but has room for {room}")));
        }
        if fixed != 0 && n as u64 > file_len / fixed as u64 + 1 {
            return Err(self.bad(format!("`stsz` claims {n} samples of {fixed} bytes")));
        }
        let mut sizes = Vec::with_capacity(n);
        for i in 0..n {
            sizes.push(if fixed != 0 {
                fixed
            } else {
                self.u32(at + 12 + 4 * i)?
            });
        }
        // Chunk offsets.
        let offsets: Vec<u64> = match (get(b"stco"), get(b"co64")) {
            (Some(b), _) => self.table(b, 4, |p, at| Ok(p.u32(at)? as u64))?,
            (None, Some(b)) => self.table(b, 8, |p, at| p.u64(at))?,
            (None, None) => return Err(self.bad("the video track has no `stco`/`co64`")),
        };
        // Samples per chunk.
        let stsc: Vec<(u32, u32)> =
            self.table(need(b"stsc")?, 12, |p, at| Ok((p.u32(at)?, p.u32(at + 4)?)))?;
        let mut sample_offsets = Vec::with_capacity(n);
        for (k, &(first, per)) in stsc.iter().enumerate() {
            let next = stsc
                .get(k + 1)
                .map_or(offsets.len() as u64 + 1, |x| x.0 as u64);
            if first == 0 || (first as u64) > next {
                return Err(self.bad("`stsc` entries are not in chunk order"));
            }
            for chunk in first as u64..next {
                let Some(&base) = offsets.get(chunk as usize - 1) else {
                    return Err(self.bad(format!(
                        "`stsc` names chunk {chunk}, `stco` has {}",
                        offsets.len()
                    )));
                };
                let mut off = base;
                for _ in 0..per {
                    let i = sample_offsets.len();
                    if i == n {
                        break;
                    }
                    sample_offsets.push(off);
                    off = off.saturating_add(sizes[i] as u64);
                }
            }
        }
        if sample_offsets.len() != n {
            return Err(self.bad(format!(
                "`stsc`/`stco` place {} of the {n} samples",
                sample_offsets.len()
            )));
        }
        // Decoding times.
        let stts: Vec<(u32, u32)> =
            self.table(need(b"stts")?, 8, |p, at| Ok((p.u32(at)?, p.u32(at + 4)?)))?;
        let mut dts = Vec::with_capacity(n);
        let mut t = 0i64;
        'stts: for &(count, delta) in &stts {
            for _ in 0..count {
                if dts.len() == n {
                    break 'stts;
                }
                dts.push(t);
                t = t.saturating_add(delta as i64);
            }
        }
        if dts.len() != n {
            return Err(self.bad(format!("`stts` times {} of the {n} samples", dts.len())));
        }
        // Composition offsets.
        let mut cts = vec![0i64; n];
        if let Some(b) = get(b"ctts") {
            let runs: Vec<(u32, i32)> =
                self.table(b, 8, |p, at| Ok((p.u32(at)?, p.u32(at + 4)? as i32)))?;
            let mut i = 0;
            for (count, off) in runs {
                for _ in 0..count {
                    if i < n {
                        cts[i] = off as i64;
                        i += 1;
                    }
                }
            }
        }
        // Sync samples.
        let sync: Option<Vec<u32>> = get(b"stss")
            .map(|b| self.table(b, 4, |p, at| p.u32(at)))
            .transpose()?;
        let mut is_sync = vec![sync.is_none(); n];
        for k in sync.unwrap_or_default() {
            if let Some(x) = (k as usize).checked_sub(1).and_then(|i| is_sync.get_mut(i)) {
                *x = true;
            }
        }
        let mut samples = Vec::with_capacity(n);
        for i in 0..n {
            let end = sample_offsets[i].checked_add(sizes[i] as u64);
            if end.is_none_or(|e| e > file_len) {
                return Err(self.bad(format!(
                    "truncated: sample {i} (bytes {}..{}) is past the end of the file ({file_len} bytes)",
                    sample_offsets[i],
                    sample_offsets[i].saturating_add(sizes[i] as u64)
                )));
            }
            samples.push(Sample {
                offset: sample_offsets[i],
                size: sizes[i],
                pts: dts[i].saturating_add(cts[i]).saturating_add(edit),
                sync: is_sync[i],
            });
        }
        Ok(Track {
            path: PathBuf::new(),
            codec,
            config,
            width,
            height,
            timescale,
            samples,
            colour,
        })
    }

    /// A full box's table: `count` entries of `size` bytes after version/flags and the count,
    /// checked against the box's size before anything is allocated.
    fn table<T>(
        &self,
        b: BoxHead,
        size: usize,
        read: impl Fn(&Self, usize) -> Result<T>,
    ) -> Result<Vec<T>> {
        let s = b.start as usize;
        let count = self.u32(s + 4)? as usize;
        let room = (b.end as usize).saturating_sub(s + 8) / size;
        if count > room {
            return Err(self.bad(format!(
                "`{}` lists {count} entries but has room for {room}",
                String::from_utf8_lossy(&b.kind)
            )));
        }
        (0..count).map(|k| read(self, s + 8 + k * size)).collect()
    }
}
