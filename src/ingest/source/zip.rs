//! The zip container of `.npz` archives, read by this crate: central directory, zip64, stored
//! and deflate members, every member's CRC-32 and every bound checked against the file.

use std::path::Path;

use super::npy::{Input, Loc};
use crate::error::{Error, Result};
// ---------------------------------------------------------------------------------------------
// Zip (the container of .npz): central directory, zip64, stored and deflate members.
// ---------------------------------------------------------------------------------------------

pub(crate) fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
pub(crate) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
pub(crate) fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// One member of the central directory.
pub(crate) struct Member {
    pub(super) name: String,
    pub(super) crc: u32,
    pub(super) method: u16,
    pub(super) flags: u16,
    pub(super) compressed: u64,
    pub(super) uncompressed: u64,
    pub(super) local_offset: u64,
}

/// An [`Error::InvalidData`] in archive `path`: its zip structure is broken.
pub(crate) fn corrupt(path: &Path, why: &str) -> Error {
    Error::invalid_data(format!("not a readable .npz (zip) archive: {why}"))
        .in_input(path.display())
}

/// The central directory's members.
pub(crate) fn zip_members(path: &Path, input: &Input) -> Result<Vec<Member>> {
    const EOCD: u32 = 0x0605_4b50;
    const EOCD64_LOCATOR: u32 = 0x0706_4b50;
    const EOCD64: u32 = 0x0606_4b50;
    const CENTRAL: u32 = 0x0201_4b50;
    let what = Loc::file(path);
    if input.len() < 22 {
        return Err(corrupt(path, "too short"));
    }
    // The end-of-central-directory record is within the last 64 KiB + 22 bytes (comment).
    let tail_start = input.len().saturating_sub(22 + 0xffff);
    let tail = input.read_at(tail_start, (input.len() - tail_start) as usize, &what)?;
    let eocd = (0..=tail.len() - 22)
        .rev()
        .find(|&i| u32_at(&tail, i) == Some(EOCD))
        .ok_or_else(|| corrupt(path, "no end-of-central-directory record (truncated?)"))?;
    let short = |at| u16_at(&tail, eocd + at).ok_or_else(|| corrupt(path, "truncated"));
    let long = |at| u32_at(&tail, eocd + at).ok_or_else(|| corrupt(path, "truncated"));
    let mut entries = short(10)? as u64;
    let mut cd_size = long(12)? as u64;
    let mut cd_offset = long(16)? as u64;
    if entries == 0xffff || cd_size == 0xffff_ffff || cd_offset == 0xffff_ffff {
        let loc = (tail_start + eocd as u64)
            .checked_sub(20)
            .ok_or_else(|| corrupt(path, "zip64 locator missing"))?;
        let loc = input.read_at(loc, 20, &what)?;
        if u32_at(&loc, 0) != Some(EOCD64_LOCATOR) {
            return Err(corrupt(path, "zip64 locator missing"));
        }
        let rec_at = u64_at(&loc, 8).ok_or_else(|| corrupt(path, "truncated"))?;
        if rec_at.checked_add(56).is_none_or(|e| e > input.len()) {
            return Err(corrupt(path, "zip64 record lies past the end of the file"));
        }
        let rec = input.read_at(rec_at, 56, &what)?;
        if u32_at(&rec, 0) != Some(EOCD64) {
            return Err(corrupt(path, "bad zip64 end-of-central-directory record"));
        }
        let get = |at| u64_at(&rec, at).ok_or_else(|| corrupt(path, "truncated"));
        entries = get(32)?;
        cd_size = get(40)?;
        cd_offset = get(48)?;
    }
    if cd_offset
        .checked_add(cd_size)
        .is_none_or(|e| e > input.len())
    {
        return Err(corrupt(
            path,
            "central directory lies past the end of the file",
        ));
    }
    let b = input.read_at(cd_offset, cd_size as usize, &what)?;
    let mut at = 0usize;
    let mut out = vec![];
    for _ in 0..entries {
        if at + 46 > b.len() || u32_at(&b, at) != Some(CENTRAL) {
            return Err(corrupt(path, "bad central directory entry"));
        }
        let h = |o| u16_at(&b, at + o).expect("bounds checked");
        let w = |o| u32_at(&b, at + o).expect("bounds checked");
        let (flags, method, crc) = (h(8), h(10), w(16));
        let (mut compressed, mut uncompressed) = (w(20) as u64, w(24) as u64);
        let (name_len, extra_len, comment_len) = (h(28) as usize, h(30) as usize, h(32) as usize);
        let mut local_offset = w(42) as u64;
        let name_at = at + 46;
        let extra_at = name_at + name_len;
        let next = extra_at + extra_len + comment_len;
        if next > b.len() {
            return Err(corrupt(path, "central directory entry runs past its end"));
        }
        let name = String::from_utf8_lossy(&b[name_at..extra_at]).into_owned();
        // Zip64 extended information: the fields that overflowed, in this order.
        let mut e = extra_at;
        while e + 4 <= extra_at + extra_len {
            let (id, size) = (
                u16_at(&b, e).expect("bounds"),
                u16_at(&b, e + 2).expect("bounds") as usize,
            );
            if id == 0x0001 {
                let mut f = e + 4;
                let mut next64 = |v: &mut u64| -> Result<()> {
                    if *v == 0xffff_ffff {
                        *v = u64_at(&b, f)
                            .filter(|_| f + 8 <= e + 4 + size)
                            .ok_or_else(|| corrupt(path, "short zip64 field"))?;
                        f += 8;
                    }
                    Ok(())
                };
                next64(&mut uncompressed)?;
                next64(&mut compressed)?;
                next64(&mut local_offset)?;
            }
            e += 4 + size;
        }
        out.push(Member {
            name,
            crc,
            method,
            flags,
            compressed,
            uncompressed,
            local_offset,
        });
        at = next;
    }
    // The end record's count and the directory's size must agree (a damaged count would
    // otherwise silently leave arrays out).
    if at != b.len() {
        return Err(corrupt(
            path,
            &format!(
                "the central directory holds {} bytes, its {entries} entries {at}",
                b.len()
            ),
        ));
    }
    Ok(out)
}

/// CRC-32 of `offset..offset + len` of an input, read in 8 MiB pieces.
pub(crate) fn crc_of(input: &Input, offset: u64, len: u64, what: &Loc) -> Result<u32> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; (8 << 20).min(len as usize)];
    let mut done = 0u64;
    while done < len {
        let k = (len - done).min(buf.len() as u64) as usize;
        input.read_into(offset + done, &mut buf[..k], what)?;
        hasher.update(&buf[..k]);
        done += k as u64;
    }
    Ok(hasher.finalize())
}
