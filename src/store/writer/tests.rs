//! Unit tests of the writer: rejected episodes leave the writer unchanged, commits with nothing to
//! commit, episodes larger than a segment or a record batch, column conformance, and the clean-up
//! of what a crashed writer left.

use super::*;

use arrow::array::{Float32Array, Int64Array};
use arrow::datatypes::Field;

use crate::store::Dataset;

/// The schema of these tests: 3-d observations, 2-d continuous actions, derived
/// `next_observation`.
fn schema() -> TransitionSchema {
    TransitionSchema::builder(&[3], 2).build().unwrap()
}

/// Episode `i` of `n` steps of [`schema`], with its final observation; even episodes end
/// terminated, odd ones truncated. (Not `synth`, which is above `store` in the layers.)
fn episode(i: u64, n: u64) -> (RecordBatch, EpisodeEnd) {
    let v = |t: u64, k: u64| (i * 1000 + t * 10 + k) as f32;
    let obs: Vec<f32> = (0..n).flat_map(|t| (0..3).map(move |k| v(t, k))).collect();
    let act: Vec<f32> = (0..n).flat_map(|t| (0..2).map(move |k| -v(t, k))).collect();
    let reward: Vec<f32> = (0..n).map(|t| v(t, 0) / 7.0).collect();
    let batch = RecordBatch::try_from_iter([
        (col::OBSERVATION, fsl(obs, 3, "item", false)),
        (col::ACTION, fsl(act, 2, "item", false)),
        (
            col::REWARD,
            Arc::new(Float32Array::from(reward)) as ArrayRef,
        ),
    ])
    .unwrap();
    let end = if i.is_multiple_of(2) {
        EpisodeEnd::terminated()
    } else {
        EpisodeEnd::truncated()
    };
    let fin = fsl((0..3).map(|k| v(n, k)).collect(), 3, "item", false);
    (batch, end.with_final_observation(fin))
}

/// A new dataset of [`schema`] and a writer on it.
fn writer(dir: &Path, options: WriterOptions) -> (Dataset, DatasetWriter) {
    let ds = Dataset::create(dir.join("d"), &schema()).unwrap();
    let w = DatasetWriter::open(ds.path(), options).unwrap();
    (ds, w)
}

/// The manifest versions on disk.
fn versions(ds: &Dataset) -> Vec<u64> {
    manifest::list_versions(ds.path()).unwrap()
}

/// Names of the files in `segments/`, sorted.
fn segment_dir(ds: &Dataset) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(ds.path().join(format::SEGMENTS_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// What the writer has taken in so far, to check that a rejected call changed nothing.
fn state(w: &DatasetWriter) -> (u64, u64, u64, usize, u64, bool, usize) {
    (
        w.next_episode_id,
        w.next_row,
        w.next_segment_id,
        w.pending.len(),
        w.pending_rows,
        w.open.is_some(),
        w.new_segments.len(),
    )
}

fn fsl(values: Vec<f32>, width: i32, item: &str, nullable: bool) -> ArrayRef {
    Arc::new(FixedSizeListArray::new(
        Arc::new(Field::new(item, DataType::Float32, nullable)),
        width,
        Arc::new(Float32Array::from(values)),
        None,
    ))
}

#[test]
fn an_empty_episode_is_invalid_data_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, mut w) = writer(dir.path(), WriterOptions::default());
    let (b, e) = episode(0, 4);
    w.append_episode(&b, e.clone()).unwrap();
    let before = state(&w);
    let err = w.append_episode(&b.slice(0, 0), e.clone()).unwrap_err();
    assert!(matches!(err, Error::InvalidData { .. }), "{err}");
    assert_eq!(state(&w), before);
    // Neither end flag: invalid data too, nothing taken.
    let err = w.append_episode(&b, EpisodeEnd::default()).unwrap_err();
    assert!(matches!(err, Error::InvalidData { .. }), "{err}");
    assert_eq!(state(&w), before);
    // A final observation of two rows.
    let two = fsl(vec![0.0; 6], 3, "item", false);
    let err = w
        .append_episode(&b, EpisodeEnd::truncated().with_final_observation(two))
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { argument: Some(ref a), .. } if a == "final_observation"),
        "{err}"
    );
    assert_eq!(state(&w), before);
    assert_eq!(w.commit().unwrap(), 2);
    let snap = ds.snapshot().unwrap();
    assert_eq!((snap.num_episodes(), snap.num_transitions()), (1, 4));
}

