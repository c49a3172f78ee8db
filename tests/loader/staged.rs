//! The staged loader (workers gather into caller-owned slots, as the Python package's CUDA path
//! does with pinned staging tensors): the stream equals the plain gather of the same batches
//! whatever the number of workers and slots, slots go by batch number and are reused only after
//! release, release is checked, and dropping a loader whose workers wait for slots returns.

use std::sync::Arc;
use std::time::Duration;

use crate::common::TestData;
use crate::common::staging::{self, Memory, Slots};
use trajstore::format::col;
use trajstore::{
    Batch, BatchSource, BoundaryPolicy, Error, Gatherer, LoaderOptions, LoaderSpec, Sampler,
    SamplerSpec, SliceSampler, Snapshot, StagedLoader,
};

const COLUMNS: [&str; 3] = [col::OBSERVATION, col::REWARD, col::ACTION];
const B: usize = 24;
const L: usize = 12;

fn dataset(dir: &std::path::Path) -> Snapshot {
    TestData::new()
        .obs_dim(5)
        .act_dim(2)
        .seed(5)
        .episodes((0..30u64).map(|i| 3 + i * 13 % 40))
        .segment_bytes(8_000)
        .snapshot(&dir.join("d"))
}

fn sampler_spec() -> SamplerSpec {
    SamplerSpec::uniform(L as u32, B)
        .with_policy(BoundaryPolicy::Pad)
        .with_seed(3)
}

/// The sampler of [`sampler_spec`] built by hand (the reference the staged batches equal).
fn sampler(snap: &Snapshot) -> Arc<SliceSampler> {
    let opts = sampler_spec();
    let index = snap.slice_index(opts.slice_len, opts.policy).unwrap();
    Arc::new(SliceSampler::try_new(index, snap.episodes(), &opts).unwrap())
}

/// The source the staged loaders draw from: [`sampler_spec`] over `snap`'s [`COLUMNS`].
fn source(snap: &Snapshot) -> BatchSource {
    BatchSource::open(LoaderSpec::single(snap.clone(), sampler_spec(), &COLUMNS)).unwrap()
}

/// [`B`] × [`L`] slots for `g`'s columns.
fn slots(g: &Gatherer, n: usize) -> Slots {
    let bytes: Vec<usize> = g.step_bytes().iter().map(|s| B * L * s).collect();
    staging::slots(n, &bytes, (B, L), None)
}

/// What a batch holds, from a slot (its first `n` slices) or from a `Batch`.
type Key = (Vec<u64>, Vec<i64>, Vec<Vec<u8>>, Vec<Vec<u8>>);

fn slot_key(m: &Memory, n: usize, steps: &[usize]) -> Key {
    (
        m.ids[..n].to_vec(),
        m.starts[..n].to_vec(),
        m.flags.iter().map(|f| f[..n * L].to_vec()).collect(),
        m.columns
            .iter()
            .zip(steps)
            .map(|(c, s)| c[..n * L * s].to_vec())
            .collect(),
    )
}

fn batch_key(b: &Batch) -> Key {
    (
        b.episode_id.clone(),
        b.start_step.clone(),
        vec![
            b.mask.clone(),
            b.is_first.clone(),
            b.is_last.clone(),
            b.terminated.clone(),
            b.truncated.clone(),
            b.slice_end.clone(),
        ],
        b.columns
            .iter()
            .map(|c| c.data.as_slice().to_vec())
            .collect(),
    )
}

fn reference(s: &dyn Sampler, g: &Gatherer, ks: std::ops::Range<u64>) -> Vec<Key> {
    let (mut plan, mut batch) = (vec![], Batch::default());
    ks.map(|k| {
        s.plan(k, &mut plan);
        g.gather(&plan, &mut batch).unwrap();
        assert_eq!(batch.slice_len, L);
        batch_key(&batch)
    })
    .collect()
}

#[test]
fn staged_batches_equal_the_gather_whatever_workers_and_slots() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let s = sampler(&snap);
    let g = Arc::new(Gatherer::try_new(&snap, &COLUMNS).unwrap());
    let steps = g.step_bytes();
    let want = reference(s.as_ref(), &g, 7..47);
    for (workers, n_slots, held) in [(1, 2, 1), (3, 3, 2), (4, 6, 3), (2, 9, 1)] {
        let (boxed, mems) = slots(&g, n_slots);
        let opts = LoaderOptions::default()
            .with_workers(workers)
            .with_prefetch(2)
            .with_start(7)
            .with_max_batches(40);
        let mut loader = StagedLoader::new(&source(&snap), opts, boxed).unwrap();
        assert_eq!(loader.slots(), n_slots);
        let mut got = vec![];
        // The consumer keeps up to `held` batches unreleased (copies in flight), releasing the
        // oldest before it would hold more: it must have released batch k - slots before it asks
        // for batch k.
        let mut holding = std::collections::VecDeque::new();
        while let Some(b) = loader.next_batch() {
            let b = b.unwrap();
            assert_eq!(b.slot, (b.number % n_slots as u64) as usize);
            got.push(slot_key(
                &mems[b.slot].lock().unwrap(),
                b.num_slices,
                &steps,
            ));
            holding.push_back(b.number);
            while holding.len() >= held.min(n_slots - 1).max(1) {
                loader.release(holding.pop_front().unwrap()).unwrap();
            }
        }
        assert_eq!(got.len(), 40, "workers {workers}, slots {n_slots}");
        assert!(
            got == want,
            "workers {workers}, slots {n_slots}: the stream differs"
        );
    }
}

#[test]
fn release_is_checked_and_dropping_a_waiting_loader_returns() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let g = Gatherer::try_new(&snap, &COLUMNS).unwrap();
    let (boxed, _mems) = slots(&g, 2);
    let opts = LoaderOptions::default().with_workers(2).with_prefetch(2);
    let mut loader = StagedLoader::new(&source(&snap), opts, boxed).unwrap();
    let first = loader.next_batch().unwrap().unwrap();
    assert_eq!(first.number, 0);
    // Not returned yet, or another slot's batch: refused.
    for bad in [1, 5, 2] {
        let e = loader.release(bad).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "number"),
            "{e}"
        );
    }
    loader.release(0).unwrap();
    let e = loader.release(0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    // Batch 1 arrives; batch 2 needs slot 0 (free) and batch 3 slot 1 (held): the workers now
    // wait for a release that never comes. Dropping the loader must still return.
    assert_eq!(loader.next_batch().unwrap().unwrap().number, 1);
    std::thread::sleep(Duration::from_millis(50));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(loader);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("dropping a staged loader whose workers wait for slots hangs");
}

#[test]
fn too_few_or_too_small_slots_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let source = source(&snap);
    let g = Gatherer::try_new(&snap, &COLUMNS).unwrap();
    let (boxed, _) = slots(&g, 1);
    let e = StagedLoader::new(&source, LoaderOptions::default(), boxed).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "slots"),
        "{e}"
    );
    // Slots too small for the batch: the gather's size check, as an error of that batch.
    let (small, _) = staging::slots(2, &[8; COLUMNS.len()], (B, L), None);
    let mut loader =
        StagedLoader::new(&source, LoaderOptions::default().with_max_batches(1), small).unwrap();
    let e = loader.next_batch().unwrap().unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "dest"),
        "{e}"
    );
}
