//! [`Remote::push`]: uploads a local dataset's newest version (content-addressed segment files
//! and the dictionaries of its frame columns, then a conditionally created manifest),
//! fast-forward only.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};

use crate::error::{ConflictKind, Error, IoContext, Result};
use crate::format;
use crate::schema::ColumnDesc;
use crate::store::Dataset;
use crate::store::manifest::{self, Manifest, SegmentEntry};

use super::*;

impl Remote {
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
        // The dictionaries of frame columns, under the same names (already content-addressed).
        for d in crate::store::dictionary::referenced(&lm.columns) {
            crate::store::dictionary::check_path(local.path(), d)?;
            files.push((
                local.path().join(&d.path),
                d.path.clone(),
                d.bytes,
                d.checksum.clone(),
            ));
        }
        let mut present = self.listing(format::SEGMENTS_DIR)?;
        if files
            .iter()
            .any(|f| f.1.starts_with(format::DICTIONARIES_DIR))
        {
            present.extend(self.listing(format::DICTIONARIES_DIR)?);
        }
        let mut to_send = Vec::new();
        let (mut files_present, mut bytes_present) = (0u64, 0u64);
        for f in files {
            match present.get(f.1.as_str()) {
                Some(&size) if size == f.2 => {
                    files_present += 1;
                    bytes_present += f.2;
                }
                Some(&size) => {
                    let object = self.url_of(&f.1);
                    return Err(Error::Conflict {
                        dataset: self.url.clone(),
                        reason: format!(
                            "{object} exists with {size} bytes, but this dataset's file of the \
                             same id and checksum has {}; remove that object or push to another \
                             prefix",
                            f.2
                        ),
                        kind: ConflictKind::ObjectDiffers { object },
                    });
                }
                None => to_send.push(f),
            }
        }
        let total: u64 = to_send.iter().map(|f| f.2).sum();
        let concurrency = self.options.concurrency.max(1);
        let large = to_send.iter().filter(|f| f.2 as usize > PART_BYTES).count();
        let parts = (PARTS_IN_FLIGHT / large.clamp(1, concurrency)).max(2);
        let pb = &self.options.progress;
        pb.start("push", Unit::Bytes, Some(total));
        let uploaded = self.rt.block_on(async {
            futures::stream::iter(to_send.iter().map(|(src, rel, bytes, checksum)| {
                self.upload(src, rel, *bytes, checksum, parts, pb)
            }))
            .buffer_unordered(self.options.concurrency.max(1))
            .try_fold(0u64, |n, _| async move { Ok(n + 1) })
            .await
        });
        pb.finish(uploaded.is_ok());
        let files_uploaded = uploaded?;
        if let Some(root) = &self.local_root {
            for (_, rel, _, _) in &to_send {
                let p = root.join(rel);
                File::open(&p).and_then(|f| f.sync_all()).at(&p)?;
            }
            manifest::sync_dir(&root.join(format::SEGMENTS_DIR))?;
            let dicts = root.join(format::DICTIONARIES_DIR);
            if dicts.is_dir() {
                manifest::sync_dir(&dicts)?;
            }
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
                    return Err(Error::Conflict {
                        dataset: self.url.clone(),
                        kind: ConflictKind::VersionTaken {
                            version: target.version,
                        },
                        reason: format!(
                            "another writer committed version {} while this push ran; the remote \
                             keeps its version (the files this push uploaded are unused). Pull \
                             it, or push to another prefix",
                            target.version
                        ),
                    });
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
        pb: &ProgressSink,
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
                    crate::store::ipc::checksum_string(crc)
                ),
            )
        };
        if bytes as usize <= PART_BYTES {
            let mut buf = Vec::with_capacity(bytes as usize);
            file.read_to_end(&mut buf).at(src)?;
            crc = crc32c::crc32c(&buf);
            seen = buf.len() as u64;
            if seen != bytes || crate::store::ipc::checksum_string(crc) != checksum {
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
            pb.advance(bytes);
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
            pb.advance(n as u64);
        }
        if seen != bytes || crate::store::ipc::checksum_string(crc) != checksum {
            let _ = writer.abort().await;
            return Err(bad(seen, crc));
        }
        writer
            .finish()
            .await
            .map_err(|e| remote_err(&self.url_of(rel), e))?;
        Ok(())
    }
}

/// Rewrites a segment entry's paths to the content-addressed names used in stores and mirrors.
pub(crate) fn canonical_paths(s: &mut SegmentEntry) -> Result<()> {
    let hex = |c: &str| -> Result<String> {
        match c.strip_prefix("crc32c:") {
            Some(h) if h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Ok(h.to_ascii_lowercase())
            }
            _ => Err(Error::invalid_data(format!(
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
pub(crate) fn same_content(a: &Manifest, b: &Manifest) -> bool {
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

/// Whether `local` is the schema `remote` or the same schema with the dictionaries that a
/// frame column gets at its first commit with frames (a version without rows has none).
fn extends_schema(remote: &[ColumnDesc], local: &[ColumnDesc]) -> bool {
    remote.len() == local.len()
        && remote.iter().zip(local).all(|(r, l)| {
            let mut r = r.clone();
            if let (Some(rf), Some(lf)) = (&mut r.frame, &l.frame)
                && rf.dictionary.is_none()
            {
                rf.dictionary.clone_from(&lf.dictionary);
            }
            r == *l
        })
}

/// A push must extend the remote's newest version: same schema, a newer version, and every
/// remote segment the local dataset still keeps present with the same content.
pub(crate) fn check_fast_forward(
    url: &str,
    local_path: &Path,
    r: &Manifest,
    l: &Manifest,
) -> Result<()> {
    if !extends_schema(&r.columns, &l.columns) {
        return Err(Error::schema_mismatch(format!(
            "{url} has a different schema from {}",
            local_path.display()
        )));
    }
    let diverged = |why: String| {
        Err(Error::Conflict {
            dataset: url.to_string(),
            kind: ConflictKind::Diverged {
                remote: r.version,
                local: l.version,
            },
            reason: format!(
                "its version {} is not an ancestor of {} (version {}): {why}. Push to another \
                 prefix, or pull the remote and append to that",
                r.version,
                local_path.display(),
                l.version
            ),
        })
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
