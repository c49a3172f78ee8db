//! `trajstore export`: every transition to Parquet.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use indicatif::HumanCount;

use crate::open::*;
use crate::output::*;

#[derive(Args)]
pub(crate) struct ExportArgs {
    /// Dataset directory, or a URL (s3://BUCKET/PREFIX; see `trajstore pull --help`).
    dataset: PathBuf,
    /// Output Parquet file (not inside a dataset directory).
    output: PathBuf,
    /// Export this version instead of the newest.
    #[arg(long)]
    version: Option<u64>,
}

pub(crate) fn run(a: ExportArgs) -> Result<()> {
    // Before a URL is pulled: an output inside a dataset is refused whatever is read.
    trajstore::store::dataset::check_output_path("OUTPUT", &a.output).map_err(one_line)?;
    let snap = open_snapshot(&a.dataset, a.version)?;
    let pb = progress(snap.num_transitions(), "exporting");
    let rows = trajstore::store::export::export_parquet(&snap, &a.output, |n| pb.inc(n))?;
    pb.finish_and_clear();
    outln!(
        "exported {} transitions to {}",
        HumanCount(rows),
        a.output.display()
    );
    Ok(())
}
