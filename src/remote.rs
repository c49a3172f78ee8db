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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};
use serde::Serialize;

use crate::dataset::{Catalog, Dataset};
use crate::error::{Error, IoContext, Result};
use crate::format;
use crate::manifest::{self, Manifest, SegmentEntry};

/// Files up to this size are uploaded with one PUT; larger ones in parts of this size (S3's
/// smallest part is 5 MiB).
const PART_BYTES: usize = 8 << 20;
/// Parts in flight at once over all the files being uploaded (each multipart file gets its share,
/// at least 2): a few large segments still use many connections, as S3 needs for bandwidth. A
/// push holds at most about `(PARTS_IN_FLIGHT + concurrency) * PART_BYTES` of file data in
/// memory (192 MiB with the default 8 files at once).
const PARTS_IN_FLIGHT: usize = 16;
/// Name of the lock that serialises pulls into one mirror.
const PULL_LOCK: &str = "_pull.lock";
/// File in a mirror's root that names the URL it mirrors.
const MIRROR_MARKER: &str = "_mirror";

pub use crate::format::is_url;

/// How to reach the store.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Store settings with object_store's keys (`aws_endpoint`, `aws_region`,
    /// `aws_access_key_id`, `aws_secret_access_key`, `aws_allow_http`, ...). They override the
    /// `AWS_*` environment variables, which are always read.
    pub config: BTreeMap<String, String>,
    /// Files transferred at once.
    pub concurrency: usize,
    /// Show a progress bar (bytes) on stderr; it hides itself when stderr is not a terminal.
    pub progress: bool,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            config: BTreeMap::new(),
            concurrency: 8,
            progress: false,
        }
    }
}