#[test]
fn a_commit_with_nothing_to_commit_keeps_the_version() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, mut w) = writer(dir.path(), WriterOptions::default());
    assert_eq!(w.base_version(), 1);
    assert_eq!(w.commit().unwrap(), 1, "a fresh writer");
    assert_eq!(w.commit().unwrap(), 1, "twice");
    assert_eq!(versions(&ds), vec![1]);
    let (b, e) = episode(0, 6);
    w.append_episode(&b, e).unwrap();
    assert_eq!(w.commit().unwrap(), 2);
    let files = segment_dir(&ds);
    assert_eq!(w.commit().unwrap(), 2, "nothing since the last commit");
    assert_eq!(versions(&ds), vec![1, 2]);
    assert_eq!(segment_dir(&ds), files, "no new segment file either");
    // Only a failed append since: still nothing.
    let err = w
        .append_episode(&b.slice(0, 0), EpisodeEnd::truncated())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidData { .. }), "{err}");
    // A step episode in progress is not part of a commit.
    let obs = [0.5f32; 3];
    let act = [0.0f32; 2];
    w.append_step(Step {
        observation: Values::F32(&obs),
        action: Values::F32(&act),
        reward: 1.0,
        next_observation: None,
        columns: &[],
    })
    .unwrap();
    assert_eq!(w.commit().unwrap(), 2, "an unfinished step episode");
    assert_eq!(w.finish().unwrap(), 2);
    assert_eq!(versions(&ds), vec![1, 2]);
    assert_eq!(ds.snapshot().unwrap().num_transitions(), 6);
}

#[test]
fn the_step_api_refuses_mixed_and_empty_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let (_ds, mut w) = writer(dir.path(), WriterOptions::default());
    let err = w.end_episode(EpisodeEnd::terminated()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let obs = [0.5f32; 3];
    let act = [0.0f32; 2];
    let step = || Step {
        observation: Values::F32(&obs),
        action: Values::F32(&act),
        reward: 1.0,
        next_observation: None,
        columns: &[],
    };
    w.append_step(step()).unwrap();
    let (b, e) = episode(0, 3);
    let before = state(&w);
    let err = w.append_episode(&b, e.clone()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert_eq!(state(&w), before);
    // A step with a next_observation the dataset derives.
    let err = w
        .append_step(Step {
            next_observation: Some(Values::F32(&obs)),
            ..step()
        })
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { argument: Some(ref a), .. } if a == "next_observation"),
        "{err}"
    );
    assert_eq!(w.end_episode(EpisodeEnd::truncated()).unwrap(), 0);
    assert_eq!(w.append_episode(&b, e).unwrap(), 1);
    // end_episode right after one: no steps.
    let err = w.end_episode(EpisodeEnd::truncated()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
}

/// Segments hold whole episodes: an episode larger than the segment target gets a segment of
/// its own (never split across two), the open segment is rolled before an episode that would
/// push it past its target, and the manifest's row and episode accounting adds up.
#[test]
fn an_episode_larger_than_a_segment_gets_a_segment_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let row_bytes = schema().row_bytes();
    // Room for ~40 rows of data (plus the file's schema header).
    let target = (40.0 * row_bytes) as u64 + 2048;
    let (ds, mut w) = writer(
        dir.path(),
        WriterOptions::default().with_segment_bytes(target),
    );
    let lens = [3u64, 5, 400, 2, 2, 7, 300, 1];
    for (i, &n) in lens.iter().enumerate() {
        let (b, e) = episode(i as u64, n);
        w.append_episode(&b, e).unwrap();
    }
    assert_eq!(w.commit().unwrap(), 2);
    let m = ds.latest_manifest().unwrap();
    let mut next = 0usize; // position of the next segment's first episode
    let mut row = 0u64;
    for seg in &m.segments {
        assert_eq!(seg.first_episode_id, next as u64);
        assert_eq!(seg.first_row, row);
        let held = &lens[next..next + seg.episodes as usize];
        assert_eq!(seg.rows, held.iter().sum::<u64>(), "segment {}", seg.id);
        if held.iter().any(|&n| n >= 300) {
            assert_eq!(held.len(), 1, "a large episode shares segment {}", seg.id);
        } else {
            assert!(
                seg.bytes <= target + (row_bytes as u64) * 8 + 4096,
                "segment {} of {} bytes for a target of {target}",
                seg.id,
                seg.bytes
            );
        }
        next += seg.episodes as usize;
        row += seg.rows;
    }
    assert_eq!(next, lens.len());
    assert!(m.segments.len() >= 4, "{} segments", m.segments.len());
    assert_eq!(m.next_row, lens.iter().sum::<u64>());
    // Every episode reads back whole from its segment.
    let snap = ds.snapshot().unwrap();
    for (i, &n) in lens.iter().enumerate() {
        let (want, _) = episode(i as u64, n);
        let got = snap.episode(i as u64).unwrap().unwrap();
        assert_eq!(got.num_rows() as u64, n);
        assert_eq!(
            got.column_by_name(col::REWARD).unwrap().to_data(),
            want.column_by_name(col::REWARD).unwrap().to_data()
        );
    }
}

