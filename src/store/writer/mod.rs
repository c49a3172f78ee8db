//! The single writer: appends whole episodes, rolls segments at episode boundaries, commits
//! atomically, applies retention. A frame column's encoding and dictionary are in `frames.rs`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeListArray, Float64Array, RecordBatch,
    UInt32Array, UInt64Array, new_null_array,
};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Float32Type};

use crate::error::{Error, IoContext, Result};
use crate::format::{self, col, ep, episodes_path, meta, segment_path};
use crate::schema::TransitionSchema;
use crate::store::episode::{ColumnBuf, EpisodeRows};
pub use crate::store::episode::{EpisodeEnd, Step, Values};
use crate::store::ipc::{IpcFileWriter, checksum_string};
use crate::store::manifest::{self, Manifest, SegmentEntry};

mod cleanup;
mod frames;
use cleanup::remove_leftovers;
#[cfg(test)]
use cleanup::segment_files;
pub(crate) use cleanup::vacuum_locked;
use frames::{FrameWriter, Held};

/// Options of a [`DatasetWriter`]. Construct with `WriterOptions::default()` and the `with_*`
/// methods; new options get defaults, so callers do not break.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WriterOptions {
    /// Target size of one segment file (default 256 MiB). Segments hold whole episodes; a single
    /// episode larger than this gets a segment of its own.
    pub segment_bytes: u64,
    /// Target size of one record batch inside a segment (default 32 MiB). This bounds the
    /// writer's memory: it buffers at most one batch plus one episode.
    pub batch_bytes: u64,
    /// FIFO retention: at each commit, the oldest segments leave the new version as long as the
    /// segments that remain hold at least this many transitions. The granularity is a segment: a
    /// version holds the newest `max_transitions` transitions or more, never fewer (an episode
    /// is never split). Must be at least 1.
    pub max_transitions: Option<u64>,
    /// After each commit, delete manifests older than the newest `n` and the segment files no
    /// remaining manifest names. `None` keeps every version (time travel to any commit).
    pub keep_versions: Option<usize>,
    /// How long opening a writer waits for another writer to release the dataset's lock before
    /// failing with [`Error::Locked`] (default 500 ms). The wait also covers a lock that an
    /// earlier writer of this process released while a child process was being spawned (a child
    /// shares the lock until it starts its program).
    pub lock_wait: std::time::Duration,
    /// How long files stay after the versions that use them are superseded (default 10
    /// minutes). Retention ([`WriterOptions::keep_versions`]) removes a version's manifest, and
    /// the files no remaining version uses, only once the version that replaced it is at least
    /// this old, so a reader that opened a recent version never loses its files. See also
    /// [`Dataset::vacuum`](crate::Dataset::vacuum).
    pub retention_grace: std::time::Duration,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            segment_bytes: format::DEFAULT_SEGMENT_BYTES,
            batch_bytes: format::DEFAULT_BATCH_BYTES,
            max_transitions: None,
            keep_versions: None,
            lock_wait: std::time::Duration::from_millis(500),
            retention_grace: DEFAULT_RETENTION_GRACE,
        }
    }
}

impl WriterOptions {
    /// Sets [`WriterOptions::segment_bytes`].
    pub fn with_segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = bytes.max(1);
        self
    }
    /// Sets [`WriterOptions::batch_bytes`].
    pub fn with_batch_bytes(mut self, bytes: u64) -> Self {
        self.batch_bytes = bytes.max(1);
        self
    }
    /// Sets [`WriterOptions::max_transitions`].
    pub fn with_max_transitions(mut self, n: u64) -> Self {
        self.max_transitions = Some(n);
        self
    }
    /// Sets [`WriterOptions::lock_wait`] (zero: fail at once when the dataset is locked).
    pub fn with_lock_wait(mut self, wait: std::time::Duration) -> Self {
        self.lock_wait = wait;
        self
    }
    /// Sets [`WriterOptions::retention_grace`] (zero: delete as soon as a version leaves the
    /// kept ones; readers opening an older version at that moment may fail).
    pub fn with_retention_grace(mut self, grace: std::time::Duration) -> Self {
        self.retention_grace = grace;
        self
    }
    /// Sets [`WriterOptions::keep_versions`] (at least 1).
    pub fn with_keep_versions(mut self, n: usize) -> Self {
        self.keep_versions = Some(n.max(1));
        self
    }
}

