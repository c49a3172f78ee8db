//! Slice indexes extended on `Snapshot::refresh` (property-based, and through retention) equal
//! indexes built from scratch, and samplers and gather built on them read the right episodes.

use crate::common::TestData;
use crate::common::sampling::{check_gathered, plans};
use proptest::prelude::*;
use trajstore::format::col;
use trajstore::{
    Batch, BoundaryPolicy, Dataset, Gatherer, SamplerSpec, SliceIndex, SliceRef, SliceSampler,
    Snapshot, WriterOptions,
};

const KEYS: [(u32, BoundaryPolicy); 5] = [
    (1, BoundaryPolicy::Strict),
    (7, BoundaryPolicy::Strict),
    (7, BoundaryPolicy::Pad),
    (12, BoundaryPolicy::Span { left: 3, right: 5 }),
    (30, BoundaryPolicy::Pad),
];

fn check_extended(snap: &Snapshot, ds: &Dataset, ctx: &str) {
    let fresh = ds.snapshot().unwrap();
    assert_eq!(snap.version(), fresh.version(), "{ctx}");
    assert_eq!(
        snap.episodes().lengths(),
        fresh.episodes().lengths(),
        "{ctx}"
    );
    for (l, p) in KEYS {
        let got = snap.slice_index(l, p).unwrap();
        let built = SliceIndex::build(snap.episodes(), l, p).unwrap();
        assert_eq!(got.as_ref(), &built, "{ctx}: ({l}, {p:?})");
        assert_eq!(
            got.as_ref(),
            fresh.slice_index(l, p).unwrap().as_ref(),
            "{ctx}: ({l}, {p:?})"
        );
        assert_eq!(got.num_episodes(), snap.episodes().len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 16,
        rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x7a5e_1ec7),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn refresh_extends_slice_indexes(
        rounds in proptest::collection::vec(proptest::collection::vec(1u64..40, 1..8), 1..8),
        retention in proptest::option::of(60u64..300),
        segment_bytes in 200u64..2000,
        seed in any::<u64>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let s = TestData::new().obs_dim(2).seed(seed).spec();
        let ds = Dataset::create(dir.path().join("d"), &s.schema().unwrap()).unwrap();
        let mut opts = WriterOptions::default().with_segment_bytes(segment_bytes);
        if let Some(n) = retention {
            opts = opts.with_max_transitions(n);
        }
        let mut w = ds.writer(opts).unwrap();
        let mut snap = ds.snapshot().unwrap();
        let mut id = 0u64;
        for (r, lens) in rounds.iter().enumerate() {
            // Query every key on the old snapshot first, so that refresh extends the cache.
            for (l, p) in KEYS {
                snap.slice_index(l, p).unwrap();
            }
            for &len in lens {
                let (b, e) = s.episode(id, len);
                w.append_episode(&b, e).unwrap();
                id += 1;
            }
            w.commit().unwrap();
            prop_assert!(snap.refresh().unwrap());
            check_extended(&snap, &ds, &format!("round {r}"));
        }
        if let Some(max) = retention {
            // Retention keeps the newest `max` transitions (or all written), in whole segments:
            // without its oldest segment the version would hold fewer than `max`.
            let written: u64 = rounds.iter().flatten().sum();
            let n = snap.num_transitions();
            prop_assert!(n >= max.min(written), "{} < {}", n, max.min(written));
            prop_assert!(n - snap.segments()[0].num_rows() < max);
        }
    }
}

#[test]
fn refresh_extends_slice_indexes_through_retention() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestData::new().obs_dim(2).seed(5).spec();
    let ds = Dataset::create(dir.path().join("d"), &s.schema().unwrap()).unwrap();
    let opts = WriterOptions::default()
        .with_segment_bytes(300)
        .with_max_transitions(120);
    let mut w = ds.writer(opts).unwrap();
    let mut snap = ds.snapshot().unwrap();
    let mut dropped_some = false;
    for i in 0..80u64 {
        let (b, e) = s.episode(i, 3 + i * 7 % 13);
        w.append_episode(&b, e).unwrap();
        if i % 4 == 3 {
            for (l, p) in KEYS {
                snap.slice_index(l, p).unwrap();
            }
            let before = snap.episodes().first_id();
            w.commit().unwrap();
            assert!(snap.refresh().unwrap());
            dropped_some |= snap.episodes().first_id() > before;
            check_extended(&snap, &ds, &format!("after episode {i}"));
            assert_eq!(
                snap.episodes().first_id(),
                ds.snapshot().unwrap().episodes().first_id()
            );
        }
    }
    assert!(dropped_some, "retention dropped segments");
    // Samplers built on the extended index only draw live episodes, with the right ids.
    let index = snap.slice_index(7, BoundaryPolicy::Pad).unwrap();
    let sampler = SliceSampler::try_new(
        index,
        snap.episodes(),
        &SamplerSpec::uniform(7, 64)
            .with_policy(BoundaryPolicy::Pad)
            .with_seed(1),
    )
    .unwrap();
    let gatherer = Gatherer::try_new(&snap, &[col::EPISODE_ID, col::STEP, col::REWARD]).unwrap();
    let mut batch = Batch::default();
    for plan in plans(&sampler, 0..10) {
        gatherer.gather(&plan, &mut batch).unwrap();
        check_gathered(&snap, &plan, &batch);
    }
}

