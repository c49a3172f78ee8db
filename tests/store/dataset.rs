//! Write → commit → reopen round trips, the step API, locking, retention, refresh and bad input.

use std::sync::Arc;

use crate::common::{TestData, fsl};
use arrow::array::{Array, ArrayRef, AsArray, Float32Array, RecordBatch};
use arrow::datatypes::{Float32Type, UInt32Type, UInt64Type};
use proptest::prelude::*;
use trajstore::format::{col, ep};
use trajstore::{Dataset, EpisodeEnd, EpisodeIndex, Error, Step, Values, WriterOptions};

fn check_round_trip(ds: &Dataset, written: &[(RecordBatch, EpisodeEnd)]) {
    let snap = ds.snapshot().unwrap();
    assert_eq!(snap.num_episodes(), written.len() as u64);
    let total: usize = written.iter().map(|(b, _)| b.num_rows()).sum();
    assert_eq!(snap.num_transitions(), total as u64);
    let idx = snap.episodes();
    assert_eq!(
        idx.lengths(),
        written
            .iter()
            .map(|(b, _)| b.num_rows() as u64)
            .collect::<Vec<_>>()
    );
    for (id, (batch, end)) in written.iter().enumerate() {
        let got = snap.episode(id as u64).unwrap().unwrap();
        let n = batch.num_rows();
        assert_eq!(got.num_rows(), n);
        for name in [col::OBSERVATION, col::ACTION, col::REWARD] {
            assert_eq!(
                got.column_by_name(name).unwrap().to_data(),
                batch.column_by_name(name).unwrap().to_data(),
                "episode {id} column {name}"
            );
        }
        let u64s = got
            .column_by_name(col::EPISODE_ID)
            .unwrap()
            .as_primitive::<UInt64Type>()
            .clone();
        assert!(u64s.values().iter().all(|&x| x == id as u64));
        let steps = got
            .column_by_name(col::STEP)
            .unwrap()
            .as_primitive::<UInt32Type>()
            .clone();
        assert_eq!(steps.values().to_vec(), (0..n as u32).collect::<Vec<_>>());
        let flag = |name: &str, i: usize| got.column_by_name(name).unwrap().as_boolean().value(i);
        for i in 0..n {
            assert_eq!(flag(col::IS_FIRST, i), i == 0);
            assert_eq!(flag(col::IS_LAST, i), i + 1 == n);
            assert_eq!(flag(col::TERMINATED, i), i + 1 == n && end.terminated);
            assert_eq!(flag(col::TRUNCATED, i), i + 1 == n && end.truncated);
        }
    }
    // The final observations are kept in the episode tables.
    let finals = snap.episode_column(ep::FINAL_OBSERVATION).unwrap();
    let mut k = 0;
    for a in finals {
        let a = a.as_fixed_size_list();
        for i in 0..a.len() {
            let want = written[k].1.final_observation.as_ref().unwrap();
            assert_eq!(
                a.value(i).to_data(),
                want.as_fixed_size_list().value(0).to_data()
            );
            k += 1;
        }
    }
    trajstore::store::verify::verify(&snap, |_| {}).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn write_commit_reopen_round_trips(
        lens in proptest::collection::vec(1u64..60, 1..40),
        commits in proptest::collection::vec(0usize..40, 0..5),
        obs_dim in 1usize..5,
        segment_bytes in 200u64..4000,
        batch_bytes in 100u64..2000,
        seed in any::<u64>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let data = TestData::new()
            .obs_dim(obs_dim)
            .seed(seed)
            .episodes(&lens)
            .commit_after(commits)
            .segment_bytes(segment_bytes)
            .batch_bytes(batch_bytes);
        let ds = data.write(&dir.path().join("d"));
        check_round_trip(&ds, &data.episode_data());
        // Every segment holds whole episodes and respects its target unless one episode is larger.
        let snap = ds.snapshot().unwrap();
        let row_bytes = snap.schema().row_bytes();
        for seg in snap.segments() {
            let t = seg.episode_table().batch();
            let lens = t.column_by_name(ep::LENGTH).unwrap().as_primitive::<UInt64Type>();
            if lens.len() > 1 {
                prop_assert!(seg.entry().rows as f64 * row_bytes <= segment_bytes as f64 + 1.0);
            }
        }
        // Reopening from scratch builds the same index as the writer-side view.
        let again = Dataset::open(dir.path().join("d")).unwrap().snapshot().unwrap();
        prop_assert_eq!(again.episodes().as_ref(), snap.episodes().as_ref());
    }
}

