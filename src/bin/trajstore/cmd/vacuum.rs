//! `trajstore vacuum`: remove old versions and the files only they use.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
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
    /// (e.g. 30s, 10m, 2h, 7d), so that readers opening recent versions keep their files.
    /// Below 10 minutes it needs --no-retention-check.
    #[arg(long, value_name = "AGE", default_value = "10m", value_parser = parse_duration)]
    older_than: std::time::Duration,
    /// Allow --older-than below the 10-minute safety floor (e.g. 0s: remove every replaced
    /// version now). A reader that is about to open a recently replaced version, or a loader
    /// resuming on it, finds its files gone.
    #[arg(long)]
    no_retention_check: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(a: VacuumArgs) -> Result<()> {
    let floor = trajstore::store::writer::VACUUM_SAFETY_FLOOR;
    if a.older_than < floor && !a.no_retention_check {
        bail!(
            "--older-than {} is below the safety floor of {}: readers opening a version replaced \
             since then would lose its files. Pass --no-retention-check to remove them anyway",
            human_duration(a.older_than),
            human_duration(floor)
        );
    }
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
