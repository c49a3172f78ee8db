//! Datasets in object storage: `s3://bucket/prefix` (AWS S3 and S3-compatible servers such as
//! MinIO, Ceph or R2, through `AWS_ENDPOINT_URL`) and `file:///path` (a mounted file system).
//!
//! Memory maps need local files, so a remote dataset is read through a **mirror**: a local
//! directory that is itself a trajstore dataset holding the pulled version's manifest and the
//! files it names. [`Remote::pull`] brings a mirror up to date (only missing files are
//! downloaded; each is checked against the manifest's size and CRC-32C before it is renamed into
//! place); [`Remote::push`] uploads a local dataset's newest version. [`Remote::catalog`]
//! fetches only a version's manifest and episode tables (what `trajstore info` shows), so that
//! looking at a large remote dataset does not download its transitions.
//!
//! Layout in the store is the dataset layout, with one difference: segment files are named by
//! content, `segments/<id>-<crc32c>.arrow` and `segments/<id>-<crc32c>.episodes.arrow`. Two
//! writers that raced on the same segment id therefore never overwrite each other's file, a
//! push that was interrupted can be resumed without uploading again what is already there, and a
//! mirror never mistakes a stale file for a new one.
//!
//! A push is atomic for readers: segment files first, then the version's manifest, written with
//! a conditional create (`If-None-Match: *` on S3). If another writer committed that version in
//! the meantime the push fails with [`Error::Conflict`] and the remote keeps the other writer's
//! version. A push only fast-forwards: the remote's newest version must be an ancestor of the
//! local one (all of its segments still present, unchanged, in the local dataset).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::format;
use crate::progress::{Progress, ProgressSink, Unit};
use crate::store::manifest::Manifest;

/// Files up to this size are uploaded with one PUT; larger ones in parts of this size (S3's
/// smallest part is 5 MiB).
pub(crate) const PART_BYTES: usize = 8 << 20;
/// Parts in flight at once over all the files being uploaded (each multipart file gets its share,
/// at least 2): a few large segments still use many connections, as S3 needs for bandwidth. A
/// push holds at most about `(PARTS_IN_FLIGHT + concurrency) * PART_BYTES` of file data in
/// memory (192 MiB with the default 8 files at once).
pub(crate) const PARTS_IN_FLIGHT: usize = 16;
/// Name of the lock that serialises pulls into one mirror.
pub(crate) const PULL_LOCK: &str = "_pull.lock";
/// File in a mirror's root that names the URL it mirrors.
pub(crate) const MIRROR_MARKER: &str = "_mirror";

mod mirror;
mod pull;
mod push;
mod stream;

pub use crate::format::is_url;
pub use mirror::{default_cache_dir, mirror_dir, open, open_catalog};
pub use stream::{Stream, StreamOptions};

/// How to reach the store.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Store settings with object_store's keys (`aws_endpoint`, `aws_region`,
    /// `aws_access_key_id`, `aws_secret_access_key`, `aws_allow_http`, ...). They override the
    /// `AWS_*` environment variables, which are always read.
    pub config: BTreeMap<String, String>,
    /// Files transferred at once.
    pub concurrency: usize,
    /// Where to report progress (bytes transferred); nothing by default.
    pub progress: ProgressSink,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            config: BTreeMap::new(),
            concurrency: 8,
            progress: ProgressSink::default(),
        }
    }
}

impl RemoteOptions {
    /// Adds one store setting.
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }

    /// Reports progress to `progress` ([`RemoteOptions::progress`]).
    pub fn with_progress(mut self, progress: impl Progress + 'static) -> Self {
        self.progress = ProgressSink::new(progress);
        self
    }
}

/// What a push did.
#[derive(Debug, Clone, Serialize)]
pub struct PushReport {
    /// The remote dataset.
    pub url: String,
    /// The version that is now the remote's newest.
    pub version: u64,
    /// The remote's newest version before the push (`None`: there was none).
    pub previous_version: Option<u64>,
    /// Files uploaded and their bytes.
    pub files_uploaded: u64,
    /// Bytes uploaded.
    pub bytes_uploaded: u64,
    /// Files already in the store (earlier pushes, or an interrupted one).
    pub files_present: u64,
    /// Bytes of those.
    pub bytes_present: u64,
    /// `true` when the remote already had this version: nothing was written.
    pub up_to_date: bool,
    /// Wall time.
    pub seconds: f64,
}