/// One commit whose retention drops every segment the old snapshot had and some of the new ones:
/// the refreshed snapshot must index the same episodes (ids included) as a freshly opened one.
#[test]
fn refresh_after_retention_drops_every_old_segment_keeps_episode_ids() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestData::new().obs_dim(2).seed(6).spec();
    let ds = Dataset::create(dir.path().join("d"), &s.schema().unwrap()).unwrap();
    let opts = WriterOptions::default()
        .with_segment_bytes(200)
        .with_max_transitions(50);
    let mut w = ds.writer(opts).unwrap();
    for i in 0..4 {
        let (b, e) = s.episode(i, 10);
        w.append_episode(&b, e).unwrap();
    }
    w.commit().unwrap();
    let mut snap = ds.snapshot().unwrap();
    assert_eq!(snap.episodes().first_id(), 0);
    snap.slice_index(4, BoundaryPolicy::Strict).unwrap();
    // 20 more episodes in one commit: retention keeps only the newest ~50 transitions.
    for i in 4..24 {
        let (b, e) = s.episode(i, 10);
        w.append_episode(&b, e).unwrap();
    }
    w.commit().unwrap();
    assert!(snap.refresh().unwrap());
    let fresh = ds.snapshot().unwrap();
    assert!(
        fresh.episodes().first_id() > 4,
        "retention dropped new episodes too"
    );
    assert_eq!(
        snap.episodes().as_ref(),
        fresh.episodes().as_ref(),
        "refreshed episode index (first_id {}) differs from a fresh one (first_id {})",
        snap.episodes().first_id(),
        fresh.episodes().first_id()
    );
    let last = fresh.episodes().first_id() + fresh.episodes().len() as u64 - 1;
    assert_eq!(last, 23);
    assert!(
        snap.episode(last).unwrap().is_some(),
        "the newest episode is reachable by its id"
    );
    let gatherer = Gatherer::try_new(&snap, &[col::EPISODE_ID]).unwrap();
    let mut batch = Batch::default();
    let pos = snap.episodes().len() as u32 - 1;
    gatherer
        .gather(
            &[SliceRef {
                episode: pos,
                start: 0,
                len: 4,
            }],
            &mut batch,
        )
        .unwrap();
    assert_eq!(
        batch.episode_id[0], 23,
        "gathered episode id of the newest episode"
    );
    assert_eq!(
        batch.column(col::EPISODE_ID).unwrap().values::<u64>()[0],
        23
    );
}
