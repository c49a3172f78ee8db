//! Mixing samplers: every batch takes a fixed number of slices from each of several parts (for
//! instance RLPD's symmetric sampling, half offline data and half online data). Each part is a
//! sampler of its own dataset; the mix's plan of batch `k` is part 0's plan of batch `k`, then
//! part 1's, ..., so part `i` always fills slices `[offset_i, offset_i + count_i)` of the batch.
//! [`crate::Gatherer::mixed`] gathers such plans, each range from its part's snapshot.

use std::cell::Cell;
use std::sync::Arc;

use super::*;
use crate::error::{Error, Result};
use crate::index::SliceRef;

/// The most parts a mix may have (a batch says which part each slice came from in a `u16`).
pub const MAX_PARTS: usize = u16::MAX as usize;

/// The number of slices each part gets in every batch of `num_slices` slices when the parts are
/// mixed in proportion to `weights`: the largest-remainder apportionment (each part gets the
/// integer part of its quota `num_slices * w_i / sum(w)`, and the slices left go to the largest
/// remainders, ties to the earlier part). The counts sum to `num_slices`; the result depends on
/// the arguments only. `[0.5, 0.5]` of 256 is `[128, 128]`; `[1, 1, 1]` of 256 is
/// `[86, 85, 85]`.
///
/// Errors with [`Error::InvalidArgument`] about `weights` when there are none or more than
/// [`MAX_PARTS`], when one is negative, NaN or infinite, when all are 0, or when a part of
/// positive weight would get no slice (the error says which, and a batch size that would give it
/// one); about `num_slices` when it is 0. A part of weight 0 gets 0 slices.
pub fn mix_counts(weights: &[f64], num_slices: usize) -> Result<Vec<usize>> {
    let n = weights.len();
    if n == 0 {
        return Err(Error::argument(
            "weights",
            "no weights: give one weight per part of the mix",
        ));
    }
    if n > MAX_PARTS {
        return Err(Error::argument(
            "weights",
            format!("{n} weights: a mix has at most {MAX_PARTS} parts"),
        ));
    }
    if let Some((i, w)) = weights
        .iter()
        .enumerate()
        .find(|(_, w)| !(w.is_finite() && **w >= 0.0))
    {
        return Err(Error::argument(
            "weights",
            format!(
                "weight {w} of part {i} (weights {}): every weight must be a finite number >= 0",
                show(weights)
            ),
        ));
    }
    let max = weights.iter().copied().fold(0.0f64, f64::max);
    if max == 0.0 {
        return Err(Error::argument(
            "weights",
            format!(
                "all weights are 0 ({}): at least one part must have a positive weight",
                show(weights)
            ),
        ));
    }
    if num_slices == 0 {
        return Err(Error::argument("num_slices", "must be at least 1"));
    }
    // Scaled to at most 1 each where the sum overflows.
    let sum: f64 = weights.iter().sum();
    let (scaled, total) = if sum.is_finite() {
        (weights.to_vec(), sum)
    } else {
        let scaled: Vec<f64> = weights.iter().map(|w| w / max).collect();
        let total = scaled.iter().sum();
        (scaled, total)
    };
    let counts = largest_remainder(&scaled, total, num_slices);
    if let Some(i) = (0..n).find(|&i| scaled[i] > 0.0 && counts[i] == 0) {
        let more = match smallest_batch_for(&scaled, total, i, num_slices) {
            (m, true) => {
                format!("a batch of {m} slices is the smallest larger one that gives it one")
            }
            (m, false) => format!("a batch of {m} slices gives it one"),
        };
        return Err(Error::argument(
            "weights",
            format!(
                "part {i} (weight {:?} of {}) would get 0 of the {num_slices} slices of a batch \
                 (counts {}); {more}, or give it a larger weight",
                weights[i],
                show(weights),
                show(&counts)
            ),
        ));
    }
    Ok(counts)
}

/// Up to 8 values, then how many more.
fn show<T: std::fmt::Debug>(values: &[T]) -> String {
    if values.len() <= 8 {
        return format!("{values:?}");
    }
    format!("{:?} and {} more", &values[..8], values.len() - 8)
}