#[test]
fn step_api_matches_batch_api() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestData::new().obs_dim(3).seed(7).spec();
    let a = Dataset::create(dir.path().join("a"), &s.schema().unwrap()).unwrap();
    let b = Dataset::create(dir.path().join("b"), &s.schema().unwrap()).unwrap();
    let mut wa = a.writer(WriterOptions::default()).unwrap();
    let mut wb = b.writer(WriterOptions::default()).unwrap();
    for i in 0..5 {
        let (batch, end) = s.episode(i, 10 + i);
        wa.append_episode(&batch, end.clone()).unwrap();
        let obs = batch
            .column_by_name(col::OBSERVATION)
            .unwrap()
            .as_fixed_size_list()
            .clone();
        let act = batch
            .column_by_name(col::ACTION)
            .unwrap()
            .as_fixed_size_list()
            .clone();
        let rew = batch
            .column_by_name(col::REWARD)
            .unwrap()
            .as_primitive::<Float32Type>()
            .clone();
        for t in 0..batch.num_rows() {
            let o = obs.value(t);
            let a = act.value(t);
            wb.append_step(Step {
                observation: Values::F32(o.as_primitive::<Float32Type>().values()),
                action: Values::F32(a.as_primitive::<Float32Type>().values()),
                reward: rew.value(t),
                next_observation: None,
                columns: &[],
            })
            .unwrap();
        }
        wb.end_episode(end).unwrap();
    }
    wa.commit().unwrap();
    wb.commit().unwrap();
    let (sa, sb) = (a.snapshot().unwrap(), b.snapshot().unwrap());
    for id in 0..5 {
        assert_eq!(
            sa.episode(id).unwrap().unwrap(),
            sb.episode(id).unwrap().unwrap()
        );
    }
    // A step with the wrong width is rejected and leaves the episode in progress untouched.
    let err = wb
        .append_step(Step {
            observation: Values::F32(&[1.0, 2.0]),
            action: Values::F32(&[0.0, 0.0]),
            reward: 0.0,
            next_observation: None,
            columns: &[],
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("observation") && err.contains("3 values"),
        "{err}"
    );
    let err = wb.end_episode(EpisodeEnd::truncated()).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. }),
        "no steps were appended: {err}"
    );
}

#[test]
fn second_writer_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let ds = TestData::new().create(&dir.path().join("d"));
    let w = ds.writer(WriterOptions::default()).unwrap();
    let err = ds.writer(WriterOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains("locked by another writer"));
    drop(w);
    ds.writer(WriterOptions::default()).unwrap();
}

#[test]
fn snapshots_are_isolated_and_refresh_extends_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestData::new().obs_dim(2).seed(3).spec();
    let ds = Dataset::create(dir.path().join("d"), &s.schema().unwrap()).unwrap();
    let opts = WriterOptions::default().with_segment_bytes(500);
    let mut w = ds.writer(opts).unwrap();
    for i in 0..10 {
        let (b, e) = s.episode(i, 5 + i);
        w.append_episode(&b, e).unwrap();
    }
    let v2 = w.commit().unwrap();
    let mut snap = ds.snapshot().unwrap();
    let old = snap.clone();
    for i in 10..25 {
        let (b, e) = s.episode(i, 3 + i % 7);
        w.append_episode(&b, e).unwrap();
        // Uncommitted data is invisible.
        assert_eq!(ds.snapshot().unwrap().version(), v2);
    }
    let v3 = w.commit().unwrap();
    assert_eq!(snap.version(), v2);
    assert!(snap.refresh().unwrap());
    assert!(!snap.refresh().unwrap());
    assert_eq!(snap.version(), v3);
    assert_eq!(snap.num_episodes(), 25);
    // Segments already mapped are reused, and the extended index equals a rebuilt one.
    assert!(Arc::ptr_eq(&snap.segments()[0], &old.segments()[0]));
    let rebuilt =
        EpisodeIndex::from_segments(0, snap.segments().iter().map(|s| s.episode_table().spans()));
    assert_eq!(snap.episodes().as_ref(), &rebuilt);
    // Time travel: the old version is still readable.
    assert_eq!(ds.snapshot_at(v2).unwrap().num_episodes(), 10);
    assert_eq!(ds.versions().unwrap(), vec![1, v2, v3]);
}

