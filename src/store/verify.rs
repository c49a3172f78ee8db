//! Deep verification of a snapshot: checksums of every file, agreement of the per-row
//! boundary columns with the episode tables, and every stored frame (and final frame) of a frame
//! column decoding to its shape. O(bytes), parallel over segments.

use arrow::array::{Array, AsArray, BooleanArray};
use arrow::datatypes::{Float32Type, UInt32Type, UInt64Type};
use rayon::prelude::*;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::col;
use crate::store::ipc::checksum_string;
use crate::store::{Segment, Snapshot};

/// What [`verify`] checked.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// The verified version.
    pub version: u64,
    /// Segments checked.
    pub segments: usize,
    /// Transitions checked.
    pub transitions: u64,
    /// Episodes checked.
    pub episodes: u64,
    /// Bytes checksummed.
    pub bytes: u64,
    /// Frames decoded (rows and final frames of frame columns).
    pub frames: u64,
}

/// Checks every file's CRC-32C against the manifest and every transition's boundary columns
/// (`episode_id`, `step`, `is_first`, `is_last`, `terminated`, `truncated`) and every episode's
/// return against its episode table. The first failure is [`Error::Corrupt`] naming the file.
/// `on_segment` is called after each segment (for progress bars).
pub fn verify(snap: &Snapshot, on_segment: impl Fn(u64) + Sync) -> Result<VerifyReport> {
    let frames: u64 = snap
        .segments()
        .par_iter()
        .map(|seg| {
            check_segment(snap, seg)?;
            let n = check_frames(snap, seg)?;
            on_segment(seg.num_rows());
            Ok::<_, Error>(n)
        })
        .try_reduce(|| 0, |a, b| Ok(a + b))?;
    Ok(VerifyReport {
        version: snap.version(),
        segments: snap.segments().len(),
        transitions: snap.num_transitions(),
        episodes: snap.num_episodes(),
        bytes: snap.bytes_on_disk(),
        frames,
    })
}

/// Decodes every frame of every frame column of `seg` (rows and final frames); returns how many.
/// A frame that does not decode to its shape is [`Error::Corrupt`] naming the file and row.
fn check_frames(snap: &Snapshot, seg: &Segment) -> Result<u64> {
    let e = seg.entry();
    let (path, ep_path) = (
        snap.path().join(&e.path),
        snap.path().join(&e.episodes_path),
    );
    let mut n = 0;
    for col in snap.frame_columns() {
        let mut dec = col.decoder()?;
        let mut buf = vec![0u8; dec.frame_len()];
        let t = seg.episode_table();
        for i in 0..t.len() {
            let (start, len) = (t.row_starts()[i], t.lengths()[i]);
            let run = seg.frames(&col.name, start, len as usize)?;
            let bad = |r: String, e: Error| Error::corrupt(&path, format!("row {r}: {e}"));
            for k in 0..run.len() {
                let row = || (start + k as u64).to_string();
                let f = run.frame(k).map_err(|e| bad(row(), e))?;
                dec.decode_into(f, &mut buf).map_err(|e| bad(row(), e))?;
            }
            // An episode's final frame is the observation's (other frame columns have none).
            let last = t.final_frame(i).filter(|_| col.name == col::OBSERVATION);
            if let Some(f) = last {
                dec.decode_into(f, &mut buf).map_err(|err| {
                    Error::corrupt(&ep_path, format!("final frame of episode row {i}: {err}"))
                })?;
                n += 1;
            }
            n += run.len() as u64;
        }
    }
    Ok(n)
}

fn check_segment(snap: &Snapshot, seg: &Segment) -> Result<()> {
    let e = seg.entry();
    let path = snap.path().join(&e.path);
    let mut crc = 0u32;
    seg.for_each_chunk(8 << 20, |c| crc = crc32c::crc32c_append(crc, c));
    let crc = checksum_string(crc);
    if crc != e.checksum {
        return Err(Error::corrupt(
            &path,
            format!("checksum {crc}, manifest says {}", e.checksum),
        ));
    }
    let ep_path = snap.path().join(&e.episodes_path);
    // The episode table's own map, opened with the snapshot: never the path again, which
    // retention may have removed since (the map keeps the file's data).
    let ep_bytes = seg.episode_table().file_bytes().ok_or_else(|| {
        Error::corrupt(&ep_path, "the episode table was not opened from its file")
    })?;
    let crc = checksum_string(crc32c::crc32c(ep_bytes));
    if crc != e.episodes_checksum {
        return Err(Error::corrupt(
            &ep_path,
            format!("checksum {crc}, manifest says {}", e.episodes_checksum),
        ));
    }
    let t = seg.episode_table();
    let (ids, starts, lens, rets) = (t.ids(), t.row_starts(), t.lengths(), t.returns());
    let (term, trunc) = (t.terminated(), t.truncated());
    for i in 0..t.len() {
        let batch = seg.slice(starts[i], lens[i] as usize)?;
        let id = ids[i];
        // The segment's schema was checked when it was mapped; a missing column is still an
        // error, never a panic.
        let c = |name: &str| {
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| Error::corrupt(&path, format!("episode {id}: no column `{name}`")))
        };
        let n = batch.num_rows();
        let bad = |what: String| Err(Error::corrupt(&path, format!("episode {id}: {what}")));
        let eid = c(col::EPISODE_ID)?;
        if eid
            .as_primitive::<UInt64Type>()
            .values()
            .iter()
            .any(|&x| x != id)
        {
            return bad("episode_id column disagrees with the episode table".into());
        }
        let step = c(col::STEP)?;
        if step
            .as_primitive::<UInt32Type>()
            .values()
            .iter()
            .enumerate()
            .any(|(k, &s)| s as usize != k)
        {
            return bad("step column is not 0, 1, 2, ...".into());
        }
        let only_last = |name: &str, last: bool| -> Result<bool> {
            let a = c(name)?;
            let b: &BooleanArray = a.as_boolean();
            let count = b.true_count();
            Ok((count == last as usize) && (!last || b.value(n - 1)))
        };
        let first = c(col::IS_FIRST)?;
        if first.as_boolean().true_count() != 1 || !first.as_boolean().value(0) {
            return bad("is_first must be set exactly on step 0".into());
        }
        if !only_last(col::IS_LAST, true)? {
            return bad("is_last must be set exactly on the last step".into());
        }
        if !only_last(col::TERMINATED, term.value(i))?
            || !only_last(col::TRUNCATED, trunc.value(i))?
        {
            return bad("terminated/truncated flags disagree with the episode table".into());
        }
        let reward = c(col::REWARD)?;
        let sum: f64 = reward
            .as_primitive::<Float32Type>()
            .values()
            .iter()
            .map(|&r| r as f64)
            .sum();
        if sum != rets[i] && !(sum.is_nan() && rets[i].is_nan()) {
            return bad(format!(
                "rewards sum to {sum}, episode table says {}",
                rets[i]
            ));
        }
        if eid.null_count() > 0 {
            return bad("nulls in boundary columns".into());
        }
    }
    Ok(())
}
