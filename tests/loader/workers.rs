//! The loader through the public API: the stream of batches does not depend on workers, queue
//! depth, buffer recycling or read-ahead; ranks shard it; epoch samplers stop after one epoch;
//! dropping a loader mid-stream returns; bad rank/world sizes are errors.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use crate::common::TestData;
use trajstore::format::col;
use trajstore::{
    Batch, BoundaryPolicy, EpochSampler, Gatherer, Loader, LoaderOptions, ReadAhead, Sampler,
    SliceIndex, SliceOptions, SliceSampler, Snapshot, Weighting,
};

const COLUMNS: [&str; 5] = [
    col::OBSERVATION,
    col::REWARD,
    col::EPISODE_ID,
    col::STEP,
    col::IS_LAST,
];

fn dataset(dir: &std::path::Path) -> Snapshot {
    let snap = TestData::new()
        .obs_dim(32)
        .act_dim(3)
        .seed(77)
        .episodes((0..50u64).map(|i| 2 + i * 37 % 90))
        .segment_bytes(60_000)
        .batch_bytes(20_000)
        .snapshot(&dir.join("d"));
    assert!(snap.segments().len() > 2);
    snap
}

/// Everything a batch holds, for comparisons.
#[derive(Debug, PartialEq)]
struct Key {
    episode_id: Vec<u64>,
    start_step: Vec<i64>,
    flags: Vec<Vec<u8>>,
    columns: Vec<(String, Vec<u8>)>,
    shape: (usize, usize),
}

fn key(b: &Batch) -> Key {
    Key {
        episode_id: b.episode_id.clone(),
        start_step: b.start_step.clone(),
        flags: vec![
            b.mask.clone(),
            b.is_first.clone(),
            b.is_last.clone(),
            b.terminated.clone(),
            b.truncated.clone(),
            b.slice_end.clone(),
        ],
        columns: b
            .columns
            .iter()
            .map(|c| (c.name.clone(), c.data.as_slice().to_vec()))
            .collect(),
        shape: (b.num_slices, b.slice_len),
    }
}

/// Sampler batches `batches` gathered directly, without a loader.
fn reference(sampler: &dyn Sampler, g: &Gatherer, batches: impl Iterator<Item = u64>) -> Vec<Key> {
    let mut plan = vec![];
    let mut batch = Batch::default();
    batches
        .map(|k| {
            sampler.plan(k, &mut plan);
            g.gather(&plan, &mut batch).unwrap();
            key(&batch)
        })
        .collect()
}

fn slice_sampler(snap: &Snapshot, seed: u64) -> Arc<SliceSampler> {
    let policy = BoundaryPolicy::Span { left: 3, right: 7 };
    let index = snap.slice_index(16, policy).unwrap();
    Arc::new(
        SliceSampler::try_new(
            index,
            snap.episodes(),
            &SliceOptions::new(16, 128)
                .with_policy(policy)
                .with_weighting(Weighting::Episodes)
                .with_seed(seed),
        )
        .unwrap(),
    )
}

/// Drains `loader`, optionally handing every batch back for reuse.
fn drain(mut loader: Loader, recycle: bool) -> Vec<Key> {
    let mut out = vec![];
    while let Some(b) = loader.next_batch() {
        out.push(key(&b));
        if recycle {
            loader.recycle(b);
        }
    }
    // The end is sticky.
    assert!(loader.next_batch().is_none());
    assert!(loader.next_batch().is_none());
    out
}

#[test]
fn batches_do_not_depend_on_workers_prefetch_recycling_or_readahead() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let g = Arc::new(Gatherer::try_new(&snap, &COLUMNS).unwrap());
    let sampler = slice_sampler(&snap, 1234);
    let n = 24u64;
    let want = reference(sampler.as_ref(), &g, 0..n);
    assert!(
        want[0].columns.iter().map(|c| c.1.len()).sum::<usize>() >= 256 << 10,
        "batches large enough to be gathered in parallel"
    );
    let mut runs = 0;
    for workers in [1, 2, 3] {
        for prefetch in [1, 4] {
            for recycle in [false, true] {
                for readahead in [false, true] {
                    if readahead && (recycle || prefetch == 1) {
                        continue;
                    }
                    let opts = LoaderOptions::default()
                        .with_workers(workers)
                        .with_prefetch(prefetch)
                        .with_read_ahead(if readahead {
                            ReadAhead::Always
                        } else {
                            ReadAhead::Never
                        })
                        .with_max_batches(n);
                    let loader = Loader::try_new(sampler.clone(), g.clone(), opts).unwrap();
                    let got = drain(loader, recycle);
                    assert_eq!(got.len(), n as usize);
                    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            a == b,
                            "batch {k} differs: workers {workers}, prefetch {prefetch}, \
                             recycle {recycle}, readahead {readahead}"
                        );
                    }
                    runs += 1;
                }
            }
        }
    }
    assert_eq!(runs, 15);
    // The iterator interface yields the same stream.
    let opts = LoaderOptions::default().with_workers(3).with_max_batches(n);
    let loader = Loader::try_new(sampler.clone(), g.clone(), opts).unwrap();
    let got: Vec<Key> = loader.map(|b| key(&b)).collect();
    assert!(got == want);
    // Another seed, another stream.
    let other = slice_sampler(&snap, 1235);
    let opts = LoaderOptions::default().with_max_batches(2);
    let got = drain(Loader::try_new(other, g, opts).unwrap(), false);
    assert!(got[0] != want[0] && got[1] != want[1]);
}