struct OpenSegment {
    id: u64,
    writer: IpcFileWriter,
    episodes: EpisodeRows,
    first_episode_id: u64,
    first_row: u64,
}

/// Appends episodes to a dataset. Holds the dataset's lock until dropped.
///
/// Nothing appended is visible to readers until [`DatasetWriter::commit`]; dropping the writer
/// without committing discards everything since the last commit (the next writer removes the
/// leftover files).
pub struct DatasetWriter {
    root: PathBuf,
    _lock: File,
    options: WriterOptions,
    schema: TransitionSchema,
    base: Manifest,
    new_segments: Vec<SegmentEntry>,
    open: Option<OpenSegment>,
    pending: Vec<RecordBatch>,
    pending_rows: u64,
    /// Bytes of frame columns in `pending` (rows times the schema's row bytes count the rest).
    pending_frame_bytes: u64,
    /// The frame column's encoder and dictionary training, when the dataset has one.
    frames: Vec<FrameWriter>,
    /// Episodes held back until the frame columns' dictionaries are trained, and their rows.
    held: Vec<Held>,
    held_frames: usize,
    next_episode_id: u64,
    next_segment_id: u64,
    next_row: u64,
    step: Option<Vec<ColumnBuf>>,
    step_rows: usize,
    /// The next commit drops every segment of the base version (see [`DatasetWriter::replace`]).
    replace: bool,
}

impl std::fmt::Debug for DatasetWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetWriter")
            .field("root", &self.root)
            .field("version", &self.base.version)
            .field("next_episode_id", &self.next_episode_id)
            .finish_non_exhaustive()
    }
}

/// The default [`WriterOptions::retention_grace`].
pub const DEFAULT_RETENTION_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// The shortest `older_than` `trajstore vacuum` accepts without `--no-retention-check` (like
/// Delta's retention check): a reader that is about to open a version replaced more recently
/// than this would find its files gone.
pub const VACUUM_SAFETY_FLOOR: std::time::Duration = DEFAULT_RETENTION_GRACE;

/// What a vacuum removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct VacuumReport {
    /// Versions whose manifests were removed.
    pub versions_removed: Vec<u64>,
    /// Segment and episode-table files removed.
    pub files_removed: u64,
    /// Their bytes.
    pub bytes_removed: u64,
    /// Versions older than the kept ones that stay for now: replaced less than the grace
    /// period ago.
    pub versions_in_grace: Vec<u64>,
}

/// Takes the writer lock of the dataset at `root`, waiting up to `wait` for another writer.
pub(crate) fn lock_dataset(root: &Path, wait: std::time::Duration) -> Result<File> {
    let lock_path = root.join(format::LOCK_FILE);
    let lock = lock_file(&lock_path)?;
    let deadline = std::time::Instant::now() + wait;
    loop {
        match lock.try_lock() {
            Ok(()) => return Ok(lock),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Locked {
                    dataset: root.to_path_buf(),
                    lock: lock_path,
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&lock_path, e)),
        }
    }
}

/// Opens (creating it if needed) a file used only for its advisory lock.
pub(crate) fn lock_file(path: &Path) -> Result<File> {
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .at(path)
}

impl DatasetWriter {
    pub(crate) fn open(root: &Path, options: WriterOptions) -> Result<Self> {
        if options.max_transitions == Some(0) {
            return Err(Error::argument(
                "max_transitions",
                "0 would keep no transition; give at least 1 (retention keeps whole segments)",
            ));
        }
        let lock = lock_dataset(root, options.lock_wait)?;
        let base = manifest::read_latest(root)?;
        let schema = TransitionSchema::from_columns(&base.columns)?;
        remove_leftovers(root, base.next_segment_id)?;
        let manifest_path = manifest::versions_dir(root).join(format::manifest_name(base.version));
        let specs = schema.frame_columns();
        let keep: Vec<_> = specs
            .iter()
            .filter_map(|(_, s)| s.dictionary.as_ref())
            .collect();
        crate::store::dictionary::remove_unreferenced(root, &keep)?;
        let input = schema.input_schema();
        let frames = specs
            .iter()
            .map(|(name, s)| {
                let column = input.index_of(name).expect("a payload column");
                FrameWriter::open(root, &manifest_path, name, column, s)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            root: root.to_path_buf(),
            _lock: lock,
            options,
            next_episode_id: base.next_episode_id,
            next_segment_id: base.next_segment_id,
            next_row: base.next_row,
            schema,
            base,
            new_segments: vec![],
            open: None,
            pending: vec![],
            pending_rows: 0,
            pending_frame_bytes: 0,
            frames,
            held: vec![],
            held_frames: 0,
            step: None,
            step_rows: 0,
            replace: false,
        })
    }

