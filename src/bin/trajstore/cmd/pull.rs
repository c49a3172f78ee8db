//! `trajstore pull`: a remote dataset into a local mirror.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::HumanBytes;

use crate::open::*;

#[cfg(feature = "remote")]
#[derive(Args)]
pub(crate) struct PullArgs {
    /// The remote dataset, e.g. s3://BUCKET/PREFIX.
    url: String,
    /// Mirror directory (default: the URL's place in the cache).
    #[arg(long, value_name = "DIR")]
    to: Option<PathBuf>,
    /// Pull this version instead of the newest.
    #[arg(long)]
    version: Option<u64>,
    /// Files transferred at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

#[cfg(feature = "remote")]
pub(crate) fn run(a: PullArgs) -> Result<()> {
    use trajstore::remote;
    let mirror = match &a.to {
        Some(dir) => dir.clone(),
        None => remote::mirror_dir(&remote::default_cache_dir(), &a.url)?,
    };
    let r = remote::Remote::open(&a.url, remote_options(a.concurrency)?)?
        .pull(&mirror, a.version)
        .with_context(|| format!("pull of {} failed", a.url))?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        outln!(
            "version {} of {} is in {} ({:.2} s): {} files ({}) downloaded, {} ({}) already there, {} old files removed",
            r.version,
            r.url,
            r.mirror.display(),
            r.seconds,
            r.files_downloaded,
            HumanBytes(r.bytes_downloaded),
            r.files_cached,
            HumanBytes(r.bytes_cached),
            r.files_pruned
        );
    }
    Ok(())
}