impl RemoteOptions {
    /// Adds one store setting.
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }

    /// Sets [`RemoteOptions::progress`].
    pub fn with_progress(mut self, progress: bool) -> Self {
        self.progress = progress;
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
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    rt: tokio::runtime::Runtime,
    options: RemoteOptions,
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
            .map_err(|e| Error::InvalidArgument(format!("`{url}` is not a valid URL: {e}")))?;
        let mut local_root = None;
        let (store, prefix): (Arc<dyn ObjectStore>, ObjectPath) = match parsed.scheme() {
            "s3" | "s3a" => {
                let bucket = parsed.host_str().unwrap_or_default();
                if bucket.is_empty() {
                    return Err(Error::InvalidArgument(format!(
                        "`{url}` names no bucket (expected s3://BUCKET/PREFIX)"
                    )));
                }
                let mut builder = object_store::aws::AmazonS3Builder::from_env().with_url(url);
                for (k, v) in &options.config {
                    let key = k.to_ascii_lowercase().parse().map_err(|e| {
                        Error::InvalidArgument(format!("unknown S3 setting `{k}`: {e}"))
                    })?;
                    builder = builder.with_config(key, v);
                }
                let store = builder.build().map_err(|e| remote_err(url, e))?;
                let prefix = ObjectPath::from_url_path(parsed.path())
                    .map_err(|e| Error::InvalidArgument(format!("`{url}`: {e}")))?;
                (Arc::new(store), prefix)
            }
            "file" => {
                let dir = parsed.to_file_path().map_err(|()| {
                    Error::InvalidArgument(format!(
                        "`{url}` is not an absolute file URL (expected file:///PATH)"
                    ))
                })?;
                // Directories are created by the first write, not by opening.
                let prefix = ObjectPath::from_absolute_path(&dir)
                    .map_err(|e| Error::InvalidArgument(format!("`{url}`: {e}")))?;
                local_root = Some(dir);
                (
                    Arc::new(object_store::local::LocalFileSystem::new()),
                    prefix,
                )
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unsupported storage scheme `{other}://` in `{url}`: this build reads s3:// \
                     (AWS and S3-compatible servers, through AWS_ENDPOINT_URL) and file://"
                )));
            }
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.concurrency.clamp(1, 8))
            .enable_all()
            .build()
            .map_err(|e| Error::io(url, e))?;
        Ok(Remote {
            url: url.trim_end_matches('/').to_string(),
            local_root,
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

    fn key(&self, rel: &str) -> ObjectPath {
        rel.split('/')
            .fold(self.prefix.clone(), |p, part| p.join(part))
    }

    fn url_of(&self, rel: &str) -> String {
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

    /// Uploads the newest version of `local`: the segment files the store lacks, then the
    /// manifest. See the module documentation for the rules.
    pub fn push(&self, local: &Dataset) -> Result<PushReport> {
        let start = Instant::now();
        let lm = local.latest_manifest()?;
        let remote = self.latest()?;
        let previous_version = remote.as_ref().map(|r| r.version);
        let mut target = lm.clone();
        for s in &mut target.segments {
            canonical_paths(s)?;
        }
        if let Some(r) = &remote {
            if same_content(r, &target) {
                return Ok(PushReport {
                    url: self.url.clone(),
                    version: r.version,
                    previous_version,
                    files_uploaded: 0,
                    bytes_uploaded: 0,
                    files_present: 0,
                    bytes_present: 0,
                    up_to_date: true,
                    seconds: start.elapsed().as_secs_f64(),
                });
            }
            check_fast_forward(&self.url, local.path(), r, &lm)?;
        }

        // Files to send, smallest first so that a progress bar moves early.
        let mut files: Vec<(PathBuf, String, u64, String)> = Vec::new();
        for (s, t) in lm.segments.iter().zip(&target.segments) {
            files.push((
                local.path().join(&s.path),
                t.path.clone(),
                s.bytes,
                s.checksum.clone(),
            ));
            files.push((
                local.path().join(&s.episodes_path),
                t.episodes_path.clone(),
                s.episodes_bytes,
                s.episodes_checksum.clone(),
            ));
        }
        let present = self.listing(format::SEGMENTS_DIR)?;
        let mut to_send = Vec::new();
        let (mut files_present, mut bytes_present) = (0u64, 0u64);
        for f in files {
            match present.get(f.1.as_str()) {
                Some(&size) if size == f.2 => {
                    files_present += 1;
                    bytes_present += f.2;
                }
                Some(&size) => {
                    return Err(Error::Conflict(format!(
                        "{} exists with {size} bytes, but this dataset's file of the same id and \
                         checksum has {}; remove that object or push to another prefix",
                        self.url_of(&f.1),
                        f.2
                    )));
                }
                None => to_send.push(f),
            }
        }
        let total: u64 = to_send.iter().map(|f| f.2).sum();
        let concurrency = self.options.concurrency.max(1);
        let large = to_send.iter().filter(|f| f.2 as usize > PART_BYTES).count();
        let parts = (PARTS_IN_FLIGHT / large.clamp(1, concurrency)).max(2);
        let pb = bytes_bar(self.options.progress, total, "push");
        let uploaded = self.rt.block_on(async {
            futures::stream::iter(to_send.iter().map(|(src, rel, bytes, checksum)| {
                self.upload(src, rel, *bytes, checksum, parts, &pb)
            }))
            .buffer_unordered(self.options.concurrency.max(1))
            .try_fold(0u64, |n, _| async move { Ok(n + 1) })
            .await
        });
        pb.finish_and_clear();
        let files_uploaded = uploaded?;
        if let Some(root) = &self.local_root {
            for (_, rel, _, _) in &to_send {
                let p = root.join(rel);
                File::open(&p).and_then(|f| f.sync_all()).at(&p)?;
            }
            manifest::sync_dir(&root.join(format::SEGMENTS_DIR))?;
        }
        crate::fault::point("remote-push-before-manifest");
        crate::fault::pause("remote-push-before-manifest");

        let rel = format!(
            "{}/{}",
            format::VERSIONS_DIR,
            format::manifest_name(target.version)
        );
        let json = serde_json::to_vec_pretty(&target).expect("manifest serializes");
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let put = self.rt.block_on(self.store.put_opts(
            &self.key(&rel),
            PutPayload::from(json),
            opts,
        ));
        match put {
            Ok(_) => {
                if let Some(root) = &self.local_root {
                    let p = root.join(&rel);
                    File::open(&p).and_then(|f| f.sync_all()).at(&p)?;
                    manifest::sync_dir(&root.join(format::VERSIONS_DIR))?;
                }
            }
            Err(object_store::Error::AlreadyExists { .. }) => {
                let theirs = self.manifest(target.version)?;
                if !same_content(&theirs, &target) {
                    return Err(Error::Conflict(format!(
                        "another writer committed version {} to {} while this push ran; the \
                         remote keeps its version (the files this push uploaded are unused). \
                         Pull it, or push to another prefix",
                        target.version, self.url
                    )));
                }
            }
            Err(e) => return Err(remote_err(&self.url_of(&rel), e)),
        }
        Ok(PushReport {
            url: self.url.clone(),
            version: target.version,
            previous_version,
            files_uploaded,
            bytes_uploaded: total,
            files_present,
            bytes_present,
            up_to_date: false,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Object names (relative to the dataset) and sizes under `dir`.
    fn listing(&self, dir: &str) -> Result<HashMap<String, u64>> {
        let base = self.key(dir);
        let metas: Vec<object_store::ObjectMeta> = self
            .rt
            .block_on(self.store.list(Some(&base)).try_collect())
            .map_err(|e| remote_err(&self.url_of(dir), e))?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let name = m.location.filename()?.to_string();
                Some((format!("{dir}/{name}"), m.size))
            })
            .collect())
    }

    /// Uploads one local file, checking its size and checksum against the manifest as it is
    /// read; on a mismatch the upload is abandoned and nothing becomes visible. A large file goes
    /// in parts, `parts_in_flight` at once.
    async fn upload(
        &self,
        src: &Path,
        rel: &str,
        bytes: u64,
        checksum: &str,
        parts_in_flight: usize,
        pb: &ProgressBar,
    ) -> Result<()> {
        let key = self.key(rel);
        let mut file = File::open(src).at(src)?;
        let mut crc = 0u32;
        let mut seen = 0u64;
        let bad = |seen: u64, crc: u32| {
            Error::corrupt(
                src,
                format!(
                    "has {seen} bytes with {} but the manifest says {bytes} bytes with {checksum}; \
                     run `trajstore verify` on the local dataset",
                    crate::segment::checksum_string(crc)
                ),
            )
        };
        if bytes as usize <= PART_BYTES {
            let mut buf = Vec::with_capacity(bytes as usize);
            file.read_to_end(&mut buf).at(src)?;
            crc = crc32c::crc32c(&buf);
            seen = buf.len() as u64;
            if seen != bytes || crate::segment::checksum_string(crc) != checksum {
                return Err(bad(seen, crc));
            }
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            match self.store.put_opts(&key, PutPayload::from(buf), opts).await {
                // The same content-addressed name: a concurrent push of the same file.
                Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => return Err(remote_err(&self.url_of(rel), e)),
            }
            pb.inc(bytes);
            return Ok(());
        }
        let upload = self
            .store
            .put_multipart(&key)
            .await
            .map_err(|e| remote_err(&self.url_of(rel), e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut buf = vec![0u8; PART_BYTES];
        loop {
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(Error::io(src, e));
                }
            };
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            seen += n as u64;
            if let Err(e) = writer.wait_for_capacity(parts_in_flight).await {
                return Err(remote_err(&self.url_of(rel), e));
            }
            writer.write(&buf[..n]);
            pb.inc(n as u64);
        }
        if seen != bytes || crate::segment::checksum_string(crc) != checksum {
            let _ = writer.abort().await;
            return Err(bad(seen, crc));
        }
        writer
            .finish()
            .await
            .map_err(|e| remote_err(&self.url_of(rel), e))?;
        Ok(())
    }

    /// Brings the mirror directory `mirror` to version `version` (default: the newest) of the
    /// remote dataset, downloading only the files it lacks, and returns what it did. The mirror
    /// is a trajstore dataset: open it with [`Dataset::open`]. Older versions' files are
    /// removed from the mirror afterwards (processes that still map them keep their data).
    pub fn pull(&self, mirror: &Path, version: Option<u64>) -> Result<PullReport> {
        let start = Instant::now();
        let f = self.fetch(mirror, version, true)?;
        let local = f.local;

        // The manifest last; a cached manifest of the same version is replaced (the remote may
        // have been recreated since).
        let ver_dir = manifest::versions_dir(mirror);
        let path = ver_dir.join(format::manifest_name(local.version));
        let same = manifest::read(mirror, local.version).is_ok_and(|c| same_content(&c, &local));
        if !same {
            let tmp = temp_name(&path);
            let json = serde_json::to_vec_pretty(&local).expect("manifest serializes");
            let mut file = File::create(&tmp).at(&tmp)?;
            file.write_all(&json).at(&tmp)?;
            file.sync_all().at(&tmp)?;
            drop(file);
            std::fs::rename(&tmp, &path).at(&path)?;
            manifest::sync_dir(&ver_dir)?;
        }
        let files_pruned = prune(mirror, local.version)?;
        drop(f.lock);
        Ok(PullReport {
            files_pruned,
            seconds: start.elapsed().as_secs_f64(),
            ..f.report
        })
    }

    /// The [`Catalog`] of version `version` (default: the newest): its manifest and episode
    /// tables, which is all `trajstore info` needs. Only the episode tables the mirror lacks
    /// are downloaded (checked like any pull) into `mirror`, where a later [`Remote::pull`] of
    /// that version reuses them; no transition file is fetched, and the mirror's own committed
    /// version does not change. The report's `files_pruned` is 0: nothing is removed.
    pub fn catalog(&self, mirror: &Path, version: Option<u64>) -> Result<(Catalog, PullReport)> {
        let start = Instant::now();
        let f = self.fetch(mirror, version, false)?;
        let catalog = Catalog::load(mirror, f.local)?;
        drop(f.lock);
        let report = PullReport {
            seconds: start.elapsed().as_secs_f64(),
            ..f.report
        };
        Ok((catalog, report))
    }

    /// The manifest of `version`, or the newest one.
    fn resolve(&self, version: Option<u64>) -> Result<Manifest> {
        match version {
            Some(v) => self.manifest(v),
            None => self.latest()?.ok_or_else(|| Error::NotFound {
                path: PathBuf::from(format!("{}/{}/", self.url, format::VERSIONS_DIR)),
            }),
        }
    }

    /// Downloads into `mirror` the files of `version` (default: the newest) that it lacks (only
    /// the episode tables unless `transitions`), each checked and renamed into place, and
    /// returns the version's manifest with the mirror's file names, what was downloaded, and
    /// the mirror's pull lock, still held.
    fn fetch(&self, mirror: &Path, version: Option<u64>, transitions: bool) -> Result<Fetched> {
        self.check_mirror(mirror)?;
        let m = self.resolve(version)?;
        let seg_dir = mirror.join(format::SEGMENTS_DIR);
        let ver_dir = manifest::versions_dir(mirror);
        std::fs::create_dir_all(&seg_dir).at(&seg_dir)?;
        std::fs::create_dir_all(&ver_dir).at(&ver_dir)?;
        let marker = mirror.join(MIRROR_MARKER);
        if !marker.exists() {
            let tmp = TempFile(temp_name(&marker));
            std::fs::write(&tmp.0, format!("{}\n", self.url)).at(&tmp.0)?;
            std::fs::rename(&tmp.0, &marker).at(&marker)?;
        }
        let lock_path = mirror.join(PULL_LOCK);
        let lock = crate::writer::lock_file(&lock_path)?;
        lock.lock().at(&lock_path)?;

        let mut local = m.clone();
        for s in &mut local.segments {
            canonical_paths(s)?;
        }
        // (remote name, local name, bytes, checksum)
        let mut files = Vec::new();
        for (r, l) in m.segments.iter().zip(&local.segments) {
            if transitions {
                files.push((r.path.clone(), l.path.clone(), r.bytes, r.checksum.clone()));
            }
            files.push((
                r.episodes_path.clone(),
                l.episodes_path.clone(),
                r.episodes_bytes,
                r.episodes_checksum.clone(),
            ));
        }
        let (mut files_cached, mut bytes_cached) = (0u64, 0u64);
        let mut missing = Vec::new();
        for (rel, name, bytes, checksum) in files {
            let dest = mirror.join(name);
            match std::fs::metadata(&dest) {
                Ok(md) if md.len() == bytes => {
                    files_cached += 1;
                    bytes_cached += bytes;
                }
                _ => missing.push((rel, dest, bytes, checksum)),
            }
        }
        let total: u64 = missing.iter().map(|f| f.2).sum();
        let pb = bytes_bar(self.options.progress, total, "pull");
        let done = self.rt.block_on(async {
            futures::stream::iter(missing.iter().map(|(rel, dest, bytes, checksum)| {
                self.download(rel, dest, *bytes, checksum, &pb)
            }))
            .buffer_unordered(self.options.concurrency.max(1))
            .try_fold(0u64, |n, _| async move { Ok(n + 1) })
            .await
        });
        pb.finish_and_clear();
        let files_downloaded = done?;
        manifest::sync_dir(&seg_dir)?;
        let report = PullReport {
            url: self.url.clone(),
            mirror: mirror.to_path_buf(),
            version: local.version,
            files_downloaded,
            bytes_downloaded: total,
            files_cached,
            bytes_cached,
            files_pruned: 0,
            seconds: 0.0,
        };
        Ok(Fetched {
            local,
            report,
            lock,
        })
    }

    /// A pull writes only into a new or empty directory or a mirror of this same URL: pulling
    /// into a dataset of its own would prune its history.
    fn check_mirror(&self, mirror: &Path) -> Result<()> {
        let marker = mirror.join(MIRROR_MARKER);
        match std::fs::read_to_string(&marker) {
            Ok(u) if u.trim() == self.url => Ok(()),
            Ok(u) => Err(Error::InvalidArgument(format!(
                "{} is the mirror of {}, not of {}; pull into another directory",
                mirror.display(),
                u.trim(),
                self.url
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let empty = match std::fs::read_dir(mirror) {
                    Ok(mut entries) => entries.next().is_none(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                    Err(e) => return Err(Error::io(mirror, e)),
                };
                if empty {
                    Ok(())
                } else {
                    Err(Error::InvalidArgument(format!(
                        "{} exists and is not a mirror of {} (no `{MIRROR_MARKER}` file); a pull \
                         writes only into a new or empty directory or a mirror of the same URL",
                        mirror.display(),
                        self.url
                    )))
                }
            }
            Err(e) => Err(Error::io(&marker, e)),
        }
    }

    /// Downloads one object to `dest` through a temporary file, checking size and checksum.
    async fn download(
        &self,
        rel: &str,
        dest: &Path,
        bytes: u64,
        checksum: &str,
        pb: &ProgressBar,
    ) -> Result<()> {
        let url = self.url_of(rel);
        // Removed on every way out (an error here, or this future dropped because another
        // download failed) except the rename.
        let guard = TempFile(temp_name(dest));
        let tmp = guard.0.clone();
        let got = self
            .store
            .get(&self.key(rel))
            .await
            .map_err(|e| remote_err(&url, e))?;
        if got.meta.size != bytes {
            return Err(Error::corrupt(
                &url,
                format!("has {} bytes but the manifest says {bytes}", got.meta.size),
            ));
        }
        let mut out = File::create(&tmp).at(&tmp)?;
        let (mut crc, mut seen) = (0u32, 0u64);
        match got.payload {
            // A local file (file:// stores): copied in large reads on a blocking thread, not in
            // the store's 8 KiB stream chunks.
            object_store::GetResultPayload::File(mut file, _) => {
                let (t, p) = (tmp.clone(), pb.clone());
                let copied = tokio::task::spawn_blocking(move || -> Result<(File, u32, u64)> {
                    let (mut crc, mut seen) = (0u32, 0u64);
                    let mut buf = vec![0u8; 4 << 20];
                    loop {
                        let n = match file.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => n,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                            Err(e) => return Err(Error::io(&t, e)),
                        };
                        crc = crc32c::crc32c_append(crc, &buf[..n]);
                        seen += n as u64;
                        out.write_all(&buf[..n]).at(&t)?;
                        p.inc(n as u64);
                    }
                    Ok((out, crc, seen))
                })
                .await
                .map_err(|e| Error::Remote {
                    url: url.clone(),
                    message: format!("copy task failed: {e}"),
                })??;
                (out, crc, seen) = copied;
            }
            object_store::GetResultPayload::Stream(mut stream) => {
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.map_err(|e| remote_err(&url, e))?;
                    seen += chunk.len() as u64;
                    if seen > bytes {
                        break;
                    }
                    crc = crc32c::crc32c_append(crc, &chunk);
                    out.write_all(&chunk).at(&tmp)?;
                    pb.inc(chunk.len() as u64);
                }
            }
        }
        let found = crate::segment::checksum_string(crc);
        if seen != bytes || found != checksum {
            return Err(Error::corrupt(
                &url,
                format!(
                    "downloaded {seen} bytes with {found}; the manifest says {bytes} bytes with \
                     {checksum}"
                ),
            ));
        }
        // fsync on a blocking thread, so that the other downloads go on meanwhile.
        let t = tmp.clone();
        tokio::task::spawn_blocking(move || out.sync_all().at(&t))
            .await
            .map_err(|e| Error::Remote {
                url: url.clone(),
                message: format!("sync task failed: {e}"),
            })??;
        std::fs::rename(&tmp, dest).at(dest)
    }
}

/// The mirror directory of `url` under `cache` (`cache/<scheme>/<bucket>/<prefix>`).
pub fn mirror_dir(cache: &Path, url: &str) -> Result<PathBuf> {
    let parsed = url::Url::parse(url)
        .map_err(|e| Error::InvalidArgument(format!("`{url}` is not a valid URL: {e}")))?;
    let mut dir = cache.join(parsed.scheme());
    if let Some(host) = parsed.host_str().filter(|h| !h.is_empty()) {
        dir.push(safe_part(host, url)?);
    }
    for part in parsed.path().split('/').filter(|p| !p.is_empty()) {
        dir.push(safe_part(part, url)?);
    }
    Ok(dir)
}

fn safe_part<'a>(part: &'a str, url: &str) -> Result<&'a str> {
    if part == "." || part == ".." || part.contains('\\') || part.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "`{url}` has a path component `{part}` that cannot name a cache directory"
        )));
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