/// What a pull did.
#[derive(Debug, Clone, Serialize)]
pub struct PullReport {
    /// The remote dataset.
    pub url: String,
    /// The local mirror (a trajstore dataset directory).
    pub mirror: PathBuf,
    /// The version pulled.
    pub version: u64,
    /// Files downloaded.
    pub files_downloaded: u64,
    /// Bytes downloaded.
    pub bytes_downloaded: u64,
    /// Files that were already in the mirror.
    pub files_cached: u64,
    /// Bytes of those.
    pub bytes_cached: u64,
    /// Files of older versions removed from the mirror.
    pub files_pruned: u64,
    /// Wall time.
    pub seconds: f64,
}

/// A dataset location in object storage.
pub struct Remote {
    url: String,
    /// For `file://` stores: the directory, whose files a push fsyncs (object_store's local
    /// store renames files into place without syncing them).
    local_root: Option<PathBuf>,
    pub(crate) store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) options: RemoteOptions,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").field("url", &self.url).finish()
    }
}

impl Remote {
    /// Connects to the dataset at `url` (nothing is read yet). `s3://bucket/prefix` reads the
    /// usual `AWS_*` environment variables (credentials, `AWS_REGION`, `AWS_ENDPOINT_URL` for
    /// S3-compatible servers, `AWS_ALLOW_HTTP=true` for a plain-HTTP endpoint), overridden by
    /// `options.config`.
    pub fn open(url: &str, options: RemoteOptions) -> Result<Self> {
        let parsed = url::Url::parse(url)
            .map_err(|e| Error::argument("url", format!("`{url}` is not a valid URL: {e}")))?;
        let mut local_root = None;
        let store: Arc<dyn ObjectStore> = match parsed.scheme() {
            "s3" | "s3a" => {
                let bucket = parsed.host_str().unwrap_or_default();
                if bucket.is_empty() {
                    return Err(Error::argument(
                        "url",
                        format!("`{url}` names no bucket (expected s3://BUCKET/PREFIX)"),
                    ));
                }
                let mut builder = object_store::aws::AmazonS3Builder::from_env().with_url(url);
                for (k, v) in &options.config {
                    let key = k.to_ascii_lowercase().parse().map_err(|e| {
                        Error::argument("config", format!("unknown S3 setting `{k}`: {e}"))
                    })?;
                    builder = builder.with_config(key, v);
                }
                Arc::new(builder.build().map_err(|e| remote_err(url, e))?)
            }
            "file" => {
                let dir = parsed.to_file_path().map_err(|()| {
                    Error::argument(
                        "url",
                        format!("`{url}` is not an absolute file URL (expected file:///PATH)"),
                    )
                })?;
                // Directories are created by the first write, not by opening.
                local_root = Some(dir);
                Arc::new(object_store::local::LocalFileSystem::new())
            }
            other => {
                return Err(Error::argument(
                    "url",
                    format!(
                        "unsupported storage scheme `{other}://` in `{url}`: this build reads s3:// \
                     (AWS and S3-compatible servers, through AWS_ENDPOINT_URL) and file://"
                    ),
                ));
            }
        };
        let mut remote = Self::with_store(url, store, options)?;
        remote.local_root = local_root;
        Ok(remote)
    }

