//! Datasets on disk: creating and opening them, snapshots of one committed version, segments.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;

use arrow::array::{Array, RecordBatch};

use crate::error::{Error, IoContext, Result};
use crate::format::{self};
use crate::frames::FrameColumn;
use crate::index::EpisodeIndex;
use crate::index::{BoundaryPolicy, SliceIndex};
use crate::schema::TransitionSchema;
use crate::store::episode::EpisodeTable;
use crate::store::episode::open_episode_table;
use crate::store::ipc::tail_cached;
use crate::store::manifest::{self, Manifest};
use crate::store::segment::Segment;
use crate::store::writer::{DatasetWriter, WriterOptions};

/// The trajstore dataset directory `path` is in (or is), if any: `path` (which need not exist)
/// is resolved through symbolic links, then it and each of its ancestors is checked for a
/// dataset's `_versions` directory.
pub fn dataset_containing(path: &Path) -> Option<PathBuf> {
    // The longest existing prefix, canonicalised, plus the components that do not exist yet.
    let mut rest = Vec::new();
    let mut p = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(path)
    };
    let base = loop {
        match p.canonicalize() {
            Ok(c) => break c,
            Err(_) => {
                rest.push(p.file_name()?.to_owned());
                p = p.parent()?.to_path_buf();
            }
        }
    };
    let mut full = base;
    full.extend(rest.iter().rev());
    full.ancestors()
        .find(|a| manifest::versions_dir(a).is_dir())
        .map(Path::to_path_buf)
}

/// Refuses an output file (`argument`, e.g. `--output`) inside a dataset directory: writing it
/// could replace a committed segment or manifest, or leave a stray file that a vacuum removes.
pub fn check_output_path(argument: &str, path: &Path) -> Result<()> {
    match dataset_containing(path) {
        Some(ds) => Err(Error::argument(
            argument,
            format!(
                "{} is inside the dataset {}: an output file must not be written into a \
                 dataset directory (it could replace a committed file); write it elsewhere",
                path.display(),
                ds.display()
            ),
        )),
        None => Ok(()),
    }
}

/// The accessors of what a [`Catalog`] and a [`Snapshot`] both describe: one committed version,
/// from its manifest (fields `root`, `manifest`, `schema`).
macro_rules! version_accessors {
    () => {
        /// The dataset directory (for a dataset named by URL, its mirror).
        pub fn path(&self) -> &Path {
            &self.root
        }
        /// The version described.
        pub fn version(&self) -> u64 {
            self.manifest.version
        }
        /// The manifest.
        pub fn manifest(&self) -> &Manifest {
            &self.manifest
        }
        /// The transition schema.
        pub fn schema(&self) -> &TransitionSchema {
            &self.schema
        }
        /// Total transitions.
        pub fn num_transitions(&self) -> u64 {
            self.manifest.transitions
        }
        /// Total episodes.
        pub fn num_episodes(&self) -> u64 {
            self.manifest.episodes
        }
        /// Bytes of all segment files and episode tables.
        pub fn bytes_on_disk(&self) -> u64 {
            self.manifest.bytes_on_disk()
        }
    };
}

/// A dataset directory. Cheap handle: it holds the path only; [`Dataset::snapshot`] reads.
#[derive(Debug, Clone)]
pub struct Dataset {
    root: PathBuf,
}