/// Record batches hold whole episodes too: small episodes are buffered and written together, an
/// episode larger than the batch target is a batch of its own.
#[test]
fn record_batches_hold_whole_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let row_bytes = schema().row_bytes();
    let batch = (10.0 * row_bytes) as u64;
    let (ds, mut w) = writer(dir.path(), WriterOptions::default().with_batch_bytes(batch));
    let lens = [2u64, 3, 2, 50, 1, 1, 1, 30, 4];
    for (i, &n) in lens.iter().enumerate() {
        let (b, e) = episode(i as u64, n);
        w.append_episode(&b, e).unwrap();
        assert!(
            w.pending_rows as f64 * row_bytes < batch as f64,
            "a full batch is flushed at once"
        );
    }
    w.commit().unwrap();
    let snap = ds.snapshot().unwrap();
    assert_eq!(snap.segments().len(), 1);
    let seg = &snap.segments()[0];
    let rows: Vec<usize> = seg
        .batches()
        .unwrap()
        .iter()
        .map(|b| b.num_rows())
        .collect();
    assert!(rows.contains(&50) && rows.contains(&30), "{rows:?}");
    assert!(
        rows.len() < lens.len(),
        "small episodes share batches: {rows:?}"
    );
    // Each batch starts at an episode start.
    let mut starts = vec![0u64];
    for &n in &lens {
        starts.push(starts.last().unwrap() + n);
    }
    let mut at = 0u64;
    for r in rows {
        assert!(starts.contains(&at), "a batch starts inside an episode");
        at += r as u64;
    }
    assert_eq!(at, lens.iter().sum::<u64>());
}

#[test]
fn conform_rebuilds_lists_and_rejects_nulls_and_other_types() {
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let field: arrow::datatypes::FieldRef =
        Arc::new(Field::new("x", DataType::FixedSizeList(item, 2), false));
    // Another writer's child name and nullability: rebuilt with the stored child.
    let foreign = fsl(vec![1.0, 2.0, 3.0, 4.0], 2, "element", true);
    let got = conform(&field, &foreign).unwrap();
    assert_eq!(got.data_type(), field.data_type());
    assert_eq!(
        got.as_fixed_size_list()
            .values()
            .as_primitive::<Float32Type>()
            .values(),
        &[1.0, 2.0, 3.0, 4.0]
    );
    // The same type: returned as is.
    let same = fsl(vec![1.0, 2.0], 2, "item", false);
    assert!(Arc::ptr_eq(&conform(&field, &same).unwrap(), &same));
    // A null row of a non-nullable column names the row.
    let nulls = Arc::new(FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        2,
        Arc::new(Float32Array::from(vec![0.0; 6])),
        Some(vec![true, true, false].into()),
    )) as ArrayRef;
    let e = conform(&field, &nulls).unwrap_err();
    assert!(matches!(e, Error::InvalidData { .. }), "{e}");
    assert!(e.to_string().contains("row 2"), "{e}");
    // A null list item.
    let items = Arc::new(FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        2,
        Arc::new(Float32Array::from(vec![Some(1.0), None])),
        None,
    )) as ArrayRef;
    let e = conform(&field, &items).unwrap_err();
    assert!(matches!(e, Error::InvalidData { .. }), "{e}");
    // Another width or element type, or not a list: a schema mismatch.
    for other in [
        fsl(vec![0.0; 6], 3, "item", false),
        Arc::new(FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Int64, false)),
            2,
            Arc::new(Int64Array::from(vec![0; 4])),
            None,
        )) as ArrayRef,
        Arc::new(Float32Array::from(vec![0.0; 2])) as ArrayRef,
    ] {
        let e = conform(&field, &other).unwrap_err();
        assert!(matches!(e, Error::SchemaMismatch { .. }), "{e}");
    }
    // A nullable scalar column takes nulls.
    let nullable: arrow::datatypes::FieldRef = Arc::new(Field::new("y", DataType::Float32, true));
    let with_null = Arc::new(Float32Array::from(vec![Some(1.0), None])) as ArrayRef;
    assert_eq!(conform(&nullable, &with_null).unwrap().null_count(), 1);
}

