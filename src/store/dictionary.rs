//! The zstd dictionaries of frame columns on disk: `dictionaries/<crc32c>.zdict`, written
//! crash-safely like segments (temporary name, fsync, rename, directory fsync), named by their
//! CRC-32C so that a name is its content, referenced by the manifest's column (size and
//! checksum), checked when a snapshot opens, and removed only when no version references them.

use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, IoContext, Result};
use crate::format::{self, DICTIONARIES_DIR, DICTIONARY_SUFFIX};
use crate::frames::{DictionaryRef, FrameCodec, FrameColumn, check_dictionary};
use crate::schema::{ColumnDesc, TransitionSchema};
use crate::store::ipc::checksum_string;
use crate::store::manifest::sync_dir;

/// Writes `bytes` as the dictionary `dictionaries/<crc32c>.zdict` under `root` (temporary name,
/// fsync, rename, fsync of the directory) and returns its reference. A file of that name with
/// the same bytes is reused; one with other bytes (a CRC collision or damage) is an error.
pub fn write_dictionary(root: &Path, bytes: &[u8]) -> Result<DictionaryRef> {
    let crc = crc32c::crc32c(bytes);
    let rel = format::dictionary_path(crc);
    let path = root.join(&rel);
    let dir = root.join(DICTIONARIES_DIR);
    std::fs::create_dir_all(&dir).at(&dir)?;
    let reference = DictionaryRef {
        path: rel,
        bytes: bytes.len() as u64,
        checksum: checksum_string(crc),
    };
    match std::fs::read(&path) {
        Ok(old) if old == bytes => return Ok(reference),
        Ok(_) => {
            return Err(Error::corrupt(
                &path,
                "a dictionary file of this name holds other bytes",
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(&path, e)),
    }
    let tmp = format::tmp_path(&path);
    let mut f = std::fs::File::create(&tmp).at(&tmp)?;
    f.write_all(bytes).at(&tmp)?;
    f.sync_all().at(&tmp)?;
    drop(f);
    std::fs::rename(&tmp, &path).at(&path)?;
    sync_dir(&dir)?;
    sync_dir(root)?;
    Ok(reference)
}

/// The dictionaries a manifest's columns reference (at most one per frame column), in column
/// order: what a push uploads, a pull or a catalog fetch downloads, and a mirror keeps.
pub fn referenced(columns: &[ColumnDesc]) -> Vec<&DictionaryRef> {
    columns
        .iter()
        .filter_map(|c| c.frame.as_ref()?.dictionary.as_ref())
        .collect()
}

/// Checks that a reference's path is a plain relative path `dictionaries/<name>.zdict` (a
/// manifest, local or fetched from a store, must never name a file elsewhere).
/// [`Error::Corrupt`] naming `manifest` (a path or URL) otherwise.
pub fn check_path(manifest: impl AsRef<Path>, r: &DictionaryRef) -> Result<()> {
    let p = Path::new(&r.path);
    let plain = p.components().all(|c| matches!(c, Component::Normal(_)))
        && !r.path.contains('\\')
        && p.starts_with(DICTIONARIES_DIR)
        && p.components().count() == 2
        && r.path.ends_with(DICTIONARY_SUFFIX);
    if !plain {
        return Err(Error::corrupt(
            manifest,
            format!(
                "dictionary path `{}` is not inside {DICTIONARIES_DIR}/",
                r.path
            ),
        ));
    }
    Ok(())
}

/// The dictionary file a reference names, after checking that its path is a plain relative
/// path inside `dictionaries/`.
fn dictionary_file(root: &Path, manifest: &Path, r: &DictionaryRef) -> Result<PathBuf> {
    check_path(manifest, r)?;
    Ok(root.join(&r.path))
}

/// Reads the dictionary `r` names and checks it: size, CRC-32C, and that zstd accepts it. Any
/// failure is [`Error::Corrupt`] naming the dictionary file (a missing file too: a version
/// references it).
pub fn read_dictionary(root: &Path, manifest: &Path, r: &DictionaryRef) -> Result<Arc<[u8]>> {
    let path = dictionary_file(root, manifest, r)?;
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::corrupt(
                &path,
                "the dictionary a version references is missing",
            ));
        }
        Err(e) => return Err(Error::io(&path, e)),
    };
    let bad = |why: String| Err(Error::corrupt(&path, why));
    if bytes.len() as u64 != r.bytes {
        return bad(format!("{} bytes, manifest says {}", bytes.len(), r.bytes));
    }
    let sum = checksum_string(crc32c::crc32c(&bytes));
    if sum != r.checksum {
        return bad(format!("checksum {sum}, manifest says {}", r.checksum));
    }
    if let Err(why) = check_dictionary(&bytes) {
        return bad(why);
    }
    Ok(bytes.into())
}

/// The frame columns of `schema` (the observation, when it is one, then user frame columns), with their dictionaries
/// read and checked. `manifest` is the manifest's path, for errors.
pub fn frame_columns(
    root: &Path,
    manifest: &Path,
    schema: &TransitionSchema,
) -> Result<Vec<Arc<FrameColumn>>> {
    schema
        .frame_columns()
        .into_iter()
        .map(|(name, spec)| {
            let dictionary = match (&spec.dictionary, spec.codec) {
                (Some(r), FrameCodec::ZstdDict) => Some(read_dictionary(root, manifest, r)?),
                _ => None,
            };
            Ok(Arc::new(FrameColumn {
                name: name.to_string(),
                spec: spec.clone(),
                dictionary,
            }))
        })
        .collect()
}

/// Removes temporary dictionary files and the dictionaries `keep` does not reference (what a
/// writer that never committed left). Called by a writer under the lock with the newest
/// version's references: a frame column's dictionary, once set, is carried into every later
/// version, so the newest version references every dictionary any version does.
pub(crate) fn remove_unreferenced(root: &Path, keep: &[&DictionaryRef]) -> Result<()> {
    let dir = root.join(DICTIONARIES_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(&dir, e)),
    };
    for entry in entries {
        let entry = entry.at(&dir)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let rel = format!("{DICTIONARIES_DIR}/{name}");
        let tmp = name.ends_with(format::TMP_SUFFIX);
        let ours = name.ends_with(DICTIONARY_SUFFIX);
        if tmp || (ours && !keep.iter().any(|k| k.path == rel)) {
            let p = entry.path();
            std::fs::remove_file(&p).at(&p)?;
        }
    }
    Ok(())
}