impl Dataset {
    /// Creates an empty dataset at `path` (which must not exist, or be an empty directory) and
    /// commits version 1 with `schema` and no transitions.
    ///
    /// Creation is atomic with respect to other writers: the directory's writer lock is taken
    /// first, then the layout is written under it. Of two processes creating the same dataset,
    /// one creates it and the other gets [`Error::Locked`] or an "already exists" error, and
    /// neither removes anything the other wrote.
    pub fn create(path: impl AsRef<Path>, schema: &TransitionSchema) -> Result<Self> {
        let root = path.as_ref().to_path_buf();
        if root.exists() && !root.is_dir() {
            return Err(Error::argument(
                "path",
                format!("{} exists and is not a directory", root.display()),
            ));
        }
        std::fs::create_dir_all(&root).at(&root)?;
        let _lock = crate::store::writer::lock_dataset(&root, std::time::Duration::ZERO)?;
        // Under the lock: only the lock file may be there.
        for entry in std::fs::read_dir(&root).at(&root)? {
            if entry.at(&root)?.file_name() != format::LOCK_FILE {
                let what = if root.join(format::VERSIONS_DIR).is_dir() {
                    "is already a trajstore dataset"
                } else {
                    "already exists and is not empty"
                };
                return Err(Error::argument(
                    "path",
                    format!("{} {what}", root.display()),
                ));
            }
        }
        let layout = || -> Result<()> {
            std::fs::create_dir_all(root.join(format::SEGMENTS_DIR)).at(&root)?;
            std::fs::create_dir_all(manifest::versions_dir(&root)).at(&root)?;
            let m = Manifest {
                format: format::FORMAT_NAME.into(),
                format_version: format::FORMAT_VERSION,
                version: 1,
                created_unix_ms: manifest::now_ms(),
                columns: schema.to_columns(),
                transitions: 0,
                episodes: 0,
                next_episode_id: 0,
                next_segment_id: 0,
                next_row: 0,
                segments: vec![],
                // An id that tells this dataset from any other (loader states check it).
                properties: [(
                    crate::format::DATASET_ID_PROPERTY.to_string(),
                    format!("{:032x}", rand::random::<u128>()),
                )]
                .into(),
            };
            if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
                manifest::sync_dir(parent)?;
            }
            manifest::sync_dir(&root)?;
            m.publish(&root)
        };
        if let Err(e) = layout() {
            // Only what this call wrote, under its lock (disk full, permissions): best effort.
            let _ = std::fs::remove_dir_all(manifest::versions_dir(&root));
            let _ = std::fs::remove_dir_all(root.join(format::SEGMENTS_DIR));
            return Err(e);
        }
        Ok(Dataset { root })
    }

    /// Opens an existing dataset: checks that it has at least one committed version. Manifests
    /// are read when a version is: a damaged newest manifest leaves every older version readable
    /// through [`Dataset::snapshot_at`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let root = path.as_ref().to_path_buf();
        // `metadata`, not `is_dir`: a directory the user may not enter (or whose parent they may
        // not) is "permission denied" with its path, as the OS says, not "not found".
        let meta = std::fs::metadata(&root).at(&root)?;
        if !meta.is_dir() {
            return Err(Error::argument(
                "path",
                format!(
                    "{} is a file, not a trajstore dataset directory",
                    root.display()
                ),
            ));
        }
        let versions = manifest::versions_dir(&root);
        let has_versions = match std::fs::metadata(&versions) {
            Ok(m) => m.is_dir(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            // Denied inside `root`: the user may not enter the dataset directory.
            Err(e) => return Err(Error::io(&root, e)),
        };
        if !has_versions {
            return Err(Error::argument(
                "path",
                format!(
                    "{} exists but is not a trajstore dataset (it has no `{}` directory)",
                    root.display(),
                    format::VERSIONS_DIR
                ),
            ));
        }
        if manifest::list_versions(&root)?.is_empty() {
            return Err(Error::corrupt(
                manifest::versions_dir(&root),
                "no committed manifest (an interrupted create?)",
            ));
        }
        Ok(Dataset { root })
    }

    /// The dataset directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Committed versions, ascending.
    pub fn versions(&self) -> Result<Vec<u64>> {
        manifest::list_versions(&self.root)
    }

    /// The newest committed manifest.
    pub fn latest_manifest(&self) -> Result<Manifest> {
        manifest::read_latest(&self.root)
    }

    /// A snapshot of the newest committed version: maps every segment (zero-copy) and builds the
    /// episode index. Cost O(segments + episodes); transitions are not read.
    pub fn snapshot(&self) -> Result<Snapshot> {
        Snapshot::load(&self.root, manifest::read_latest(&self.root)?, None)
    }

    /// A snapshot of version `version`.
    pub fn snapshot_at(&self, version: u64) -> Result<Snapshot> {
        Snapshot::load(&self.root, manifest::read(&self.root, version)?, None)
    }

    /// The [`Catalog`] of the newest committed version: its manifest and episode tables only
    /// (no transition file is opened). O(episodes).
    pub fn catalog(&self) -> Result<Catalog> {
        Catalog::load(&self.root, manifest::read_latest(&self.root)?)
    }

    /// The [`Catalog`] of version `version`.
    pub fn catalog_at(&self, version: u64) -> Result<Catalog> {
        Catalog::load(&self.root, manifest::read(&self.root, version)?)
    }

    /// Removes the versions older than the newest `keep_versions` that were replaced at least
    /// `older_than` ago, and the segment files no remaining version uses, like Delta's VACUUM
    /// or Lance's `cleanup_old_versions`. Takes the writer lock (waiting as a writer does). A
    /// reader that opened a removed version keeps reading it (its files stay mapped); opening it
    /// afterwards is [`Error::NotFound`].
    pub fn vacuum(
        &self,
        keep_versions: usize,
        older_than: std::time::Duration,
    ) -> Result<crate::store::VacuumReport> {
        self.writer(WriterOptions::default())?
            .vacuum(keep_versions, older_than)
    }

    /// Takes the single-writer lock and returns a writer that appends after the newest version.
    /// Fails with [`Error::Locked`] if another writer (in any process) holds it.
    pub fn writer(&self, options: WriterOptions) -> Result<DatasetWriter> {
        DatasetWriter::open(&self.root, options)
    }
}