#[test]
fn segment_files_are_found_by_name_only() {
    let dir = tempfile::tempdir().unwrap();
    let segs = dir.path().join(format::SEGMENTS_DIR);
    std::fs::create_dir_all(&segs).unwrap();
    for name in [
        format!("{}{}", format::segment_name(3), format::SEGMENT_SUFFIX),
        format!("{}{}", format::segment_name(3), format::EPISODES_SUFFIX),
        format!("{}{}", format::segment_name(12), format::EPISODES_SUFFIX),
        format!("{}{}", format::segment_name(0), format::SEGMENT_SUFFIX),
        format!("{}{}.tmp", format::segment_name(7), format::SEGMENT_SUFFIX),
        "12.arrow".into(),
        "notes.txt".into(),
        format!("x{}", &format::segment_name(4)[1..]) + format::SEGMENT_SUFFIX,
    ] {
        std::fs::write(segs.join(name), b"").unwrap();
    }
    assert_eq!(segment_files(dir.path()).unwrap(), vec![0, 3, 12]);
    assert!(segment_path(3).starts_with(format::SEGMENTS_DIR));
    assert!(segment_path(3).ends_with(format::SEGMENT_SUFFIX));
    assert!(episodes_path(3).ends_with(format::EPISODES_SUFFIX));
    assert_eq!(
        std::path::Path::new(&segment_path(3)).file_name(),
        std::path::Path::new(&format!(
            "{}{}",
            format::segment_name(3),
            format::SEGMENT_SUFFIX
        ))
        .file_name()
    );
}

/// A writer dropped without committing leaves files no manifest names; the next writer removes
/// them, and temporary files, and keeps the committed segments and foreign files.
#[test]
fn the_next_writer_removes_what_an_uncommitted_one_left() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, mut w) = writer(dir.path(), WriterOptions::default().with_segment_bytes(1));
    for i in 0..2 {
        let (b, e) = episode(i, 5);
        w.append_episode(&b, e).unwrap();
    }
    w.commit().unwrap();
    let committed = segment_dir(&ds);
    assert_eq!(
        committed.len(),
        4,
        "two segments of two files: {committed:?}"
    );
    for i in 2..5 {
        let (b, e) = episode(i, 5);
        w.append_episode(&b, e).unwrap();
    }
    drop(w); // sealed segments 2 and 3 and an open one (a .tmp file), never committed
    assert!(segment_dir(&ds).len() > committed.len());
    let root = ds.path();
    std::fs::write(root.join(format::SEGMENTS_DIR).join("notes.txt"), b"keep").unwrap();
    let stray = manifest::versions_dir(root).join(format!("{}.tmp", format::manifest_name(9)));
    std::fs::write(&stray, b"{").unwrap();
    let w = DatasetWriter::open(root, WriterOptions::default()).unwrap();
    let mut want = committed.clone();
    want.push("notes.txt".into());
    want.sort();
    assert_eq!(segment_dir(&ds), want);
    assert!(!stray.exists());
    assert_eq!(
        w.next_episode_id(),
        2,
        "the uncommitted ids are given again"
    );
    assert_eq!(ds.snapshot().unwrap().num_episodes(), 2);
}

#[test]
fn a_second_writer_is_locked_out() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, w) = writer(dir.path(), WriterOptions::default());
    let e = DatasetWriter::open(ds.path(), WriterOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Locked { .. }), "{e}");
    drop(w);
    DatasetWriter::open(ds.path(), WriterOptions::default()).unwrap();
}

