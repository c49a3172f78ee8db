//! Helpers shared by the integration tests (each test binary uses some of them).
#![allow(dead_code)]

#[cfg(feature = "remote")]
pub mod s3;
pub mod sampling;
pub mod staging;

use std::borrow::Borrow;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, FixedSizeListArray, Float32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Float32Type};
use trajstore::synth::{ObsDtype, SynthSpec};
use trajstore::{Dataset, EpisodeEnd, Snapshot, TransitionSchema, WriterOptions};

/// The `trajstore` binary (built for the integration tests).
#[cfg(feature = "cli")]
pub const BIN: &str = env!("CARGO_BIN_EXE_trajstore");

/// A command of the `trajstore` binary.
#[cfg(feature = "cli")]
pub fn bin() -> std::process::Command {
    std::process::Command::new(BIN)
}

/// Runs the `trajstore` binary: (exit code, -1 when a signal ended it; stdout; stderr). The one
/// CLI runner of the tests.
#[cfg(feature = "cli")]
pub fn run_cli(args: &[&str]) -> (i32, String, String) {
    run_cli_env(args, &[])
}

/// [`run_cli`] with extra environment variables.
#[cfg(feature = "cli")]
pub fn run_cli_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = bin().args(args).envs(env.iter().copied()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// (terminated, truncated) of every episode, read from the boundary columns of its last row.
pub fn ends(snap: &Snapshot) -> Vec<(bool, bool)> {
    (0..snap.num_episodes())
        .map(|id| {
            let e = snap.episode(id).unwrap().unwrap();
            let last = e.num_rows() - 1;
            let flag = |n: &str| e.column_by_name(n).unwrap().as_boolean().value(last);
            (flag("terminated"), flag("truncated"))
        })
        .collect()
}

/// The float32 values of a scalar or fixed-size-list column, flattened.
pub fn f32_values(batch: &RecordBatch, name: &str) -> Vec<f32> {
    let a = batch.column_by_name(name).unwrap();
    match a.data_type() {
        DataType::FixedSizeList(..) => a
            .as_fixed_size_list()
            .values()
            .as_primitive::<Float32Type>()
            .values()
            .to_vec(),
        _ => a.as_primitive::<Float32Type>().values().to_vec(),
    }
}

/// A float32 fixed-size-list column of `width` values per row (non-nullable items).
pub fn fsl(values: Vec<f32>, width: usize) -> ArrayRef {
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    Arc::new(FixedSizeListArray::new(
        item,
        width as i32,
        Arc::new(Float32Array::from(values)),
        None,
    ))
}

/// `batch` (an episode of `f32` observations) with a stored `next_observation` column: the
/// observation one step later, then `end`'s final observation.
pub fn with_next_observation(batch: &RecordBatch, end: &trajstore::EpisodeEnd) -> RecordBatch {
    use arrow::array::AsArray;
    use arrow::datatypes::Float32Type;
    let obs = batch
        .column_by_name(trajstore::format::col::OBSERVATION)
        .unwrap()
        .as_fixed_size_list();
    let d = obs.value_length() as usize;
    let fin = end.final_observation.clone().unwrap();
    let mut next: Vec<f32> = obs.values().as_primitive::<Float32Type>().values()[d..].to_vec();
    next.extend_from_slice(
        fin.as_fixed_size_list()
            .values()
            .as_primitive::<Float32Type>()
            .values(),
    );
    let schema = batch.schema();
    let mut cols: Vec<(&str, ArrayRef)> = schema
        .fields()
        .iter()
        .map(|f| {
            (
                f.name().as_str(),
                batch.column_by_name(f.name()).unwrap().clone(),
            )
        })
        .collect();
    cols.push((trajstore::format::col::NEXT_OBSERVATION, fsl(next, d)));
    RecordBatch::try_from_iter(cols).unwrap()
}

/// The terminal flag of transition `i` in the NumPy and TorchRL fixtures.
pub fn fixture_terminated(i: usize) -> bool {
    (i + 1).is_multiple_of(97)
}

/// The time-limit flag of transition `i` in the NumPy and TorchRL fixtures.
pub fn fixture_truncated(i: usize) -> bool {
    (i + 1).is_multiple_of(150) && !fixture_terminated(i)
}

/// (first transition, length, terminated, truncated) of the fixtures' episodes among
/// transitions `lo..hi`, cut by the flags; rows after the last flag form a truncated episode.
pub fn fixture_episodes(lo: usize, hi: usize) -> Vec<(usize, usize, bool, bool)> {
    let mut out = vec![];
    let mut start = lo;
    for i in lo..hi {
        let (t, tr) = (fixture_terminated(i), fixture_truncated(i));
        if t || tr {
            out.push((start, i + 1 - start, t, tr));
            start = i + 1;
        }
    }
    if start < hi {
        out.push((start, hi - start, false, true));
    }
    out
}

/// `tests/data/{dir}/{name}`.
pub fn fixture_path(dir: &str, name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(dir)
        .join(name)
}

/// Small segments and write batches, so that even the small fixtures span several segments.
pub fn small_segments() -> trajstore::WriterOptions {
    trajstore::WriterOptions::default()
        .with_segment_bytes(16 << 10)
        .with_batch_bytes(4 << 10)
}

/// Small decode batches, so that units (4 batches) split episodes.
pub fn small_batches() -> trajstore::ingest::IngestOptions {
    trajstore::ingest::IngestOptions::default().with_batch_rows(64)
}

/// The names of the stored (payload) columns, in order.
pub fn payload_names(snap: &Snapshot) -> Vec<String> {
    snap.schema()
        .payload_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect()
}

/// Checks the columns the NumPy, TorchRL and LeRobot fixtures share (their scripts' formulas) for
/// the episode `e` holding transitions `start..start + len` (`next_observation` where stored).
pub fn check_fixture_values(e: &RecordBatch, start: usize, len: usize) {
    let rows = start..start + len;
    let obs: Vec<f32> = rows
        .clone()
        .flat_map(|i| (0..3).map(move |j| (i * 10 + j) as f32))
        .collect();
    assert_eq!(f32_values(e, "observation"), obs, "episode at {start}");
    if e.column_by_name("next_observation").is_some() {
        let next: Vec<f32> = obs.iter().map(|v| v + 1000.0).collect();
        assert_eq!(f32_values(e, "next_observation"), next);
    }
    let act: Vec<f32> = rows
        .clone()
        .flat_map(|i| (0..2).map(move |j| -(i as f32) - 0.5 * j as f32))
        .collect();
    assert_eq!(f32_values(e, "action"), act);
    let rew: Vec<f32> = rows.map(|i| (0.25 * i as f64) as f32).collect();
    assert_eq!(f32_values(e, "reward"), rew);
}

/// Ends and lengths of every episode of `snap` match `want` (from [`fixture_episodes`]).
pub fn check_fixture_episodes(snap: &Snapshot, want: &[(usize, usize, bool, bool)]) {
    assert_eq!(
        ends(snap),
        want.iter().map(|e| (e.2, e.3)).collect::<Vec<_>>()
    );
    let lengths: Vec<u64> = want.iter().map(|e| e.1 as u64).collect();
    assert_eq!(snap.episodes().lengths(), lengths.as_slice());
}

/// A Python that can `import {modules}` (`TRAJSTORE_PYTHON`, else `python3`), or `None` with a
/// `note: skipped:` line for `what` (see [`skipped`]). Under `CI=true` a missing module is a
/// failure: `scripts/test.sh` installs them through `scripts/setup-python.sh`.
pub fn python_with(modules: &str, what: &str) -> Option<String> {
    let py = std::env::var("TRAJSTORE_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&py)
        .args(["-c", &format!("import {modules}")])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(py);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true but `{py}` cannot import {modules}; scripts/setup-python.sh installs them");
    }
    skipped(&format!(
        "{what} needs Python with {modules}, which `{py}` cannot import (set TRAJSTORE_PYTHON, \
         or run scripts/setup-python.sh)"
    ));
    None
}

/// Says on stderr that the running test returns early without checking anything, and why:
/// `note: skipped: <test>: <why>` (cargo shows it with `--nocapture`, and for failing tests).
pub fn skipped(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("<unnamed test>");
    eprintln!("note: skipped: {test}: {why}");
}

/// The error of `result`, which must be one (for results whose value is not `Debug`, such as
/// the samplers, where `unwrap_err` does not compile).
pub fn err_of<T>(result: trajstore::Result<T>) -> trajstore::Error {
    match result {
        Ok(_) => panic!("expected an error, got a value"),
        Err(e) => e,
    }
}

/// A loader made the one way there is: a [`trajstore::BatchSource`] opened from `spec`, and a
/// [`trajstore::Loader`] of `opts` over it.
pub fn open_loader(
    spec: trajstore::LoaderSpec,
    opts: trajstore::LoaderOptions,
) -> trajstore::Result<trajstore::Loader> {
    trajstore::Loader::new(&trajstore::BatchSource::open(spec)?, opts)
}

/// Asserts that `e` is an [`trajstore::Error::InvalidArgument`] naming `argument`, or naming
/// anything (or nothing) when `argument` is `None` (errors about a combination of arguments name
/// none in particular). `what` says which case failed.
pub fn assert_invalid_argument(e: &trajstore::Error, argument: Option<&str>, what: &str) {
    let trajstore::Error::InvalidArgument {
        argument: named, ..
    } = e
    else {
        panic!("{what}: not an invalid argument: {e}");
    };
    if let Some(want) = argument {
        assert_eq!(named.as_deref(), Some(want), "{what}: {e}");
    }
}

/// Synthetic datasets for tests: the one builder every test binary uses, with named setters so
/// that no argument order can be confused. Defaults: 2-d observations, 2-d continuous actions,
/// mean episode length 20, seed 0, no episodes, default writer options, one commit at the end.
///
/// Episodes come either from [`TestData::episodes`] (one episode per given length, generated
/// by [`SynthSpec::episode`] with indices 0, 1, ...) or from [`TestData::transitions`] (lengths
/// drawn by the generator, written by [`SynthSpec::write`]); the last one set wins.
///
/// ```ignore
/// let snap = TestData::new().obs_dim(4).seed(7).episodes([10, 20]).snapshot(&dir.join("d"));
/// ```
#[derive(Debug, Clone)]
pub struct TestData {
    spec: SynthSpec,
    lengths: Option<Vec<u64>>,
    writer: WriterOptions,
    commit_every: Option<usize>,
    commit_after: Vec<usize>,
}

impl Default for TestData {
    fn default() -> Self {
        Self::new()
    }
}

impl TestData {
    /// The defaults above.
    pub fn new() -> Self {
        Self {
            spec: SynthSpec {
                transitions: 0,
                obs_shape: vec![2],
                obs_dtype: ObsDtype::Float32,
                act_dim: 2,
                discrete_actions: false,
                mean_episode_len: 20.0,
                seed: 0,
            },
            lengths: Some(vec![]),
            writer: WriterOptions::default(),
            commit_every: None,
            commit_after: vec![],
        }
    }

    /// Observation dimension.
    pub fn obs_dim(mut self, dim: usize) -> Self {
        self.spec.obs_shape = vec![dim];
        self
    }

    /// Action dimension (the number of discrete actions with [`TestData::discrete_actions`]).
    pub fn act_dim(mut self, dim: usize) -> Self {
        self.spec.act_dim = dim;
        self
    }

    /// Discrete (int64) actions instead of continuous ones.
    pub fn discrete_actions(mut self, discrete: bool) -> Self {
        self.spec.discrete_actions = discrete;
        self
    }

    /// Mean episode length of [`TestData::transitions`].
    pub fn mean_episode_len(mut self, mean: f64) -> Self {
        self.spec.mean_episode_len = mean;
        self
    }

    /// Seed of every random draw.
    pub fn seed(mut self, seed: u64) -> Self {
        self.spec.seed = seed;
        self
    }

    /// `n` transitions in episodes of random lengths (mean [`TestData::mean_episode_len`]).
    pub fn transitions(mut self, n: u64) -> Self {
        self.spec.transitions = n;
        self.lengths = None;
        self
    }

    /// One episode per entry of `lengths`, in order.
    pub fn episodes<B: Borrow<u64>>(mut self, lengths: impl IntoIterator<Item = B>) -> Self {
        self.lengths = Some(lengths.into_iter().map(|l| *l.borrow()).collect());
        self.spec.transitions = 0;
        self
    }

    /// The writer options (replaces any set by [`TestData::segment_bytes`] and co. before).
    pub fn writer_options(mut self, options: WriterOptions) -> Self {
        self.writer = options;
        self
    }

    /// [`WriterOptions::segment_bytes`].
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.writer = self.writer.with_segment_bytes(bytes);
        self
    }

    /// [`WriterOptions::batch_bytes`].
    pub fn batch_bytes(mut self, bytes: u64) -> Self {
        self.writer = self.writer.with_batch_bytes(bytes);
        self
    }

    /// Commits after every `n` episodes too (as a live collector would).
    pub fn commit_every(mut self, n: usize) -> Self {
        self.commit_every = Some(n.max(1));
        self
    }

    /// Commits right after the episodes at these positions too (explicit episodes only).
    pub fn commit_after(mut self, positions: impl IntoIterator<Item = usize>) -> Self {
        self.commit_after = positions.into_iter().collect();
        self
    }

    /// The generator's spec, e.g. for [`SynthSpec::episode`] in tests that append by hand.
    pub fn spec(&self) -> SynthSpec {
        self.spec.clone()
    }

    /// The schema of the data.
    pub fn schema(&self) -> TransitionSchema {
        self.spec.schema().unwrap()
    }

    /// The lengths of the episodes, in order.
    pub fn lengths(&self) -> Vec<u64> {
        match &self.lengths {
            Some(l) => l.clone(),
            None => self.spec.episode_lengths().unwrap(),
        }
    }

    /// Every episode [`TestData::append_to`] writes, in order.
    pub fn episode_data(&self) -> Vec<(RecordBatch, EpisodeEnd)> {
        self.lengths()
            .iter()
            .enumerate()
            .map(|(i, &l)| self.spec.episode(i as u64, l))
            .collect()
    }

    /// An empty dataset at `path` with this schema.
    pub fn create(&self, path: &Path) -> Dataset {
        Dataset::create(path, &self.schema()).unwrap()
    }

    /// Appends the episodes to `ds` (ids consecutive from the dataset's next id) and commits;
    /// returns the version committed last.
    pub fn append_to(&self, ds: &Dataset) -> u64 {
        let mut w = ds.writer(self.writer.clone()).unwrap();
        let Some(lengths) = &self.lengths else {
            assert!(
                self.commit_after.is_empty(),
                "commit_after needs explicit episodes"
            );
            return self.spec.write(&mut w, self.commit_every, |_| {}).unwrap();
        };
        let first = w.next_episode_id();
        for (i, &l) in lengths.iter().enumerate() {
            let (b, e) = self.spec.episode(i as u64, l);
            let id = w.append_episode(&b, e).unwrap();
            assert_eq!(id, first + i as u64, "episode ids are consecutive");
            if self.commit_after.contains(&i) || self.commit_every.is_some_and(|n| (i + 1) % n == 0)
            {
                w.commit().unwrap();
            }
        }
        w.finish().unwrap()
    }

    /// A new dataset at `path` holding the episodes.
    pub fn write(&self, path: &Path) -> Dataset {
        let ds = self.create(path);
        self.append_to(&ds);
        ds
    }

    /// [`TestData::write`], then a snapshot of its latest version.
    pub fn snapshot(&self, path: &Path) -> Snapshot {
        self.write(path).snapshot().unwrap()
    }
}

/// Copies the directory tree `from` to `to` (created), files and subdirectories.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let p = entry.unwrap().path();
        let q = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &q);
        } else {
            std::fs::copy(&p, &q).unwrap();
        }
    }
}
