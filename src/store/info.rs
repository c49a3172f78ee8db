//! What `trajstore info` and the Python `repr()` of a dataset show: counts, sizes, schema and
//! episode length/return summaries with histograms, from the catalog only (no segment is read).

use std::fmt::Write;

use serde_json::json;

use super::{Catalog, Snapshot};
use crate::format::{ep, human_bytes};
use crate::stats::{Summary, render_histogram};

/// What a frame column stores: its codec and shape, frames, and bytes stored against raw.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FrameStats {
    /// The column.
    pub column: String,
    /// The codec's name.
    pub codec: String,
    /// The zstd level the frames were written at (`None` for the `none` codec).
    pub level: Option<i32>,
    /// The frame shape.
    pub shape: Vec<usize>,
    /// Frames stored (rows).
    pub frames: u64,
    /// Bytes of the stored frames (the values of the `LargeBinary` column; offsets not counted).
    pub stored_bytes: u64,
    /// Bytes of the dictionary file (0 without one).
    pub dictionary_bytes: u64,
    /// Stored bytes per frame.
    pub bytes_per_frame: f64,
    /// Raw bytes per frame over stored bytes per frame.
    pub ratio: f64,
}

/// The [`FrameStats`] of each frame column of `snap`, from the columns' offsets (one read of
/// the first and last offset of each record batch: no frame is read).
pub fn frame_stats(snap: &Snapshot) -> Vec<FrameStats> {
    snap.frame_columns()
        .iter()
        .map(|c| {
            let (mut frames, mut stored) = (0u64, 0u64);
            for (f, b) in snap
                .segments()
                .iter()
                .filter_map(|s| s.frame_totals(&c.name))
            {
                frames += f;
                stored += b;
            }
            let per = stored as f64 / frames.max(1) as f64;
            FrameStats {
                column: c.name.clone(),
                codec: c.spec.codec.to_string(),
                level: (c.spec.codec != crate::frames::FrameCodec::None).then_some(c.spec.level),
                shape: c.spec.shape.clone(),
                frames,
                stored_bytes: stored,
                dictionary_bytes: c.dictionary.as_ref().map_or(0, |d| d.len() as u64),
                bytes_per_frame: per,
                ratio: c.spec.frame_len() as f64 / per.max(f64::MIN_POSITIVE),
            }
        })
        .collect()
}

/// One line per frame column: codec, shape, bytes per frame and the ratio to raw.
pub fn render_frame_stats(stats: &[FrameStats]) -> String {
    let mut s = String::new();
    for f in stats {
        let raw: usize = f.shape.iter().product();
        let _ = writeln!(
            s,
            "frames ({}): {}{} {:?} uint8, {} frames, {:.1} B per frame stored ({raw} B raw, {:.1}x), {} with a {} dictionary",
            f.column,
            f.codec,
            f.level.map(|l| format!(" level {l}")).unwrap_or_default(),
            f.shape,
            f.frames,
            f.bytes_per_frame,
            f.ratio,
            human_bytes(f.stored_bytes),
            human_bytes(f.dictionary_bytes)
        );
    }
    s
}

/// The most histogram bins `info` draws: each is a line of text, and a count per bin is
/// allocated before any is drawn.
pub const MAX_BINS: u64 = 10_000;

/// The values of the numeric episode-table column `name` (`length`, `episode_return`) over
/// every episode, as `f64`.
pub fn episode_values(snap: &Catalog, name: &str) -> Vec<f64> {
    let columns = snap.episode_column(name).unwrap_or_default();
    // Sized by the episode tables as read, not by the manifest's count.
    let mut out = Vec::with_capacity(columns.iter().map(|a| a.len()).sum());
    for a in columns {
        if let Some(x) = a.as_any().downcast_ref::<arrow::array::Float64Array>() {
            out.extend(x.values().iter().copied());
        } else if let Some(x) = a.as_any().downcast_ref::<arrow::array::UInt64Array>() {
            out.extend(x.values().iter().map(|&v| v as f64));
        }
    }
    out
}

