//! The loader through the public API: the stream of batches does not depend on workers, queue
//! depth, buffer recycling or read-ahead; ranks shard it; epoch samplers stop after one epoch;
//! dropping a loader mid-stream returns; bad rank/world sizes are errors.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{TestData, open_loader};
use trajstore::format::col;
use trajstore::{
    Batch, BatchSource, BoundaryPolicy, EpochSampler, GatherInto, Gatherer, LoaderOptions,
    LoaderSpec, ReadAhead, Sampler, SamplerKind, SamplerSpec, SliceIndex, SliceSampler, Snapshot,
    StagedLoader, StagingSlot, Weighting,
};
use trajstore::{Loader, Result};

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

/// The uniform sampler of these tests: 128 slices of 16 steps, span windows, episode weighting.
fn slice_spec(seed: u64) -> SamplerSpec {
    SamplerSpec::uniform(16, 128)
        .with_policy(BoundaryPolicy::Span { left: 3, right: 7 })
        .with_weighting(Weighting::Episodes)
        .with_seed(seed)
}

/// The sampler of [`slice_spec`] built by hand over its slice index (the reference the loaders'
/// batches are compared with).
fn slice_sampler(snap: &Snapshot, seed: u64) -> Arc<SliceSampler> {
    let spec = slice_spec(seed);
    let index = snap.slice_index(spec.slice_len, spec.policy).unwrap();
    Arc::new(SliceSampler::try_new(index, snap.episodes(), &spec).unwrap())
}