#[test]
fn a_writer_waits_up_to_lock_wait_for_the_lock() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let (ds, w) = writer(dir.path(), WriterOptions::default());
    // No wait: refused at once.
    let t = Instant::now();
    let e = DatasetWriter::open(
        ds.path(),
        WriterOptions::default().with_lock_wait(Duration::ZERO),
    )
    .unwrap_err();
    assert!(matches!(e, Error::Locked { .. }), "{e}");
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    // Released while a second writer waits: it gets the lock.
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(w);
    });
    let opts = WriterOptions::default().with_lock_wait(Duration::from_secs(30));
    let w2 = DatasetWriter::open(ds.path(), opts).unwrap();
    release.join().unwrap();
    drop(w2);
}

#[test]
fn retention_and_pruning_drop_whole_old_segments() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WriterOptions::default()
        .with_segment_bytes(1)
        .with_max_transitions(25)
        .with_keep_versions(2)
        .with_retention_grace(std::time::Duration::ZERO);
    let (ds, mut w) = writer(dir.path(), opts);
    for i in 0..12u64 {
        let (b, e) = episode(i, 10);
        w.append_episode(&b, e).unwrap();
        w.commit().unwrap();
        let m = ds.latest_manifest().unwrap();
        let total: u64 = m.segments.iter().map(|x| x.rows).sum();
        assert_eq!(m.transitions, total);
        // At least the newest 25 (all, before there are 25), never a segment more than needed.
        assert!(total >= 25.min(10 * (i + 1)), "{total} after commit {i}");
        assert!(total - m.segments[0].rows < 25, "{total} after commit {i}");
        assert!(versions(&ds).len() <= 2);
    }
    let m = ds.latest_manifest().unwrap();
    assert_eq!(m.segments.len(), 3);
    assert_eq!(m.segments[0].first_episode_id, 9);
    assert_eq!(m.next_episode_id, 12);
    // Files of dropped segments are gone once no kept version names them.
    let live: Vec<u64> = m.segments.iter().map(|x| x.id).collect();
    let on_disk = segment_files(ds.path()).unwrap();
    assert!(on_disk.len() <= 4, "{on_disk:?} for live {live:?}");
    assert!(live.iter().all(|id| on_disk.contains(id)));
}

#[test]
fn retention_waits_out_the_grace_period_and_vacuum_removes_after_it() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    // Default grace (minutes): superseded versions stay, with their files.
    let opts = WriterOptions::default()
        .with_segment_bytes(1)
        .with_max_transitions(10)
        .with_keep_versions(1);
    let (ds, mut w) = writer(dir.path(), opts);
    for i in 0..5u64 {
        let (b, e) = episode(i, 10);
        w.append_episode(&b, e).unwrap();
        w.commit().unwrap();
    }
    let all = versions(&ds);
    assert_eq!(
        all.len(),
        6,
        "in the grace period nothing is removed: {all:?}"
    );
    // A reader of an old version still opens it, and its files verify.
    let old = ds.snapshot_at(all[2]).unwrap();
    crate::store::verify::verify(&old, |_| {}).unwrap();
    // An explicit vacuum with a shorter grace removes them; the open snapshot keeps reading.
    let report = w.vacuum(1, Duration::ZERO).unwrap();
    assert_eq!(report.versions_removed, all[..5].to_vec());
    assert!(
        report.files_removed > 0 && report.bytes_removed > 0,
        "{report:?}"
    );
    assert_eq!(versions(&ds), all[5..].to_vec());
    assert!(matches!(
        ds.snapshot_at(all[2]).unwrap_err(),
        Error::NotFound { .. }
    ));
    crate::store::verify::verify(&old, |_| {}).unwrap();
    let live: Vec<u64> = ds
        .latest_manifest()
        .unwrap()
        .segments
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(segment_files(ds.path()).unwrap(), live);
    // Within the grace, a vacuum keeps what is recent.
    let (b, e) = episode(5, 10);
    w.append_episode(&b, e).unwrap();
    w.commit().unwrap();
    let report = w.vacuum(1, Duration::from_secs(3600)).unwrap();
    assert!(report.versions_removed.is_empty());
    assert_eq!(report.versions_in_grace.len(), 1);
}
