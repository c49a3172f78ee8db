//! `trajstore push`: a local dataset's newest version into object storage.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::HumanBytes;
use trajstore::Dataset;

use crate::open::*;

#[cfg(feature = "remote")]
#[derive(Args)]
pub(crate) struct PushArgs {
    /// Local dataset directory.
    dataset: PathBuf,
    /// Destination, e.g. s3://BUCKET/PREFIX (or file:///PATH).
    url: String,
    /// Files transferred at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

#[cfg(feature = "remote")]
pub(crate) fn run(a: PushArgs) -> Result<()> {
    if !trajstore::format::is_url(&a.url) {
        bail!(
            "`{}` is not a URL; push to s3://BUCKET/PREFIX (or file:///PATH)",
            a.url
        );
    }
    let ds = Dataset::open(&a.dataset)
        .with_context(|| format!("cannot open dataset {}", a.dataset.display()))?;
    let remote = trajstore::remote::Remote::open(&a.url, remote_options(a.concurrency)?)?;
    let r = remote
        .push(&ds)
        .with_context(|| format!("push of {} to {} failed", a.dataset.display(), a.url))?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else if r.up_to_date {
        outln!("{} is up to date (version {})", r.url, r.version);
    } else {
        outln!(
            "pushed version {} to {} in {:.2} s: {} files ({}) uploaded, {} ({}) already there{}",
            r.version,
            r.url,
            r.seconds,
            r.files_uploaded,
            HumanBytes(r.bytes_uploaded),
            r.files_present,
            HumanBytes(r.bytes_present),
            match r.previous_version {
                Some(v) => format!("; the remote was at version {v}"),
                None => String::new(),
            }
        );
    }
    Ok(())
}