/// A loader of `columns` of `snap` sampled by `sampler`, as rank `rank` of `world`.
fn loader_of(
    snap: &Snapshot,
    sampler: SamplerSpec,
    columns: &[&str],
    (rank, world): (u64, u64),
    opts: LoaderOptions,
) -> Result<Loader> {
    open_loader(
        LoaderSpec::single(snap.clone(), sampler, columns).with_rank(rank, world),
        opts,
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
                        .with_max_batches(n);
                    let spec = LoaderSpec::single(snap.clone(), slice_spec(1234), &COLUMNS)
                        .with_read_ahead(if readahead {
                            ReadAhead::Always
                        } else {
                            ReadAhead::Never
                        });
                    let loader = open_loader(spec, opts).unwrap();
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
    let loader = loader_of(&snap, slice_spec(1234), &COLUMNS, (0, 1), opts).unwrap();
    let got: Vec<Key> = loader.map(|b| key(&b)).collect();
    assert!(got == want);
    // Another seed, another stream.
    let opts = LoaderOptions::default().with_max_batches(2);
    let got = drain(
        loader_of(&snap, slice_spec(1235), &COLUMNS, (0, 1), opts).unwrap(),
        false,
    );
    assert!(got[0] != want[0] && got[1] != want[1]);
}

#[test]
fn ranks_draw_disjoint_interleaved_streams() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let columns = [col::REWARD, col::STEP];
    let g = Arc::new(Gatherer::try_new(&snap, &columns).unwrap());
    let sampler = slice_sampler(&snap, 9);
    let single = drain(
        loader_of(
            &snap,
            slice_spec(9),
            &columns,
            (0, 1),
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
                .with_max_batches(per_rank);
            let got = drain(
                loader_of(&snap, slice_spec(9), &columns, (rank, world), opts).unwrap(),
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
    for policy in [BoundaryPolicy::Strict, BoundaryPolicy::Pad] {
        let index = snap.slice_index(12, policy).unwrap();
        let n = index.num_windows();
        for (drop_last, workers) in [(false, 1), (false, 3), (true, 2)] {
            let b = 37usize;
            assert_ne!(n % b as u64, 0);
            let sampler = EpochSampler::windows(index.clone(), b, 5, drop_last).unwrap();
            let per = sampler.batches_per_epoch().unwrap();
            let spec = SamplerSpec::new(SamplerKind::Epoch, 12, b)
                .with_policy(policy)
                .with_seed(5)
                .with_drop_last(drop_last);
            let opts = LoaderOptions::default().with_workers(workers);
            let mut loader = loader_of(&snap, spec, &[col::REWARD], (0, 1), opts).unwrap();
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
    let index = snap.slice_index(12, BoundaryPolicy::Pad).unwrap();
    let n = index.num_windows();
    // `EpochSampler::windows(index, 41, 8, false)`.
    let sampler = SamplerSpec::new(SamplerKind::Epoch, 12, 41)
        .with_policy(BoundaryPolicy::Pad)
        .with_seed(8)
        .with_drop_last(false);
    for world in [2u64, 3] {
        let mut counts: HashMap<u64, u32> = HashMap::new();
        let mut lengths = vec![];
        for rank in 0..world {
            let opts = LoaderOptions::default();
            let loader =
                loader_of(&snap, sampler.clone(), &[col::REWARD], (rank, world), opts).unwrap();
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
        let mut loader = loader_of(&snap, slice_spec(3), &COLUMNS, (0, 1), opts).unwrap();
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

/// Rank and world size are the source's: `BatchSource::open` refuses bad ones.
#[test]
fn invalid_rank_or_world_size_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let spec = |rank, world| {
        LoaderSpec::single(snap.clone(), slice_spec(0), &[col::REWARD]).with_rank(rank, world)
    };
    for (rank, world) in [(0u64, 0u64), (1, 1), (2, 2), (5, 3), (u64::MAX, 4)] {
        let err = BatchSource::open(spec(rank, world))
            .map(|_| ())
            .unwrap_err();
        assert!(
            err.to_string().contains("rank"),
            "rank {rank} / world {world}: {err}"
        );
    }
    let opts = LoaderOptions::default().with_max_batches(1);
    let mut ok = open_loader(spec(2, 3), opts).unwrap();
    assert!(ok.next_batch().is_some());
    assert!(ok.next_batch().is_none());
    // Zero workers or queue depth are raised to 1, not errors.
    let o = LoaderOptions::default().with_workers(0).with_prefetch(0);
    assert_eq!((o.workers, o.prefetch), (1, 1));
}

/// Staging memory for one batch that panics the `panic_on`-th time (from 0) a worker gathers into
/// it (a stand-in for any worker panic, e.g. in a sampler or the gather: a loader's sampler is
/// always built from a `SamplerSpec` now, so caller code that runs in a worker is a staging slot).
struct PanicsAt {
    columns: Vec<Vec<u8>>,
    flags: [Vec<u8>; 6],
    ids: Vec<u64>,
    starts: Vec<i64>,
    calls: u32,
    panic_on: Option<u32>,
}

impl PanicsAt {
    fn new(g: &Gatherer, num_slices: usize, slice_len: usize, panic_on: Option<u32>) -> Self {
        let steps = num_slices * slice_len;
        Self {
            columns: g.step_bytes().iter().map(|s| vec![0; steps * s]).collect(),
            flags: std::array::from_fn(|_| vec![0; steps]),
            ids: vec![0; num_slices],
            starts: vec![0; num_slices],
            calls: 0,
            panic_on,
        }
    }
}

impl StagingSlot for PanicsAt {
    fn dest(&mut self) -> GatherInto<'_> {
        let call = self.calls;
        self.calls += 1;
        assert!(
            Some(call) != self.panic_on,
            "staging failure at call {call}"
        );
        GatherInto {
            columns: self.columns.iter_mut().map(|c| c.as_mut_slice()).collect(),
            flags: self.flags.each_mut().map(|f| f.as_mut_slice()),
            episode_id: &mut self.ids,
            start_step: &mut self.starts,
        }
    }
}

/// A worker that panics must not look like the end of the stream: today the other workers run
/// on, the consumer buffers their batches while waiting for the lost one, and `next_batch`
/// returns `None` once they are done (a silently short epoch), or never returns for an endless
/// sampler. The panic should reach the consumer.
///
/// (Loaders share their worker pipeline. This used to run a `Loader` over a hand-built sampler
/// that panics at batch 1; loaders are built from a `SamplerSpec` only now, so the panic comes
/// from the caller's staging slot of batch 1 in a `StagedLoader`.)
#[test]
fn a_worker_panic_is_not_a_silent_end_of_stream() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let g = Gatherer::try_new(&snap, &[col::REWARD]).unwrap();
    let spec = slice_spec(4);
    let (b, l) = (spec.num_slices, spec.slice_len as usize);
    // Batch k goes to slot k % 2: slot 1 panics at its first batch, batch 1.
    let slots: Vec<Box<dyn StagingSlot>> = vec![
        Box::new(PanicsAt::new(&g, b, l, None)),
        Box::new(PanicsAt::new(&g, b, l, Some(0))),
    ];
    let opts = LoaderOptions::default()
        .with_workers(2)
        .with_max_batches(2000);
    let source = BatchSource::open(LoaderSpec::single(snap.clone(), spec, &[col::REWARD])).unwrap();
    let mut loader = StagedLoader::new(&source, opts, slots).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let first = loader.next_batch().unwrap().unwrap();
        assert_eq!(first.number, 0);
        loader.release(0).unwrap();
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

/// A prioritized loader draws each batch from the priorities current when a worker plans it, and
/// plans at most `2 × workers + prefetch` batches ahead of the consumer (the window's `workers +
/// prefetch`, and each worker's next plan, made one batch early for read-ahead; no bursts further
/// ahead, which other loaders run when their batches are small): a change of priorities shows from
/// the batch after those on.
#[test]
fn a_prioritized_loader_plans_no_further_ahead_than_the_window_and_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let (len, policy) = (6, BoundaryPolicy::Strict);
    let index = snap.slice_index(len, policy).unwrap();
    let n = index.num_windows();
    let (workers, prefetch) = (2, 1);
    let spec = SamplerSpec::new(SamplerKind::Prioritized, len, 8)
        .with_policy(policy)
        .with_alpha(1.0)
        .with_seed(9);
    let opts = LoaderOptions::default()
        .with_workers(workers)
        .with_prefetch(prefetch)
        .with_max_batches(40);
    let mut loader = loader_of(&snap, spec, &[col::REWARD], (0, 1), opts).unwrap();
    let first = loader.next_batch().unwrap();
    // Let the workers plan as far ahead as they may, then make one window all but certain.
    std::thread::sleep(Duration::from_millis(300));
    let target = windows_of(&index, &snap, &first)[0];
    let windows: Vec<u64> = (0..n).collect();
    let prios: Vec<f64> = windows
        .iter()
        .map(|&w| if w == target { 1e12 } else { 1e-12 })
        .collect();
    loader
        .prioritized(0)
        .expect("a prioritized sampler")
        .update_priorities(&windows, &prios)
        .unwrap();
    // Batches 1..=2 × workers + prefetch may have been planned before; every later one after.
    let mut k = 1;
    while let Some(b) = loader.next_batch() {
        if k > 2 * workers + prefetch {
            let w = windows_of(&index, &snap, &b);
            assert!(
                w.iter().all(|&w| w == target),
                "batch {k} was planned before the priorities changed: windows {w:?}, not \
                 {target}"
            );
        }
        k += 1;
    }
    assert_eq!(k, 40);
}

/// A training loop slower than the workers, recycling every batch: after the first batches the
/// workers gather into recycled ones only. The workers wake in bursts (up to 4 batches each),
/// so the pool swings by about `3 × workers` between their wake-ups; a pool capped at 16 (the
/// first version) dropped what it could not keep with 8 workers, and the workers made new batches
/// for ever.
#[test]
fn a_slow_consumer_that_recycles_every_batch_makes_no_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let spec = SamplerSpec::uniform(4, 4).with_seed(5);
    let opts = LoaderOptions::default().with_workers(8).with_prefetch(2);
    let mut loader = loader_of(&snap, spec, &COLUMNS, (0, 1), opts).unwrap();
    let recycler = loader.recycler();
    let mut made = vec![];
    for k in 0..600 {
        let b = loader.next_batch().unwrap();
        // The training step: the workers catch up and wait at the window meanwhile.
        std::thread::sleep(Duration::from_micros(200));
        loader.recycle(b);
        if k % 200 == 199 {
            made.push(recycler.batches_made());
        }
    }
    // Never more than the loader can have in use at once: the window (8 workers x 4 + 2), one
    // being gathered by each worker and the consumer's (with 16 kept: 87, 141, 195).
    assert!(made.iter().all(|&m| m <= 8 * 5 + 2 + 2), "{made:?}");
}
