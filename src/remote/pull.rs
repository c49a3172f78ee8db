//! [`Remote::pull`] and [`Remote::catalog`]: bring a local mirror to a version, checking every
//! downloaded file against the manifest before it is renamed into place. The dictionaries of
//! frame columns come with the catalog as well as with a pull: every segment needs them.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;

use crate::error::{Error, IoContext, Result};
use crate::format;
use crate::store::Catalog;
use crate::store::manifest::{self, Manifest};

use super::push::{canonical_paths, same_content};
use super::*;

impl Remote {
    /// Brings the mirror directory `mirror` to version `version` (default: the newest) of the
    /// remote dataset, downloading only the files it lacks, and returns what it did. The mirror
    /// is a trajstore dataset: open it with [`Dataset::open`](crate::store::Dataset::open). Older versions' files are
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
    /// tables, which is all `trajstore info` needs, and the dictionaries of its frame columns,
    /// which every segment needs. Only the files the mirror lacks are downloaded (checked like any pull) into `mirror`, where a later [`Remote::pull`] of
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
        let lock = crate::store::writer::lock_file(&lock_path)?;
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
        // The dictionaries of frame columns: small, and needed to open any segment, so fetched
        // with the catalog too. Their names are their checksums, in the store as in the mirror.
        let dictionaries = crate::store::dictionary::referenced(&m.columns);
        for d in &dictionaries {
            let manifest_url = self.url_of(&format!(
                "{}/{}",
                format::VERSIONS_DIR,
                format::manifest_name(m.version)
            ));
            crate::store::dictionary::check_path(&manifest_url, d)?;
            files.push((d.path.clone(), d.path.clone(), d.bytes, d.checksum.clone()));
        }
        let dict_dir = mirror.join(format::DICTIONARIES_DIR);
        if !dictionaries.is_empty() {
            std::fs::create_dir_all(&dict_dir).at(&dict_dir)?;
        }
        let (mut files_cached, mut bytes_cached) = (0u64, 0u64);
        let mut missing = Vec::new();
        for (rel, name, bytes, checksum) in files {
            let dest = mirror.join(&name);
            // A cached dictionary (a few KiB) is checked whole, so that a damaged one is
            // fetched again rather than failing every open.
            let intact = |len: u64| {
                len == bytes
                    && (!name.starts_with(format::DICTIONARIES_DIR)
                        || std::fs::read(&dest).is_ok_and(|b| {
                            crate::store::ipc::checksum_string(crc32c::crc32c(&b)) == checksum
                        }))
            };
            match std::fs::metadata(&dest) {
                Ok(md) if intact(md.len()) => {
                    files_cached += 1;
                    bytes_cached += bytes;
                }
                _ => missing.push((rel, dest, bytes, checksum)),
            }
        }
        let total: u64 = missing.iter().map(|f| f.2).sum();
        let pb = &self.options.progress;
        pb.start("pull", Unit::Bytes, Some(total));
        let done =
            self.rt.block_on(async {
                futures::stream::iter(missing.iter().map(|(rel, dest, bytes, checksum)| {
                    self.download(rel, dest, *bytes, checksum, pb)
                }))
                .buffer_unordered(self.options.concurrency.max(1))
                .try_fold(0u64, |n, _| async move { Ok(n + 1) })
                .await
            });
        pb.finish(done.is_ok());
        let files_downloaded = done?;
        manifest::sync_dir(&seg_dir)?;
        if !dictionaries.is_empty() {
            manifest::sync_dir(&dict_dir)?;
        }
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
            Ok(u) => Err(Error::argument(
                "mirror",
                format!(
                    "{} is the mirror of {}, not of {}; pull into another directory",
                    mirror.display(),
                    u.trim(),
                    self.url
                ),
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let empty = match std::fs::read_dir(mirror) {
                    Ok(mut entries) => entries.next().is_none(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                    Err(e) => return Err(Error::io(mirror, e)),
                };
                if empty {
                    Ok(())
                } else {
                    Err(Error::argument(
                        "mirror",
                        format!(
                            "{} exists and is not a mirror of {} (no `{MIRROR_MARKER}` file); a pull \
                         writes only into a new or empty directory or a mirror of the same URL",
                            mirror.display(),
                            self.url
                        ),
                    ))
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
        pb: &ProgressSink,
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
        let range = got.range.clone();
        match got.payload {
            // A local file (file:// stores): copied in large reads on a blocking thread, not in
            // the store's 8 KiB stream chunks.
            object_store::GetResultPayload::File(file, src) => {
                let p = pb.clone();
                let copied =
                    super::copy_local(&url, file, src, range, out, tmp.clone(), 0, move |n| {
                        p.advance(n)
                    })
                    .await?;
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
                    pb.advance(chunk.len() as u64);
                }
            }
        }
        let found = crate::store::ipc::checksum_string(crc);
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
                message: "sync task failed".into(),
                source: Some(Box::new(e)),
            })??;
        std::fs::rename(&tmp, dest).at(dest)
    }
}

/// Removes manifests older than `keep_from` and the segment and dictionary files no remaining
/// manifest names (and temporary files left by interrupted pulls). Returns the number of files removed.
pub(crate) fn prune(mirror: &Path, keep_from: u64) -> Result<u64> {
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
            for d in crate::store::dictionary::referenced(&m.columns) {
                referenced.insert(d.path.clone());
            }
            for s in m.segments {
                referenced.insert(s.path);
                referenced.insert(s.episodes_path);
            }
        }
    }
    for sub in [format::SEGMENTS_DIR, format::DICTIONARIES_DIR] {
        let dir = mirror.join(sub);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&dir, e)),
        };
        for entry in entries {
            let entry = entry.at(&dir)?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !referenced.contains(&format!("{sub}/{name}")) {
                std::fs::remove_file(entry.path()).at(entry.path())?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}
