//! Store benchmarks: writing (append + commit) and opening a snapshot, on seeded synthetic data.
//!
//! `cargo bench --bench store`. Ids spell their axes: `write/obs=17/transitions=1e5`.
// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use trajstore::synth::SynthSpec;
use trajstore::{Dataset, WriterOptions};

fn spec(transitions: u64) -> SynthSpec {
    SynthSpec {
        transitions,
        obs_shape: vec![17],
        obs_dtype: trajstore::synth::ObsDtype::Float32,
        act_dim: 6,
        discrete_actions: false,
        mean_episode_len: 1000.0,
        seed: 0,
    }
}

fn write(c: &mut Criterion) {
    let mut g = c.benchmark_group("write");
    g.sample_size(10);
    let n = 100_000;
    let s = spec(n);
    let lens = s.episode_lengths().unwrap();
    let episodes: Vec<_> = lens
        .iter()
        .enumerate()
        .map(|(i, &l)| s.episode(i as u64, l))
        .collect();
    g.throughput(Throughput::Elements(n));
    g.bench_function(BenchmarkId::new("obs=17", "transitions=1e5"), |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().unwrap();
                let ds = Dataset::create(dir.path().join("d"), &s.schema().unwrap()).unwrap();
                (dir, ds)
            },
            |(dir, ds)| {
                let mut w = ds.writer(WriterOptions::default()).unwrap();
                for (batch, end) in &episodes {
                    w.append_episode(batch, end.clone()).unwrap();
                }
                w.commit().unwrap();
                dir
            },
            criterion::BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn open(c: &mut Criterion) {
    let mut g = c.benchmark_group("open");
    for (n, label) in [(100_000u64, "1e5"), (1_000_000, "1e6")] {
        let dir = tempfile::tempdir().unwrap();
        let s = SynthSpec {
            mean_episode_len: 100.0,
            ..spec(n)
        };
        let ds = Dataset::create(dir.path().join("d"), &s.schema().unwrap()).unwrap();
        let mut w = ds
            .writer(WriterOptions::default().with_segment_bytes(8 << 20))
            .unwrap();
        s.write(&mut w, None, |_| {}).unwrap();
        drop(w);
        g.bench_function(
            BenchmarkId::new("snapshot", format!("transitions={label}")),
            |b| b.iter(|| ds.snapshot().unwrap()),
        );
    }
    g.finish();
}

criterion_group!(benches, write, open);
criterion_main!(benches);
