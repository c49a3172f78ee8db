//! What writers remove: `vacuum` (versions older than the kept ones, then the segment files no
//! remaining version uses) and, when a writer opens, the leftovers of a writer that crashed
//! (temporary files, segments no commit published).

use std::path::Path;

use crate::error::{Error, IoContext, Result};
use crate::format::{self, episodes_path, segment_path};
use crate::store::manifest;

use super::VacuumReport;

/// Removes, under the writer lock the caller holds, the manifests of versions older than the
/// newest `keep` that were replaced at least `grace` ago, then the segment files no remaining
/// manifest uses. Files of uncommitted segments (`id >= next_segment_id`) are not touched. A
/// manifest that cannot be read stops the file removal (its references are unknown).
pub(crate) fn vacuum_locked(
    root: &Path,
    keep: usize,
    grace: std::time::Duration,
    next_segment_id: u64,
) -> Result<VacuumReport> {
    let versions = manifest::list_versions(root)?;
    let cut = versions.len().saturating_sub(keep.max(1));
    let now = manifest::now_ms();
    // Saturating: a grace of u64::MAX ms or more means "never", not a wrapped few ms.
    let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
    let mut report = VacuumReport::default();
    for i in 0..cut {
        // A version is replaced when the next one is created.
        let replaced_at = manifest::read(root, versions[i + 1]).map(|m| m.created_unix_ms);
        match replaced_at {
            Ok(t) if now.saturating_sub(t) >= grace_ms => report.versions_removed.push(versions[i]),
            _ => report.versions_in_grace.push(versions[i]),
        }
    }
    let mut referenced = std::collections::HashSet::new();
    for &v in versions
        .iter()
        .filter(|v| !report.versions_removed.contains(v))
    {
        match manifest::read(root, v) {
            Ok(m) => referenced.extend(m.segments.iter().map(|s| s.id)),
            Err(e) => return Err(e),
        }
    }
    let dir = manifest::versions_dir(root);
    for &v in &report.versions_removed {
        let p = dir.join(format::manifest_name(v));
        std::fs::remove_file(&p).at(&p)?;
    }
    for id in segment_files(root)? {
        if !referenced.contains(&id) && id < next_segment_id {
            for rel in [segment_path(id), episodes_path(id)] {
                let p = root.join(rel);
                if let Ok(md) = std::fs::metadata(&p) {
                    report.bytes_removed += md.len();
                    report.files_removed += 1;
                }
            }
            remove_segment(root, id)?;
        }
    }
    Ok(report)
}

/// Ids of the segment files present in `segments/`.
pub(super) fn segment_files(root: &Path) -> Result<Vec<u64>> {
    let dir = root.join(format::SEGMENTS_DIR);
    let mut ids = vec![];
    for entry in std::fs::read_dir(&dir).at(&dir)? {
        let name = entry.at(&dir)?.file_name();
        let Some(name) = name.to_str() else { continue };
        let stem = name
            .strip_suffix(format::EPISODES_SUFFIX)
            .or_else(|| name.strip_suffix(format::SEGMENT_SUFFIX));
        if let Some(stem) = stem
            && stem.len() == format::ID_DIGITS
            && let Ok(id) = stem.parse()
        {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

fn remove_segment(root: &Path, id: u64) -> Result<()> {
    for rel in [segment_path(id), episodes_path(id)] {
        let p = root.join(rel);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&p, e)),
        }
    }
    Ok(())
}

/// Removes what a crashed writer left: temporary files and segments no commit published.
pub(super) fn remove_leftovers(root: &Path, next_segment_id: u64) -> Result<()> {
    for dir in [
        root.join(format::SEGMENTS_DIR),
        manifest::versions_dir(root),
    ] {
        for entry in std::fs::read_dir(&dir).at(&dir)? {
            let path = entry.at(&dir)?.path();
            if path
                .to_str()
                .is_some_and(|p| p.ends_with(format::TMP_SUFFIX))
            {
                std::fs::remove_file(&path).at(&path)?;
            }
        }
    }
    for id in segment_files(root)? {
        if id >= next_segment_id {
            remove_segment(root, id)?;
        }
    }
    Ok(())
}
