//! A dataset in object storage opened for streaming ([`Stream::open`]): its catalog fetched into
//! the local mirror, and nothing else. The streaming loader that reads it through a bounded
//! cache is [`crate::loader::StreamLoader`].

use std::path::PathBuf;
use std::sync::Arc;

use super::{Remote, RemoteOptions};
use crate::error::{Error, Result};
use crate::store::Catalog;
use crate::store::manifest::Manifest;

/// Options of [`Stream::open`].
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// Bytes of transition files the node's caches may hold on disk (downloads in progress
    /// included), shared equally by its [`StreamOptions::ranks_per_node`] ranks. A rank's share
    /// is at least three times the largest segment, unless it holds the whole version.
    pub cache_limit: u64,
    /// Ranks of this node that stream the version at once (torchrun's `LOCAL_WORLD_SIZE`;
    /// default 1): each keeps at most `cache_limit / ranks_per_node` bytes, so that the node's
    /// caches together stay within `cache_limit`, and a file one of them holds is hard-linked by
    /// another rather than downloaded again.
    pub ranks_per_node: u64,
    /// Uniform sampling: draws per transition per round, on average (default 4). Higher values
    /// download less per batch (each window is sampled longer); lower ones rotate faster.
    pub reuse: f64,
    /// Where mirrors live (default [`super::default_cache_dir`]).
    pub cache_dir: Option<PathBuf>,
    /// The version (default: the newest).
    pub version: Option<u64>,
    /// How to reach the store.
    pub remote: RemoteOptions,
}

impl StreamOptions {
    /// A cache of `cache_limit` bytes, the newest version.
    pub fn new(cache_limit: u64) -> Self {
        Self {
            cache_limit,
            ranks_per_node: 1,
            reuse: 4.0,
            cache_dir: None,
            version: None,
            remote: RemoteOptions::default(),
        }
    }
}

/// A dataset in object storage opened for streaming: its catalog, fetched into the mirror.
/// Cheap to clone (shared).
#[derive(Clone)]
pub struct Stream(pub(crate) Arc<StreamInner>);

pub(crate) struct StreamInner {
    pub(crate) remote: Arc<Remote>,
    pub(crate) mirror: PathBuf,
    pub(crate) catalog: Catalog,
    /// The version's manifest as the store names its files.
    pub(crate) remote_manifest: Manifest,
    pub(crate) options: StreamOptions,
}

impl StreamInner {
    pub(crate) fn rank_cache_limit(&self) -> u64 {
        self.options.cache_limit / self.options.ranks_per_node.max(1)
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("url", &self.0.remote.url())
            .field("version", &self.0.catalog.version())
            .finish()
    }
}

impl Stream {
    /// Opens `url` for streaming: fetches its catalog (manifest and episode tables, checked)
    /// into the mirror, and nothing else.
    pub fn open(url: &str, options: StreamOptions) -> Result<Self> {
        if options.cache_limit == 0 {
            return Err(Error::argument(
                "cache_limit",
                "the cache limit must be positive",
            ));
        }
        if options.ranks_per_node == 0 || options.ranks_per_node > options.cache_limit {
            return Err(Error::argument(
                "ranks_per_node",
                format!(
                    "{} ranks per node: use at least 1 (and no more than the cache's bytes)",
                    options.ranks_per_node
                ),
            ));
        }
        if !(options.reuse.is_finite() && options.reuse > 0.0) {
            return Err(Error::argument(
                "reuse",
                format!("reuse {} must be a positive number", options.reuse),
            ));
        }
        let cache = options
            .cache_dir
            .clone()
            .unwrap_or_else(super::default_cache_dir);
        let mirror = super::mirror_dir(&cache, url)?;
        let remote = Remote::open(url, options.remote.clone())?;
        let (catalog, _) = remote.catalog(&mirror, options.version)?;
        let remote_manifest = remote.manifest(catalog.version())?;
        Ok(Self(Arc::new(StreamInner {
            remote: Arc::new(remote),
            mirror,
            catalog,
            remote_manifest,
            options,
        })))
    }

    /// The newest version in the store now (one listing of its manifests; nothing else is
    /// fetched): what a following loader compares its version with.
    pub fn newest_version(&self) -> Result<u64> {
        Ok(self
            .0
            .remote
            .versions()?
            .into_iter()
            .max()
            .unwrap_or(self.0.catalog.version()))
    }

    /// The URL it was opened from.
    pub fn url(&self) -> &str {
        self.0.remote.url()
    }

    /// The version's catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.0.catalog
    }

    /// The local mirror (catalog, and the ranks' caches under `_stream/`).
    pub fn mirror(&self) -> &std::path::Path {
        &self.0.mirror
    }

    /// The options it was opened with (cache limit, reuse, version, ...).
    pub fn options(&self) -> &StreamOptions {
        &self.0.options
    }

    /// The bytes one rank's cache may hold: the node's limit shared by its ranks.
    pub fn rank_cache_limit(&self) -> u64 {
        self.0.rank_cache_limit()
    }

    /// The cache directory of `rank`.
    pub fn cache_dir(&self, rank: u64) -> PathBuf {
        self.0.mirror.join(format!("_stream/rank-{rank}"))
    }
}