    /// The dataset at `url` in a store built by the caller: any object_store implementation
    /// (`InMemory` in tests, a store with custom credentials or retry settings, GCS or Azure
    /// from another build of object_store's features). The URL's path is the dataset's prefix in
    /// the store; the URL also names the dataset in messages and reports.
    ///
    /// ```
    /// # fn main() -> trajstore::Result<()> {
    /// use std::sync::Arc;
    /// use trajstore::remote::{Remote, RemoteOptions};
    /// let store = Arc::new(object_store::memory::InMemory::new());
    /// let remote = Remote::with_store("memory:///runs/walker", store, RemoteOptions::default())?;
    /// assert_eq!(remote.versions()?, Vec::<u64>::new());
    /// # Ok(()) }
    /// ```
    pub fn with_store(
        url: &str,
        store: Arc<dyn ObjectStore>,
        options: RemoteOptions,
    ) -> Result<Self> {
        let parsed = url::Url::parse(url)
            .map_err(|e| Error::argument("url", format!("`{url}` is not a valid URL: {e}")))?;
        let prefix = ObjectPath::from_url_path(parsed.path())
            .map_err(|e| Error::argument("url", format!("`{url}`: {e}")))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.concurrency.clamp(1, 8))
            .enable_all()
            .build()
            .map_err(|e| Error::io(url, e))?;
        Ok(Remote {
            url: url.trim_end_matches('/').to_string(),
            local_root: None,
            store,
            prefix,
            rt,
            options,
        })
    }

    /// The dataset's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The store this dataset lives in.
    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The location in the store and the URL of file `rel` (relative to the dataset's root).
    pub(crate) fn object(&self, rel: &str) -> (ObjectPath, String) {
        (self.key(rel), self.url_of(rel))
    }

    pub(crate) fn key(&self, rel: &str) -> ObjectPath {
        rel.split('/')
            .fold(self.prefix.clone(), |p, part| p.join(part))
    }

    pub(crate) fn url_of(&self, rel: &str) -> String {
        format!("{}/{rel}", self.url)
    }

    /// Committed versions in the store, ascending.
    pub fn versions(&self) -> Result<Vec<u64>> {
        let dir = self.key(format::VERSIONS_DIR);
        let listed = self
            .rt
            .block_on(self.store.list_with_delimiter(Some(&dir)))
            .map_err(|e| remote_err(&self.url, e))?;
        let mut out: Vec<u64> = listed
            .objects
            .iter()
            .filter_map(|o| o.location.filename().and_then(format::parse_manifest_name))
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// Reads and validates version `v`'s manifest.
    pub fn manifest(&self, v: u64) -> Result<Manifest> {
        let rel = format!("{}/{}", format::VERSIONS_DIR, format::manifest_name(v));
        let bytes = self
            .rt
            .block_on(async { self.store.get(&self.key(&rel)).await?.bytes().await })
            .map_err(|e| remote_err(&self.url_of(&rel), e))?;
        let where_ = PathBuf::from(self.url_of(&rel));
        let m: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::corrupt(&where_, format!("invalid manifest JSON: {e}")))?;
        m.validate(&where_, v)?;
        Ok(m)
    }

    /// The newest committed manifest, or `None` when the location holds no dataset.
    pub fn latest(&self) -> Result<Option<Manifest>> {
        match self.versions()?.last() {
            Some(&v) => self.manifest(v).map(Some),
            None => Ok(None),
        }
    }
}

/// What [`Remote::fetch`] did.
pub(crate) struct Fetched {
    /// The manifest, with the mirror's file names.
    local: Manifest,
    report: PullReport,
    /// The mirror's pull lock, held until dropped.
    lock: File,
}

/// A temporary file that is removed when dropped (after a rename, the removal finds nothing).
pub(crate) struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A temporary name beside `path`, unique to this process and call.
pub(crate) fn temp_name(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut s = path.as_os_str().to_owned();
    s.push(format!(
        ".{}.{}{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        format::TMP_SUFFIX
    ));
    PathBuf::from(s)
}

/// Appends `range` of a local `file` (`src`: the object at `url` of a `file://` store, which
/// object_store hands over open) to `out` (`out_path`) in 1 MiB reads on a blocking thread,
/// extending `crc`, and calls `on_chunk(n)` after each chunk written; returns `out`, the CRC and
/// the bytes copied. object_store's own stream of such a file reads 8 KiB per hop through tokio's
/// blocking pool, which measured at a third of this (BENCHMARKS.md, "From Python").
#[allow(clippy::too_many_arguments)]
pub(crate) async fn copy_local(
    url: &str,
    file: File,
    src: PathBuf,
    range: std::ops::Range<u64>,
    mut out: File,
    out_path: PathBuf,
    crc: u32,
    on_chunk: impl FnMut(u64) + Send + 'static,
) -> Result<(File, u32, u64)> {
    tokio::task::spawn_blocking(move || {
        let (crc, n) = copy_local_blocking(file, &src, range, &mut out, &out_path, crc, on_chunk)?;
        Ok((out, crc, n))
    })
    .await
    .map_err(|e| Error::Remote {
        url: url.to_string(),
        message: "copy task failed".into(),
        source: Some(Box::new(e)),
    })?
}

fn copy_local_blocking(
    mut file: File,
    src: &Path,
    range: std::ops::Range<u64>,
    out: &mut File,
    out_path: &Path,
    mut crc: u32,
    mut on_chunk: impl FnMut(u64),
) -> Result<(u32, u64)> {
    use std::io::{Read, Seek, SeekFrom, Write};

    use crate::error::IoContext;
    file.seek(SeekFrom::Start(range.start)).at(src)?;
    let mut left = range.end.saturating_sub(range.start);
    let mut buf = vec![0u8; (1usize << 20).min(left as usize)];
    let mut copied = 0u64;
    while left > 0 {
        let want = buf.len().min(left as usize);
        let n = match file.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(src, e)),
        };
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        out.write_all(&buf[..n]).at(out_path)?;
        copied += n as u64;
        left -= n as u64;
        on_chunk(n as u64);
    }
    Ok((crc, copied))
}

