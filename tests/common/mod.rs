//! Helpers shared by the integration tests (each test binary uses some of them).
#![allow(dead_code)]

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type};
use trajstore::Snapshot;

/// (terminated, truncated) of every episode, read from the boundary columns of its last row.
pub fn ends(snap: &Snapshot) -> Vec<(bool, bool)> {
    (0..snap.num_episodes())
        .map(|id| {
            let e = snap.episode(id).unwrap();
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
/// SKIPPED line for `what`. Under `CI=true` a missing module is a failure: `scripts/test.sh`
/// installs them through `scripts/setup-python.sh`.
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
    eprintln!("SKIPPED: {what} needs Python with {modules} (set TRAJSTORE_PYTHON)");
    None
}
