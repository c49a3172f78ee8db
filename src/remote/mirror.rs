//! Where mirrors live: the cache directory, one mirror directory per URL, and opening a URL as
//! a local snapshot or catalog.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::store::{Catalog, Dataset};

use super::*;

/// The mirror directory of `url` under `cache` (`cache/<scheme>/<bucket>/<prefix>`).
pub fn mirror_dir(cache: &Path, url: &str) -> Result<PathBuf> {
    let parsed = url::Url::parse(url)
        .map_err(|e| Error::argument("url", format!("`{url}` is not a valid URL: {e}")))?;
    let mut dir = cache.join(parsed.scheme());
    if let Some(host) = parsed.host_str().filter(|h| !h.is_empty()) {
        dir.push(safe_part(host, url)?);
    }
    for part in parsed.path().split('/').filter(|p| !p.is_empty()) {
        dir.push(safe_part(part, url)?);
    }
    Ok(dir)
}

pub(crate) fn safe_part<'a>(part: &'a str, url: &str) -> Result<&'a str> {
    if part == "." || part == ".." || part.contains('\\') || part.contains('\0') {
        return Err(Error::argument(
            "url",
            format!("`{url}` has a path component `{part}` that cannot name a cache directory"),
        ));
    }
    Ok(part)
}

/// Where mirrors live: `$TRAJSTORE_CACHE`, else `$XDG_CACHE_HOME/trajstore`, else
/// `~/.cache/trajstore`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TRAJSTORE_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir).join("trajstore");
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => PathBuf::from(home).join(".cache").join("trajstore"),
        None => std::env::temp_dir().join("trajstore-cache"),
    }
}

/// Pulls `url` (version `version`, default the newest) into its mirror under `cache` (default
/// [`default_cache_dir`]) and opens the mirror.
pub fn open(
    url: &str,
    cache: Option<&Path>,
    version: Option<u64>,
    options: RemoteOptions,
) -> Result<(Dataset, PullReport)> {
    let cache = cache.map_or_else(default_cache_dir, Path::to_path_buf);
    let mirror = mirror_dir(&cache, url)?;
    let report = Remote::open(url, options)?.pull(&mirror, version)?;
    Ok((Dataset::open(&mirror)?, report))
}

/// The [`Catalog`] of `url` (version `version`, default the newest) through its mirror under
/// `cache` (default [`default_cache_dir`]): only the episode tables are fetched.
pub fn open_catalog(
    url: &str,
    cache: Option<&Path>,
    version: Option<u64>,
    options: RemoteOptions,
) -> Result<(Catalog, PullReport)> {
    let cache = cache.map_or_else(default_cache_dir, Path::to_path_buf);
    let mirror = mirror_dir(&cache, url)?;
    Remote::open(url, options)?.catalog(&mirror, version)
}
