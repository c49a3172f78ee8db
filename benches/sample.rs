//! Sampling benchmarks: index-only planning and plan + gather of 256 slices x 64 steps, against a
//! memcpy of the same bytes from the mapped data, on seeded synthetic datasets.
//!
//! `cargo bench --bench sample`. Ids spell their axes: `sample/gather/len=64/slices=256/transitions=1e7`.
// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use trajstore::synth::SynthSpec;
use trajstore::{Dataset, Gatherer, SamplerSpec, WriterOptions};

fn bench(c: &mut Criterion) {
    let (len, slices) = (64u32, 256usize);
    let mut g = c.benchmark_group("sample");
    g.throughput(Throughput::Elements(len as u64 * slices as u64));
    for (n, label) in [(1_000_000u64, "1e6"), (10_000_000, "1e7")] {
        let dir = tempfile::tempdir().unwrap();
        let spec = SynthSpec {
            transitions: n,
            ..SynthSpec::default()
        };
        let ds = Dataset::create(dir.path().join("d"), &spec.schema().unwrap()).unwrap();
        let mut w = ds.writer(WriterOptions::default()).unwrap();
        spec.write(&mut w, None, |_| {}).unwrap();
        drop(w);
        let snap = ds.snapshot().unwrap();
        let sampler = SamplerSpec::uniform(len, slices)
            .build(&snap)
            .unwrap()
            .sampler;
        let gatherer =
            Arc::new(Gatherer::try_new(&snap, &["observation", "action", "reward"]).unwrap());
        let id = |what: &str| {
            BenchmarkId::new(
                what,
                format!("len={len}/slices={slices}/transitions={label}"),
            )
        };
        let mut plan = vec![];
        let mut k = 0u64;
        g.bench_function(id("index"), |b| {
            b.iter(|| {
                k += 1;
                sampler.plan(k, &mut plan);
                black_box(&plan);
            })
        });
        let mut batch = trajstore::Batch::default();
        g.bench_function(id("gather"), |b| {
            b.iter(|| {
                k += 1;
                sampler.plan(k, &mut plan);
                gatherer.gather(&plan, &mut batch).unwrap();
                black_box(&batch);
            })
        });
        // Baseline: one memcpy of the batch's bytes from a moving place in the mapped data.
        let bytes = batch.data_bytes();
        let seg = &snap.segments()[0];
        let src = seg.mapped_bytes();
        let spots = (src.len() / bytes).max(1);
        let mut dst = vec![0u8; bytes];
        g.bench_function(id("memcpy"), |b| {
            b.iter(|| {
                k += 1;
                let from = (k as usize * 7919 % spots) * bytes;
                dst.copy_from_slice(&src[from..from + bytes]);
                black_box(&dst);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
