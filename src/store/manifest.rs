//! Manifests: one immutable JSON file per committed version, published atomically.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::format::{self, FORMAT_NAME, FORMAT_VERSION};
use crate::schema::ColumnDesc;

/// One segment as listed in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    /// Segment id (unique within the dataset, increasing in write order).
    pub id: u64,
    /// Path of the transition file, relative to the dataset root.
    pub path: String,
    /// Path of the episode table, relative to the dataset root.
    pub episodes_path: String,
    /// Number of transitions.
    pub rows: u64,
    /// Number of episodes.
    pub episodes: u64,
    /// Id of the segment's first episode; its episodes are `first_episode_id..+episodes`.
    pub first_episode_id: u64,
    /// Position of the segment's first transition in the dataset's whole history (stable across
    /// retention, which drops the oldest segments).
    pub first_row: u64,
    /// Size of the transition file.
    pub bytes: u64,
    /// Checksum of the transition file (`crc32c:` + 8 hex digits).
    pub checksum: String,
    /// Size of the episode table.
    pub episodes_bytes: u64,
    /// Checksum of the episode table.
    pub episodes_checksum: String,
}

/// A committed version of a dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `"trajstore"`.
    pub format: String,
    /// On-disk format version.
    pub format_version: u32,
    /// This manifest's version (its file name).
    pub version: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The transition schema.
    pub columns: Vec<ColumnDesc>,
    /// Total transitions over all segments.
    pub transitions: u64,
    /// Total episodes over all segments.
    pub episodes: u64,
    /// Id the next appended episode gets.
    pub next_episode_id: u64,
    /// Id the next segment gets.
    pub next_segment_id: u64,
    /// Absolute row position the next appended transition gets.
    pub next_row: u64,
    /// Segments in episode order.
    pub segments: Vec<SegmentEntry>,
    /// Free-form dataset properties (source, ingest options, ...).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// Path of the manifest directory.
pub fn versions_dir(root: &Path) -> PathBuf {
    root.join(format::VERSIONS_DIR)
}