    /// The dataset's schema.
    pub fn schema(&self) -> &TransitionSchema {
        &self.schema
    }

    /// The version this writer's next commit builds on.
    pub fn base_version(&self) -> u64 {
        self.base.version
    }

    /// Makes the next commit a version that holds only what this writer appends, none of the
    /// base version's transitions (an overwrite). Nothing is deleted: the older versions stay
    /// readable (time travel) until retention or `vacuum` removes them. Episode ids go on from
    /// the base version's.
    pub fn replace(&mut self) {
        self.replace = true;
    }

    /// Id the next appended episode gets.
    pub fn next_episode_id(&self) -> u64 {
        self.next_episode_id + self.held.len() as u64
    }

    /// Appends one whole episode. `batch` holds the payload columns (observation, action, reward,
    /// optional next_observation, user columns) by name, in any order, one row per transition;
    /// the writer adds the boundary columns. Returns the episode's id.
    ///
    /// Memory: the batch is buffered until the current record batch reaches its target size.
    pub fn append_episode(&mut self, batch: &RecordBatch, end: EpisodeEnd) -> Result<u64> {
        if self.step.is_some() && self.step_rows > 0 {
            return Err(Error::invalid_argument(
                "a step-by-step episode is in progress; call end_episode first",
            ));
        }
        let n = batch.num_rows();
        if n == 0 {
            return Err(Error::invalid_data(
                "an episode must have at least one transition",
            ));
        }
        if u32::try_from(n).is_err() {
            return Err(Error::invalid_data(format!(
                "episode of {n} steps exceeds u32 steps"
            )));
        }
        if !end.terminated && !end.truncated {
            return Err(Error::invalid_data(
                "an episode must end terminated or truncated (use truncated for time limits and the end of data)",
            ));
        }
        let payload = self.schema.input_schema().clone();
        let mut input: Vec<ArrayRef> = Vec::with_capacity(payload.fields().len());
        for field in payload.fields() {
            let array = batch.column_by_name(field.name()).ok_or_else(|| {
                Error::schema(field.name(), "the episode batch has no such column")
            })?;
            input.push(conform(field, array)?);
        }
        if batch.num_columns() != payload.fields().len() {
            let extra: Vec<_> = batch
                .schema()
                .fields()
                .iter()
                .filter(|f| payload.field_with_name(f.name()).is_err())
                .map(|f| f.name().clone())
                .collect();
            return Err(match extra.as_slice() {
                [one] => Error::schema(
                    one,
                    "the episode batch has this column, the dataset does not",
                ),
                _ => Error::schema_mismatch(format!(
                    "episode batch has columns the dataset does not: {}",
                    extra.join(", ")
                )),
            });
        }
        let final_obs = match (self.schema.has_next_observation(), end.final_observation) {
            (false, Some(obs)) => {
                if obs.len() != 1 {
                    return Err(Error::argument(
                        "final_observation",
                        format!("must have one row, got {}", obs.len()),
                    ));
                }
                Some(conform(
                    payload.fields().first().expect("observation"),
                    &obs,
                )?)
            }
            _ => None,
        };
        let held = Held {
            columns: input,
            terminated: end.terminated,
            truncated: end.truncated,
            final_frame: final_obs,
        };
        if self.frames.iter().any(|f| f.training()) {
            let id = self.next_episode_id + self.held.len() as u64;
            self.held_frames += n;
            self.held.push(held);
            if self
                .frames
                .iter()
                .filter(|f| f.training())
                .all(|f| f.enough(self.held_frames))
            {
                self.train_frames()?;
            }
            return Ok(id);
        }
        self.append_input(held)
    }