#[test]
fn ranks_draw_disjoint_interleaved_streams() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let g = Arc::new(Gatherer::try_new(&snap, &[col::REWARD, col::STEP]).unwrap());
    let sampler = slice_sampler(&snap, 9);
    let single = drain(
        Loader::try_new(
            sampler.clone(),
            g.clone(),
            LoaderOptions::default().with_max_batches(30),
        )
        .unwrap(),
        false,
    );
    assert_eq!(single, reference(sampler.as_ref(), &g, 0..30));
    for (world, workers) in [(2u64, 2usize), (3, 1), (3, 4)] {
        let per_rank = 30 / world;
        let mut seen = [false; 30];
        for rank in 0..world {
            let opts = LoaderOptions::default()
                .with_workers(workers)
                .with_rank(rank, world)
                .with_max_batches(per_rank);
            let got = drain(
                Loader::try_new(sampler.clone(), g.clone(), opts).unwrap(),
                rank == 0,
            );
            assert_eq!(got.len() as u64, per_rank);
            for (k, b) in got.iter().enumerate() {
                let global = k as u64 * world + rank;
                assert!(
                    *b == single[global as usize],
                    "world {world}: batch {k} of rank {rank} is batch {global} of one rank"
                );
                assert!(!seen[global as usize], "batch {global} drawn by two ranks");
                seen[global as usize] = true;
            }
        }
        // Disjoint, and together the single-rank stream.
        assert!(
            seen.iter().all(|&s| s),
            "world {world}: union covers the stream"
        );
    }
}

/// Window number of each slice of a batch (episode id -> position -> window).
fn windows_of(index: &SliceIndex, snap: &Snapshot, b: &Batch) -> Vec<u64> {
    let first = snap.episodes().first_id();
    b.episode_id
        .iter()
        .zip(&b.start_step)
        .map(|(&id, &start)| {
            let e = (id - first) as usize;
            let k = start - index.start_in(e, 0);
            assert!(k >= 0 && (k as u64) < index.windows(e), "not a window");
            index.first_window(e) + k as u64
        })
        .collect()
}

#[test]
fn epoch_sampler_stops_after_one_epoch_covering_every_window_once() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let g = Arc::new(Gatherer::try_new(&snap, &[col::REWARD]).unwrap());
    for policy in [BoundaryPolicy::Strict, BoundaryPolicy::Pad] {
        let index = snap.slice_index(12, policy).unwrap();
        let n = index.num_windows();
        for (drop_last, workers) in [(false, 1), (false, 3), (true, 2)] {
            let b = 37usize;
            assert_ne!(n % b as u64, 0);
            let sampler = Arc::new(EpochSampler::windows(index.clone(), b, 5, drop_last).unwrap());
            let per = sampler.batches_per_epoch().unwrap();
            let opts = LoaderOptions::default().with_workers(workers);
            let mut loader = Loader::try_new(sampler.clone(), g.clone(), opts).unwrap();
            let mut counts: HashMap<u64, u32> = HashMap::new();
            let mut batches = 0u64;
            while let Some(batch) = loader.next_batch() {
                for w in windows_of(&index, &snap, &batch) {
                    *counts.entry(w).or_default() += 1;
                }
                batches += 1;
                loader.recycle(batch);
            }
            assert!(loader.next_batch().is_none());
            assert_eq!(batches, per, "{policy:?} drop_last {drop_last}");
            assert!(counts.values().all(|&c| c == 1), "a window drawn twice");
            let want = if drop_last { n - n % b as u64 } else { n };
            assert_eq!(
                counts.len() as u64,
                want,
                "{policy:?} drop_last {drop_last}"
            );
            if !drop_last {
                assert_eq!(
                    counts.keys().copied().max(),
                    Some(n - 1),
                    "every window of 0..{n}"
                );
            }
        }
    }
}

