//! A loader that follows a growing dataset (issue 22): a writer commits while several loaders
//! sample; new episodes become sampleable within the refresh period; every batch comes from one
//! version and reads the rows it names; under retention no batch reads a removed episode of its
//! version and nothing dies of a signal. (The Python suite runs the collector in another
//! process.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::{TestData, err_of, open_loader};
use trajstore::format::col;
use trajstore::{
    Batch, Dataset, Follow, Loader, LoaderOptions, LoaderSpec, SamplerKind, SamplerSpec,
    WriterOptions,
};

/// Every valid step of `b` holds the episode id and step number its slice names: the batch was
/// gathered from the rows its plan named, from one consistent snapshot.
fn check_rows(b: &Batch) {
    let ids = b.column(col::EPISODE_ID).unwrap().values::<u64>();
    let steps = b.column(col::STEP).unwrap().values::<u32>();
    let l = b.slice_len;
    for i in 0..b.num_slices {
        for j in 0..l {
            if b.mask[i * l + j] == 1 {
                assert_eq!(ids[i * l + j], b.episode_id[i], "slice {i} step {j}");
                assert_eq!(steps[i * l + j] as i64, b.start_step[i] + j as i64);
            }
        }
    }
}

fn following(snap: trajstore::Snapshot, follow: Follow, workers: usize) -> Loader {
    let s = SamplerSpec::new(SamplerKind::Uniform, 4, 32).with_seed(workers as u64);
    open_loader(
        LoaderSpec::single(snap, s, &[col::EPISODE_ID, col::STEP, col::REWARD]).follow(follow),
        LoaderOptions::default().with_workers(workers),
    )
    .unwrap()
}

#[test]
fn a_following_loader_samples_new_episodes_within_the_refresh_period() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    let data = TestData::new().seed(1).episodes([20u64; 8]);
    let snap = data.snapshot(&path);
    let period = Duration::from_millis(100);
    let mut loaders: Vec<Loader> = (1..=3)
        .map(|w| following(snap.clone(), Follow::every(period), w))
        .collect();
    let ds = Dataset::open(&path).unwrap();
    for round in 0..5u64 {
        // One new episode per commit, long enough to hold windows, with a new id.
        let v = TestData::new().seed(round).episodes([20u64]).append_to(&ds);
        let new_id = 8 + round;
        for l in &mut loaders {
            let t = Instant::now();
            let mut last_version = 0;
            let mut seen = false;
            // Within the period (plus the batches already in flight): the new version, and
            // then the new episode in the batches.
            while !seen {
                assert!(
                    t.elapsed() < period + Duration::from_secs(10),
                    "episode {new_id} (version {v}) never sampled"
                );
                let versions = l.versions();
                assert!(versions[0] >= last_version, "versions go forward");
                last_version = versions[0];
                let b = l.next_batch().unwrap();
                check_rows(&b);
                assert!(b.episode_id.iter().all(|&id| id <= new_id));
                seen = versions[0] >= v && b.episode_id.contains(&new_id);
            }
        }
    }
    for l in &loaders {
        let s = l.follow_stats();
        assert!(s.refreshes >= 5, "{s:?}");
        assert_eq!(s.failures, 0, "{s:?}");
    }
}

#[test]
fn retention_never_removes_what_a_batch_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    let opts = WriterOptions::default()
        .with_segment_bytes(4 << 10)
        .with_max_transitions(600)
        .with_retention_grace(Duration::ZERO)
        .with_keep_versions(3);
    let snap = TestData::new()
        .seed(2)
        .episodes([30u64; 10])
        .writer_options(opts.clone())
        .snapshot(&path);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, path, opts) = (stop.clone(), path.clone(), opts.clone());
        std::thread::spawn(move || {
            let ds = Dataset::open(&path).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                TestData::new()
                    .seed(n)
                    .episodes([30u64, 25])
                    .writer_options(opts.clone())
                    .append_to(&ds);
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            n
        })
    };
    let mut loaders: Vec<Loader> = (1..=3)
        .map(|w| following(snap.clone(), Follow::every_batches(3), w))
        .collect();
    let start = Instant::now();
    let mut batches = 0u64;
    while start.elapsed() < Duration::from_secs(4) {
        for l in &mut loaders {
            let versions = l.versions();
            let b = l.next_batch().unwrap();
            check_rows(&b);
            // The batch's episodes are those of its version: the oldest ids are gone from
            // newer versions, and a batch of version v never names an id retention dropped
            // before v (ids only grow, so the smallest id must be recent enough).
            let ds = Dataset::open(&path).unwrap();
            if let Ok(m) = ds.catalog_at(versions[0]) {
                let first = m.manifest().segments.first().map(|s| s.first_episode_id);
                if let Some(first) = first {
                    assert!(b.episode_id.iter().all(|&id| id >= first));
                }
            }
            batches += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let commits = writer.join().unwrap();
    assert!(commits > 10, "{commits} commits");
    let ds = Dataset::open(&path).unwrap();
    let newest = ds.snapshot().unwrap();
    assert!(
        newest.episodes().first_id() > 10,
        "retention dropped the first episodes"
    );
    for l in &loaders {
        let s = l.follow_stats();
        assert!(s.refreshes > 3, "{s:?} after {batches} batches");
    }
}

#[test]
fn following_needs_an_endless_sampler() {
    let dir = tempfile::tempdir().unwrap();
    let snap = TestData::new()
        .episodes([20u64; 4])
        .snapshot(&dir.path().join("d"));
    for kind in [SamplerKind::Epoch, SamplerKind::Prioritized] {
        let spec = LoaderSpec::single(snap.clone(), SamplerSpec::new(kind, 4, 8), &[col::STEP])
            .follow(Follow::default());
        let e = err_of(open_loader(spec, LoaderOptions::default()));
        assert!(e.to_string().contains("follow"), "{e}");
    }
}
