//! `trajstore vacuum`: remove old versions and the files only they use.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::HumanBytes;
use trajstore::Dataset;

use crate::output::*;

#[derive(Args)]
pub(crate) struct VacuumArgs {
    /// Dataset directory.
    dataset: PathBuf,
    /// Keep the newest N versions whatever their age.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    keep_versions: u64,
    /// Remove an older version only once the version that replaced it is at least this old
    /// (e.g. 0s, 30s, 10m, 2h, 7d), so that readers opening recent versions keep their files.
    #[arg(long, value_name = "AGE", default_value = "10m", value_parser = parse_duration)]
    older_than: std::time::Duration,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(a: VacuumArgs) -> Result<()> {
    let ds = Dataset::open(&a.dataset)
        .with_context(|| format!("cannot open dataset {}", a.dataset.display()))?;
    let report = ds.vacuum(a.keep_versions as usize, a.older_than)?;
    if a.json {
        outln!("{}", serde_json::to_string(&report)?);
    } else {
        outln!(
            "removed {} versions, {} files ({}); {} older versions are inside the --older-than window",
            report.versions_removed.len(),
            report.files_removed,
            HumanBytes(report.bytes_removed),
            report.versions_in_grace.len()
        );
    }
    Ok(())
}
