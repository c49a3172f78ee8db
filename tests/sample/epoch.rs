//! Epoch samplers (every window or eligible episode once per epoch, `drop_last`), the
//! whole-episode sampler, and determinism: every sampler's plans are pure functions of its seed
//! and the batch number.

use std::collections::HashSet;

use crate::common::sampling::{assert_fits, check_gathered, plans, window_number};
use crate::common::{TestData, assert_invalid_argument, err_of};
use trajstore::format::col;
use trajstore::{
    Batch, BoundaryPolicy, EpisodeSampler, EpochSampler, Gatherer, Sampler, SamplerSpec, SliceRef,
    SliceSampler, Weighting, WriterOptions,
};

// ---------------------------------------------------------------------------------------------
// Epochs without replacement
// ---------------------------------------------------------------------------------------------

#[test]
fn epoch_windows_visit_every_window_once_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [3u64, 40, 17, 8, 1, 25, 60, 11, 2, 33];
    let snap = TestData::new()
        .obs_dim(2)
        .seed(4)
        .episodes(lens)
        .snapshot(&dir.path().join("d"));
    for policy in [
        BoundaryPolicy::Strict,
        BoundaryPolicy::Pad,
        BoundaryPolicy::Span { left: 3, right: 2 },
    ] {
        let index = snap.slice_index(8, policy).unwrap();
        let n = index.num_windows();
        let b = 13usize;
        assert_ne!(n % b as u64, 0, "a remainder to drop");
        // drop_last = false: every window exactly once, the last batch partial.
        let s = EpochSampler::windows(index.clone(), b, 99, false).unwrap();
        let per = s.batches_per_epoch().unwrap();
        assert_eq!(per, n.div_ceil(b as u64));
        assert_eq!(s.slice_len(), 8);
        let epoch = |e: u64| -> Vec<u64> {
            plans(&s, e * per..(e + 1) * per)
                .iter()
                .enumerate()
                .flat_map(|(k, p)| {
                    let want = if k as u64 + 1 < per {
                        b
                    } else {
                        (n as usize - 1) % b + 1
                    };
                    assert_eq!(p.len(), want, "{policy:?}: batch {k} of the epoch");
                    p.iter()
                        .map(|x| window_number(&index, x))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let (e0, e1) = (epoch(0), epoch(1));
        for (i, e) in [&e0, &e1].into_iter().enumerate() {
            let mut sorted = e.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "{policy:?}: epoch {i}");
        }
        assert_ne!(e0, e1, "{policy:?}: the next epoch has a new order");
        assert_ne!(e0, (0..n).collect::<Vec<_>>(), "{policy:?}: shuffled");

        // drop_last = true: full batches only, the remainder dropped, no window repeated.
        let s = EpochSampler::windows(index.clone(), b, 99, true).unwrap();
        let per = s.batches_per_epoch().unwrap();
        assert_eq!(per, n / b as u64);
        for e in 0..2 {
            let mut seen = HashSet::new();
            for p in plans(&s, e * per..(e + 1) * per) {
                assert_eq!(p.len(), b);
                for x in &p {
                    assert!(
                        seen.insert(window_number(&index, x)),
                        "{policy:?}: repeated"
                    );
                }
            }
            assert_eq!(
                seen.len() as u64,
                n - n % b as u64,
                "{policy:?}: only the remainder"
            );
        }
    }
}

#[test]
fn epoch_episodes_visit_every_eligible_episode_once_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [3u64, 40, 17, 8, 1, 25, 60, 11, 2, 33, 9, 12];
    let snap = TestData::new()
        .obs_dim(2)
        .seed(4)
        .episodes(lens)
        .snapshot(&dir.path().join("d"));
    let index = snap.slice_index(9, BoundaryPolicy::Strict).unwrap();
    let eligible: Vec<u32> = (0..lens.len() as u32)
        .filter(|&e| lens[e as usize] >= 9)
        .collect();
    let s = EpochSampler::episodes(index.clone(), 3, 5, false).unwrap();
    let per = s.batches_per_epoch().unwrap();
    assert_eq!(per, (eligible.len() as u64).div_ceil(3));
    let mut orders = vec![];
    let mut starts = HashSet::new();
    for e in 0..6 {
        let mut got: Vec<u32> = vec![];
        for p in plans(&s, e * per..(e + 1) * per) {
            for x in &p {
                window_number(&index, x); // a valid window
                starts.insert((x.episode, x.start));
                got.push(x.episode);
            }
        }
        orders.push(got.clone());
        got.sort_unstable();
        assert_eq!(got, eligible, "epoch {e}");
    }
    assert!(
        orders.windows(2).any(|w| w[0] != w[1]),
        "orders change across epochs"
    );
    assert!(
        starts.len() > eligible.len(),
        "the window of an episode changes across epochs"
    );
    // drop_last drops the remainder of episodes.
    let s = EpochSampler::episodes(index.clone(), 4, 5, true).unwrap();
    let per = s.batches_per_epoch().unwrap();
    assert_eq!(per, eligible.len() as u64 / 4);
    let mut got: Vec<u32> = plans(&s, 0..per)
        .concat()
        .iter()
        .map(|x| x.episode)
        .collect();
    assert_eq!(got.len() as u64, per * 4);
    got.sort_unstable();
    got.dedup();
    assert_eq!(got.len() as u64, per * 4, "no episode twice");
    // Nothing to sample, or no full batch under drop_last, is an error.
    let empty = snap.slice_index(100, BoundaryPolicy::Strict).unwrap();
    for (what, argument, r) in [
        (
            "no window",
            Some("index"),
            EpochSampler::windows(empty.clone(), 4, 0, false),
        ),
        (
            "no episode",
            Some("index"),
            EpochSampler::episodes(empty, 4, 0, false),
        ),
        (
            "no slices",
            Some("num_slices"),
            EpochSampler::windows(index.clone(), 0, 0, false),
        ),
        (
            "drop_last without a full batch",
            None,
            EpochSampler::episodes(index, eligible.len() + 1, 0, true),
        ),
    ] {
        assert_invalid_argument(&err_of(r), argument, what);
    }
}