/// The transition schema a manifest declares.
fn manifest_schema(root: &Path, manifest: &Manifest) -> Result<TransitionSchema> {
    TransitionSchema::from_columns(&manifest.columns).map_err(|e| {
        Error::corrupt(
            manifest::versions_dir(root).join(format::manifest_name(manifest.version)),
            format!("invalid schema: {e}"),
        )
    })
}

/// The frame columns of `manifest`'s schema with their dictionaries, read and checked (a bad
/// dictionary is [`Error::Corrupt`] naming it).
fn manifest_frames(
    root: &Path,
    manifest: &Manifest,
    schema: &TransitionSchema,
) -> Result<Vec<Arc<FrameColumn>>> {
    let path = manifest::versions_dir(root).join(format::manifest_name(manifest.version));
    crate::store::dictionary::frame_columns(root, &path, schema)
}

/// How many threads [`open_each`] opens the files of a cold dataset on. Opening a cold dataset
/// waits on small reads (footers, message headers, episode-table columns), a few at a time per
/// file: threads are how those waits overlap, up to a queue depth the disk serves well. A warm
/// open is CPU work (and `mmap`s that serialize in the kernel): at most one thread per core.
const COLD_OPEN_THREADS: usize = 16;

/// `open(entry)` for every entry of `entries` (whose file is `file(entry)`), on several threads,
/// the results in order. The error returned is the one of the first failing entry, as a loop
/// in order would return it (entries after a failure are skipped).
fn open_each<T: Send>(
    entries: &[manifest::SegmentEntry],
    file: impl Fn(&manifest::SegmentEntry) -> PathBuf,
    open: impl Fn(&manifest::SegmentEntry) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    // Cold if the first or the last file is: one `pread` each, at most.
    let mut ends = [entries.first(), entries.last()].into_iter().flatten();
    let threads = if ends.all(|e| tail_cached(&file(e))) {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        COLD_OPEN_THREADS
    };
    let threads = threads.min(entries.len());
    if threads <= 1 {
        return entries.iter().map(open).collect();
    }
    let (next, failed) = (AtomicUsize::new(0), AtomicUsize::new(usize::MAX));
    let work = || {
        let mut done = vec![];
        loop {
            let i = next.fetch_add(1, Relaxed);
            if i >= entries.len() || i > failed.load(Relaxed) {
                return done;
            }
            let r = open(&entries[i]);
            if r.is_err() {
                failed.fetch_min(i, Relaxed);
            }
            done.push((i, r));
        }
    };
    let mut slots: Vec<Option<Result<T>>> = entries.iter().map(|_| None).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads).map(|_| s.spawn(work)).collect();
        for w in workers {
            let done = w.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            for (i, r) in done {
                slots[i] = Some(r);
            }
        }
    });
    // Every entry before the first failure was opened: only later ones are skipped.
    slots.into_iter().map_while(|r| r).collect()
}

/// A per-episode column (`episode_return`, `terminated`, ...) of each episode table.
fn episode_column<'a>(
    tables: impl Iterator<Item = &'a EpisodeTable>,
    name: &str,
) -> Result<Vec<Arc<dyn Array>>> {
    tables
        .map(|t| {
            t.column(name)
                .cloned()
                .ok_or_else(|| Error::argument("name", format!("no episode column `{name}`")))
        })
        .collect()
}

/// One committed version's metadata without its transitions: the manifest and every segment's
/// episode table (ids, lengths, returns, end flags). Loading it reads only the episode files
/// (O(episodes)), so it is all that `trajstore info` needs, and all that a remote dataset's
/// mirror fetches for it ([`crate::remote::Remote::catalog`]).
#[derive(Debug, Clone)]
pub struct Catalog {
    root: PathBuf,
    manifest: Arc<Manifest>,
    schema: TransitionSchema,
    tables: Vec<EpisodeTable>,
}