#[test]
fn retention_drops_oldest_segments_and_prunes_files() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestData::new().obs_dim(2).seed(5).spec();
    let ds = Dataset::create(dir.path().join("d"), &s.schema().unwrap()).unwrap();
    let opts = WriterOptions::default()
        .with_segment_bytes(400)
        .with_max_transitions(100)
        .with_keep_versions(1)
        .with_retention_grace(std::time::Duration::ZERO);
    let mut w = ds.writer(opts).unwrap();
    let mut snap = ds.snapshot().unwrap();
    for i in 0..60 {
        let (b, e) = s.episode(i, 8);
        w.append_episode(&b, e).unwrap();
        if i % 5 == 4 {
            w.commit().unwrap();
            assert!(snap.refresh().unwrap());
            // The newest 100 transitions (or all so far), in whole segments: without its
            // oldest segment the version would hold fewer.
            let n = snap.num_transitions();
            assert!(n >= 100.min(8 * (i + 1)), "{n}");
            assert!(n - snap.segments()[0].num_rows() < 100, "{n}");
            let rebuilt = EpisodeIndex::from_segments(
                snap.episodes().first_id(),
                snap.segments().iter().map(|s| s.episode_table().spans()),
            );
            assert_eq!(
                snap.episodes().as_ref(),
                &rebuilt,
                "extended index after retention"
            );
        }
    }
    let snap = ds.snapshot().unwrap();
    assert!(snap.num_transitions() >= 100);
    assert!(snap.num_transitions() - snap.segments()[0].num_rows() < 100);
    // Episode ids keep counting; the oldest are gone.
    let first = snap.episodes().first_id();
    assert!(first > 0);
    assert_eq!(first + snap.num_episodes(), 60);
    assert_eq!(snap.episode(first).unwrap().unwrap().num_rows(), 8);
    assert_eq!(
        snap.episode(59).unwrap().unwrap().num_rows(),
        8,
        "the newest episode is kept"
    );
    assert!(snap.episode(first - 1).unwrap().is_none());
    // Only the newest version and its files remain.
    assert_eq!(ds.versions().unwrap().len(), 1);
    let files = std::fs::read_dir(dir.path().join("d/segments"))
        .unwrap()
        .count();
    assert_eq!(files, 2 * snap.segments().len());
    trajstore::store::verify::verify(&snap, |_| {}).unwrap();
}

#[test]
fn bad_episodes_are_clear_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestData::new().obs_dim(2).seed(1).spec();
    let ds = Dataset::create(dir.path().join("d"), &s.schema().unwrap()).unwrap();
    let mut w = ds.writer(WriterOptions::default()).unwrap();
    let (good, _) = s.episode(0, 3);
    let err = w
        .append_episode(&good, EpisodeEnd::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("terminated or truncated"), "{err}");
    let err = w
        .append_episode(&good.slice(0, 0), EpisodeEnd::truncated())
        .unwrap_err()
        .to_string();
    assert!(err.contains("at least one transition"), "{err}");
    let with_null = RecordBatch::try_from_iter([
        (col::OBSERVATION, fsl(vec![0.0; 6], 2)),
        (col::ACTION, fsl(vec![0.0; 6], 2)),
        (
            col::REWARD,
            Arc::new(Float32Array::from(vec![Some(1.0), None, Some(0.0)])) as ArrayRef,
        ),
    ])
    .unwrap();
    let err = w
        .append_episode(&with_null, EpisodeEnd::truncated())
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidData { column: Some(ref c), .. } if c == "reward"),
        "{err}"
    );
    assert!(err.to_string().contains("null at row 1"), "{err}");
    let wrong_width = RecordBatch::try_from_iter([
        (col::OBSERVATION, fsl(vec![0.0; 9], 3)),
        (col::ACTION, fsl(vec![0.0; 6], 2)),
        (
            col::REWARD,
            Arc::new(Float32Array::from(vec![0.0; 3])) as ArrayRef,
        ),
    ])
    .unwrap();
    let err = w
        .append_episode(&wrong_width, EpisodeEnd::truncated())
        .unwrap_err();
    assert!(matches!(err, Error::SchemaMismatch { .. }), "{err}");
    let extra = RecordBatch::try_from_iter([
        (col::OBSERVATION, fsl(vec![0.0; 6], 2)),
        (col::ACTION, fsl(vec![0.0; 6], 2)),
        (
            col::REWARD,
            Arc::new(Float32Array::from(vec![0.0; 3])) as ArrayRef,
        ),
        (
            "surprise",
            Arc::new(Float32Array::from(vec![0.0; 3])) as ArrayRef,
        ),
    ])
    .unwrap();
    let err = w
        .append_episode(&extra, EpisodeEnd::truncated())
        .unwrap_err()
        .to_string();
    assert!(err.contains("surprise"), "{err}");
    assert_eq!(
        w.commit().unwrap(),
        1,
        "nothing was appended, nothing committed"
    );
    assert_eq!(ds.snapshot().unwrap().num_transitions(), 0);
}