// ---------------------------------------------------------------------------------------------
// Whole episodes
// ---------------------------------------------------------------------------------------------

#[test]
fn episode_sampler_covers_whole_episodes_from_step_zero() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [5u64, 30, 1, 17, 25, 40, 8];
    let opts = WriterOptions::default().with_segment_bytes(1200);
    let snap = TestData::new()
        .obs_dim(2)
        .seed(50)
        .episodes(lens)
        .writer_options(opts)
        .snapshot(&dir.path().join("d"));
    let max_len = 25u32;
    let s = EpisodeSampler::try_new(snap.episodes(), 6, max_len, 9).unwrap();
    assert_eq!(s.slice_len(), max_len);
    assert_eq!(s.batches_per_epoch(), None);
    let g = Gatherer::try_new(&snap, &[col::EPISODE_ID, col::STEP, col::REWARD]).unwrap();
    let mut batch = Batch::default();
    let mut counts = vec![0u64; lens.len()];
    for plan in plans(&s, 0..400) {
        assert_eq!(plan.len(), 6);
        for x in &plan {
            assert_eq!((x.start, x.len), (0, max_len));
            counts[x.episode as usize] += 1;
        }
        g.gather(&plan, &mut batch).unwrap();
        assert_eq!(batch.slice_len, max_len as usize);
        check_gathered(&snap, &plan, &batch);
        for (i, x) in plan.iter().enumerate() {
            let n = lens[x.episode as usize].min(max_len as u64) as usize;
            let m = &batch.mask[i * 25..(i + 1) * 25];
            assert_eq!(m.iter().filter(|&&v| v == 1).count(), n);
            assert_eq!(batch.is_first[i * 25], 1);
            let full = lens[x.episode as usize] <= max_len as u64;
            assert_eq!(batch.is_last[i * 25 + n - 1], full as u8);
        }
    }
    // Uniform over episodes (2400 draws).
    assert_fits("episode sampler", &counts, &vec![1.0; lens.len()]);
    for (what, argument, r) in [
        (
            "no episodes",
            "num_episodes",
            EpisodeSampler::try_new(snap.episodes(), 0, 10, 0),
        ),
        (
            "no steps",
            "max_len",
            EpisodeSampler::try_new(snap.episodes(), 4, 0, 0),
        ),
    ] {
        assert_invalid_argument(&err_of(r), Some(argument), what);
    }
}