/// The number of episodes whose boolean episode-table column `name` is set.
pub fn count_true(snap: &Catalog, name: &str) -> usize {
    snap.episode_column(name)
        .unwrap_or_default()
        .iter()
        .filter_map(|a| {
            a.as_any()
                .downcast_ref::<arrow::array::BooleanArray>()
                .map(|b| b.true_count())
        })
        .sum()
}

/// The summary as JSON (what `trajstore info --json` prints).
pub fn info_json(snap: &Catalog, name: &str) -> serde_json::Value {
    let m = snap.manifest();
    json!({
        "path": name,
        "version": snap.version(),
        "format_version": m.format_version,
        "transitions": snap.num_transitions(),
        "episodes": snap.num_episodes(),
        "segments": m.segments.len(),
        "bytes_on_disk": snap.bytes_on_disk(),
        "bytes_per_transition": snap.bytes_on_disk() as f64 / snap.num_transitions().max(1) as f64,
        "terminated_episodes": count_true(snap, ep::TERMINATED),
        "truncated_episodes": count_true(snap, ep::TRUNCATED),
        "episode_length": Summary::of(episode_values(snap, ep::LENGTH)),
        "episode_return": Summary::of(episode_values(snap, ep::EPISODE_RETURN)),
        "schema": m.columns,
        "properties": m.properties,
    })
}

/// The summary as text with histograms of `bins` bins (0: none), `name` naming the dataset.
pub fn render_info(snap: &Catalog, name: &str, bins: usize) -> String {
    let mut o = String::new();
    let m = snap.manifest();
    let n = snap.num_transitions();
    writeln!(
        o,
        "dataset      {name} (version {}, format v{})",
        snap.version(),
        m.format_version
    )
    .unwrap();
    writeln!(
        o,
        "transitions  {}   episodes {} ({} terminated, {} truncated)   segments {}",
        human_count(n),
        human_count(snap.num_episodes()),
        human_count(count_true(snap, ep::TERMINATED) as u64),
        human_count(count_true(snap, ep::TRUNCATED) as u64),
        m.segments.len()
    )
    .unwrap();
    writeln!(
        o,
        "on disk      {} ({:.1} B/transition)",
        human_bytes(snap.bytes_on_disk()),
        snap.bytes_on_disk() as f64 / n.max(1) as f64
    )
    .unwrap();
    for (k, v) in &m.properties {
        writeln!(o, "{k:<12} {v}").unwrap();
    }
    writeln!(o, "schema").unwrap();
    for c in &m.columns {
        let shape = c
            .shape
            .as_ref()
            .map(|s| format!("  shape {s:?}"))
            .unwrap_or_default();
        writeln!(
            o,
            "  {:<18} {}{}{}",
            c.name,
            c.data_type,
            if c.nullable { " (nullable)" } else { "" },
            shape
        )
        .unwrap();
    }
    for (label, name) in [
        ("episode length", ep::LENGTH),
        ("episode return", ep::EPISODE_RETURN),
    ] {
        let v = episode_values(snap, name);
        let s = Summary::of(v.iter().copied());
        writeln!(
            o,
            "{label}: min {:.2}  p25 {:.2}  median {:.2}  mean {:.2}  p75 {:.2}  max {:.2}",
            s.min, s.p25, s.median, s.mean, s.p75, s.max
        )
        .unwrap();
        if bins > 0 && !v.is_empty() {
            o.push_str(&render_histogram(&v, bins, 40));
        }
    }
    o
}

/// `1234567` as `1,234,567`.
pub fn human_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(super::human_count(0), "0");
        assert_eq!(super::human_count(999), "999");
        assert_eq!(super::human_count(1000), "1,000");
        assert_eq!(super::human_count(1_234_567), "1,234,567");
    }
}