impl Catalog {
    /// Opens and checks the episode tables `manifest` names under `root`.
    pub(crate) fn load(root: &Path, manifest: Manifest) -> Result<Self> {
        let schema = manifest_schema(root, &manifest)?;
        let tables = open_each(
            &manifest.segments,
            |e| root.join(&e.episodes_path),
            |e| open_episode_table(root, e, &schema),
        )?;
        Ok(Catalog {
            root: root.to_path_buf(),
            manifest: Arc::new(manifest),
            schema,
            tables,
        })
    }
    version_accessors!();
    /// The episode tables, one per segment, in episode order.
    pub fn episode_tables(&self) -> &[EpisodeTable] {
        &self.tables
    }
    /// A per-episode column (`episode_return`, `terminated`, ...) over all episode tables.
    pub fn episode_column(&self, name: &str) -> Result<Vec<Arc<dyn Array>>> {
        episode_column(self.tables.iter(), name)
    }
}

/// One committed version, mapped and indexed. Readers hold a snapshot; commits after it are
/// invisible until [`Snapshot::refresh`]. Cloning is cheap (segments are shared).
#[derive(Debug, Clone)]
pub struct Snapshot {
    root: PathBuf,
    manifest: Arc<Manifest>,
    schema: TransitionSchema,
    segments: Vec<Arc<Segment>>,
    index: Arc<EpisodeIndex>,
    slice_indexes: Arc<Mutex<SliceCache>>,
    /// The frame columns, with their dictionaries read and checked on open.
    frames: Vec<Arc<FrameColumn>>,
    /// Whether this maps only some segments of its version ([`Snapshot::partial`]).
    partial: bool,
}

type SliceCache = HashMap<(u32, BoundaryPolicy), Arc<SliceIndex>>;