// ---------------------------------------------------------------------------------------------
// Determinism
// ---------------------------------------------------------------------------------------------

#[test]
fn plans_are_pure_functions_of_seed_and_batch() {
    let dir = tempfile::tempdir().unwrap();
    let lens: Vec<u64> = (0..30).map(|i| 1 + (i * 29 % 70)).collect();
    let snap = TestData::new()
        .obs_dim(2)
        .seed(8)
        .episodes(&lens)
        .snapshot(&dir.path().join("d"));
    let policy = BoundaryPolicy::Pad;
    let index = snap.slice_index(10, policy).unwrap();
    let eps = snap.episodes();
    type Make = Box<dyn Fn(u64) -> Box<dyn Sampler>>;
    let slice = {
        let (index, eps) = (index.clone(), eps.clone());
        move |seed| -> Box<dyn Sampler> {
            let o = SamplerSpec::uniform(10, 32)
                .with_policy(policy)
                .with_seed(seed);
            Box::new(SliceSampler::try_new(index.clone(), &eps, &o).unwrap())
        }
    };
    let weighted = {
        let (index, eps) = (index.clone(), eps.clone());
        move |seed| -> Box<dyn Sampler> {
            let o = SamplerSpec::uniform(10, 32)
                .with_policy(policy)
                .with_weighting(Weighting::Episodes)
                .with_episode_weights((0..30).map(|i| i as f64).collect())
                .with_seed(seed);
            Box::new(SliceSampler::try_new(index.clone(), &eps, &o).unwrap())
        }
    };
    let epoch_windows = {
        let index = index.clone();
        move |seed| -> Box<dyn Sampler> {
            Box::new(EpochSampler::windows(index.clone(), 32, seed, false).unwrap())
        }
    };
    let epoch_episodes = {
        let index = index.clone();
        move |seed| -> Box<dyn Sampler> {
            Box::new(EpochSampler::episodes(index.clone(), 7, seed, false).unwrap())
        }
    };
    let episodes = {
        let eps = eps.clone();
        move |seed| -> Box<dyn Sampler> {
            Box::new(EpisodeSampler::try_new(&eps, 8, 50, seed).unwrap())
        }
    };
    let make: Vec<(&str, Make)> = vec![
        ("slice", Box::new(slice)),
        ("slice weighted", Box::new(weighted)),
        ("epoch windows", Box::new(epoch_windows)),
        ("epoch episodes", Box::new(epoch_episodes)),
        ("episodes", Box::new(episodes)),
    ];
    for (what, make) in &make {
        let a = make(42);
        let forward = plans(a.as_ref(), 0..60);
        // A second sampler with the same seed.
        assert_eq!(
            plans(make(42).as_ref(), 0..60),
            forward,
            "{what}: same seed"
        );
        // Another seed.
        let other = plans(make(43).as_ref(), 0..60);
        assert_ne!(other, forward, "{what}: another seed");
        assert!(
            forward.iter().zip(&other).filter(|(x, y)| x != y).count() > 50,
            "{what}: other seeds differ in (almost) every batch"
        );
        // Any call order, one buffer reused.
        let mut buf = vec![
            SliceRef {
                episode: 999,
                start: -5,
                len: 1
            };
            100
        ];
        for k in (0..60u64).rev().chain([17, 3, 59, 0, 17]) {
            a.plan(k, &mut buf);
            assert_eq!(buf, forward[k as usize], "{what}: batch {k} out of order");
        }
        // Batches differ from each other.
        assert!(
            forward.windows(2).all(|w| w[0] != w[1]),
            "{what}: batches differ"
        );
    }
}
