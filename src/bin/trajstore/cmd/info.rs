//! `trajstore info`: counts, sizes, schema and episode histograms, from the catalog only.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use indicatif::{HumanBytes, HumanCount};
use serde_json::json;
use trajstore::Catalog;
use trajstore::format::ep;
use trajstore::stats::{Summary, render_histogram};

use super::*;
use crate::open::*;
use crate::output::*;

#[derive(Args)]
pub(crate) struct InfoArgs {
    #[command(flatten)]
    v: VersionArgs,
    /// Number of histogram bins (0 to hide the histograms; at most 10000, one line each).
    #[arg(
        long,
        default_value_t = 12,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=MAX_BINS)
    )]
    bins: usize,
}

/// The most histogram bins `info` draws: each is a line of text, and a count per bin is
/// allocated before any is drawn.
pub(crate) const MAX_BINS: u64 = 10_000;

pub(crate) fn episode_values(snap: &Catalog, name: &str) -> Vec<f64> {
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

pub(crate) fn count_true(snap: &Catalog, name: &str) -> usize {
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

pub(crate) fn info_json(snap: &Catalog, name: &str) -> serde_json::Value {
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

pub(crate) fn render_info(snap: &Catalog, name: &str, bins: usize) -> String {
    use std::fmt::Write;
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
        HumanCount(n),
        HumanCount(snap.num_episodes()),
        HumanCount(count_true(snap, ep::TERMINATED) as u64),
        HumanCount(count_true(snap, ep::TRUNCATED) as u64),
        m.segments.len()
    )
    .unwrap();
    writeln!(
        o,
        "on disk      {} ({:.1} B/transition)",
        HumanBytes(snap.bytes_on_disk()),
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

pub(crate) fn run(a: InfoArgs) -> Result<()> {
    let start = Instant::now();
    let (snap, name) = open_catalog(&a.v.dataset, a.v.version)?;
    let open_ms = start.elapsed().as_secs_f64() * 1e3;
    if a.v.json {
        let mut v = info_json(&snap, &name);
        if snap.path() != Path::new(&name) {
            v["mirror"] = json!(snap.path());
        }
        v["open_ms"] = json!(open_ms);
        emit(&format!("{}\n", serde_json::to_string_pretty(&v)?));
    } else {
        emit(&format!(
            "{}opened in {open_ms:.1} ms\n",
            render_info(&snap, &name, a.bins)
        ));
    }
    Ok(())
}
