//! Helpers of the sampler and gather tests (`sample_*.rs`, `gather.rs`): plans, chi-square fits,
//! window numbers and a full check of a gathered batch against the stored rows.

use arrow::array::AsArray;
use arrow::datatypes::{DataType, Float32Type};
use trajstore::format::{col, ep};
use trajstore::{Batch, Sampler, SliceIndex, SliceRef, SliceSampler, Snapshot};

/// `(terminated, truncated)` of every episode position, from the episode tables.
pub fn episode_ends(snap: &Snapshot) -> Vec<(bool, bool)> {
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

/// The plans of batches `batches` of `s`.
pub fn plans(s: &dyn Sampler, batches: std::ops::Range<u64>) -> Vec<Vec<SliceRef>> {
    batches
        .map(|k| {
            let mut p = vec![];
            s.plan(k, &mut p);
            p
        })
        .collect()
}

/// Upper 0.001 critical value of chi-square with `df` degrees of freedom (Wilson–Hilferty).
pub fn chi2_critical_001(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.090_232_306; // standard normal upper 0.001 quantile
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Asserts that `observed` counts fit the probabilities `p` (proportional weights; cells with
/// weight 0 must never be observed).
pub fn assert_fits(what: &str, observed: &[u64], weights: &[f64]) {
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
pub fn episode_counts(sampler: &SliceSampler, episodes: usize, batches: u64) -> Vec<u64> {
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
pub fn window_number(index: &SliceIndex, s: &SliceRef) -> u64 {
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
pub fn check_gathered(snap: &Snapshot, plan: &[SliceRef], batch: &Batch) {
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
        let source = snap.episode(id).unwrap().unwrap();
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