/// Rewrites a segment entry's paths to the content-addressed names used in stores and mirrors.
fn canonical_paths(s: &mut SegmentEntry) -> Result<()> {
    let hex = |c: &str| -> Result<String> {
        match c.strip_prefix("crc32c:") {
            Some(h) if h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Ok(h.to_ascii_lowercase())
            }
            _ => Err(Error::InvalidData(format!(
                "segment {} has checksum `{c}`, expected crc32c:XXXXXXXX",
                s.id
            ))),
        }
    };
    let name = format::segment_name(s.id);
    s.path = format!(
        "{}/{name}-{}{}",
        format::SEGMENTS_DIR,
        hex(&s.checksum)?,
        format::SEGMENT_SUFFIX
    );
    s.episodes_path = format!(
        "{}/{name}-{}{}",
        format::SEGMENTS_DIR,
        hex(&s.episodes_checksum)?,
        format::EPISODES_SUFFIX
    );
    Ok(())
}

/// Whether two manifests describe the same committed data (version, schema, segments).
fn same_content(a: &Manifest, b: &Manifest) -> bool {
    let key = |m: &Manifest| -> Vec<(u64, String, String)> {
        m.segments
            .iter()
            .map(|s| (s.id, s.checksum.clone(), s.episodes_checksum.clone()))
            .collect()
    };
    a.version == b.version
        && a.columns == b.columns
        && a.transitions == b.transitions
        && a.next_segment_id == b.next_segment_id
        && key(a) == key(b)
}