    /// Trains the frame columns' dictionaries on the held episodes, records them in the schema
    /// the next commit publishes, and appends the held episodes.
    fn train_frames(&mut self) -> Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        self.held_frames = 0;
        for f in self.frames.iter_mut().filter(|f| f.training()) {
            let dictionary = f.train(&self.root, &held)?;
            self.schema = self.schema.with_column_dictionary(&f.name, dictionary)?;
        }
        self.base.columns = self.schema.to_columns();
        for h in held {
            self.append_input(h)?;
        }
        Ok(())
    }

    /// Appends an episode whose payload was checked against the input schema: encodes its
    /// frames, adds the boundary columns.
    fn append_input(&mut self, mut e: Held) -> Result<u64> {
        for f in self.frames.iter_mut() {
            e.columns[f.column] = f.encode(&e.columns[f.column])?;
            if f.column == 0 {
                e.final_frame = e.final_frame.map(|x| f.encode(&x)).transpose()?;
            }
        }
        let n = e.columns[0].len();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(6 + e.columns.len());
        let id = self.next_episode_id;
        let (terminated, truncated) = (e.terminated, e.truncated);
        columns.push(Arc::new(UInt64Array::from_value(id, n)));
        columns.push(Arc::new(UInt32Array::from_iter_values(0..n as u32)));
        columns.push(Arc::new(BooleanArray::from_iter(
            (0..n).map(|i| Some(i == 0)),
        )));
        columns.push(Arc::new(BooleanArray::from_iter(
            (0..n).map(|i| Some(i + 1 == n)),
        )));
        columns.push(Arc::new(BooleanArray::from_iter(
            (0..n).map(|i| Some(terminated && i + 1 == n)),
        )));
        columns.push(Arc::new(BooleanArray::from_iter(
            (0..n).map(|i| Some(truncated && i + 1 == n)),
        )));
        columns.extend(e.columns);
        let ret: f64 = columns[6 + 2]
            .as_primitive::<Float32Type>()
            .values()
            .iter()
            .map(|&r| r as f64)
            .sum();
        let full = RecordBatch::try_new(self.schema.arrow_schema().clone(), columns)?;
        self.add(full, ret, terminated, truncated, e.final_frame)?;
        Ok(id)
    }

    fn add(
        &mut self,
        batch: RecordBatch,
        ret: f64,
        terminated: bool,
        truncated: bool,
        final_obs: Option<ArrayRef>,
    ) -> Result<()> {
        let rows = batch.num_rows() as u64;
        let row_bytes = self.schema.row_bytes().max(1.0);
        let frame_bytes = (0..batch.num_columns())
            .map(|i| frames::stored_bytes(&batch, i))
            .sum::<u64>();
        let bytes = |r: u64, extra: u64| (r as f64 * row_bytes) as u64 + extra;
        // Roll the segment first if this episode would push it past its target.
        if let Some(open) = &self.open
            && open.writer.bytes_written()
                + bytes(
                    self.pending_rows + rows,
                    self.pending_frame_bytes + frame_bytes,
                )
                > self.options.segment_bytes
        {
            self.finish_segment()?;
        }
        if !self.pending.is_empty()
            && bytes(
                self.pending_rows + rows,
                self.pending_frame_bytes + frame_bytes,
            ) > self.options.batch_bytes
        {
            self.flush_pending()?;
        }
        if self.open.is_none() {
            let id = self.next_segment_id;
            self.next_segment_id += 1;
            let path = self.root.join(segment_path(id));
            self.open = Some(OpenSegment {
                id,
                writer: IpcFileWriter::create(
                    &path,
                    self.schema.arrow_schema(),
                    meta::KIND_TRANSITIONS,
                    id,
                )?,
                episodes: EpisodeRows::default(),
                first_episode_id: self.next_episode_id,
                first_row: self.next_row,
            });
        }
        let open = self.open.as_mut().expect("opened above");
        let e = &mut open.episodes;
        e.ids.push(self.next_episode_id);
        e.starts.push(open.writer.rows() + self.pending_rows);
        e.lengths.push(rows);
        e.returns.push(ret);
        e.terminated.push(terminated);
        e.truncated.push(truncated);
        e.finals.push(final_obs);
        self.next_episode_id += 1;
        self.next_row += rows;
        self.pending_rows += rows;
        self.pending_frame_bytes += frame_bytes;
        self.pending.push(batch);
        if bytes(self.pending_rows, self.pending_frame_bytes) >= self.options.batch_bytes {
            self.flush_pending()?;
        }
        Ok(())
    }

    fn flush_pending(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = match self.pending.len() {
            1 => self.pending.pop().expect("one"),
            _ => concat_batches(self.schema.arrow_schema(), &self.pending)?,
        };
        self.pending.clear();
        self.pending_rows = 0;
        self.pending_frame_bytes = 0;
        self.open
            .as_mut()
            .expect("pending rows belong to an open segment")
            .writer
            .write(&batch)
    }

    fn finish_segment(&mut self) -> Result<()> {
        self.flush_pending()?;
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        let rows = open.writer.rows();
        let info = open.writer.finish()?;
        let e = open.episodes;
        let n = e.ids.len();
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(e.ids)),
            Arc::new(UInt64Array::from(e.starts)),
            Arc::new(UInt64Array::from(e.lengths)),
            Arc::new(Float64Array::from(e.returns)),
            Arc::new(BooleanArray::from(e.terminated)),
            Arc::new(BooleanArray::from(e.truncated)),
        ];
        let ep_schema = self.schema.episode_schema().clone();
        if let Ok(field) = ep_schema.field_with_name(ep::FINAL_OBSERVATION) {
            let null = new_null_array(field.data_type(), 1);
            let parts: Vec<&dyn Array> = e
                .finals
                .iter()
                .map(|f| f.as_deref().unwrap_or(null.as_ref()))
                .collect();
            cols.push(arrow::compute::concat(&parts)?);
        }
        let table = RecordBatch::try_new(ep_schema.clone(), cols)?;
        let ep_path = self.root.join(episodes_path(open.id));
        let mut w = IpcFileWriter::create(&ep_path, &ep_schema, meta::KIND_EPISODES, open.id)?;
        w.write(&table)?;
        let ep_info = w.finish()?;
        self.new_segments.push(SegmentEntry {
            id: open.id,
            path: segment_path(open.id),
            episodes_path: episodes_path(open.id),
            rows,
            episodes: n as u64,
            first_episode_id: open.first_episode_id,
            first_row: open.first_row,
            bytes: info.bytes,
            checksum: checksum_string(info.crc32c),
            episodes_bytes: ep_info.bytes,
            episodes_checksum: checksum_string(ep_info.crc32c),
        });
        Ok(())
    }

    /// Appends one transition to the episode in progress (for live collectors).
    pub fn append_step(&mut self, step: Step<'_>) -> Result<()> {
        let payload = self.schema.input_schema().clone();
        let bufs = self
            .step
            .get_or_insert_with(|| payload.fields().iter().map(ColumnBuf::new).collect());
        let has_next = payload.column_with_name(col::NEXT_OBSERVATION).is_some();
        let fixed = 3 + has_next as usize;
        if step.next_observation.is_some() != has_next {
            return Err(Error::argument(
                "next_observation",
                if has_next {
                    "this dataset stores next_observation, so each step needs one"
                } else {
                    "this dataset derives next_observation, so steps must not pass one"
                },
            ));
        }
        if step.columns.len() != bufs.len() - fixed {
            return Err(Error::argument(
                "columns",
                format!(
                    "expected {} user column values per step, got {}",
                    bufs.len() - fixed,
                    step.columns.len()
                ),
            ));
        }
        // Check every column before touching any buffer, so a bad step changes nothing.
        let reward = [step.reward];
        let mut values = vec![step.observation, step.action, Values::F32(&reward)];
        values.extend(step.next_observation);
        values.extend_from_slice(step.columns);
        for (b, v) in bufs.iter().zip(&values) {
            if v.data_type() != b.elem || v.len() != b.width {
                return ColumnBuf::push(&mut ColumnBuf::new(&b.field), v);
            }
        }
        for (b, v) in bufs.iter_mut().zip(&values) {
            b.push(v)?;
        }
        self.step_rows += 1;
        Ok(())
    }

    /// Ends the episode built with [`DatasetWriter::append_step`] and appends it. Returns its id.
    pub fn end_episode(&mut self, end: EpisodeEnd) -> Result<u64> {
        let rows = std::mem::take(&mut self.step_rows);
        let Some(bufs) = self.step.as_mut().filter(|_| rows > 0) else {
            return Err(Error::invalid_argument(
                "end_episode called with no steps appended",
            ));
        };
        let columns = bufs
            .iter_mut()
            .map(|b| b.finish(rows))
            .collect::<Result<Vec<_>>>()?;
        let batch = RecordBatch::try_new(self.schema.input_schema().clone(), columns)?;
        self.append_episode(&batch, end)
    }

    /// Makes everything appended so far durable and visible as a new version, atomically: segment
    /// files are already synced and renamed; the new manifest is written to a temporary file,
    /// synced, renamed, and the directory synced. A crash at any point leaves the previous version
    /// intact. An episode in progress (step API) is not part of the commit. Returns the version
    /// (unchanged if there was nothing to commit).
    pub fn commit(&mut self) -> Result<u64> {
        self.train_frames()?;
        self.finish_segment()?;
        let mut segments = if self.replace {
            vec![]
        } else {
            self.base.segments.clone()
        };
        segments.append(&mut self.new_segments);
        if let Some(max) = self.options.max_transitions {
            // Whole segments, oldest first, and only while what remains still holds `max`: the
            // newest `max` transitions are always kept (a dataset holds between `max` and `max`
            // plus one segment).
            let mut total: u64 = segments.iter().map(|s| s.rows).sum();
            let drop = segments
                .iter()
                .take_while(|s| {
                    let keep_enough = total - s.rows >= max;
                    if keep_enough {
                        total -= s.rows;
                    }
                    keep_enough
                })
                .count();
            segments.drain(..drop);
        }
        if segments == self.base.segments && !(self.replace && self.base.transitions > 0) {
            return Ok(self.base.version);
        }
        manifest::sync_dir(&self.root.join(format::SEGMENTS_DIR))?;
        crate::fault::point("commit-before-manifest");
        let m = Manifest {
            format: format::FORMAT_NAME.into(),
            format_version: format::FORMAT_VERSION,
            version: self.base.version + 1,
            created_unix_ms: manifest::now_ms(),
            columns: self.base.columns.clone(),
            transitions: segments.iter().map(|s| s.rows).sum(),
            episodes: segments.iter().map(|s| s.episodes).sum(),
            next_episode_id: self.next_episode_id,
            next_segment_id: self.next_segment_id,
            next_row: self.next_row,
            segments,
            properties: self.base.properties.clone(),
        };
        m.publish(&self.root)?;
        self.base = m;
        self.replace = false;
        if let Some(keep) = self.options.keep_versions {
            self.prune_versions(keep)?;
        }
        Ok(self.base.version)
    }

    /// Sets a dataset property, recorded in the next commit's manifest.
    pub fn set_property(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.base.properties.insert(key.into(), value.into());
    }

    /// Commits and releases the lock. Returns the final version.
    pub fn finish(mut self) -> Result<u64> {
        self.commit()
    }

    fn prune_versions(&self, keep: usize) -> Result<()> {
        vacuum_locked(
            &self.root,
            keep,
            self.options.retention_grace,
            self.next_segment_id,
        )
        .map(drop)
    }

    /// Removes old versions now, under this writer's lock: see [`Dataset::vacuum`](crate::Dataset::vacuum).
    pub fn vacuum(&self, keep: usize, grace: std::time::Duration) -> Result<VacuumReport> {
        vacuum_locked(&self.root, keep, grace, self.next_segment_id)
    }
}