#[test]
fn damaged_files_are_corrupt_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("d");
    let ds = TestData::new()
        .obs_dim(2)
        .seed(9)
        .episodes([30, 40, 50])
        .write(&root);
    let snap = ds.snapshot().unwrap();
    let seg = root.join(&snap.manifest().segments[0].path);
    let good = std::fs::read(&seg).unwrap();
    drop(snap);

    // Truncated: open fails.
    std::fs::write(&seg, &good[..good.len() - 100]).unwrap();
    let err = ds.snapshot().unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&*seg.file_name().unwrap().to_string_lossy()),
        "{err}"
    );

    // One flipped bit in the column data: open succeeds (it reads no data), verify catches it.
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x10;
    std::fs::write(&seg, &flipped).unwrap();
    let snap = ds.snapshot().unwrap();
    let err = trajstore::store::verify::verify(&snap, |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("checksum"), "{err}");
    drop(snap);

    // A foreign file in place of a segment.
    std::fs::write(&seg, b"not an arrow file at all").unwrap();
    assert!(matches!(ds.snapshot(), Err(Error::Corrupt { .. })));

    // A missing segment.
    std::fs::remove_file(&seg).unwrap();
    assert!(matches!(ds.snapshot(), Err(Error::NotFound { .. })));

    // A corrupt manifest.
    std::fs::write(&seg, &good).unwrap();
    ds.snapshot().unwrap();
    let m = root
        .join("_versions")
        .join(trajstore::format::manifest_name(2));
    let text = std::fs::read_to_string(&m).unwrap();
    std::fs::write(&m, text.replace("segments/", "../../etc/")).unwrap();
    let err = ds.snapshot().unwrap_err().to_string();
    assert!(err.contains("must be relative"), "{err}");
    std::fs::write(&m, &text[..text.len() / 2]).unwrap();
    // Opening the dataset reads no manifest; reading the damaged version is Corrupt.
    assert!(matches!(
        Dataset::open(&root).and_then(|d| d.snapshot()),
        Err(Error::Corrupt { .. })
    ));
    assert!(matches!(
        Dataset::open(dir.path().join("nope")),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn a_catalog_reads_the_episode_tables_only_and_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("d");
    let ds = TestData::new()
        .obs_dim(3)
        .seed(4)
        .episodes([30, 40, 50, 20, 25])
        .commit_after([2])
        .write(&root);
    let snap = ds.snapshot().unwrap();
    assert_eq!(snap.segments().len(), 2, "a commit seals its segment");
    let cat = ds.catalog().unwrap();
    assert_eq!(cat.version(), snap.version());
    assert_eq!(
        (cat.num_transitions(), cat.num_episodes()),
        (165, 5),
        "counts from the manifest"
    );
    assert_eq!(cat.bytes_on_disk(), snap.bytes_on_disk());
    let tables: Vec<_> = snap
        .segments()
        .iter()
        .map(|s| s.episode_table().clone())
        .collect();
    assert_eq!(cat.episode_tables(), &tables[..]);
    assert_eq!(snap.catalog().episode_tables(), &tables[..]);
    let lengths = cat.episode_column(ep::LENGTH).unwrap();
    let lengths: Vec<u64> = lengths
        .iter()
        .flat_map(|a| a.as_primitive::<UInt64Type>().values().to_vec())
        .collect();
    assert_eq!(lengths, [30, 40, 50, 20, 25]);
    let err = cat.episode_column("nope").unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { argument: Some(ref a), .. } if a == "name"),
        "{err}"
    );
    let older = ds.catalog_at(snap.version() - 1).unwrap();
    assert_eq!(older.num_episodes(), 3);

    // No transition file is opened: without them the catalog still loads, a snapshot does not.
    let seg = root.join(&snap.manifest().segments[1].path);
    let ep_file = root.join(&snap.manifest().segments[0].episodes_path);
    drop(snap);
    std::fs::rename(&seg, dir.path().join("aside")).unwrap();
    assert!(matches!(ds.snapshot(), Err(Error::NotFound { .. })));
    assert_eq!(ds.catalog().unwrap().episode_tables(), &tables[..]);

    // A damaged episode table is a corrupt error naming it.
    let good = std::fs::read(&ep_file).unwrap();
    std::fs::write(&ep_file, &good[..good.len() - 64]).unwrap();
    let err = ds.catalog().unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&*ep_file.file_name().unwrap().to_string_lossy()),
        "{err}"
    );
}