impl Snapshot {
    fn load(root: &Path, manifest: Manifest, previous: Option<&Snapshot>) -> Result<Self> {
        let schema = manifest_schema(root, &manifest)?;
        let frames = manifest_frames(root, &manifest, &schema)?;
        let reuse: HashMap<u64, Arc<Segment>> = previous
            .filter(|p| p.schema == schema)
            .map(|p| {
                p.segments
                    .iter()
                    .map(|s| (s.entry().id, s.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let segments = open_each(
            &manifest.segments,
            |e| root.join(&e.path),
            |e| match reuse.get(&e.id) {
                Some(s) if s.entry() == e => Ok(s.clone()),
                _ => Segment::open(root, e, &schema).map(Arc::new),
            },
        )?;
        let first_id = manifest
            .segments
            .first()
            .map_or(manifest.next_episode_id, |s| s.first_episode_id);
        // Extend the previous indexes when this version only drops old segments and adds new ones.
        let mut slice_indexes = SliceCache::new();
        let index = match previous {
            Some(p) if !p.segments.is_empty() => {
                let dropped = p
                    .segments
                    .iter()
                    .take_while(|s| s.entry().first_episode_id < first_id)
                    .count();
                let kept = &p.segments[dropped..];
                // Extend only when some old segments survive; otherwise nothing is shared.
                if !kept.is_empty()
                    && segments.len() >= kept.len()
                    && kept.iter().zip(&segments).all(|(a, b)| Arc::ptr_eq(a, b))
                {
                    let idx = p.index.extended(
                        dropped,
                        segments[kept.len()..]
                            .iter()
                            .map(|s| s.episode_table().spans()),
                    );
                    let dropped_episodes = (idx.first_id() - p.index.first_id()) as usize;
                    let cache = p.slice_indexes.lock().unwrap_or_else(|e| e.into_inner());
                    for (k, v) in cache.iter() {
                        slice_indexes.insert(*k, Arc::new(v.extended(&idx, dropped_episodes)));
                    }
                    idx
                } else {
                    EpisodeIndex::from_segments(
                        first_id,
                        segments.iter().map(|s| s.episode_table().spans()),
                    )
                }
            }
            _ => EpisodeIndex::from_segments(
                first_id,
                segments.iter().map(|s| s.episode_table().spans()),
            ),
        };
        Ok(Snapshot {
            root: root.to_path_buf(),
            manifest: Arc::new(manifest),
            schema,
            segments,
            index: Arc::new(index),
            slice_indexes: Arc::new(Mutex::new(slice_indexes)),
            frames,
            partial: false,
        })
    }

    /// A snapshot of only `entries`, some segments of `manifest`'s version in episode order
    /// (paths relative to `root`): what a streaming cache has resident. Its manifest lists those
    /// segments and counts their transitions and episodes; its episode index keeps the real
    /// episode ids ([`EpisodeIndex::from_sparse_segments`]). It cannot be refreshed.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub(crate) fn partial(
        root: &Path,
        manifest: &Manifest,
        entries: Vec<manifest::SegmentEntry>,
    ) -> Result<Self> {
        let schema = manifest_schema(root, manifest)?;
        let frames = manifest_frames(root, manifest, &schema)?;
        let mut m = manifest.clone();
        m.transitions = entries.iter().map(|e| e.rows).sum();
        m.episodes = entries.iter().map(|e| e.episodes).sum();
        m.segments = entries;
        let segments = open_each(
            &m.segments,
            |e| root.join(&e.path),
            |e| Segment::open(root, e, &schema).map(Arc::new),
        )?;
        let index = EpisodeIndex::from_sparse_segments(segments.iter().map(|s| {
            let (starts, lengths) = s.episode_table().spans();
            (s.entry().first_episode_id, starts, lengths)
        }));
        Ok(Snapshot {
            root: root.to_path_buf(),
            manifest: Arc::new(m),
            schema,
            segments,
            index: Arc::new(index),
            slice_indexes: Arc::new(Mutex::new(SliceCache::new())),
            frames,
            partial: true,
        })
    }

    /// [`Segment::prefault`]s every segment, in parallel: for training runs that will touch the
    /// whole dataset anyway and want steady-state speed from the first batch. O(bytes).
    pub fn prefault(&self) {
        use rayon::prelude::*;
        self.segments.par_iter().for_each(|s| s.prefault());
    }

    /// The cached [`SliceIndex`] of `slice_len`-step windows under `policy`: built on first use
    /// in O(episodes), shared by every sampler of this snapshot, and extended (not rebuilt) by
    /// [`Snapshot::refresh`].
    pub fn slice_index(&self, slice_len: u32, policy: BoundaryPolicy) -> Result<Arc<SliceIndex>> {
        let mut cache = self.slice_indexes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = cache.get(&(slice_len, policy)) {
            return Ok(i.clone());
        }
        let i = Arc::new(SliceIndex::build(&self.index, slice_len, policy)?);
        cache.insert((slice_len, policy), i.clone());
        Ok(i)
    }

    /// Moves to the newest committed version, reusing the segments that are still part of it.
    /// Returns whether the version changed.
    pub fn refresh(&mut self) -> Result<bool> {
        if self.partial {
            return Err(Error::invalid_argument(
                "this snapshot maps some segments of its version (a streaming cache's window) and \
                 cannot be refreshed",
            ));
        }
        let latest = manifest::list_versions(&self.root)?
            .last()
            .copied()
            .unwrap_or(0);
        if latest == self.manifest.version {
            return Ok(false);
        }
        *self = Snapshot::load(&self.root, manifest::read(&self.root, latest)?, Some(self))?;
        Ok(true)
    }

    version_accessors!();
    /// The mapped segments, in episode order.
    pub fn segments(&self) -> &[Arc<Segment>] {
        &self.segments
    }
    /// The frame column `name` (codec, frame shape, dictionary): make a
    /// [`FrameDecoder`](crate::frames::FrameDecoder) per worker with [`FrameColumn::decoder`],
    /// and read stored frames with [`Segment::frames`] and
    /// [`EpisodeTable::final_frame`]. `None` when `name` is not a frame column.
    pub fn frame_column(&self, name: &str) -> Option<&Arc<FrameColumn>> {
        self.frames.iter().find(|f| f.name == name)
    }
    /// Every frame column (the observation, when it is one).
    pub fn frame_columns(&self) -> &[Arc<FrameColumn>] {
        &self.frames
    }
    /// The episode index.
    pub fn episodes(&self) -> &Arc<EpisodeIndex> {
        &self.index
    }
    /// The transitions of the episode with id `id`, zero-copy; `None` if there is none. Its
    /// frame offsets are checked (a damaged one is [`crate::Error::Corrupt`]).
    pub fn episode(&self, id: u64) -> Result<Option<RecordBatch>> {
        let Some(loc) = self.index.by_id(id) else {
            return Ok(None);
        };
        (self.segments[loc.segment].slice(loc.segment_row, loc.length as usize)).map(Some)
    }
    /// A per-episode column (`episode_return`, `terminated`, ...) over all episode tables.
    pub fn episode_column(&self, name: &str) -> Result<Vec<Arc<dyn Array>>> {
        episode_column(self.segments.iter().map(|s| s.episode_table()), name)
    }
    /// This version's [`Catalog`] (manifest and episode tables), without any I/O.
    pub fn catalog(&self) -> Catalog {
        Catalog {
            root: self.root.clone(),
            manifest: self.manifest.clone(),
            schema: self.schema.clone(),
            tables: self
                .segments
                .iter()
                .map(|s| s.episode_table().clone())
                .collect(),
        }
    }
}