/// Largest-remainder counts of `n` slices for weights `w` (finite, >= 0, summing to `total` >
/// 0); parts of weight 0 get none.
fn largest_remainder(w: &[f64], total: f64, n: usize) -> Vec<usize> {
    let quotas: Vec<f64> = w.iter().map(|&w| w * n as f64 / total).collect();
    let mut counts: Vec<usize> = quotas.iter().map(|q| q.floor() as usize).collect();
    let rem = |i: usize| quotas[i] - quotas[i].floor();
    // Parts of positive weight, largest remainder first, ties to the earlier part.
    let mut order: Vec<usize> = (0..w.len()).filter(|&i| w[i] > 0.0).collect();
    order.sort_by(|&a, &b| rem(b).total_cmp(&rem(a)).then(a.cmp(&b)));
    let mut given: usize = counts.iter().sum();
    // Rounding could in principle push the floors past `n`: take back from the smallest
    // remainders.
    for &i in order.iter().rev().cycle() {
        if given <= n {
            break;
        }
        if counts[i] > 0 {
            counts[i] -= 1;
            given -= 1;
        }
    }
    for &i in order.iter().cycle().take(n - given) {
        counts[i] += 1;
    }
    counts
}

/// The smallest batch larger than `n` slices in which part `i` gets a slice, and `true`; or,
/// when that search would take too long (a tiny weight), a batch size that gives it one for
/// certain (its quota reaches 1) and `false`.
fn smallest_batch_for(w: &[f64], total: f64, i: usize, n: usize) -> (usize, bool) {
    let sure = (total / w[i]).ceil();
    let sure = if sure >= usize::MAX as f64 {
        usize::MAX
    } else {
        sure as usize
    };
    let budget = ((1usize << 20) / w.len()).max(64);
    for m in (n + 1..=sure.saturating_add(1)).take(budget) {
        if largest_remainder(w, total, m)[i] > 0 {
            return (m, true);
        }
    }
    // The quota reaches 1 at `sure` slices (a step further if the division rounded down).
    match largest_remainder(w, total, sure)[i] {
        0 => (sure.saturating_add(1), false),
        _ => (sure, false),
    }
}

thread_local! {
    /// One part's plan, reused across batches planned on this thread.
    static PART_PLAN: Cell<Vec<SliceRef>> = const { Cell::new(Vec::new()) };
}

/// A sampler whose every batch takes `num_slices()` slices from each of its parts, in part
/// order: a pure function of the batch number, as its parts are. Endless (parts without
/// replacement are refused: their epochs would end at different batches).
///
/// Plans hold part-local slices: the episode positions of slices `[offset_i, offset_i +
/// count_i)` are positions in part `i`'s snapshot. Gather them with a
/// [`crate::Gatherer::mixed`] of the parts' gatherers and [`MixSampler::counts`].
pub struct MixSampler {
    parts: Vec<Arc<dyn Sampler>>,
    counts: Vec<usize>,
    num_slices: usize,
    slice_len: u32,
}

impl std::fmt::Debug for MixSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MixSampler")
            .field("counts", &self.counts)
            .field("slice_len", &self.slice_len)
            .finish_non_exhaustive()
    }
}

impl MixSampler {
    /// A mix of `parts`, each built with the number of slices it contributes per batch (see
    /// [`mix_counts`] to split a batch by weights). Cost O(parts).
    ///
    /// Errors with [`Error::InvalidArgument`] about `parts` when there are none or more than
    /// [`MAX_PARTS`], or when a part is without replacement
    /// ([`Sampler::batches_per_epoch`] is `Some`); about `slice_len` when the parts' slice
    /// lengths differ; about `num_slices` when the mixed batch is too large (see
    /// [`max_batch_bytes`]).
    pub fn try_new(parts: Vec<Arc<dyn Sampler>>) -> Result<Self> {
        let Some(first) = parts.first() else {
            return Err(Error::argument("parts", "a mix needs at least one part"));
        };
        if parts.len() > MAX_PARTS {
            return Err(Error::argument(
                "parts",
                format!("{} parts: a mix has at most {MAX_PARTS}", parts.len()),
            ));
        }
        let slice_len = first.slice_len();
        for (i, p) in parts.iter().enumerate() {
            if let Some(epoch) = p.batches_per_epoch() {
                return Err(Error::argument(
                    "parts",
                    format!(
                        "part {i} samples without replacement ({epoch} batches per epoch), but a \
                         mix is endless: use an endless sampler (with replacement, such as \
                         SliceSampler) for each part"
                    ),
                ));
            }
            if p.slice_len() != slice_len {
                return Err(Error::argument(
                    "slice_len",
                    format!(
                        "part 0 plans slices of {slice_len} steps and part {i} slices of {} \
                         steps: the parts of a mix must have the same slice length",
                        p.slice_len()
                    ),
                ));
            }
        }
        let counts: Vec<usize> = parts.iter().map(|p| p.num_slices()).collect();
        let num_slices = counts
            .iter()
            .try_fold(0usize, |a, &c| a.checked_add(c))
            .ok_or_else(|| {
                Error::argument(
                    "num_slices",
                    format!("the parts' slices per batch {} overflow", show(&counts)),
                )
            })?;
        check_sizes(num_slices, slice_len, "num_slices", "slice_len")?;
        Ok(Self {
            parts,
            counts,
            num_slices,
            slice_len,
        })
    }

