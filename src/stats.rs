//! Summaries and text histograms of per-episode quantities (for `trajstore info`).

use serde::Serialize;

/// Order statistics of a sample.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Summary {
    /// Number of values.
    pub count: usize,
    /// Smallest value.
    pub min: f64,
    /// 25th percentile.
    pub p25: f64,
    /// Median.
    pub median: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// 75th percentile.
    pub p75: f64,
    /// Largest value.
    pub max: f64,
}

impl Summary {
    /// Summarises `values` (NaNs are ignored). O(n log n).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return Summary::default();
        }
        v.sort_by(f64::total_cmp);
        let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        Summary {
            count: v.len(),
            min: v[0],
            p25: q(0.25),
            median: q(0.5),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p75: q(0.75),
            max: v[v.len() - 1],
        }
    }
}

/// The most bins [`histogram`] makes (more are capped: a histogram is for reading).
pub const MAX_BINS: usize = 1 << 16;

/// Counts of `values` in `bins` equal-width bins over `[min, max]` (at most [`MAX_BINS`]).
pub fn histogram(values: &[f64], bins: usize) -> (f64, f64, Vec<u64>) {
    let bins = bins.min(MAX_BINS);
    let finite = values.iter().copied().filter(|x| x.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let mut counts = vec![0u64; bins.max(1)];
    if lo > hi {
        return (0.0, 0.0, counts);
    }
    let last = counts.len() - 1;
    let width = (hi - lo) / counts.len() as f64;
    for &x in values.iter().filter(|x| x.is_finite()) {
        let b = if width > 0.0 {
            ((x - lo) / width) as usize
        } else {
            0
        };
        counts[b.min(last)] += 1;
    }
    (lo, hi, counts)
}

/// Renders a histogram as text rows `[lo, hi)  count  ████`.
pub fn render_histogram(values: &[f64], bins: usize, width: usize) -> String {
    let (lo, hi, counts) = histogram(values, bins);
    let peak = counts.iter().copied().max().unwrap_or(0).max(1);
    let step = (hi - lo) / counts.len() as f64;
    let mut out = String::new();
    for (i, c) in counts.iter().enumerate() {
        let bar = (*c as f64 / peak as f64 * width as f64).round() as usize;
        let from = lo + step * i as f64;
        out.push_str(&format!(
            "  {:>11} .. {:<11} {:>9}  {}\n",
            fmt_num(from),
            fmt_num(from + step),
            c,
            "█".repeat(bar)
        ));
    }
    out
}

fn fmt_num(x: f64) -> String {
    if x.abs() >= 1e6 || (x != 0.0 && x.abs() < 1e-2) {
        format!("{x:.3e}")
    } else {
        format!("{x:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_histogram() {
        let s = Summary::of((1..=101).map(|x| x as f64));
        assert_eq!(
            (s.count, s.min, s.median, s.max, s.mean),
            (101, 1.0, 51.0, 101.0, 51.0)
        );
        assert_eq!((s.p25, s.p75), (26.0, 76.0));
        let (lo, hi, c) = histogram(&[0.0, 1.0, 2.0, 3.0, 4.0, f64::NAN], 2);
        assert_eq!((lo, hi, c), (0.0, 4.0, vec![2, 3]));
        assert_eq!(histogram(&[5.0, 5.0], 3).2, vec![2, 0, 0]);
        assert_eq!(Summary::of([]), Summary::default());
        assert_eq!(render_histogram(&[1.0, 2.0], 2, 10).lines().count(), 2);
        // A bin count from a command line cannot allocate without bound.
        assert_eq!(histogram(&[1.0, 2.0], usize::MAX).2.len(), MAX_BINS);
    }
}
