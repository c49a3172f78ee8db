//! The dataset an ingest writes to, and its removal when an ingest that created it fails before
//! its first commit.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::schema::TransitionSchema;
use crate::store::Dataset;
use crate::store::writer::WriterOptions;

/// The dataset an ingest writes to: opened, or created (and then removed again if the ingest
/// fails before committing anything).
pub(crate) struct Target {
    pub(crate) ds: Dataset,
    path: PathBuf,
    pub(crate) created: bool,
    existed: bool,
}

impl Target {
    /// `frame_level`: the zstd level of the frame columns of a dataset this creates; where the
    /// dataset exists, its frame columns must have been created at that level (an append
    /// compresses at the level the dataset records). Either way the dataset must have a frame
    /// column, and the level must be 1 to 22.
    pub(crate) fn open(
        dataset: &Path,
        schema: &TransitionSchema,
        frame_level: Option<i32>,
    ) -> Result<Self> {
        if let Some(level) = frame_level {
            crate::frames::check_level(level)?;
        }
        let existed = dataset.exists();
        let fresh = !existed || is_empty_dir(dataset)?;
        let (ds, created) = if fresh {
            let schema = match frame_level {
                Some(level) => {
                    check_frame_level(schema, level, false)?;
                    schema.with_frame_level(level)?
                }
                None => schema.clone(),
            };
            // A failed create removes only what it wrote itself, under the dataset's lock.
            (Dataset::create(dataset, &schema)?, true)
        } else {
            if !dataset.is_dir() {
                return Err(Error::argument(
                    "dataset",
                    format!(
                        "{} exists and is not a dataset directory",
                        dataset.display()
                    ),
                ));
            }
            let ds = Dataset::open(dataset)?;
            if let Some(level) = frame_level {
                let stored = TransitionSchema::from_columns(&ds.latest_manifest()?.columns)?;
                check_frame_level(&stored, level, true)?;
            }
            (ds, false)
        };
        Ok(Target {
            ds,
            path: dataset.to_path_buf(),
            created,
            existed,
        })
    }

    /// Removes the dataset if this ingest created it.
    pub(crate) fn discard(&self) {
        if self.created {
            remove_created(&self.path, self.existed);
        }
    }
}

/// Removes a dataset this ingest created and never committed to, under its lock (waited for as
/// a writer does: a child another thread spawned holds a dropped writer's lock until it execs),
/// only while it holds nothing but its empty version 1. Best effort: the ingest's error stands.
fn remove_created(dataset: &Path, existed_empty: bool) {
    let wait = WriterOptions::default().lock_wait;
    let Ok(lock) = crate::store::writer::lock_dataset(dataset, wait) else {
        return;
    };
    let untouched = crate::store::manifest::list_versions(dataset).is_ok_and(|v| v == [1])
        && crate::store::manifest::read(dataset, 1).is_ok_and(|m| m.segments.is_empty());
    if !untouched {
        return;
    }
    let _ = std::fs::remove_dir_all(dataset);
    if existed_empty {
        let _ = std::fs::create_dir(dataset);
    }
    drop(lock);
}

/// A `frame_level` needs a frame column of `schema` to apply to; on an append (`existing`) the
/// dataset's frame columns must be at that level, since the writer compresses at the level the
/// dataset records.
fn check_frame_level(schema: &TransitionSchema, level: i32, existing: bool) -> Result<()> {
    let columns = schema.frame_columns();
    if columns.is_empty() {
        return Err(Error::argument(
            "frame_level",
            "the dataset has no frame column (no uint8 image observations, or images kept as \
             tensors with keep_tensor / --keep-tensor): a zstd level applies to frame columns",
        ));
    }
    match columns
        .into_iter()
        .find(|(_, spec)| existing && spec.level != level)
    {
        Some((name, spec)) => Err(Error::argument(
            "frame_level",
            format!(
                "the dataset's frame column `{name}` is compressed at zstd level {} (set when \
                 the dataset was created; appends use it): leave the level out, or ingest into a \
                 new dataset",
                spec.level
            ),
        )),
        None => Ok(()),
    }
}

fn is_empty_dir(path: &Path) -> Result<bool> {
    if !path.is_dir() {
        return Ok(false);
    }
    let mut entries = std::fs::read_dir(path).map_err(|e| Error::io(path, e))?;
    Ok(entries.next().is_none())
}
