//! Opening the dataset a command names: a directory, or a URL mirrored into the cache.

use std::path::Path;

use anyhow::{Context, Result, bail};
use trajstore::{Catalog, Dataset, Snapshot};

pub(crate) fn open_snapshot(path: &Path, version: Option<u64>) -> Result<Snapshot> {
    if let Some(url) = path.to_str().filter(|s| trajstore::format::is_url(s)) {
        return open_remote_snapshot(url, version);
    }
    let ds =
        Dataset::open(path).with_context(|| format!("cannot open dataset {}", path.display()))?;
    Ok(match version {
        Some(v) => ds.snapshot_at(v)?,
        None => ds.snapshot()?,
    })
}

/// A snapshot of a dataset in object storage: its mirror under the cache is brought up to date
/// (missing files downloaded and checked), then mapped like any local dataset.
#[cfg(feature = "remote")]
pub(crate) fn open_remote_snapshot(url: &str, version: Option<u64>) -> Result<Snapshot> {
    let (ds, r) = trajstore::remote::open(url, None, version, reader_remote_options())
        .with_context(|| format!("cannot open dataset {url}"))?;
    report_fetch("pulled version", &r);
    Ok(ds.snapshot_at(r.version)?)
}

/// The catalog (manifest and episode tables) of a dataset: for a URL only the episode tables
/// are fetched into the mirror, not the transitions.
pub(crate) fn open_catalog(path: &Path, version: Option<u64>) -> Result<(Catalog, String)> {
    if let Some(url) = path.to_str().filter(|s| trajstore::format::is_url(s)) {
        return open_remote_catalog(url, version).map(|c| (c, url.to_string()));
    }
    let snap = open_snapshot(path, version)?;
    Ok((snap.catalog(), path.display().to_string()))
}

#[cfg(feature = "remote")]
pub(crate) fn open_remote_catalog(url: &str, version: Option<u64>) -> Result<Catalog> {
    let (catalog, r) = trajstore::remote::open_catalog(url, None, version, reader_remote_options())
        .with_context(|| format!("cannot open dataset {url}"))?;
    report_fetch("fetched the episode tables of version", &r);
    Ok(catalog)
}

#[cfg(not(feature = "remote"))]
pub(crate) fn open_remote_catalog(url: &str, _version: Option<u64>) -> Result<Catalog> {
    open_remote_snapshot(url, None).map(|s| s.catalog())
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

#[cfg(not(feature = "remote"))]
pub(crate) fn open_remote_snapshot(url: &str, _version: Option<u64>) -> Result<Snapshot> {
    bail!("{url} is a URL, but this build of trajstore has no `remote` feature (object storage)")
}

#[cfg(feature = "remote")]
pub(crate) fn remote_options(concurrency: usize) -> Result<trajstore::remote::RemoteOptions> {
    if concurrency == 0 {
        bail!("--concurrency must be at least 1");
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