/// Checks `array` against `field` (type, nulls) and rebuilds fixed-size lists with the field's
/// child so that list item names from other writers (`item`, `element`) do not matter.
fn conform(field: &arrow::datatypes::FieldRef, array: &ArrayRef) -> Result<ArrayRef> {
    let name = field.name();
    if !field.is_nullable() && array.null_count() > 0 {
        let row = (0..array.len()).find(|&i| array.is_null(i)).unwrap_or(0);
        return Err(Error::invalid_data(format!(
            "a null at row {row} of the episode (the column is not nullable)"
        ))
        .in_column(name));
    }
    match (field.data_type(), array.data_type()) {
        (a, b) if a == b => Ok(array.clone()),
        (DataType::FixedSizeList(want, n), DataType::FixedSizeList(got, m))
            if want.data_type() == got.data_type() && n == m =>
        {
            let list = array.as_fixed_size_list();
            if list.values().null_count() > 0 {
                return Err(Error::invalid_data("the column has null list items").in_column(name));
            }
            Ok(Arc::new(FixedSizeListArray::try_new(
                want.clone(),
                *n,
                list.values().clone(),
                list.nulls().cloned(),
            )?))
        }
        (want, got) => Err(Error::schema_types(
            name,
            want,
            got,
            "the episode's column has another type than the dataset stores",
        )),
    }
}

#[cfg(test)]
mod tests;