/// A push must extend the remote's newest version: same schema, a newer version, and every
/// remote segment the local dataset still keeps present with the same content.
fn check_fast_forward(url: &str, local_path: &Path, r: &Manifest, l: &Manifest) -> Result<()> {
    if r.columns != l.columns {
        return Err(Error::SchemaMismatch(format!(
            "{url} has a different schema from {}",
            local_path.display()
        )));
    }
    let diverged = |why: String| {
        Err(Error::Conflict(format!(
            "{url} (version {}) is not an ancestor of {} (version {}): {why}. Push to another \
             prefix, or pull the remote and append to that",
            r.version,
            local_path.display(),
            l.version
        )))
    };
    if r.version >= l.version {
        return diverged(format!(
            "the remote's version is not older than the local {}",
            l.version
        ));
    }
    if r.next_segment_id > l.next_segment_id || r.next_episode_id > l.next_episode_id {
        return diverged("the remote has segments or episodes the local dataset never had".into());
    }
    let first_local = l.segments.first().map_or(l.next_segment_id, |s| s.id);
    let local: HashMap<u64, &str> = l
        .segments
        .iter()
        .map(|s| (s.id, s.checksum.as_str()))
        .collect();
    for s in r.segments.iter().filter(|s| s.id >= first_local) {
        match local.get(&s.id) {
            Some(c) if *c == s.checksum => {}
            Some(_) => return diverged(format!("segment {} differs", s.id)),
            None => return diverged(format!("segment {} is missing locally", s.id)),
        }
    }
    Ok(())
}