/// Across ranks, an epoch sampler's windows are all visited and every rank yields the same
/// number of batches (ranks stay in lockstep).
#[test]
fn epoch_sampler_across_ranks_covers_every_window() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let g = Arc::new(Gatherer::try_new(&snap, &[col::REWARD]).unwrap());
    let index = snap.slice_index(12, BoundaryPolicy::Pad).unwrap();
    let n = index.num_windows();
    let sampler = Arc::new(EpochSampler::windows(index.clone(), 41, 8, false).unwrap());
    for world in [2u64, 3] {
        let mut counts: HashMap<u64, u32> = HashMap::new();
        let mut lengths = vec![];
        for rank in 0..world {
            let opts = LoaderOptions::default().with_rank(rank, world);
            let loader = Loader::try_new(sampler.clone(), g.clone(), opts).unwrap();
            let mut k = 0;
            for batch in loader {
                for w in windows_of(&index, &snap, &batch) {
                    *counts.entry(w).or_default() += 1;
                }
                k += 1;
            }
            lengths.push(k);
        }
        assert!(lengths.iter().all(|&k| k == lengths[0]), "{lengths:?}");
        assert_eq!(
            counts.len() as u64,
            n,
            "world {world}: every window visited"
        );
        // Ranks stay inside the epoch: only the padding batches (fewer than `world`) repeat
        // windows, never the next epoch's.
        let visits: u64 = counts.values().map(|&c| c as u64).sum();
        assert!(
            visits <= n + (world - 1) * 41,
            "world {world}: {visits} visits of {n} windows"
        );
    }
}

#[test]
fn dropping_a_loader_mid_stream_returns() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let g = Arc::new(Gatherer::try_new(&snap, &COLUMNS).unwrap());
    let sampler = slice_sampler(&snap, 3);
    let cases: [(usize, usize, usize, Option<u64>); 5] = [
        // (workers, prefetch, batches consumed before the drop, max_batches)
        (3, 1, 2, None),
        (4, 2, 0, None),
        (1, 1, 5, None),
        (2, 4, 1, Some(1000)),
        (2, 1, 3, Some(3)), // dropped at its end
    ];
    for (workers, prefetch, take, max) in cases {
        let mut opts = LoaderOptions::default()
            .with_workers(workers)
            .with_prefetch(prefetch);
        if let Some(m) = max {
            opts = opts.with_max_batches(m);
        }
        let mut loader = Loader::try_new(sampler.clone(), g.clone(), opts).unwrap();
        for _ in 0..take {
            assert!(loader.next_batch().is_some());
        }
        // Let the workers fill the queue and block on it.
        std::thread::sleep(Duration::from_millis(200));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            drop(loader);
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(30)).is_ok(),
            "dropping a loader (workers {workers}, prefetch {prefetch}) hangs"
        );
    }
}

#[test]
fn invalid_rank_or_world_size_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let g = Arc::new(Gatherer::try_new(&snap, &[col::REWARD]).unwrap());
    let sampler = slice_sampler(&snap, 0);
    for (rank, world) in [(0u64, 0u64), (1, 1), (2, 2), (5, 3), (u64::MAX, 4)] {
        let opts = LoaderOptions::default().with_rank(rank, world);
        let err = Loader::try_new(sampler.clone(), g.clone(), opts)
            .map(|_| ())
            .unwrap_err();
        assert!(
            err.to_string().contains("rank"),
            "rank {rank} / world {world}: {err}"
        );
    }
    let opts = LoaderOptions::default().with_rank(2, 3).with_max_batches(1);
    let mut ok = Loader::try_new(sampler.clone(), g, opts).unwrap();
    assert!(ok.next_batch().is_some());
    assert!(ok.next_batch().is_none());
    // Zero workers or queue depth are raised to 1, not errors.
    let o = LoaderOptions::default().with_workers(0).with_prefetch(0);
    assert_eq!((o.workers, o.prefetch), (1, 1));
}

/// A sampler that panics on one batch number (a stand-in for any worker panic, e.g. in gather).
struct PanicsAt {
    inner: Arc<SliceSampler>,
    at: u64,
}

impl Sampler for PanicsAt {
    fn plan(&self, batch: u64, out: &mut Vec<trajstore::SliceRef>) {
        assert!(batch != self.at, "sampler failure at batch {batch}");
        self.inner.plan(batch, out)
    }
    fn slice_len(&self) -> u32 {
        self.inner.slice_len()
    }
    fn num_slices(&self) -> usize {
        self.inner.num_slices()
    }
}

/// A worker that panics must not look like the end of the stream: today the other workers run
/// on, the consumer buffers their batches while waiting for the lost one, and `next_batch`
/// returns `None` once they are done (a silently short epoch), or never returns for an endless
/// sampler. The panic should reach the consumer.
#[test]
fn a_worker_panic_is_not_a_silent_end_of_stream() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let g = Arc::new(Gatherer::try_new(&snap, &[col::REWARD]).unwrap());
    let sampler = Arc::new(PanicsAt {
        inner: slice_sampler(&snap, 4),
        at: 1,
    });
    let opts = LoaderOptions::default()
        .with_workers(2)
        .with_max_batches(2000);
    let mut loader = Loader::try_new(sampler, g, opts).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        assert!(loader.next_batch().is_some());
        let second = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            loader.next_batch().is_some()
        }));
        let _ = tx.send(second);
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Err(_) => panic!("next_batch hangs after a worker panicked"),
        Ok(Ok(got)) => panic!(
            "next_batch returned {} after the worker of batch 1 panicked, instead of \
             propagating the panic",
            if got {
                "a batch"
            } else {
                "None (end of stream)"
            }
        ),
        Ok(Err(_)) => {} // the panic reached the consumer
    }
}
