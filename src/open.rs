//! One entry point that opens a dataset whatever names it: a local directory, or a URL
//! (`s3://bucket/prefix`, `file:///path`) whose mirror in the local cache is brought up to date
//! and then memory-mapped like any local dataset.
//!
//! ```no_run
//! # fn main() -> trajstore::Result<()> {
//! use trajstore::DatasetBuilder;
//! let newest = DatasetBuilder::from_uri("runs/walker").load()?;
//! let pinned = DatasetBuilder::from_uri("s3://bucket/runs/walker").with_version(3).load()?;
//! let episodes_only = DatasetBuilder::from_uri("s3://bucket/runs/walker").load_catalog()?;
//! # Ok(()) }
//! ```

use std::path::Path;
#[cfg(feature = "remote")]
use std::path::PathBuf;

#[cfg(not(feature = "remote"))]
use crate::error::Error;
use crate::error::Result;
use crate::format;
#[cfg(feature = "remote")]
use crate::remote::{PullReport, RemoteOptions};
use crate::store::{Catalog, Dataset, Snapshot};

/// Opens a dataset by path or URL, like Lance's `DatasetBuilder::from_uri(..).load()`.
#[derive(Debug, Clone)]
pub struct DatasetBuilder {
    uri: String,
    version: Option<u64>,
    #[cfg(feature = "remote")]
    cache: Option<PathBuf>,
    #[cfg(feature = "remote")]
    remote: RemoteOptions,
}

impl DatasetBuilder {
    /// The dataset at `uri`: a directory, or a URL ([`format::is_url`]).
    pub fn from_uri(uri: impl AsRef<str>) -> Self {
        Self {
            uri: uri.as_ref().to_string(),
            version: None,
            #[cfg(feature = "remote")]
            cache: None,
            #[cfg(feature = "remote")]
            remote: RemoteOptions::default(),
        }
    }

    /// The dataset in directory `path`.
    pub fn from_path(path: impl AsRef<Path>) -> Self {
        Self::from_uri(path.as_ref().to_string_lossy())
    }

    /// Reads version `version` instead of the newest.
    pub fn with_version(mut self, version: u64) -> Self {
        self.version = Some(version);
        self
    }

    /// Where URL datasets are mirrored (default [`crate::remote::default_cache_dir`]).
    #[cfg(feature = "remote")]
    pub fn with_cache_dir(mut self, cache: impl Into<PathBuf>) -> Self {
        self.cache = Some(cache.into());
        self
    }

    /// How to reach the store of a URL dataset (settings, concurrency, progress).
    #[cfg(feature = "remote")]
    pub fn with_remote_options(mut self, options: RemoteOptions) -> Self {
        self.remote = options;
        self
    }

    /// Whether the dataset is named by a URL (and so read through a mirror).
    pub fn is_remote(&self) -> bool {
        format::is_url(&self.uri)
    }

    /// A snapshot of the requested version (default the newest).
    pub fn load(self) -> Result<Snapshot> {
        self.load_reported().map(|(s, _)| s)
    }

    /// The catalog (manifest and episode tables) of the requested version: no transition file is
    /// opened (for a URL only the episode tables are fetched). O(episodes).
    pub fn load_catalog(self) -> Result<Catalog> {
        self.load_catalog_reported().map(|(c, _)| c)
    }

    /// The [`Dataset`] handle (versions, writers): the directory itself, or for a URL its
    /// mirror, brought up to the requested version.
    pub fn load_dataset(self) -> Result<Dataset> {
        if !self.is_remote() {
            return Dataset::open(&self.uri);
        }
        self.mirror().map(|(ds, _)| ds)
    }

    /// [`DatasetBuilder::load`], with what was downloaded for a URL (`None` for a directory).
    #[cfg(feature = "remote")]
    pub fn load_reported(self) -> Result<(Snapshot, Option<PullReport>)> {
        if !self.is_remote() {
            return Ok((self.local_snapshot()?, None));
        }
        let (ds, report) = self.mirror()?;
        Ok((ds.snapshot_at(report.version)?, Some(report)))
    }

    /// [`DatasetBuilder::load_catalog`], with what was downloaded for a URL (`None` for a
    /// directory).
    #[cfg(feature = "remote")]
    pub fn load_catalog_reported(self) -> Result<(Catalog, Option<PullReport>)> {
        if !self.is_remote() {
            return Ok((self.local_catalog()?, None));
        }
        let cache = self.cache.unwrap_or_else(crate::remote::default_cache_dir);
        let (catalog, report) =
            crate::remote::open_catalog(&self.uri, Some(&cache), self.version, self.remote)?;
        Ok((catalog, Some(report)))
    }

    #[cfg(not(feature = "remote"))]
    fn load_reported(self) -> Result<(Snapshot, Option<()>)> {
        if self.is_remote() {
            return Err(self.no_remote());
        }
        Ok((self.local_snapshot()?, None))
    }

    #[cfg(not(feature = "remote"))]
    fn load_catalog_reported(self) -> Result<(Catalog, Option<()>)> {
        if self.is_remote() {
            return Err(self.no_remote());
        }
        Ok((self.local_catalog()?, None))
    }

    /// The catalog of a directory: its manifest and episode tables, no transition file opened
    /// (as for a URL, whose mirror holds only those).
    fn local_catalog(&self) -> Result<Catalog> {
        let ds = Dataset::open(&self.uri)?;
        match self.version {
            Some(v) => ds.catalog_at(v),
            None => ds.catalog(),
        }
    }

    fn local_snapshot(&self) -> Result<Snapshot> {
        let ds = Dataset::open(&self.uri)?;
        match self.version {
            Some(v) => ds.snapshot_at(v),
            None => ds.snapshot(),
        }
    }

    #[cfg(feature = "remote")]
    fn mirror(self) -> Result<(Dataset, PullReport)> {
        let cache = self.cache.unwrap_or_else(crate::remote::default_cache_dir);
        crate::remote::open(&self.uri, Some(&cache), self.version, self.remote)
    }

    #[cfg(not(feature = "remote"))]
    fn mirror(self) -> Result<(Dataset, ())> {
        Err(self.no_remote())
    }

    #[cfg(not(feature = "remote"))]
    fn no_remote(&self) -> Error {
        Error::argument(
            "uri",
            format!(
                "`{}` is a URL, but this build of trajstore has no `remote` feature (object \
                 storage)",
                self.uri
            ),
        )
    }
}

/// [`DatasetBuilder::from_uri`]`(uri).load()`: the newest snapshot of the dataset at `uri`.
pub fn open(uri: impl AsRef<str>) -> Result<Snapshot> {
    DatasetBuilder::from_uri(uri).load()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn a_missing_directory_is_not_found_and_a_bad_url_names_the_argument() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = DatasetBuilder::from_path(&missing).load().unwrap_err();
        assert!(matches!(e, Error::NotFound { .. }), "{e}");
        assert!(!DatasetBuilder::from_path(&missing).is_remote());
        let b = DatasetBuilder::from_uri("gopher://host/ds");
        assert!(b.is_remote());
        let e = b.load().unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "url" || a == "uri"),
            "{e}"
        );
    }
}
