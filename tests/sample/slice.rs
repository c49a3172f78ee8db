//! Slice sampling through the public API: window sets per boundary policy (property-based, with
//! the gathered values checked against the stored rows), span overhangs, sampling distributions
//! (chi-square, fixed seeds) per weighting, episode weights and id subsets, and option
//! validation.

use std::sync::Arc;

use crate::common::sampling::{assert_fits, check_gathered, episode_counts, plans, window_number};
use crate::common::{TestData, assert_invalid_argument, err_of};
use proptest::prelude::*;
use trajstore::format::col;
use trajstore::{
    Batch, BoundaryPolicy, Error, Gatherer, Sampler, SamplerKind, SamplerSpec, SliceIndex,
    SliceRef, SliceSampler, Snapshot, Weighting, WriterOptions,
};

// ---------------------------------------------------------------------------------------------
// Windows and gathered values, property-based
// ---------------------------------------------------------------------------------------------
// ---------------------------------------------------------------------------------------------

/// (slice_len, policy) with span overhangs shorter than the slice (see
/// `span_windows_always_hold_a_valid_step` for longer ones).
fn len_and_policy() -> impl Strategy<Value = (u32, BoundaryPolicy)> {
    (1u32..40).prop_flat_map(|l| {
        (
            Just(l),
            prop_oneof![
                Just(BoundaryPolicy::Strict),
                Just(BoundaryPolicy::Pad),
                (0..l, 0..l).prop_map(|(left, right)| BoundaryPolicy::Span { left, right }),
            ],
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x7a5e_1ec7),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn slices_lie_in_their_window_set_and_gather_the_source_rows(
        lens in proptest::collection::vec(1u64..80, 1..12),
        (slice_len, policy) in len_and_policy(),
        episodes_weighting in any::<bool>(),
        segment_bytes in 300u64..6000,
        batch_bytes in 100u64..3000,
        seed in any::<u64>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let opts = WriterOptions::default()
            .with_segment_bytes(segment_bytes)
            .with_batch_bytes(batch_bytes);
        let snap = TestData::new()
        .obs_dim(2)
        .seed(seed)
        .episodes(&lens)
        .writer_options(opts)
        .snapshot(&dir.path().join("d"));
        let index = snap.slice_index(slice_len, policy).unwrap();
        prop_assert_eq!(index.as_ref(), &SliceIndex::build(snap.episodes(), slice_len, policy).unwrap());
        let l = slice_len as i64;
        let (left, right) = match policy {
            BoundaryPolicy::Strict => (0, 0),
            BoundaryPolicy::Pad => (0, l - 1),
            BoundaryPolicy::Span { left, right } => (left as i64, right as i64),
        };
        // The window count per episode is the number of allowed starts.
        for (e, &len) in lens.iter().enumerate() {
            let n = (len as i64 + left + right - l + 1).max(0) as u64;
            prop_assert_eq!(index.windows(e), n, "episode {} of length {}", e, len);
        }
        let weighting = if episodes_weighting { Weighting::Episodes } else { Weighting::Windows };
        let opts = SamplerSpec::uniform(slice_len, 16)
            .with_policy(policy)
            .with_weighting(weighting)
            .with_seed(seed);
        let sampler = match SliceSampler::try_new(index.clone(), snap.episodes(), &opts) {
            Ok(s) => s,
            Err(e) => {
                // Only when no episode has a window (every episode too short for the policy).
                prop_assert_eq!(index.num_windows(), 0, "{}", e);
                prop_assert!(lens.iter().all(|&n| n as i64 + left + right < l));
                return Ok(());
            }
        };
        prop_assert!(index.num_windows() > 0);
        let gatherer = Gatherer::try_new(&snap, &[col::EPISODE_ID, col::STEP, col::REWARD]).unwrap();
        let mut batch = Batch::default();
        for (k, plan) in plans(&sampler, 0..12).into_iter().enumerate() {
            prop_assert_eq!(plan.len(), 16);
            for s in &plan {
                let ep_len = lens[s.episode as usize] as i64;
                prop_assert_eq!(s.len, slice_len);
                match policy {
                    BoundaryPolicy::Strict => {
                        prop_assert!(s.start >= 0 && s.start + l <= ep_len, "{:?} len {}", s, ep_len)
                    }
                    BoundaryPolicy::Pad => {
                        prop_assert!(s.start >= 0 && s.start < ep_len, "{:?} len {}", s, ep_len)
                    }
                    BoundaryPolicy::Span { .. } => prop_assert!(
                        -left <= s.start && s.start + l <= ep_len + right,
                        "{:?} len {}", s, ep_len
                    ),
                }
                // At least one step of the episode.
                prop_assert!(s.start < ep_len && s.start + l > 0, "{:?} len {}", s, ep_len);
            }
            gatherer.gather(&plan, &mut batch).unwrap();
            check_gathered(&snap, &plan, &batch);
            prop_assert!(batch.valid_steps() >= plan.len(), "batch {}", k);
        }
    }
}

/// Span overhangs of a slice length or more allow windows with no step of the episode at all
/// (`SliceIndex` counts `len + left + right + 1 - L` windows whatever `left` and `right`): such a
/// slice is pure padding. Every window must hold a valid step, i.e. the overhangs act as if
/// clamped to `L - 1`.
#[test]
fn span_windows_always_hold_a_valid_step() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [10u64, 4];
    let snap = TestData::new()
        .obs_dim(2)
        .seed(1)
        .episodes(lens)
        .snapshot(&dir.path().join("d"));
    let policy = BoundaryPolicy::Span { left: 6, right: 5 };
    let index = snap.slice_index(3, policy).unwrap();
    let sampler = SliceSampler::try_new(
        index.clone(),
        snap.episodes(),
        &SamplerSpec::uniform(3, 64).with_policy(policy).with_seed(3),
    )
    .unwrap();
    let mut empty: Vec<SliceRef> = plans(&sampler, 0..20)
        .concat()
        .into_iter()
        .filter(|s| s.start + 3 <= 0 || s.start >= lens[s.episode as usize] as i64)
        .collect();
    empty.sort_by_key(|s| (s.episode, s.start));
    empty.dedup();
    assert!(
        empty.is_empty(),
        "{} distinct windows of Span {{ left: 6, right: 5 }} with slice_len 3 hold no step of \
         their episode, e.g. {:?}; windows per episode: {:?} (starts -(L-1)..len would give {:?})",
        empty.len(),
        &empty[..empty.len().min(4)],
        (0..2).map(|e| index.windows(e)).collect::<Vec<_>>(),
        [10 + 2, 4 + 2],
    );
}

// ---------------------------------------------------------------------------------------------
// Sampling distributions (chi-square, fixed seeds)
// ---------------------------------------------------------------------------------------------
const LENS: [u64; 8] = [3, 7, 12, 20, 5, 30, 9, 16];
const L: u32 = 6;
const BATCH: usize = 1000;
const BATCHES: u64 = 200; // 200k draws

fn distribution_fixture() -> (tempfile::TempDir, Snapshot) {
    let dir = tempfile::tempdir().unwrap();
    let opts = WriterOptions::default().with_segment_bytes(1500);
    let snap = TestData::new()
        .obs_dim(2)
        .seed(21)
        .episodes(LENS)
        .writer_options(opts)
        .snapshot(&dir.path().join("d"));
    assert!(snap.segments().len() > 1);
    (dir, snap)
}

fn strict_windows() -> Vec<f64> {
    LENS.iter()
        .map(|&n| (n + 1).saturating_sub(L as u64) as f64)
        .collect()
}

#[test]
fn windows_weighting_is_uniform_over_windows() {
    let (_dir, snap) = distribution_fixture();
    let index = snap.slice_index(L, BoundaryPolicy::Strict).unwrap();
    let windows = strict_windows();
    assert_eq!(
        windows,
        (0..8).map(|e| index.windows(e) as f64).collect::<Vec<_>>()
    );
    // Plain (prefix sums) and through the alias table (all weights 1): same law.
    for (what, opts) in [
        ("plain", SamplerSpec::uniform(L, BATCH).with_seed(1)),
        (
            "alias",
            SamplerSpec::uniform(L, BATCH)
                .with_seed(2)
                .with_episode_weights(vec![1.0; 8]),
        ),
    ] {
        let sampler = SliceSampler::try_new(index.clone(), snap.episodes(), &opts).unwrap();
        let mut per_window = vec![0u64; index.num_windows() as usize];
        let mut per_episode = vec![0u64; 8];
        let mut p = vec![];
        for k in 0..BATCHES {
            sampler.plan(k, &mut p);
            for s in &p {
                per_episode[s.episode as usize] += 1;
                per_window[window_number(&index, s) as usize] += 1;
            }
        }
        // Episodes 0 (3 steps) and 4 (5 steps) are shorter than the slice: never drawn.
        assert_eq!((per_episode[0], per_episode[4]), (0, 0), "{what}");
        assert_fits(&format!("{what}: episodes"), &per_episode, &windows);
        assert_fits(
            &format!("{what}: windows"),
            &per_window,
            &vec![1.0; per_window.len()],
        );
    }
}

#[test]
fn episodes_weighting_is_uniform_over_episodes_with_a_window() {
    let (_dir, snap) = distribution_fixture();
    for (policy, eligible) in [
        (
            BoundaryPolicy::Strict,
            vec![0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0],
        ),
        (BoundaryPolicy::Pad, vec![1.0; 8]),
        (BoundaryPolicy::Span { left: 2, right: 1 }, vec![1.0; 8]),
    ] {
        let index = snap.slice_index(L, policy).unwrap();
        let opts = SamplerSpec::uniform(L, BATCH)
            .with_policy(policy)
            .with_weighting(Weighting::Episodes)
            .with_seed(7);
        let sampler = SliceSampler::try_new(index, snap.episodes(), &opts).unwrap();
        let c = episode_counts(&sampler, 8, BATCHES);
        assert_fits(&format!("episodes weighting {policy:?}"), &c, &eligible);
    }
}

#[test]
fn episode_weights_multiply_window_counts() {
    let (_dir, snap) = distribution_fixture();
    let index = snap.slice_index(L, BoundaryPolicy::Strict).unwrap();
    let w = vec![5.0, 1.0, 2.5, 0.5, 9.0, 3.0, 0.0, 1.5];
    let sampler = SliceSampler::try_new(
        index.clone(),
        snap.episodes(),
        &SamplerSpec::uniform(L, BATCH)
            .with_seed(11)
            .with_episode_weights(w.clone()),
    )
    .unwrap();
    let c = episode_counts(&sampler, 8, BATCHES);
    let expected: Vec<f64> = w.iter().zip(strict_windows()).map(|(a, b)| a * b).collect();
    assert_fits("episode weights x windows", &c, &expected);
    // Under episode weighting the weights alone count.
    let sampler = SliceSampler::try_new(
        index,
        snap.episodes(),
        &SamplerSpec::uniform(L, BATCH)
            .with_seed(12)
            .with_weighting(Weighting::Episodes)
            .with_episode_weights(w.clone()),
    )
    .unwrap();
    let c = episode_counts(&sampler, 8, BATCHES);
    let expected: Vec<f64> = w
        .iter()
        .zip(strict_windows())
        .map(|(a, b)| if b > 0.0 { *a } else { 0.0 })
        .collect();
    assert_fits("episode weights, episodes weighting", &c, &expected);
}

#[test]
fn episode_id_subsets_are_never_left_and_uniform_over_their_windows() {
    let (_dir, snap) = distribution_fixture();
    let index = snap.slice_index(L, BoundaryPolicy::Strict).unwrap();
    let subset = [1u64, 3, 4, 6]; // 4 has no window under strict
    let opts = SamplerSpec::uniform(L, BATCH)
        .with_seed(13)
        .with_episode_ids(subset.to_vec());
    let sampler = SliceSampler::try_new(index.clone(), snap.episodes(), &opts).unwrap();
    let mut per_window = vec![0u64; index.num_windows() as usize];
    let mut per_episode = vec![0u64; 8];
    let mut p = vec![];
    for k in 0..BATCHES {
        sampler.plan(k, &mut p);
        for s in &p {
            assert!(
                subset.contains(&(s.episode as u64)),
                "{s:?} left the subset"
            );
            per_episode[s.episode as usize] += 1;
            per_window[window_number(&index, s) as usize] += 1;
        }
    }
    let w: Vec<f64> = strict_windows()
        .iter()
        .enumerate()
        .map(|(e, &n)| if subset.contains(&(e as u64)) { n } else { 0.0 })
        .collect();
    assert_fits("subset episodes", &per_episode, &w);
    let in_subset: Vec<f64> = (0..index.num_windows())
        .map(|x| subset.contains(&(index.window(x).0 as u64)) as u8 as f64)
        .collect();
    assert_fits("subset windows", &per_window, &in_subset);
    // Under episode weighting: uniform over the subset's episodes with a window.
    let opts = SamplerSpec::uniform(L, BATCH)
        .with_seed(14)
        .with_weighting(Weighting::Episodes)
        .with_episode_ids(subset.to_vec());
    let sampler = SliceSampler::try_new(index.clone(), snap.episodes(), &opts).unwrap();
    let c = episode_counts(&sampler, 8, BATCHES);
    let w: Vec<f64> = (0..8)
        .map(|e| ([1, 3, 6].contains(&e)) as u8 as f64)
        .collect();
    assert_fits("subset, episodes weighting", &c, &w);
    // A subset without any window, or an unknown id, is an error.
    for (ids, argument) in [(vec![0u64, 4], None), (vec![99], Some("episode_ids"))] {
        let e = err_of(SliceSampler::try_new(
            index.clone(),
            snap.episodes(),
            &SamplerSpec::uniform(L, 4).with_episode_ids(ids.clone()),
        ));
        assert_invalid_argument(&e, argument, &format!("{ids:?}"));
    }
}

#[test]
fn starts_within_an_episode_are_uniform() {
    let (_dir, snap) = distribution_fixture();
    // Episode 5 has 30 steps.
    for policy in [
        BoundaryPolicy::Strict,
        BoundaryPolicy::Pad,
        BoundaryPolicy::Span { left: 4, right: 2 },
    ] {
        let index = snap.slice_index(L, policy).unwrap();
        let (left, _) = policy.overhang(L);
        let n = index.windows(5) as usize;
        let opts = SamplerSpec::uniform(L, BATCH)
            .with_policy(policy)
            .with_weighting(Weighting::Episodes)
            .with_episode_ids(vec![5])
            .with_seed(17);
        let sampler = SliceSampler::try_new(index.clone(), snap.episodes(), &opts).unwrap();
        let mut c = vec![0u64; n];
        let mut p = vec![];
        for k in 0..BATCHES {
            sampler.plan(k, &mut p);
            for s in &p {
                assert_eq!(s.episode, 5);
                c[(s.start + left as i64) as usize] += 1;
            }
        }
        assert_fits(
            &format!("starts of episode 5 under {policy:?}"),
            &c,
            &vec![1.0; n],
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Options validation
// ---------------------------------------------------------------------------------------------

#[test]
fn sampler_options_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let snap = TestData::new()
        .obs_dim(2)
        .seed(60)
        .episodes([4, 9])
        .snapshot(&dir.path().join("d"));
    let eps = snap.episodes();
    let idx = snap.slice_index(5, BoundaryPolicy::Strict).unwrap();
    let new = |o: SamplerSpec| SliceSampler::try_new(idx.clone(), eps, &o);
    // `None`: an error about a combination of arguments, which may name none.
    let invalid = |what: &str, argument: Option<&str>, r: trajstore::Result<SliceSampler>| {
        assert_invalid_argument(&err_of(r), argument, what);
    };
    invalid(
        "no slices",
        Some("num_slices"),
        new(SamplerSpec::uniform(5, 0)),
    );
    invalid(
        "index of another length",
        None,
        new(SamplerSpec::uniform(6, 4)),
    );
    invalid(
        "index of another policy",
        None,
        new(SamplerSpec::uniform(5, 4).with_policy(BoundaryPolicy::Pad)),
    );
    for (what, argument, w) in [
        (
            "one weight for two episodes",
            Some("episode_weights"),
            vec![1.0],
        ),
        (
            "a negative weight",
            Some("episode_weights"),
            vec![1.0, -1.0],
        ),
        ("a NaN weight", Some("episode_weights"), vec![1.0, f64::NAN]),
        (
            "no weight on an episode with a window",
            None,
            vec![1.0, 0.0],
        ),
    ] {
        invalid(
            what,
            argument,
            new(SamplerSpec::uniform(5, 4).with_episode_weights(w)),
        );
    }
    assert!(new(SamplerSpec::uniform(5, 4).with_episode_weights(vec![0.0, 2.0])).is_ok());
    let e = snap.slice_index(0, BoundaryPolicy::Pad).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "slice_len"),
        "{e}"
    );
    let none = snap.slice_index(10, BoundaryPolicy::Strict).unwrap();
    assert_eq!(none.num_windows(), 0);
    invalid(
        "no window",
        None,
        SliceSampler::try_new(none, eps, &SamplerSpec::uniform(10, 1)),
    );
    let e = SamplerSpec::from_batch_size(SamplerKind::Uniform, 100, 7).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "batch_size"),
        "{e}"
    );
    assert_eq!(
        SamplerSpec::from_batch_size(SamplerKind::Uniform, 96, 8)
            .unwrap()
            .num_slices,
        12
    );
    // The cached index is shared.
    assert!(Arc::ptr_eq(
        &idx,
        &snap.slice_index(5, BoundaryPolicy::Strict).unwrap()
    ));
}