    /// Slices per batch of each part, in part order (the parts' [`Sampler::num_slices`]).
    pub fn counts(&self) -> &[usize] {
        &self.counts
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[Arc<dyn Sampler>] {
        &self.parts
    }
}

impl Sampler for MixSampler {
    fn plan(&self, batch: u64, out: &mut Vec<SliceRef>) {
        out.clear();
        out.reserve(self.num_slices);
        // A nested mix planning on this thread finds the cell empty and uses a vector of its own.
        let mut part = PART_PLAN.take();
        for (p, &count) in self.parts.iter().zip(&self.counts) {
            p.plan(batch, &mut part);
            debug_assert_eq!(
                part.len(),
                count,
                "a part of a mix planned {} slices, not its num_slices() {count}",
                part.len()
            );
            out.extend_from_slice(&part);
        }
        PART_PLAN.set(part);
    }
    fn slice_len(&self) -> u32 {
        self.slice_len
    }
    fn num_slices(&self) -> usize {
        self.num_slices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg_error(e: Error, argument: &str) -> String {
        match e {
            Error::InvalidArgument {
                argument: Some(a),
                reason,
            } if a == argument => reason,
            e => panic!("not an invalid argument `{argument}`: {e}"),
        }
    }

    #[test]
    fn counts_split_batches_by_largest_remainder() {
        assert_eq!(mix_counts(&[0.5, 0.5], 256).unwrap(), [128, 128]);
        assert_eq!(mix_counts(&[1.0, 1.0], 255).unwrap(), [128, 127]);
        assert_eq!(mix_counts(&[1.0, 1.0, 1.0], 256).unwrap(), [86, 85, 85]);
        assert_eq!(mix_counts(&[1.0, 1.0, 1.0], 3).unwrap(), [1, 1, 1]);
        assert_eq!(mix_counts(&[1.0, 2.0], 3).unwrap(), [1, 2]);
        assert_eq!(mix_counts(&[1.0, 2.0], 256).unwrap(), [85, 171]);
        assert_eq!(mix_counts(&[2.0, 1.0], 256).unwrap(), [171, 85]);
        assert_eq!(mix_counts(&[0.25, 0.75], 10).unwrap(), [3, 7]); // 2.5 / 7.5: tie → earlier
        assert_eq!(mix_counts(&[3.0], 7).unwrap(), [7]);
        assert_eq!(mix_counts(&[0.0, 1.0], 5).unwrap(), [0, 5]);
        assert_eq!(mix_counts(&[1e308, 1e308], 4).unwrap(), [2, 2]);
        assert_eq!(mix_counts(&[0.1, 0.2, 0.7], 10).unwrap(), [1, 2, 7]);
        for n in 20..300 {
            for w in [[0.3, 0.3, 0.4], [0.9, 0.05, 0.05], [1.0, 1.0, 1.0]] {
                let c = mix_counts(&w, n).unwrap();
                assert_eq!(c.iter().sum::<usize>(), n, "{w:?} of {n}");
                let total: f64 = w.iter().sum();
                for (c, w) in c.iter().zip(w) {
                    let q = w * n as f64 / total;
                    assert!((*c as f64 - q).abs() < 1.0, "{c} for quota {q}");
                }
            }
        }
        assert_eq!(
            mix_counts(&[0.5, 0.5], 256).unwrap(),
            mix_counts(&[0.5, 0.5], 256).unwrap()
        );
    }

    #[test]
    fn counts_refuse_bad_weights() {
        let e = arg_error(mix_counts(&[], 8).unwrap_err(), "weights");
        assert!(e.contains("no weights"), "{e}");
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let e = arg_error(mix_counts(&[1.0, bad], 8).unwrap_err(), "weights");
            assert!(e.contains(&format!("weight {bad} of part 1")), "{e}");
        }
        let e = arg_error(mix_counts(&[0.0, 0.0], 8).unwrap_err(), "weights");
        assert!(e.contains("all weights are 0 ([0.0, 0.0])"), "{e}");
        let e = arg_error(
            mix_counts(&vec![1.0; 65536], 1 << 20).unwrap_err(),
            "weights",
        );
        assert!(e.contains("at most 65535"), "{e}");
        assert!(mix_counts(&vec![1.0; 65535], 65535).is_ok());
        arg_error(mix_counts(&[1.0], 0).unwrap_err(), "num_slices");
        // 0.15 of 2 slices: quota 0.3; 3 slices give 0.45 (against 0.55), 4 give 0.6.
        let e = arg_error(mix_counts(&[0.85, 0.15], 2).unwrap_err(), "weights");
        assert!(e.contains("part 1 (weight 0.15 of [0.85, 0.15])"), "{e}");
        assert!(e.contains("0 of the 2 slices"), "{e}");
        assert!(e.contains("(counts [2, 0])"), "{e}");
        assert!(e.contains("a batch of 4 slices is the smallest"), "{e}");
        assert!(mix_counts(&[0.85, 0.15], 3).is_err());
        assert_eq!(mix_counts(&[0.85, 0.15], 4).unwrap(), [3, 1]);
        // A tiny weight: no exhaustive search, but a batch size that surely gives it one.
        let e = arg_error(mix_counts(&[1.0, 1e-9], 8).unwrap_err(), "weights");
        assert!(e.contains("slices gives it one"), "{e}");
        let m: usize = e
            .split("a batch of ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(mix_counts(&[1.0, 1e-9], m).unwrap()[1] >= 1, "{e}");
    }

    /// Plans `n` slices of `len` steps whose episode is `tag` and whose start is the batch
    /// number and the slice's position.
    struct Stub {
        tag: u32,
        n: usize,
        len: u32,
        epoch: Option<u64>,
    }

    impl Sampler for Stub {
        fn plan(&self, batch: u64, out: &mut Vec<SliceRef>) {
            out.clear();
            out.extend((0..self.n).map(|i| SliceRef {
                episode: self.tag,
                start: (batch * 1000 + i as u64) as i64,
                len: self.len,
            }));
        }
        fn slice_len(&self) -> u32 {
            self.len
        }
        fn num_slices(&self) -> usize {
            self.n
        }
        fn batches_per_epoch(&self) -> Option<u64> {
            self.epoch
        }
    }

    fn stub(tag: u32, n: usize, len: u32) -> Arc<dyn Sampler> {
        Arc::new(Stub {
            tag,
            n,
            len,
            epoch: None,
        })
    }

    #[test]
    fn mixes_concatenate_their_parts_plans() {
        let m = MixSampler::try_new(vec![stub(7, 3, 4), stub(9, 2, 4)]).unwrap();
        assert_eq!(
            (m.num_slices(), m.slice_len(), m.counts()),
            (5, 4, &[3, 2][..])
        );
        assert_eq!(m.parts().len(), 2);
        assert_eq!(m.batches_per_epoch(), None);
        let mut p = vec![SliceRef {
            episode: 1,
            start: 1,
            len: 1,
        }];
        m.plan(5, &mut p);
        let got: Vec<(u32, i64)> = p.iter().map(|s| (s.episode, s.start)).collect();
        assert_eq!(got, [(7, 5000), (7, 5001), (7, 5002), (9, 5000), (9, 5001)]);
        // A mix of mixes plans the same on one thread.
        let outer = MixSampler::try_new(vec![Arc::new(m), stub(3, 1, 4)]).unwrap();
        outer.plan(2, &mut p);
        let got: Vec<u32> = p.iter().map(|s| s.episode).collect();
        assert_eq!(got, [7, 7, 7, 9, 9, 3]);
        assert_eq!(outer.counts(), [5, 1]);
    }

    #[test]
    fn mixes_refuse_what_cannot_be_mixed() {
        let e = arg_error(MixSampler::try_new(vec![]).unwrap_err(), "parts");
        assert!(e.contains("at least one part"), "{e}");
        let e = MixSampler::try_new(vec![stub(0, 2, 4), stub(1, 2, 8)]).unwrap_err();
        let e = arg_error(e, "slice_len");
        assert!(
            e.contains("part 0 plans slices of 4 steps and part 1 slices of 8"),
            "{e}"
        );
        let epoch = Arc::new(Stub {
            tag: 0,
            n: 2,
            len: 4,
            epoch: Some(10),
        });
        let e = arg_error(
            MixSampler::try_new(vec![stub(0, 2, 4), epoch]).unwrap_err(),
            "parts",
        );
        assert!(e.contains("part 1 samples without replacement"), "{e}");
        assert!(e.contains("use an endless sampler"), "{e}");
        let e = MixSampler::try_new(vec![stub(0, usize::MAX, 4), stub(1, 2, 4)]).unwrap_err();
        arg_error(e, "num_slices");
    }
}
