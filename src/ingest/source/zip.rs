//! The zip container of `.npz` archives, read by this crate: central directory, zip64, stored
//! and deflate members, every member's CRC-32 and every bound checked against the file.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use super::array::*;
use super::npy::*;
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

/// The longest `.npy` header read from a deflated member (NumPy's own reader refuses headers
/// over 10 000 bytes unless told otherwise).
const MAX_NPY_HEADER: u64 = 1 << 20;

/// One member of the central directory.
pub(crate) struct Member {
    name: String,
    crc: u32,
    method: u16,
    flags: u16,
    compressed: u64,
    uncompressed: u64,
    local_offset: u64,
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

/// The arrays of a `.npz` archive, in the archive's order.
pub(crate) fn open_zip(
    path: &Path,
    input: Arc<Input>,
    is_zip: bool,
    drop: &[String],
) -> Result<Vec<(String, Option<Array>)>> {
    const LOCAL: u32 = 0x0403_4b50;
    if !is_zip {
        return Err(Error::argument(
            "input",
            format!(
                "{} is neither a .npz archive nor a directory of .npy files",
                path.display()
            ),
        ));
    }
    let mut out = vec![];
    for m in zip_members(path, &input)? {
        if m.name.ends_with('/') {
            continue; // a directory entry
        }
        let Some(name) = m.name.strip_suffix(".npy") else {
            return Err(
                Error::invalid_data(format!("member `{}` is not a .npy array", m.name))
                    .in_input(path.display()),
            );
        };
        let name = name.to_string();
        if drop.contains(&name) {
            out.push((name, None));
            continue;
        }
        let what = Loc::array(path, &name);
        if m.flags & 1 != 0 {
            return Err(what.data("the array is encrypted"));
        }
        if m.local_offset
            .checked_add(30)
            .is_none_or(|e| e > input.len())
        {
            return Err(corrupt(path, &format!("no local header for `{}`", m.name)));
        }
        let local = input.read_at(m.local_offset, 30, &what)?;
        if u32_at(&local, 0) != Some(LOCAL) {
            return Err(corrupt(path, &format!("no local header for `{}`", m.name)));
        }
        let (n, e) = (
            u16_at(&local, 26).unwrap_or(0) as u64,
            u16_at(&local, 28).unwrap_or(0) as u64,
        );
        let start = m.local_offset + 30 + n + e;
        if start
            .checked_add(m.compressed)
            .is_none_or(|end| end > input.len())
        {
            return Err(corrupt(path, &format!("member `{}` is truncated", m.name)));
        }
        let array = match m.method {
            0 => {
                let got = crc_of(&input, start, m.compressed, &what)?;
                if got != m.crc {
                    return Err(what.data(format!(
                        "CRC-32 mismatch (archive says {:08x}, data gives {got:08x}): the \
                         archive is corrupt",
                        m.crc
                    )));
                }
                let header = input.header_at(start, m.compressed, &what)?;
                let available = m.compressed - header.data_offset as u64;
                let a = Array {
                    name: name.clone(),
                    data: Data::Stored {
                        input: input.clone(),
                        offset: start + header.data_offset as u64,
                    },
                    header,
                };
                check_size(&a, available, &what)?;
                a
            }
            8 => {
                // Inflate just the header now; the data is inflated while ingesting.
                let mut decoder = inflater(&input, start, m.compressed);
                let mut head = [0u8; 12];
                decoder
                    .read_exact(&mut head)
                    .map_err(|e| what.data(format!("cannot inflate: {e}")))?;
                let (pre, len) = preamble(&head, &what)?;
                // NumPy's headers are a few hundred bytes; a length field that says more than
                // the member holds (or than any header needs) is damage, not a header to inflate.
                if (pre + len) as u64 > m.uncompressed.min(MAX_NPY_HEADER) {
                    return Err(what.data(format!(
                        "a .npy header of {} bytes in a member of {} bytes (damaged header)",
                        pre + len,
                        m.uncompressed
                    )));
                }
                let mut text = vec![0u8; pre + len];
                let copied = text.len().min(12);
                text[..copied].copy_from_slice(&head[..copied]);
                if text.len() > 12 {
                    decoder
                        .read_exact(&mut text[12..])
                        .map_err(|e| what.data(format!("cannot inflate: {e}")))?;
                }
                let header = parse_header(&text[pre..], pre + len, &what)?;
                let have = m.uncompressed.saturating_sub(header.data_offset as u64);
                let a = Array {
                    name: name.clone(),
                    data: Data::Deflated {
                        input: input.clone(),
                        offset: start,
                        len: m.compressed,
                        crc: m.crc,
                    },
                    header,
                };
                check_size(&a, have, &what)?;
                a
            }
            other => {
                return Err(what.data(format!(
                    "the array uses zip compression method {other}; only stored (np.savez) and \
                     deflate (np.savez_compressed) are supported"
                )));
            }
        };
        out.push((name, Some(array)));
    }
    Ok(out)
}
