//! Opening the dataset a command names, a directory or a URL, through the library's
//! [`trajstore::DatasetBuilder`]; for a URL the mirror's download is drawn and summed up here.

use std::path::Path;

use anyhow::{Context, Result};
use trajstore::{Catalog, DatasetBuilder, Snapshot};

fn builder(path: &Path, version: Option<u64>) -> DatasetBuilder {
    let b = DatasetBuilder::from_path(path);
    #[cfg(feature = "remote")]
    let b = b.with_remote_options(reader_remote_options());
    match version {
        Some(v) => b.with_version(v),
        None => b,
    }
}

/// A snapshot of the dataset at `path` (a directory or a URL), version `version` or the newest.
pub(crate) fn open_snapshot(path: &Path, version: Option<u64>) -> Result<Snapshot> {
    let ctx = || format!("cannot open dataset {}", path.display());
    #[cfg(feature = "remote")]
    {
        let (snap, fetched) = builder(path, version).load_reported().with_context(ctx)?;
        if let Some(r) = fetched {
            report_fetch("pulled version", &r);
        }
        Ok(snap)
    }
    #[cfg(not(feature = "remote"))]
    builder(path, version).load().with_context(ctx)
}

/// The catalog (manifest and episode tables) of a dataset, and its name: for a URL only the
/// episode tables are fetched into the mirror, not the transitions.
pub(crate) fn open_catalog(path: &Path, version: Option<u64>) -> Result<(Catalog, String)> {
    let ctx = || format!("cannot open dataset {}", path.display());
    let name = path.display().to_string();
    #[cfg(feature = "remote")]
    {
        let (catalog, fetched) = builder(path, version)
            .load_catalog_reported()
            .with_context(ctx)?;
        if let Some(r) = fetched {
            report_fetch("fetched the episode tables of version", &r);
        }
        Ok((catalog, name))
    }
    #[cfg(not(feature = "remote"))]
    Ok((
        builder(path, version).load_catalog().with_context(ctx)?,
        name,
    ))
}

/// One line on stderr when files were downloaded into a mirror.
#[cfg(feature = "remote")]
pub(crate) fn report_fetch(what: &str, r: &trajstore::remote::PullReport) {
    if r.files_downloaded > 0 {
        eprintln!(
            "{what} {} of {}: {} files ({}) downloaded, {} ({}) already in {}",
            r.version,
            r.url,
            r.files_downloaded,
            indicatif::HumanBytes(r.bytes_downloaded),
            r.files_cached,
            indicatif::HumanBytes(r.bytes_cached),
            r.mirror.display()
        );
    }
}

#[cfg(feature = "remote")]
pub(crate) fn remote_options(concurrency: usize) -> Result<trajstore::remote::RemoteOptions> {
    if concurrency == 0 {
        anyhow::bail!("--concurrency must be at least 1");
    }
    let mut o = reader_remote_options();
    o.concurrency = concurrency;
    Ok(o)
}

/// What a reading command uses for a URL: the default concurrency, a progress bar on a terminal.
#[cfg(feature = "remote")]
pub(crate) fn reader_remote_options() -> trajstore::remote::RemoteOptions {
    let o = trajstore::remote::RemoteOptions::default();
    match crate::output::TerminalBar::on_terminal(true) {
        Some(bar) => o.with_progress(bar),
        None => o,
    }
}