/// Committed versions present on disk, ascending. Temporary files are ignored.
pub fn list_versions(root: &Path) -> Result<Vec<u64>> {
    let dir = versions_dir(root);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).at(&dir)? {
        let entry = entry.at(&dir)?;
        if let Some(v) = entry
            .file_name()
            .to_str()
            .and_then(format::parse_manifest_name)
        {
            out.push(v);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The largest manifest read (a million segments take ~300 MB... at 256 MiB segments that is
/// 256 TB of transitions): anything bigger is not a manifest trajstore wrote.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// Reads and validates version `v`. Only a regular file of at most [`MAX_MANIFEST_BYTES`] is
/// read (a manifest replaced by a device or a huge file is [`Error::Corrupt`], not an
/// unbounded read).
pub fn read(root: &Path, v: u64) -> Result<Manifest> {
    use std::io::Read;
    let path = versions_dir(root).join(format::manifest_name(v));
    let file = std::fs::File::open(&path).at(&path)?;
    let meta = file.metadata().at(&path)?;
    if !meta.is_file() {
        return Err(Error::corrupt(&path, "is not a regular file"));
    }
    if meta.len() > MAX_MANIFEST_BYTES {
        return Err(Error::corrupt(
            &path,
            format!(
                "has {} bytes, more than any manifest ({} at most)",
                meta.len(),
                format::human_bytes(MAX_MANIFEST_BYTES)
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .at(&path)?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(Error::corrupt(
            &path,
            "grew past the manifest size limit while read",
        ));
    }
    let m: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| Error::corrupt(&path, format!("invalid manifest JSON: {e}")))?;
    m.validate(&path, v)?;
    Ok(m)
}

/// Reads the newest committed version. When its manifest is damaged the error says so and names
/// the newest version that is still readable (older versions never depend on newer manifests).
pub fn read_latest(root: &Path) -> Result<Manifest> {
    let versions = list_versions(root)?;
    let v = *versions.last().ok_or_else(|| {
        Error::corrupt(
            versions_dir(root),
            "no committed manifest (not a trajstore dataset?)",
        )
    })?;
    match read(root, v) {
        Err(Error::Corrupt { path, reason }) => {
            let readable = versions[..versions.len() - 1]
                .iter()
                .rev()
                .find(|&&old| read(root, old).is_ok());
            let hint = match readable {
                Some(old) => format!(
                    "; the newest readable version is {old} (open it with --version {old} / \
                     snapshot_at({old}))"
                ),
                None => "; no older version is readable".to_string(),
            };
            Err(Error::Corrupt {
                path,
                reason: format!("{reason} (the newest version, {v}){hint}"),
            })
        }
        other => other,
    }
}

/// The newest version whose manifest reads and validates, with the damaged newer ones skipped.
pub fn newest_readable(root: &Path) -> Result<Option<u64>> {
    Ok(list_versions(root)?
        .into_iter()
        .rev()
        .find(|&v| read(root, v).is_ok()))
}

fn check_relative(path: &Path, p: &str, what: &str) -> Result<()> {
    let rel = Path::new(p);
    let ok = rel.components().all(|c| matches!(c, Component::Normal(_)))
        && rel.starts_with(format::SEGMENTS_DIR)
        && !p.contains('\\');
    if ok {
        Ok(())
    } else {
        Err(Error::corrupt(
            path,
            format!(
                "{what} path `{p}` must be relative, inside `{}/`, without `..`",
                format::SEGMENTS_DIR
            ),
        ))
    }
}

impl Manifest {
    /// Bytes of all segment files and episode tables.
    pub fn bytes_on_disk(&self) -> u64 {
        self.segments
            .iter()
            .map(|s| s.bytes + s.episodes_bytes)
            .sum()
    }

    /// Checks format, version, paths and that counts add up.
    pub fn validate(&self, path: &Path, expected_version: u64) -> Result<()> {
        if self.format != FORMAT_NAME || self.format_version != FORMAT_VERSION {
            return Err(Error::IncompatibleFormat {
                found: format!(
                    "{} v{} in {}",
                    self.format,
                    self.format_version,
                    path.display()
                ),
                supported: format!("{FORMAT_NAME} v{FORMAT_VERSION}"),
            });
        }
        let bad = |r: String| Err(Error::corrupt(path, r));
        if self.version != expected_version {
            return bad(format!(
                "file is version {expected_version} but says {}",
                self.version
            ));
        }
        let (mut rows, mut episodes) = (0u64, 0u64);
        let mut prev: Option<&SegmentEntry> = None;
        for s in &self.segments {
            check_relative(path, &s.path, "segment")?;
            check_relative(path, &s.episodes_path, "episode table")?;
            if s.rows == 0 || s.episodes == 0 || s.episodes > s.rows {
                return bad(format!(
                    "segment {} has {} rows and {} episodes",
                    s.id, s.rows, s.episodes
                ));
            }
            if let Some(p) = prev
                && (s.id <= p.id
                    || Some(s.first_episode_id) != p.first_episode_id.checked_add(p.episodes)
                    || Some(s.first_row) != p.first_row.checked_add(p.rows))
            {
                return bad(format!(
                    "segment {} does not continue segment {}",
                    s.id, p.id
                ));
            }
            let (Some(r), Some(e)) = (rows.checked_add(s.rows), episodes.checked_add(s.episodes))
            else {
                return bad(format!("segment {} overflows the counts", s.id));
            };
            (rows, episodes) = (r, e);
            prev = Some(s);
        }
        if rows != self.transitions || episodes != self.episodes {
            return bad(format!(
                "segments hold {rows} transitions and {episodes} episodes, header says {} and {}",
                self.transitions, self.episodes
            ));
        }
        if let Some(last) = self.segments.last()
            && (last.first_episode_id.checked_add(last.episodes) != Some(self.next_episode_id)
                || last.first_row.checked_add(last.rows) != Some(self.next_row)
                || last.id >= self.next_segment_id)
        {
            return bad(
                "next_episode_id/next_row/next_segment_id disagree with the last segment".into(),
            );
        }
        Ok(())
    }

    /// Writes this manifest as version `self.version`: temporary file, fsync, rename, fsync of
    /// the directory. Either the whole new version becomes visible or none of it does.
    pub fn publish(&self, root: &Path) -> Result<()> {
        let dir = versions_dir(root);
        let path = dir.join(format::manifest_name(self.version));
        if path.exists() {
            return Err(Error::Conflict {
                dataset: root.display().to_string(),
                kind: crate::error::ConflictKind::VersionTaken {
                    version: self.version,
                },
                reason: format!(
                    "version {} already exists at {}; another writer committed it",
                    self.version,
                    path.display()
                ),
            });
        }
        let tmp = crate::format::tmp_path(&path);
        let json = serde_json::to_vec_pretty(self).expect("manifest serializes");
        let mut f = File::create(&tmp).at(&tmp)?;
        f.write_all(&json).at(&tmp)?;
        f.sync_all().at(&tmp)?;
        drop(f);
        crate::fault::point("manifest-before-rename");
        std::fs::rename(&tmp, &path).at(&path)?;
        sync_dir(&dir)?;
        crate::fault::point("manifest-after-rename");
        Ok(())
    }
}

/// fsyncs a directory so that renames inside it are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            format: FORMAT_NAME.into(),
            format_version: FORMAT_VERSION,
            version: 3,
            created_unix_ms: 0,
            columns: vec![],
            transitions: 10,
            episodes: 2,
            next_episode_id: 2,
            next_segment_id: 1,
            next_row: 10,
            segments: vec![SegmentEntry {
                id: 0,
                path: "segments/00000000000000000000.arrow".into(),
                episodes_path: "segments/00000000000000000000.episodes.arrow".into(),
                rows: 10,
                episodes: 2,
                first_episode_id: 0,
                first_row: 0,
                bytes: 1,
                checksum: "crc32c:00000000".into(),
                episodes_bytes: 1,
                episodes_checksum: "crc32c:00000000".into(),
            }],
            properties: Default::default(),
        }
    }

    #[test]
    fn rejects_escaping_paths_and_bad_counts() {
        let p = Path::new("m.json");
        assert!(manifest().validate(p, 3).is_ok());
        for bad in [
            "../etc/passwd",
            "/etc/passwd",
            "segments/../../x",
            "other/x.arrow",
        ] {
            let mut m = manifest();
            m.segments[0].path = bad.into();
            let err = m.validate(p, 3).unwrap_err().to_string();
            assert!(err.contains("must be relative"), "{bad}: {err}");
        }
        let mut m = manifest();
        m.transitions = 11;
        assert!(m.validate(p, 3).is_err());
        assert!(manifest().validate(p, 4).is_err());
        let mut m = manifest();
        m.format_version = 2;
        assert!(matches!(
            m.validate(p, 3),
            Err(Error::IncompatibleFormat { .. })
        ));
    }

    #[test]
    fn publish_is_atomic_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(versions_dir(dir.path())).unwrap();
        let m = manifest();
        m.publish(dir.path()).unwrap();
        assert_eq!(list_versions(dir.path()).unwrap(), vec![3]);
        assert_eq!(read_latest(dir.path()).unwrap(), m);
        assert!(m.publish(dir.path()).is_err());
        // A leftover temporary manifest is not a version.
        std::fs::write(
            versions_dir(dir.path()).join("00000000000000000004.json.tmp"),
            b"{",
        )
        .unwrap();
        assert_eq!(list_versions(dir.path()).unwrap(), vec![3]);
        std::fs::write(
            versions_dir(dir.path()).join("00000000000000000005.json"),
            b"{",
        )
        .unwrap();
        assert!(matches!(
            read_latest(dir.path()),
            Err(Error::Corrupt { .. })
        ));
    }
}
