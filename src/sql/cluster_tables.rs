//! The tables a Ballista cluster process opens (feature `ballista`), each once per (URL,
//! version) for the process's life: the catalog, a URL's `transitions` read with ranged GETs,
//! and a directory's `transitions` over its memory map.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::{RemoteTransitions, TransitionsTable};
use crate::error::Result;
use crate::open::DatasetBuilder;
use crate::remote::{Remote, RemoteOptions};
use crate::store::Catalog;

pub(crate) type Cache<T> = OnceLock<Mutex<HashMap<(String, u64), Arc<T>>>>;

/// Looks `(url, version)` up in `cache`, or opens it with `open` (holding the lock, so that two
/// partitions never mirror the same version at once).
pub(crate) fn cached<T>(
    cache: &Cache<T>,
    url: &str,
    version: u64,
    open: impl FnOnce() -> Result<T>,
) -> Result<Arc<T>> {
    let mut map = cache
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let key = (url.to_string(), version);
    if let Some(t) = map.get(&key) {
        return Ok(t.clone());
    }
    let t = Arc::new(open()?);
    map.insert(key, t.clone());
    Ok(t)
}

/// How a cluster process opens version `version` of the dataset at `url` for SQL: the
/// `transitions` table over its memory-mapped files (for a URL, a mirror pulled into this
/// process's cache on first use: executors read URLs with [`ranged_for_sql`] instead), kept for
/// the process's life. Blocking; call it off the async threads.
pub fn transitions_for_sql(url: &str, version: u64) -> Result<Arc<TransitionsTable>> {
    static TABLES: Cache<TransitionsTable> = OnceLock::new();
    cached(&TABLES, url, version, || {
        let snap = DatasetBuilder::from_uri(url).with_version(version).load()?;
        Ok(TransitionsTable::new(&snap))
    })
}

/// The `transitions` table of a version in object storage, read with ranged GETs, and the
/// [`Remote`] whose store it reads through (kept for the table's life).
pub(crate) struct RangedTable {
    pub(crate) table: RemoteTransitions,
    _remote: Remote,
}

/// How a cluster process reads version `version` of the dataset at URL `url`: the version's
/// [`RemoteTransitions`] (its catalog fetched once, then footers and message headers once per
/// segment, then only the projected columns' buffers of each scanned segment, nearby ranges
/// coalesced across record batches), cached for the process's life. Nothing is mirrored.
/// Blocking; call it off the async threads.
pub(crate) fn ranged_for_sql(url: &str, version: u64) -> Result<Arc<RangedTable>> {
    static RANGED: Cache<RangedTable> = OnceLock::new();
    let catalog = catalog_for_sql(url, version)?;
    cached(&RANGED, url, version, || {
        let remote = Remote::open(url, RemoteOptions::default())?;
        Ok(RangedTable {
            table: RemoteTransitions::new(&remote, &catalog)?,
            _remote: remote,
        })
    })
}

/// The catalog of version `version` of `url` (only the episode tables are fetched), cached for
/// the process's life. The scheduler builds `episodes` from it. Blocking.
pub(crate) fn catalog_for_sql(url: &str, version: u64) -> Result<Arc<Catalog>> {
    static CATALOGS: Cache<Catalog> = OnceLock::new();
    cached(&CATALOGS, url, version, || {
        DatasetBuilder::from_uri(url)
            .with_version(version)
            .load_catalog()
    })
}