/// Removes manifests older than `keep_from` and the segment files no remaining manifest names
/// (and temporary files left by interrupted pulls). Returns the number of files removed.
fn prune(mirror: &Path, keep_from: u64) -> Result<u64> {
    let mut removed = 0u64;
    let mut referenced = BTreeSet::new();
    for v in manifest::list_versions(mirror)? {
        if v < keep_from {
            let p = manifest::versions_dir(mirror).join(format::manifest_name(v));
            std::fs::remove_file(&p).at(&p)?;
            removed += 1;
            continue;
        }
        if let Ok(m) = manifest::read(mirror, v) {
            for s in m.segments {
                referenced.insert(s.path);
                referenced.insert(s.episodes_path);
            }
        }
    }
    let dir = mirror.join(format::SEGMENTS_DIR);
    for entry in std::fs::read_dir(&dir).at(&dir)? {
        let entry = entry.at(&dir)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let rel = format!("{}/{name}", format::SEGMENTS_DIR);
        if !referenced.contains(&rel) {
            std::fs::remove_file(entry.path()).at(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// What [`Remote::fetch`] did.
struct Fetched {
    /// The manifest, with the mirror's file names.
    local: Manifest,
    report: PullReport,
    /// The mirror's pull lock, held until dropped.
    lock: File,
}

/// A temporary file that is removed when dropped (after a rename, the removal finds nothing).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A temporary name beside `path`, unique to this process and call.
fn temp_name(path: &Path) -> PathBuf {
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

fn bytes_bar(show: bool, total: u64, what: &str) -> ProgressBar {
    if !show || total == 0 {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{what} {{spinner}} [{{wide_bar}}] {{bytes}}/{{total_bytes}}, {{binary_bytes_per_sec}}, ETA {{eta}}"
    )) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// An object_store error with the URL it concerns; "not found" becomes [`Error::NotFound`].
fn remote_err(url: &str, e: object_store::Error) -> Error {
    match e {
        object_store::Error::NotFound { .. } => Error::NotFound {
            path: PathBuf::from(url),
        },
        other => Error::Remote {
            url: url.to_string(),
            message: explain(&other.to_string()),
        },
    }
}

/// S3 errors arrive as the server's XML body inside object_store's message; this keeps the
/// server's code and message, with a hint for the common ones, instead of the XML.
fn explain(text: &str) -> String {
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
    use super::*;

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