/// An object_store error with the URL it concerns; "not found" becomes [`Error::NotFound`].
pub(crate) fn remote_err(url: &str, e: object_store::Error) -> Error {
    match e {
        object_store::Error::NotFound { .. } => Error::NotFound {
            path: PathBuf::from(url),
        },
        other => Error::Remote {
            url: url.to_string(),
            message: explain(&other.to_string()),
            source: Some(Box::new(other)),
        },
    }
}

/// S3 errors arrive as the server's XML body inside object_store's message; this keeps the
/// server's code and message, with a hint for the common ones, instead of the XML.
pub(crate) fn explain(text: &str) -> String {
    let tag = |name: &str| -> Option<&str> {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let len = text[start..].find(&format!("</{name}>"))?;
        Some(&text[start..start + len])
    };
    let Some(code) = tag("Code") else {
        return text.to_string();
    };
    let hint = match code {
        "NoSuchBucket" => " (check the bucket name and AWS_ENDPOINT_URL/AWS_REGION)",
        "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "AccessDenied" | "ExpiredToken" => {
            " (check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the bucket's permissions)"
        }
        _ => "",
    };
    match tag("Message") {
        Some(m) => format!("S3 error {code}: {m}{hint}"),
        None => format!("S3 error {code}{hint}"),
    }
}

#[cfg(test)]
mod tests {
    use super::push::canonical_paths;
    use super::*;
    use crate::store::SegmentEntry;

    #[test]
    fn urls_are_told_from_paths() {
        assert!(is_url("s3://bucket/x"));
        assert!(is_url("file:///tmp/x"));
        assert!(!is_url("/tmp/x"));
        assert!(!is_url("demo.trajstore"));
        assert!(!is_url("://x"));
        assert!(!is_url("a b://x"));
    }

    #[test]
    fn mirror_dirs_follow_the_url_and_refuse_escapes() {
        let c = Path::new("/c");
        assert_eq!(
            mirror_dir(c, "s3://bkt/a/b").unwrap(),
            PathBuf::from("/c/s3/bkt/a/b")
        );
        assert_eq!(
            mirror_dir(c, "s3://bkt").unwrap(),
            PathBuf::from("/c/s3/bkt")
        );
        // `url` normalises `..` away before it can escape the cache.
        let d = mirror_dir(c, "s3://bkt/a/../../x").unwrap();
        assert!(d.starts_with("/c/s3/bkt"), "{}", d.display());
    }

    #[test]
    fn s3_errors_lose_their_xml() {
        let raw = "Generic S3 error: Error performing list request: ... 404 Not Found: <?xml \
                   version=\"1.0\"?><Error><Code>NoSuchBucket</Code><Message>The specified \
                   bucket does not exist</Message><BucketName>b</BucketName></Error>";
        assert_eq!(
            explain(raw),
            "S3 error NoSuchBucket: The specified bucket does not exist (check the bucket name \
             and AWS_ENDPOINT_URL/AWS_REGION)"
        );
        assert_eq!(explain("connection refused"), "connection refused");
    }

    #[test]
    fn content_addressed_names_depend_on_id_and_checksum() {
        let mut s = SegmentEntry {
            id: 7,
            path: "segments/00000000000000000007.arrow".into(),
            episodes_path: "segments/00000000000000000007.episodes.arrow".into(),
            rows: 10,
            episodes: 1,
            first_episode_id: 0,
            first_row: 0,
            bytes: 1,
            checksum: "crc32c:0000abcd".into(),
            episodes_bytes: 1,
            episodes_checksum: "crc32c:DEADBEEF".into(),
        };
        canonical_paths(&mut s).unwrap();
        assert_eq!(s.path, "segments/00000000000000000007-0000abcd.arrow");
        assert_eq!(
            s.episodes_path,
            "segments/00000000000000000007-deadbeef.episodes.arrow"
        );
        let again = s.clone();
        canonical_paths(&mut s).unwrap();
        assert_eq!(s, again, "idempotent");
        s.checksum = "md5:00".into();
        assert!(canonical_paths(&mut s).is_err());
    }
}
