//! `trajstore info`: counts, sizes, schema and episode histograms, from the catalog only (or,
//! with `--snapshot`, after opening every segment as training does).

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use serde_json::json;
pub(crate) use trajstore::store::info::*;

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
    /// Open the dataset as training does: also map every segment and check its transition file
    /// (footer, schema, message headers). `open_ms` then times that open; without it, only the
    /// manifest and the episode tables are read.
    #[arg(long)]
    snapshot: bool,
}

pub(crate) fn run(a: InfoArgs) -> Result<()> {
    let start = Instant::now();
    // The snapshot stays open (mapped) until the end, out of the time measured.
    let snapshot = match a.snapshot {
        true => Some(open_snapshot(&a.v.dataset, a.v.version)?),
        false => None,
    };
    let (snap, name) = match &snapshot {
        Some(s) => (s.catalog(), a.v.dataset.display().to_string()),
        None => open_catalog(&a.v.dataset, a.v.version)?,
    };
    let open_ms = start.elapsed().as_secs_f64() * 1e3;
    // Frame columns: bytes per frame from the mapped segments' offsets (no frame is read).
    let has_frames = !snap.schema().frame_columns().is_empty();
    let frames = match (&snapshot, has_frames) {
        (Some(s), true) => frame_stats(s),
        (None, true) => frame_stats(&open_snapshot(&a.v.dataset, a.v.version)?),
        _ => vec![],
    };
    if a.v.json {
        let mut v = info_json(&snap, &name);
        if !frames.is_empty() {
            v["frames"] = json!(frames);
        }
        if snap.path() != Path::new(&name) {
            v["mirror"] = json!(snap.path());
        }
        v["open_ms"] = json!(open_ms);
        emit(&format!("{}\n", serde_json::to_string_pretty(&v)?));
    } else {
        emit(&format!(
            "{}{}opened in {open_ms:.1} ms\n",
            render_info(&snap, &name, a.bins),
            render_frame_stats(&frames)
        ));
    }
    Ok(())
}
