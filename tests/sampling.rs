//! Samplers and gather through the public API: window sets per boundary policy, gathered values
//! and flags against the stored rows, sampling distributions (chi-square), epochs without
//! replacement, determinism, slice-index extension on refresh, derived `next_observation`,
//! `Batch::to_record_batch` and whole-episode sampling.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, RecordBatch};
use arrow::datatypes::{
    DataType, Field, Float32Type, Int64Type, UInt8Type, UInt32Type, UInt64Type,
};
use proptest::prelude::*;
use trajstore::format::{col, ep};
use trajstore::synth::SynthSpec;
use trajstore::{
    Batch, BoundaryPolicy, Dataset, EpisodeEnd, EpisodeSampler, EpochSampler, Gatherer, Sampler,
    SliceIndex, SliceOptions, SliceRef, SliceSampler, Snapshot, TransitionSchema, Weighting,
    WriterOptions,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn spec(obs_dim: usize, seed: u64) -> SynthSpec {
    SynthSpec {
        transitions: 0,
        obs_dim,
        act_dim: 2,
        discrete_actions: false,
        mean_episode_len: 20.0,
        seed,
    }
}

/// A dataset at `dir/name` holding one synthetic episode per entry of `lens` (ids 0..), one commit.
fn build(
    dir: &std::path::Path,
    name: &str,
    lens: &[u64],
    obs_dim: usize,
    seed: u64,
    opts: WriterOptions,
) -> (Dataset, Snapshot) {
    let s = spec(obs_dim, seed);
    let ds = Dataset::create(dir.join(name), &s.schema().unwrap()).unwrap();
    let mut w = ds.writer(opts).unwrap();
    for (i, &l) in lens.iter().enumerate() {
        let (b, e) = s.episode(i as u64, l);
        w.append_episode(&b, e).unwrap();
    }
    w.commit().unwrap();
    let snap = ds.snapshot().unwrap();
    (ds, snap)
}

/// `(terminated, truncated)` of every episode position, from the episode tables.
fn episode_ends(snap: &Snapshot) -> Vec<(bool, bool)> {
    let flat = |name: &str| -> Vec<bool> {
        snap.episode_column(name)
            .unwrap()
            .iter()
            .flat_map(|a| {
                let a = a.as_boolean();
                (0..a.len()).map(|i| a.value(i)).collect::<Vec<_>>()
            })
            .collect()
    };
    let (t, u) = (flat(ep::TERMINATED), flat(ep::TRUNCATED));
    assert_eq!(t.len(), snap.episodes().len());
    t.into_iter().zip(u).collect()
}

fn plans(s: &dyn Sampler, batches: std::ops::Range<u64>) -> Vec<Vec<SliceRef>> {
    batches
        .map(|k| {
            let mut p = vec![];
            s.plan(k, &mut p);
            p
        })
        .collect()
}

/// Upper 0.001 critical value of chi-square with `df` degrees of freedom (Wilson–Hilferty).
fn chi2_critical_001(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.090_232_306; // standard normal upper 0.001 quantile
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Asserts that `observed` counts fit the probabilities `p` (proportional weights; cells with
/// weight 0 must never be observed).
fn assert_fits(what: &str, observed: &[u64], weights: &[f64]) {
    assert_eq!(observed.len(), weights.len(), "{what}");
    let n: u64 = observed.iter().sum();
    let total: f64 = weights.iter().sum();
    let mut stat = 0.0;
    let mut cells = 0usize;
    for (i, (&o, &w)) in observed.iter().zip(weights).enumerate() {
        if w == 0.0 {
            assert_eq!(
                o, 0,
                "{what}: cell {i} has weight 0 but was drawn {o} times"
            );
            continue;
        }
        let e = n as f64 * w / total;
        stat += (o as f64 - e).powi(2) / e;
        cells += 1;
    }
    assert!(cells >= 2, "{what}: need two or more cells");
    let crit = chi2_critical_001(cells - 1);
    assert!(
        stat < crit,
        "{what}: chi-square {stat:.1} >= {crit:.1} (df {}), observed {observed:?}, weights {weights:?}",
        cells - 1
    );
}

/// Draws `batches` batches of `sampler` and counts slices per episode position.
fn episode_counts(sampler: &SliceSampler, episodes: usize, batches: u64) -> Vec<u64> {
    let mut c = vec![0u64; episodes];
    let mut p = vec![];
    for k in 0..batches {
        sampler.plan(k, &mut p);
        for s in &p {
            c[s.episode as usize] += 1;
        }
    }
    c
}

/// Window number of a slice in `index`.
fn window_number(index: &SliceIndex, s: &SliceRef) -> u64 {
    let e = s.episode as usize;
    let k = s.start - index.start_in(e, 0);
    assert!(
        k >= 0 && (k as u64) < index.windows(e),
        "slice {s:?} is not a window of episode {e}"
    );
    index.first_window(e) + k as u64
}

/// Checks every slice of a gathered batch of `["episode_id", "step", "reward"]` against the
/// snapshot: ids, steps, masks, padding, flags and rewards.
fn check_gathered(snap: &Snapshot, plan: &[SliceRef], batch: &Batch) {
    let l = plan.iter().map(|s| s.len as usize).max().unwrap_or(0);
    assert_eq!(batch.num_slices, plan.len());
    assert_eq!(batch.slice_len, l);
    let ends = episode_ends(snap);
    let ids = batch.column(col::EPISODE_ID).unwrap();
    let steps = batch.column(col::STEP).unwrap();
    let rewards = batch.column(col::REWARD).unwrap();
    assert_eq!(ids.data_type, DataType::UInt64);
    assert_eq!(steps.data_type, DataType::UInt32);
    assert_eq!(rewards.data_type, DataType::Float32);
    let (ids, steps, rewards) = (
        ids.values::<u64>(),
        steps.values::<u32>(),
        rewards.values::<f32>(),
    );
    assert_eq!(ids.len(), plan.len() * l);
    for (i, s) in plan.iter().enumerate() {
        let loc = snap.episodes().get(s.episode as usize);
        let id = loc.episode_id;
        let len = loc.length as i64;
        assert_eq!(batch.episode_id[i], id, "slice {i}");
        assert_eq!(batch.start_step[i], s.start, "slice {i}");
        let source = snap.episode(id).unwrap();
        let src_reward = source
            .column_by_name(col::REWARD)
            .unwrap()
            .as_primitive::<Float32Type>()
            .clone();
        let (terminated, truncated) = ends[s.episode as usize];
        let last_valid = (s.start + l as i64).min(len) - 1;
        for t in 0..l {
            let j = i * l + t;
            let step = s.start + t as i64;
            let valid = step >= 0 && step < len;
            let ctx = format!("slice {i} {s:?} (episode length {len}) step {t}");
            assert_eq!(batch.mask[j], valid as u8, "mask: {ctx}");
            if valid {
                assert_eq!(ids[j], id, "episode_id: {ctx}");
                assert_eq!(steps[j] as i64, step, "step: {ctx}");
                assert_eq!(
                    rewards[j].to_bits(),
                    src_reward.value(step as usize).to_bits(),
                    "reward: {ctx}"
                );
            } else {
                assert_eq!(
                    (ids[j], steps[j], rewards[j].to_bits()),
                    (0, 0, 0),
                    "pad: {ctx}"
                );
            }
            let is_last = valid && step == len - 1;
            assert_eq!(
                batch.is_first[j],
                (valid && step == 0) as u8,
                "is_first: {ctx}"
            );
            assert_eq!(batch.is_last[j], is_last as u8, "is_last: {ctx}");
            assert_eq!(
                batch.terminated[j],
                (is_last && terminated) as u8,
                "terminated: {ctx}"
            );
            assert_eq!(
                batch.truncated[j],
                (is_last && truncated) as u8,
                "truncated: {ctx}"
            );
            assert_eq!(
                batch.slice_end[j],
                (valid && step == last_valid) as u8,
                "slice_end: {ctx}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Windows and gathered values, property-based
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
        let (_ds, snap) = build(dir.path(), "d", &lens, 2, seed, opts);
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
        let opts = SliceOptions::new(slice_len, 16)
            .with_policy(policy)
            .with_weighting(weighting)
            .with_seed(seed);
        let sampler = match SliceSampler::new(index.clone(), snap.episodes(), &opts) {
            Ok(s) => s,
            Err(e) => {
                // Only when no episode has a window (every episode too short for the policy).
                prop_assert_eq!(index.num_windows(), 0, "{}", e);
                prop_assert!(lens.iter().all(|&n| n as i64 + left + right < l));
                return Ok(());
            }
        };
        prop_assert!(index.num_windows() > 0);
        let gatherer = Gatherer::new(&snap, &[col::EPISODE_ID, col::STEP, col::REWARD]).unwrap();
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
            gatherer.gather(&plan, &mut batch);
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
    let (_ds, snap) = build(dir.path(), "d", &lens, 2, 1, WriterOptions::default());
    let policy = BoundaryPolicy::Span { left: 6, right: 5 };
    let index = snap.slice_index(3, policy).unwrap();
    let sampler = SliceSampler::new(
        index.clone(),
        snap.episodes(),
        &SliceOptions::new(3, 64).with_policy(policy).with_seed(3),
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

/// A slice that ends before its episode starts is all padding, like one that starts after the
/// episode's end: gathering it must not panic.
#[test]
fn gather_of_a_slice_wholly_outside_its_episode_is_padding() {
    let dir = tempfile::tempdir().unwrap();
    let (_ds, snap) = build(dir.path(), "d", &[10, 4], 2, 1, WriterOptions::default());
    let g = Gatherer::new(&snap, &[col::REWARD, col::OBSERVATION]).unwrap();
    let mut batch = Batch::default();
    // After the end: fine today.
    g.gather(
        &[SliceRef {
            episode: 1,
            start: 4,
            len: 3,
        }],
        &mut batch,
    );
    assert_eq!(batch.mask, vec![0, 0, 0]);
    // Before the start (a start the span policy produces for left >= L): panics today with
    // "range end index 24 out of range for slice of length 12" in Gatherer::gather_slice
    // (`out[..off * step]` with off = a - start = 6 > L = 3).
    let plan = [
        SliceRef {
            episode: 0,
            start: 1,
            len: 3,
        },
        SliceRef {
            episode: 1,
            start: -6,
            len: 3,
        },
    ];
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        g.gather(&plan, &mut batch);
    }));
    assert!(
        result.is_ok(),
        "gather panicked on a slice ending before its episode's start"
    );
    assert_eq!(batch.mask, vec![1, 1, 1, 0, 0, 0]);
    assert!(
        batch.columns[0].values::<f32>()[3..]
            .iter()
            .all(|&x| x == 0.0)
    );
    assert!(
        batch.columns[1].values::<f32>()[6..]
            .iter()
            .all(|&x| x == 0.0)
    );
    assert_eq!(batch.slice_end, vec![0, 0, 1, 0, 0, 0]);
}

/// A large batch (gathered in parallel) equals the slices gathered one at a time.
#[test]
fn parallel_gather_equals_per_slice_gather() {
    let dir = tempfile::tempdir().unwrap();
    let lens: Vec<u64> = (0..40).map(|i| 5 + (i * 37 % 90)).collect();
    let opts = WriterOptions::default()
        .with_segment_bytes(40_000)
        .with_batch_bytes(9_000);
    let (_ds, snap) = build(dir.path(), "d", &lens, 48, 11, opts);
    assert!(snap.segments().len() > 2);
    let policy = BoundaryPolicy::Span { left: 7, right: 9 };
    let index = snap.slice_index(24, policy).unwrap();
    let sampler = SliceSampler::new(
        index,
        snap.episodes(),
        &SliceOptions::new(24, 256).with_policy(policy).with_seed(5),
    )
    .unwrap();
    let names = [
        col::OBSERVATION,
        col::REWARD,
        col::STEP,
        col::IS_LAST,
        "next_observation",
    ];
    let gatherer = Gatherer::new(&snap, &names).unwrap();
    let mut plan = vec![];
    sampler.plan(0, &mut plan);
    let mut big = Batch::default();
    gatherer.gather(&plan, &mut big);
    assert!(
        big.data_bytes() >= 256 << 10,
        "large enough for the parallel path"
    );
    let mut one = Batch::default();
    for (i, s) in plan.iter().enumerate() {
        gatherer.gather(std::slice::from_ref(s), &mut one);
        for (a, b) in big.columns.iter().zip(&one.columns) {
            let n = b.data.len();
            assert_eq!(
                &a.data.as_slice()[i * n..(i + 1) * n],
                b.data.as_slice(),
                "{}",
                a.name
            );
        }
        let r = i * 24..(i + 1) * 24;
        assert_eq!(&big.mask[r.clone()], &one.mask[..]);
        assert_eq!(&big.is_first[r.clone()], &one.is_first[..]);
        assert_eq!(&big.is_last[r.clone()], &one.is_last[..]);
        assert_eq!(&big.terminated[r.clone()], &one.terminated[..]);
        assert_eq!(&big.truncated[r.clone()], &one.truncated[..]);
        assert_eq!(&big.slice_end[r], &one.slice_end[..]);
        assert_eq!(
            (big.episode_id[i], big.start_step[i]),
            (one.episode_id[0], one.start_step[0])
        );
    }
    // Buffers are reused: gathering a smaller plan into the big batch shrinks it consistently.
    gatherer.gather(&plan[..3], &mut big);
    assert_eq!(
        (big.num_slices, big.mask.len(), big.episode_id.len()),
        (3, 72, 3)
    );
    let obs = big.column(col::OBSERVATION).unwrap();
    assert_eq!(obs.data.len(), 3 * 24 * 48 * 4);
    assert_eq!(obs.shape, vec![48]);
}

// ---------------------------------------------------------------------------------------------
// 2. Sampling distributions (chi-square, fixed seeds)
// ---------------------------------------------------------------------------------------------

const LENS: [u64; 8] = [3, 7, 12, 20, 5, 30, 9, 16];
const L: u32 = 6;
const BATCH: usize = 1000;
const BATCHES: u64 = 200; // 200k draws

fn distribution_fixture() -> (tempfile::TempDir, Snapshot) {
    let dir = tempfile::tempdir().unwrap();
    let opts = WriterOptions::default().with_segment_bytes(1500);
    let (_ds, snap) = build(dir.path(), "d", &LENS, 2, 21, opts);
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
        ("plain", SliceOptions::new(L, BATCH).with_seed(1)),
        (
            "alias",
            SliceOptions::new(L, BATCH)
                .with_seed(2)
                .with_episode_weights(vec![1.0; 8]),
        ),
    ] {
        let sampler = SliceSampler::new(index.clone(), snap.episodes(), &opts).unwrap();
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
        let opts = SliceOptions::new(L, BATCH)
            .with_policy(policy)
            .with_weighting(Weighting::Episodes)
            .with_seed(7);
        let sampler = SliceSampler::new(index, snap.episodes(), &opts).unwrap();
        let c = episode_counts(&sampler, 8, BATCHES);
        assert_fits(&format!("episodes weighting {policy:?}"), &c, &eligible);
    }
}

#[test]
fn episode_weights_multiply_window_counts() {
    let (_dir, snap) = distribution_fixture();
    let index = snap.slice_index(L, BoundaryPolicy::Strict).unwrap();
    let w = vec![5.0, 1.0, 2.5, 0.5, 9.0, 3.0, 0.0, 1.5];
    let sampler = SliceSampler::new(
        index.clone(),
        snap.episodes(),
        &SliceOptions::new(L, BATCH)
            .with_seed(11)
            .with_episode_weights(w.clone()),
    )
    .unwrap();
    let c = episode_counts(&sampler, 8, BATCHES);
    let expected: Vec<f64> = w.iter().zip(strict_windows()).map(|(a, b)| a * b).collect();
    assert_fits("episode weights x windows", &c, &expected);
    // Under episode weighting the weights alone count.
    let sampler = SliceSampler::new(
        index,
        snap.episodes(),
        &SliceOptions::new(L, BATCH)
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
    let opts = SliceOptions::new(L, BATCH)
        .with_seed(13)
        .with_episode_ids(subset.to_vec());
    let sampler = SliceSampler::new(index.clone(), snap.episodes(), &opts).unwrap();
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
    let opts = SliceOptions::new(L, BATCH)
        .with_seed(14)
        .with_weighting(Weighting::Episodes)
        .with_episode_ids(subset.to_vec());
    let sampler = SliceSampler::new(index.clone(), snap.episodes(), &opts).unwrap();
    let c = episode_counts(&sampler, 8, BATCHES);
    let w: Vec<f64> = (0..8)
        .map(|e| ([1, 3, 6].contains(&e)) as u8 as f64)
        .collect();
    assert_fits("subset, episodes weighting", &c, &w);
    // A subset without any window, or an unknown id, is an error.
    for ids in [vec![0u64, 4], vec![99]] {
        assert!(
            SliceSampler::new(
                index.clone(),
                snap.episodes(),
                &SliceOptions::new(L, 4).with_episode_ids(ids.clone())
            )
            .is_err(),
            "{ids:?}"
        );
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
        let opts = SliceOptions::new(L, BATCH)
            .with_policy(policy)
            .with_weighting(Weighting::Episodes)
            .with_episode_ids(vec![5])
            .with_seed(17);
        let sampler = SliceSampler::new(index.clone(), snap.episodes(), &opts).unwrap();
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
// 3. Epochs without replacement
// ---------------------------------------------------------------------------------------------

#[test]
fn epoch_windows_visit_every_window_once_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [3u64, 40, 17, 8, 1, 25, 60, 11, 2, 33];
    let (_ds, snap) = build(dir.path(), "d", &lens, 2, 4, WriterOptions::default());
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
    let (_ds, snap) = build(dir.path(), "d", &lens, 2, 4, WriterOptions::default());
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
    // Nothing to sample is an error.
    let empty = snap.slice_index(100, BoundaryPolicy::Strict).unwrap();
    assert!(EpochSampler::windows(empty.clone(), 4, 0, false).is_err());
    assert!(EpochSampler::episodes(empty, 4, 0, false).is_err());
    assert!(EpochSampler::windows(index, 0, 0, false).is_err());
}

// ---------------------------------------------------------------------------------------------
// 4. Determinism
// ---------------------------------------------------------------------------------------------

#[test]
fn plans_are_pure_functions_of_seed_and_batch() {
    let dir = tempfile::tempdir().unwrap();
    let lens: Vec<u64> = (0..30).map(|i| 1 + (i * 29 % 70)).collect();
    let (_ds, snap) = build(dir.path(), "d", &lens, 2, 8, WriterOptions::default());
    let policy = BoundaryPolicy::Pad;
    let index = snap.slice_index(10, policy).unwrap();
    let eps = snap.episodes();
    type Make = Box<dyn Fn(u64) -> Box<dyn Sampler>>;
    let slice = {
        let (index, eps) = (index.clone(), eps.clone());
        move |seed| -> Box<dyn Sampler> {
            let o = SliceOptions::new(10, 32)
                .with_policy(policy)
                .with_seed(seed);
            Box::new(SliceSampler::new(index.clone(), &eps, &o).unwrap())
        }
    };
    let weighted = {
        let (index, eps) = (index.clone(), eps.clone());
        move |seed| -> Box<dyn Sampler> {
            let o = SliceOptions::new(10, 32)
                .with_policy(policy)
                .with_weighting(Weighting::Episodes)
                .with_episode_weights((0..30).map(|i| i as f64).collect())
                .with_seed(seed);
            Box::new(SliceSampler::new(index.clone(), &eps, &o).unwrap())
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
            Box::new(EpisodeSampler::new(&eps, 8, 50, seed).unwrap())
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

// ---------------------------------------------------------------------------------------------
// 5. Slice index extension on refresh
// ---------------------------------------------------------------------------------------------

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
        let s = spec(2, seed);
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
            prop_assert!(snap.num_transitions() <= max);
        }
    }
}

#[test]
fn refresh_extends_slice_indexes_through_retention() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(2, 5);
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
    let sampler = SliceSampler::new(
        index,
        snap.episodes(),
        &SliceOptions::new(7, 64)
            .with_policy(BoundaryPolicy::Pad)
            .with_seed(1),
    )
    .unwrap();
    let gatherer = Gatherer::new(&snap, &[col::EPISODE_ID, col::STEP, col::REWARD]).unwrap();
    let mut batch = Batch::default();
    for plan in plans(&sampler, 0..10) {
        gatherer.gather(&plan, &mut batch);
        check_gathered(&snap, &plan, &batch);
    }
}

/// One commit whose retention drops every segment the old snapshot had and some of the new ones:
/// the refreshed snapshot must index the same episodes (ids included) as a freshly opened one.
#[test]
fn refresh_after_retention_drops_every_old_segment_keeps_episode_ids() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(2, 6);
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
        snap.episode(last).is_some(),
        "the newest episode is reachable by its id"
    );
    let gatherer = Gatherer::new(&snap, &[col::EPISODE_ID]).unwrap();
    let mut batch = Batch::default();
    let pos = snap.episodes().len() as u32 - 1;
    gatherer.gather(
        &[SliceRef {
            episode: pos,
            start: 0,
            len: 4,
        }],
        &mut batch,
    );
    assert_eq!(
        batch.episode_id[0], 23,
        "gathered episode id of the newest episode"
    );
    assert_eq!(
        batch.column(col::EPISODE_ID).unwrap().values::<u64>()[0],
        23
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Derived next_observation equals a stored one
// ---------------------------------------------------------------------------------------------

fn fsl(values: Vec<f32>, n: usize) -> ArrayRef {
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    Arc::new(FixedSizeListArray::new(
        item,
        n as i32,
        Arc::new(Float32Array::from(values)),
        None,
    ))
}

#[test]
fn derived_next_observation_equals_stored() {
    let dir = tempfile::tempdir().unwrap();
    let d = 3;
    let s = spec(d, 31);
    let lens: Vec<u64> = (0..25).map(|i| 1 + (i * 17 % 41)).collect();
    let stored_schema = TransitionSchema::builder(&[d], 2)
        .next_observation(true)
        .build()
        .unwrap();
    let stored = Dataset::create(dir.path().join("stored"), &stored_schema).unwrap();
    let derived = Dataset::create(dir.path().join("derived"), &s.schema().unwrap()).unwrap();
    let opts = WriterOptions::default()
        .with_segment_bytes(2500)
        .with_batch_bytes(700);
    let mut ws = stored.writer(opts.clone()).unwrap();
    let mut wd = derived.writer(opts).unwrap();
    for (i, &len) in lens.iter().enumerate() {
        let (batch, end) = s.episode(i as u64, len);
        let obs = batch
            .column_by_name(col::OBSERVATION)
            .unwrap()
            .as_fixed_size_list();
        let obs_vals = obs.values().as_primitive::<Float32Type>().values();
        let fin = end.final_observation.clone().unwrap();
        let fin_vals = fin
            .as_fixed_size_list()
            .values()
            .as_primitive::<Float32Type>()
            .clone();
        let mut next: Vec<f32> = obs_vals[d..].to_vec();
        next.extend_from_slice(fin_vals.values());
        assert_eq!(next.len(), len as usize * d);
        let schema = batch.schema();
        let mut cols: Vec<(&str, ArrayRef)> = schema
            .fields()
            .iter()
            .map(|f| {
                (
                    f.name().as_str(),
                    batch.column_by_name(f.name()).unwrap().clone(),
                )
            })
            .collect();
        cols.push((col::NEXT_OBSERVATION, fsl(next, d)));
        let with_next = RecordBatch::try_from_iter(cols).unwrap();
        ws.append_episode(&with_next, end.clone()).unwrap();
        wd.append_episode(&batch, end).unwrap();
    }
    ws.commit().unwrap();
    wd.commit().unwrap();
    let (ss, sd) = (stored.snapshot().unwrap(), derived.snapshot().unwrap());
    assert!(ss.schema().has_next_observation() && !sd.schema().has_next_observation());
    assert!(sd.segments().len() > 1 && ss.segments().len() > 1);
    let gs = Gatherer::new(&ss, &[col::NEXT_OBSERVATION, col::OBSERVATION]).unwrap();
    let gd = Gatherer::new(&sd, &[col::NEXT_OBSERVATION, col::OBSERVATION]).unwrap();
    for (l, policy) in [
        (8, BoundaryPolicy::Pad),
        (1, BoundaryPolicy::Strict),
        (41, BoundaryPolicy::Pad),
        (6, BoundaryPolicy::Span { left: 4, right: 5 }),
    ] {
        let index = sd.slice_index(l, policy).unwrap();
        assert_eq!(index.as_ref(), ss.slice_index(l, policy).unwrap().as_ref());
        let sampler = SliceSampler::new(
            index,
            sd.episodes(),
            &SliceOptions::new(l, 48)
                .with_policy(policy)
                .with_seed(l as u64),
        )
        .unwrap();
        let (mut bs, mut bd) = (Batch::default(), Batch::default());
        let mut reached_end = 0;
        for plan in plans(&sampler, 0..8) {
            gs.gather(&plan, &mut bs);
            gd.gather(&plan, &mut bd);
            assert_eq!(bs.mask, bd.mask);
            assert_eq!(bs.is_last, bd.is_last);
            reached_end += bd.is_last.iter().filter(|&&x| x == 1).count();
            let (ns, nd) = (&bs.columns[0], &bd.columns[0]);
            assert_eq!(
                (ns.width, &ns.shape, &ns.data_type),
                (nd.width, &nd.shape, &nd.data_type)
            );
            assert_eq!(ns.shape, vec![d]);
            assert_eq!(
                ns.values::<f32>(),
                nd.values::<f32>(),
                "next_observation, L={l} {policy:?}, plan {plan:?}"
            );
            assert_eq!(bs.columns[1].data.as_slice(), bd.columns[1].data.as_slice());
            // And o_{t+1} is the observation of the next step inside a slice.
            let (obs, next) = (bd.columns[1].values::<f32>(), nd.values::<f32>());
            for i in 0..plan.len() * l as usize {
                if bd.mask[i] == 1 && bd.is_last[i] == 0 && (i + 1) % l as usize != 0 {
                    assert_eq!(&next[i * d..(i + 1) * d], &obs[(i + 1) * d..(i + 2) * d]);
                }
            }
        }
        if policy != BoundaryPolicy::Strict || l == 1 {
            assert!(reached_end > 0, "windows reach episode ends");
        }
    }
}

/// An episode appended without a final observation derives zeros after its last step.
#[test]
fn derived_next_observation_without_final_observation_is_zero() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(2, 32);
    let ds = Dataset::create(dir.path().join("d"), &s.schema().unwrap()).unwrap();
    let mut w = ds.writer(WriterOptions::default()).unwrap();
    let (b0, e0) = s.episode(0, 5);
    w.append_episode(&b0, e0).unwrap();
    let (b1, _) = s.episode(1, 4);
    w.append_episode(&b1, EpisodeEnd::truncated()).unwrap();
    let (b2, e2) = s.episode(2, 3);
    let fin = e2.final_observation.clone().unwrap();
    w.append_episode(&b2, e2).unwrap();
    w.commit().unwrap();
    let snap = ds.snapshot().unwrap();
    // The episode table holds a null for episode 1.
    let finals = snap.episode_column(ep::FINAL_OBSERVATION).unwrap();
    assert_eq!(finals[0].null_count(), 1);
    assert!(finals[0].is_null(1));
    let g = Gatherer::new(&snap, &[col::NEXT_OBSERVATION]).unwrap();
    let mut batch = Batch::default();
    let plan = [
        SliceRef {
            episode: 1,
            start: 2,
            len: 3,
        },
        SliceRef {
            episode: 2,
            start: 1,
            len: 3,
        },
    ];
    g.gather(&plan, &mut batch);
    let next = batch.columns[0].values::<f32>();
    let obs1 = b1
        .column_by_name(col::OBSERVATION)
        .unwrap()
        .as_fixed_size_list()
        .clone();
    let o1 = obs1.values().as_primitive::<Float32Type>().values();
    assert_eq!(&next[0..2], &o1[6..8]); // o_3 after step 2
    assert_eq!(&next[2..4], &[0.0, 0.0]); // no o_4 stored
    assert_eq!(&next[4..6], &[0.0, 0.0]); // padding
    assert_eq!(batch.mask, vec![1, 1, 0, 1, 1, 0]);
    let f = fin
        .as_fixed_size_list()
        .values()
        .as_primitive::<Float32Type>()
        .clone();
    assert_eq!(&next[8..10], f.values()); // o_3 of episode 2 is its final observation
}

// ---------------------------------------------------------------------------------------------
// 7. Batch::to_record_batch
// ---------------------------------------------------------------------------------------------

#[test]
fn to_record_batch_round_trips_the_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [5u64, 12, 3, 20, 9];
    let (_ds, snap) = build(dir.path(), "d", &lens, 3, 40, WriterOptions::default());
    let policy = BoundaryPolicy::Span { left: 2, right: 3 };
    let index = snap.slice_index(6, policy).unwrap();
    let sampler = SliceSampler::new(
        index,
        snap.episodes(),
        &SliceOptions::new(6, 10).with_policy(policy).with_seed(3),
    )
    .unwrap();
    let g = Gatherer::new(&snap, &[col::OBSERVATION, col::ACTION, col::REWARD]).unwrap();
    let mut plan = vec![];
    sampler.plan(0, &mut plan);
    let mut batch = Batch::default();
    g.gather(&plan, &mut batch);
    let rb = batch.to_record_batch().unwrap();
    let (b, l) = (10usize, 6usize);
    assert_eq!(rb.num_rows(), b * l);
    let u64s = |name: &str| {
        rb.column_by_name(name)
            .unwrap()
            .as_primitive::<UInt64Type>()
            .values()
            .to_vec()
    };
    let u8s = |name: &str| {
        rb.column_by_name(name)
            .unwrap()
            .as_primitive::<UInt8Type>()
            .values()
            .to_vec()
    };
    assert_eq!(
        u64s("slice"),
        (0..b * l).map(|i| (i / l) as u64).collect::<Vec<_>>()
    );
    assert_eq!(
        u64s(col::EPISODE_ID),
        (0..b * l)
            .map(|i| batch.episode_id[i / l])
            .collect::<Vec<_>>()
    );
    let steps = rb
        .column_by_name(col::STEP)
        .unwrap()
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(
        steps,
        (0..b * l)
            .map(|i| plan[i / l].start + (i % l) as i64)
            .collect::<Vec<_>>()
    );
    for name in [col::OBSERVATION, col::ACTION] {
        let a = rb.column_by_name(name).unwrap().as_fixed_size_list();
        let c = batch.column(name).unwrap();
        assert_eq!(a.len(), b * l);
        assert_eq!(a.value_length() as usize, c.width);
        assert_eq!(
            a.values().as_primitive::<Float32Type>().values(),
            c.values::<f32>(),
            "{name}"
        );
    }
    let r = rb
        .column_by_name(col::REWARD)
        .unwrap()
        .as_primitive::<Float32Type>();
    assert_eq!(
        r.values(),
        batch.column(col::REWARD).unwrap().values::<f32>()
    );
    for (name, v) in [
        ("mask", &batch.mask),
        (col::IS_FIRST, &batch.is_first),
        (col::IS_LAST, &batch.is_last),
        (col::TERMINATED, &batch.terminated),
        (col::TRUNCATED, &batch.truncated),
        ("slice_end", &batch.slice_end),
    ] {
        assert_eq!(&u8s(name), v, "{name}");
    }
    assert_eq!(rb.num_columns(), 3 + 3 + 6);
    // A stored boolean and an integer column round trip too.
    let g = Gatherer::new(&snap, &["is_last", "step"]).unwrap();
    g.gather(&plan, &mut batch);
    let rb = batch.to_record_batch().unwrap();
    assert_eq!(rb.num_rows(), b * l);
    // Gathered columns take the place of the metadata and flag columns of the same name.
    let names: Vec<_> = rb
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let unique: std::collections::HashSet<_> = names.iter().collect();
    assert_eq!(
        unique.len(),
        names.len(),
        "duplicate column names: {names:?}"
    );
    let stored_last: Vec<bool> = rb
        .column_by_name("is_last")
        .unwrap()
        .as_boolean()
        .iter()
        .map(|x| x.unwrap())
        .collect();
    assert_eq!(
        stored_last,
        batch.is_last.iter().map(|&x| x == 1).collect::<Vec<_>>(),
        "stored is_last column equals the flag"
    );
    let step_col = rb
        .column_by_name("step")
        .unwrap()
        .as_primitive::<UInt32Type>();
    for (i, (&m, &step)) in batch.mask.iter().zip(&steps).enumerate() {
        if m == 1 {
            assert_eq!(step_col.value(i) as i64, step);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 8. Whole episodes
// ---------------------------------------------------------------------------------------------

#[test]
fn episode_sampler_covers_whole_episodes_from_step_zero() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [5u64, 30, 1, 17, 25, 40, 8];
    let opts = WriterOptions::default().with_segment_bytes(1200);
    let (_ds, snap) = build(dir.path(), "d", &lens, 2, 50, opts);
    let max_len = 25u32;
    let s = EpisodeSampler::new(snap.episodes(), 6, max_len, 9).unwrap();
    assert_eq!(s.slice_len(), max_len);
    assert_eq!(s.batches_per_epoch(), None);
    let g = Gatherer::new(&snap, &[col::EPISODE_ID, col::STEP, col::REWARD]).unwrap();
    let mut batch = Batch::default();
    let mut counts = vec![0u64; lens.len()];
    for plan in plans(&s, 0..400) {
        assert_eq!(plan.len(), 6);
        for x in &plan {
            assert_eq!((x.start, x.len), (0, max_len));
            counts[x.episode as usize] += 1;
        }
        g.gather(&plan, &mut batch);
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
    assert!(EpisodeSampler::new(snap.episodes(), 0, 10, 0).is_err());
    assert!(EpisodeSampler::new(snap.episodes(), 4, 0, 0).is_err());
}

// ---------------------------------------------------------------------------------------------
// Misc: options validation
// ---------------------------------------------------------------------------------------------

#[test]
fn sampler_options_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let (_ds, snap) = build(dir.path(), "d", &[4, 9], 2, 60, WriterOptions::default());
    let eps = snap.episodes();
    let idx = snap.slice_index(5, BoundaryPolicy::Strict).unwrap();
    let new = |o: SliceOptions| SliceSampler::new(idx.clone(), eps, &o);
    assert!(new(SliceOptions::new(5, 0)).is_err(), "no slices");
    assert!(
        new(SliceOptions::new(6, 4)).is_err(),
        "index of another length"
    );
    assert!(new(SliceOptions::new(5, 4).with_policy(BoundaryPolicy::Pad)).is_err());
    assert!(new(SliceOptions::new(5, 4).with_episode_weights(vec![1.0])).is_err());
    assert!(new(SliceOptions::new(5, 4).with_episode_weights(vec![1.0, -1.0])).is_err());
    assert!(new(SliceOptions::new(5, 4).with_episode_weights(vec![1.0, f64::NAN])).is_err());
    assert!(new(SliceOptions::new(5, 4).with_episode_weights(vec![1.0, 0.0])).is_err());
    assert!(new(SliceOptions::new(5, 4).with_episode_weights(vec![0.0, 2.0])).is_ok());
    assert!(snap.slice_index(0, BoundaryPolicy::Pad).is_err());
    let none = snap.slice_index(10, BoundaryPolicy::Strict).unwrap();
    assert_eq!(none.num_windows(), 0);
    assert!(SliceSampler::new(none, eps, &SliceOptions::new(10, 1)).is_err());
    assert!(SliceOptions::from_batch_size(100, 7).is_err());
    assert_eq!(SliceOptions::from_batch_size(96, 8).unwrap().num_slices, 12);
    // The cached index is shared.
    assert!(Arc::ptr_eq(
        &idx,
        &snap.slice_index(5, BoundaryPolicy::Strict).unwrap()
    ));
}

/// `gather_into` (what the torch loader's pinned staging uses) writes exactly what `gather` does,
/// pads short plans and rejects destinations or slices that do not fit, without writing.
#[test]
fn gather_into_caller_memory_equals_gather_and_checks_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let lens: Vec<u64> = (0..30).map(|i| 3 + (i * 29 % 60)).collect();
    let (_ds, snap) = build(dir.path(), "d", &lens, 6, 3, WriterOptions::default());
    let policy = BoundaryPolicy::Pad;
    let index = snap.slice_index(10, policy).unwrap();
    let opts = SliceOptions::new(10, 16).with_policy(policy).with_seed(2);
    let sampler = SliceSampler::new(index, snap.episodes(), &opts).unwrap();
    let names = [
        col::OBSERVATION,
        col::STEP,
        col::IS_LAST,
        "next_observation",
    ];
    let g = Gatherer::new(&snap, &names).unwrap();
    let steps = g.step_bytes();
    assert_eq!(steps, vec![24, 4, 1, 24]);
    let mut plan = vec![];
    sampler.plan(4, &mut plan);
    let mut want = Batch::default();
    g.gather(&plan, &mut want);
    let (b, l) = (16, 10);
    // Caller memory, dirty on purpose: everything must be overwritten.
    let mut cols: Vec<Vec<u8>> = steps.iter().map(|s| vec![0xAB; b * l * s]).collect();
    let mut flags = vec![vec![7u8; b * l]; 6];
    let (mut ids, mut starts) = (vec![9u64; b], vec![9i64; b]);
    fn dest<'a>(
        cols: &'a mut [Vec<u8>],
        flags: &'a mut [Vec<u8>],
        ids: &'a mut [u64],
        starts: &'a mut [i64],
    ) -> trajstore::GatherInto<'a> {
        let mut f = flags.iter_mut();
        trajstore::GatherInto {
            columns: cols.iter_mut().map(|c| c.as_mut_slice()).collect(),
            flags: std::array::from_fn(|_| f.next().unwrap().as_mut_slice()),
            episode_id: ids,
            start_step: starts,
        }
    }
    g.gather_into(&plan, l, dest(&mut cols, &mut flags, &mut ids, &mut starts))
        .unwrap();
    for (c, got) in want.columns.iter().zip(&cols) {
        assert_eq!(c.data.as_slice(), got.as_slice(), "{}", c.name);
    }
    let want_flags = [
        &want.mask,
        &want.is_first,
        &want.is_last,
        &want.terminated,
        &want.truncated,
        &want.slice_end,
    ];
    for (w, got) in want_flags.iter().zip(&flags) {
        assert_eq!(*w, got);
    }
    assert_eq!(
        (ids.clone(), starts.clone()),
        (want.episode_id.clone(), want.start_step.clone())
    );
    // Slices longer than the destination's slice length, and short destinations, are errors.
    let e = g
        .gather_into(
            &plan,
            l - 1,
            dest(&mut cols, &mut flags, &mut ids, &mut starts),
        )
        .unwrap_err();
    assert!(e.to_string().contains("does not fit"), "{e}");
    cols[0].truncate(b * l * steps[0] - 1);
    let e = g
        .gather_into(&plan, l, dest(&mut cols, &mut flags, &mut ids, &mut starts))
        .unwrap_err();
    assert!(
        e.to_string().contains("destination of `observation`"),
        "{e}"
    );
}
