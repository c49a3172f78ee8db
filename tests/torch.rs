//! The torch loader (feature `torch`) through the public API: tensors equal the gathered Arrow
//! data exactly with dtypes preserved, flags and metadata agree, the stream does not depend on
//! workers, transforms and casts apply, resident sampling equals streaming, workers stop on
//! drop, a CPU run never loads the CUDA driver, bad devices and budgets are clear errors. Tests
//! that need CUDA report themselves skipped on machines without it.
#![cfg(feature = "torch")]

mod common;

use std::sync::Arc;

use common::TestData;
use tch::{Device, Kind, Tensor};
use trajstore::torch::{
    FloatCast, TensorBatch, TorchLoader, TorchLoaderOptions, parse_device, resident_bytes,
};
use trajstore::{
    Batch, BatchSource, BoundaryPolicy, Error, Gatherer, LoaderOptions, LoaderSpec, Sampler,
    SamplerKind, SamplerSpec, SliceSampler, Snapshot,
};

fn dataset(dir: &std::path::Path, discrete: bool) -> Snapshot {
    let snap = TestData::new()
        .obs_dim(5)
        .act_dim(3)
        .discrete_actions(discrete)
        .seed(11)
        .episodes((0..60u64).map(|i| 1 + i * 29 % 70))
        .segment_bytes(20_000)
        .batch_bytes(8_000)
        .snapshot(&dir.join("d"));
    assert!(snap.segments().len() > 2, "several segments");
    snap
}

const COLUMNS: [&str; 5] = [
    "observation",
    "action",
    "reward",
    "next_observation",
    "step",
];

/// The loaders' sampler: 24 slices of 16 steps.
fn uniform(policy: BoundaryPolicy, seed: u64) -> SamplerSpec {
    SamplerSpec::uniform(16, 24)
        .with_policy(policy)
        .with_seed(seed)
}

/// [`uniform`] built by hand over the slice index: the plans the loaders' batches must equal.
fn sampler(snap: &Snapshot, policy: BoundaryPolicy, seed: u64) -> Arc<SliceSampler> {
    let index = snap.slice_index(16, policy).unwrap();
    let opts = uniform(policy, seed);
    Arc::new(SliceSampler::try_new(index, snap.episodes(), &opts).unwrap())
}

fn bytes(t: &Tensor) -> Vec<u8> {
    let t = t.to_device(Device::Cpu).contiguous();
    let n = t.numel() * t.kind().elt_size_in_bytes();
    let mut v = vec![0u8; n];
    t.copy_data_u8(&mut v, t.numel());
    v
}

/// Asserts that `t` holds exactly what the gather made of the same plan.
fn assert_equals_gather(t: &TensorBatch, b: &Batch, what: &str) {
    let (bs, l) = (b.num_slices as i64, b.slice_len as i64);
    assert_eq!(t.shape(), (bs, l), "{what}: shape");
    for c in &b.columns {
        let x = t
            .get(&c.name)
            .unwrap_or_else(|| panic!("{what}: no {}", c.name));
        let mut shape = vec![bs, l];
        shape.extend(c.shape.iter().map(|&d| d as i64));
        assert_eq!(x.size(), shape, "{what}: shape of {}", c.name);
        assert_eq!(
            x.kind(),
            trajstore::torch::kind_of(&c.data_type).unwrap(),
            "{what}: dtype of {}",
            c.name
        );
        match c.data_type {
            // Widened exactly (tch has no unsigned 32-bit kind).
            arrow::datatypes::DataType::UInt32 => {
                let got: Vec<i64> = Vec::try_from(&x.to_device(Device::Cpu).view([-1])).unwrap();
                let want: Vec<i64> = c.values::<u32>().iter().map(|&v| v as i64).collect();
                assert_eq!(got, want, "{what}: values of {}", c.name);
            }
            _ => assert_eq!(bytes(x), c.data.as_slice(), "{what}: values of {}", c.name),
        }
    }
    for (name, v) in [
        ("mask", &b.mask),
        ("is_first", &b.is_first),
        ("is_last", &b.is_last),
        ("terminated", &b.terminated),
        ("truncated", &b.truncated),
        ("slice_end", &b.slice_end),
    ] {
        let x = t.get(name).unwrap();
        assert_eq!(x.kind(), Kind::Bool, "{what}: {name} dtype");
        assert_eq!(&bytes(x), v, "{what}: {name}");
    }
    let ids: Vec<i64> = Vec::try_from(&t.episode_id.to_device(Device::Cpu)).unwrap();
    assert_eq!(
        ids,
        b.episode_id.iter().map(|&i| i as i64).collect::<Vec<_>>(),
        "{what}: episode ids"
    );
    let starts: Vec<i64> = Vec::try_from(&t.start_step.to_device(Device::Cpu)).unwrap();
    assert_eq!(starts, b.start_step, "{what}: start steps");
}

fn gathered(snap: &Snapshot, s: &dyn Sampler, cols: &[&str], k: u64) -> Batch {
    let g = Gatherer::try_new(snap, cols).unwrap();
    let mut plan = vec![];
    s.plan(k, &mut plan);
    let mut b = Batch::default();
    g.gather(&plan, &mut b).unwrap();
    b
}

/// The source of `cols` of `snap` sampled by `s`.
fn source(snap: &Snapshot, s: SamplerSpec, cols: &[&str]) -> BatchSource {
    BatchSource::open(LoaderSpec::single(snap.clone(), s, cols)).unwrap()
}

fn loader(snap: &Snapshot, s: SamplerSpec, cols: &[&str], opts: TorchLoaderOptions) -> TorchLoader {
    TorchLoader::new(&source(snap, s, cols), opts).unwrap()
}

fn cpu(workers: usize, batches: u64) -> TorchLoaderOptions {
    TorchLoaderOptions::new(Device::Cpu).with_loader(
        LoaderOptions::default()
            .with_workers(workers)
            .with_max_batches(batches),
    )
}

#[test]
fn cpu_tensors_equal_the_arrow_data_with_dtypes_preserved() {
    for discrete in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let snap = dataset(dir.path(), discrete);
        for policy in [BoundaryPolicy::Strict, BoundaryPolicy::Pad] {
            let s = sampler(&snap, policy, 3);
            let mut l = loader(&snap, uniform(policy, 3), &COLUMNS, cpu(2, 6));
            let mut k = 0;
            while let Some(t) = l.next_batch() {
                let t = t.unwrap();
                assert_eq!(t.device(), Device::Cpu);
                let b = gathered(&snap, s.as_ref(), &COLUMNS, k);
                assert_equals_gather(&t, &b, &format!("discrete={discrete} {policy:?} #{k}"));
                k += 1;
            }
            assert_eq!(k, 6, "max_batches");
        }
        // Integer actions stay integer (never one-hot, never float).
        let mut l = loader(
            &snap,
            uniform(BoundaryPolicy::Strict, 1),
            &["action"],
            cpu(1, 1),
        );
        let a = l.next_batch().unwrap().unwrap();
        let want = if discrete { Kind::Int64 } else { Kind::Float };
        assert_eq!(a.get("action").unwrap().kind(), want);
    }
}

#[test]
fn same_seed_same_tensors_whatever_the_workers() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let run = |workers: usize| -> Vec<Vec<u8>> {
        loader(
            &snap,
            uniform(BoundaryPolicy::Pad, 9),
            &COLUMNS,
            cpu(workers, 10),
        )
        .map(|t| {
            let t = t.unwrap();
            t.tensors().flat_map(|(_, x)| bytes(x)).collect()
        })
        .collect()
    };
    let one = run(1);
    assert_eq!(one.len(), 10);
    assert_eq!(one, run(3));
    // A different seed is a different stream.
    let other: Vec<Vec<u8>> = {
        loader(
            &snap,
            uniform(BoundaryPolicy::Pad, 10),
            &COLUMNS,
            cpu(1, 10),
        )
        .map(|t| t.unwrap().tensors().flat_map(|(_, x)| bytes(x)).collect())
        .collect()
    };
    assert_ne!(one, other);
}

#[test]
fn ranks_draw_disjoint_batches() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let s = sampler(&snap, BoundaryPolicy::Strict, 5);
    for rank in 0..2u64 {
        let opts = TorchLoaderOptions::new(Device::Cpu)
            .with_loader(LoaderOptions::default().with_max_batches(3));
        let spec = LoaderSpec::single(
            snap.clone(),
            uniform(BoundaryPolicy::Strict, 5),
            &["observation"],
        )
        .with_rank(rank, 2);
        let mut l = TorchLoader::new(&BatchSource::open(spec).unwrap(), opts).unwrap();
        for k in 0..3u64 {
            let t = l.next_batch().unwrap().unwrap();
            let b = gathered(&snap, s.as_ref(), &["observation"], k * 2 + rank);
            assert_equals_gather(&t, &b, &format!("rank {rank} batch {k}"));
        }
    }
}

#[test]
fn recycled_tensors_are_gathered_into_again() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let s = sampler(&snap, BoundaryPolicy::Strict, 2);
    let opts = TorchLoaderOptions::new(Device::Cpu).with_loader(
        LoaderOptions::default()
            .with_workers(1)
            .with_prefetch(1)
            .with_max_batches(40),
    );
    let mut l = loader(
        &snap,
        uniform(BoundaryPolicy::Strict, 2),
        &["observation"],
        opts,
    );
    let mut seen = std::collections::HashSet::new();
    let mut k = 0;
    while let Some(t) = l.next_batch() {
        let t = t.unwrap();
        let b = gathered(&snap, s.as_ref(), &["observation"], k);
        assert_equals_gather(&t, &b, &format!("recycled #{k}"));
        seen.insert(t.get("observation").unwrap().data_ptr() as usize);
        l.recycle(t);
        k += 1;
    }
    // With one worker and a queue of one, a handful of buffers circulate instead of 40.
    assert!(
        seen.len() <= 4,
        "{} distinct buffers for 40 batches",
        seen.len()
    );
}

#[test]
fn transforms_and_casts_apply() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), true);
    let s = sampler(&snap, BoundaryPolicy::Pad, 4);
    let opts = cpu(2, 3)
        .with_transform(|b: &mut TensorBatch| {
            let doubled = b.get("observation").unwrap() * 2.0;
            b.insert("observation", doubled);
            let norm =
                b.get("observation")
                    .unwrap()
                    .square()
                    .sum_dim_intlist(-1, false, Kind::Float);
            b.insert("obs_sq_norm", norm);
            Ok(())
        })
        .with_cast(FloatCast::BFloat16);
    let cols = ["observation", "action", "reward"];
    let mut l = loader(&snap, uniform(BoundaryPolicy::Pad, 4), &cols, opts);
    for k in 0..3 {
        let t = l.next_batch().unwrap().unwrap();
        let b = gathered(&snap, s.as_ref(), &["observation", "action", "reward"], k);
        let obs = t.get("observation").unwrap();
        assert_eq!(obs.kind(), Kind::BFloat16);
        assert_eq!(t.get("reward").unwrap().kind(), Kind::BFloat16);
        assert_eq!(
            t.get("action").unwrap().kind(),
            Kind::Int64,
            "integers are never cast"
        );
        assert_eq!(t.mask.kind(), Kind::Bool, "flags are never cast");
        let want = Tensor::from_slice(b.column("observation").unwrap().values::<f32>())
            .view([24, 16, 5])
            * 2.0;
        let got = obs.to_kind(Kind::Float);
        let err = (got - want.to_kind(Kind::BFloat16).to_kind(Kind::Float))
            .abs()
            .max()
            .double_value(&[]);
        assert_eq!(err, 0.0, "doubled then cast to bf16");
        assert_eq!(t.get("obs_sq_norm").unwrap().size(), vec![24, 16]);
    }
}

#[test]
fn a_failing_transform_is_an_error_at_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let opts = cpu(1, 2).with_transform(|_b: &mut TensorBatch| {
        Err(Error::invalid_argument("transform refused the batch"))
    });
    let s = uniform(BoundaryPolicy::Strict, 4);
    let mut l = loader(&snap, s, &["observation"], opts);
    let e = l.next_batch().unwrap().unwrap_err();
    assert!(e.to_string().contains("transform refused"), "{e}");
}

#[test]
fn resident_sampling_equals_streaming() {
    for discrete in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let snap = dataset(dir.path(), discrete);
        for policy in [
            BoundaryPolicy::Strict,
            BoundaryPolicy::Pad,
            "span:3:5".parse().unwrap(),
        ] {
            let s = sampler(&snap, policy, 8);
            let g = Gatherer::try_new(&snap, &COLUMNS).unwrap();
            let need = resident_bytes(&g, FloatCast::None).unwrap();
            // The workers plan the batches (and write their parameters) in any order: the
            // batches are the streaming plan's, whatever their number.
            // Fused: the kernel of resident_gather.cu, as the build compiled it for the CPU;
            // unfused: libtorch operations; mapped: the fused kernel reading the workers'
            // parameters in place and copying them into the ring's buffer (the ids and start
            // steps are views of that copy). All give the streaming plan's batches.
            for (workers, fused, mapped) in [
                (1, true, false),
                (3, true, false),
                (3, false, false),
                (2, true, true),
            ] {
                let opts = cpu(workers, 9)
                    .with_resident(need)
                    .with_resident_fused(fused)
                    .with_resident_mapped_params(mapped);
                // The output ring (which the in-place parameters need) holds no widened
                // column: without `step` (uint32, widened to int64).
                let cols: &[&str] = if mapped { &COLUMNS[..4] } else { &COLUMNS };
                let mut l = loader(&snap, uniform(policy, 8), cols, opts);
                assert!(l.is_resident());
                let kind = l.resident_gather().unwrap();
                assert_eq!(kind.starts_with("fused"), fused, "{kind}");
                assert_eq!(kind.contains("in place"), mapped, "{kind}");
                for k in 0..9 {
                    let t = l.next_batch().unwrap().unwrap();
                    let b = gathered(&snap, s.as_ref(), cols, k);
                    let what = format!("resident ({kind}) {policy:?} {workers} workers #{k}");
                    assert_equals_gather(&t, &b, &what);
                }
                assert!(l.next_batch().is_none());
            }
        }
    }
}

#[test]
fn a_large_resident_batch_is_gathered_in_row_ranges_equal_to_streaming() {
    // 200 slices x 15 steps: 3,000 rows, which the CPU copy of the fused kernel gathers in
    // ranges of 2,048 rows on several threads (the first range ends inside a slice, the last
    // is partial).
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), true);
    let spec = SamplerSpec::uniform(15, 200)
        .with_policy(BoundaryPolicy::Pad)
        .with_seed(4);
    let index = snap.slice_index(15, BoundaryPolicy::Pad).unwrap();
    let s = SliceSampler::try_new(index, snap.episodes(), &spec).unwrap();
    // All the columns (`step` is widened: no output ring), and without `step` (the ring).
    for cols in [&COLUMNS[..], &COLUMNS[..4]] {
        let ring = cols.len() == 4;
        let opts = cpu(2, 3).with_resident(1 << 30);
        let mut l = loader(&snap, spec.clone(), cols, opts);
        assert_eq!(l.resident_gather().as_deref(), Some("fused"));
        assert!(l.time_resident_kernel(1).is_none(), "before a batch");
        let mut before = None;
        for k in 0..3 {
            let t = l.next_batch().unwrap().unwrap();
            assert_eq!(t.shape(), (200, 15));
            let want = gathered(&snap, &s, cols, k);
            assert_equals_gather(&t, &want, &format!("#{k}"));
            // The kernel alone (`bench --resident`), relaunched into a buffer of the ring that
            // nothing holds: none while the last two batches are held; once the one before is
            // dropped, into its buffer, and `t` keeps its values.
            assert!(
                l.time_resident_kernel(2).is_none(),
                "#{k}: every buffer held"
            );
            drop(before.take());
            if ring && k > 0 {
                let us = l.time_resident_kernel(4).unwrap().unwrap();
                assert!(us > 0.0, "{us}");
                assert_equals_gather(&t, &want, &format!("#{k} after the kernel alone"));
            } else {
                assert!(
                    l.time_resident_kernel(1).is_none(),
                    "#{k}: no ring, or held"
                );
            }
            before = Some(t);
        }
    }
}

/// The workers' and the consumer's time is accounted per batch (what `bench --device`
/// reports): every batch the workers produced, with time spent gathering (resident mode:
/// planning the parameters), every batch the consumer asked for (the end too) and, in resident
/// mode, issued.
#[test]
fn workers_and_the_consumer_account_for_their_time() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let mut l = loader(&snap, uniform(BoundaryPolicy::Pad, 9), &COLUMNS, cpu(2, 6));
    let mut n = 0;
    for b in l.by_ref() {
        b.unwrap();
        n += 1;
    }
    assert_eq!(n, 6);
    let t = l.worker_times().unwrap();
    assert_eq!(t.batches, 6, "{t:?}");
    assert!(t.gather_ns > 0 && t.device_ns > 0, "{t:?}");
    assert_eq!(t.asked, 7, "{t:?}");
    assert!(t.waited_ns > 0, "{t:?}");
    let mut r = loader(
        &snap,
        uniform(BoundaryPolicy::Pad, 9),
        &COLUMNS,
        cpu(2, 2).with_resident(1 << 30),
    );
    assert_eq!(r.by_ref().map(Result::unwrap).count(), 2);
    let t = r.worker_times().unwrap();
    assert_eq!((t.batches, t.issued, t.asked), (2, 2, 3), "{t:?}");
    assert!(
        t.gather_ns > 0 && t.issue_ns > 0 && t.waited_ns > 0,
        "{t:?}"
    );
    assert_eq!((t.wait_ns, t.device_ns), (0, 0), "{t:?}");
}

#[test]
fn the_resident_kernel_compiles_for_a_gpu_with_nvrtc() {
    // NVRTC needs no GPU: where PyTorch's CUDA wheels put it beside libtorch (as
    // scripts/setup-libtorch.sh installs them), the CUDA half of resident_gather.cu is compiled
    // here for the architectures of the GPUs it runs on (Turing to Hopper), with the frame
    // decoder (frame_decode.cu) and the compact batch's expansion (expand.cu) in the same
    // program.
    for arch in ["compute_75", "compute_90"] {
        match trajstore::torch::compile_resident_kernel(arch) {
            Ok(Some(ptx)) => {
                for entry in [
                    "trajstore_resident_gather",
                    "trajstore_decode_frames",
                    "trajstore_decode_frames_warp",
                    "trajstore_expand_compact",
                ] {
                    assert!(
                        ptx.contains(&format!(".entry {entry}")),
                        "{arch}: no {entry}"
                    );
                }
            }
            Ok(None) => {
                eprintln!("skipped: no NVRTC beside this libtorch (a CPU-only build)");
                return;
            }
            Err(e) => panic!("{arch}: {e}"),
        }
    }
}

#[test]
fn resident_budget_too_small_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let g = Arc::new(Gatherer::try_new(&snap, &["observation", "next_observation"]).unwrap());
    let need = resident_bytes(&g, FloatCast::None).unwrap();
    // observation once, plus one final observation per episode for the derived next one.
    // Every transition, one final observation per episode, and one row of zeros.
    let rows = snap.num_transitions() + snap.num_episodes() + 1;
    assert_eq!(need, rows * 5 * 4);
    assert_eq!(resident_bytes(&g, FloatCast::Half).unwrap(), rows * 5 * 2);
    let s = source(
        &snap,
        uniform(BoundaryPolicy::Strict, 1),
        &["observation", "next_observation"],
    );
    let e = TorchLoader::new(&s, cpu(1, 1).with_resident(need - 1)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("budget"), "{e}");
}

#[test]
fn dropping_a_loader_mid_stream_stops_its_workers() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let source = source(&snap, uniform(BoundaryPolicy::Strict, 4), &COLUMNS);
    // The source's gatherer, which the source and the loader's workers hold.
    let (_, g) = source.at(0).unwrap();
    let opts = TorchLoaderOptions::new(Device::Cpu)
        .with_loader(LoaderOptions::default().with_workers(3).with_prefetch(2));
    let mut l = TorchLoader::new(&source, opts).unwrap(); // endless
    drop(source);
    let _ = l.next_batch().unwrap().unwrap();
    assert!(Arc::strong_count(&g) > 1, "workers hold the gatherer");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(l);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("dropping the loader returns (workers blocked on a full queue are woken)");
    // Every worker (each holding the source's feed, and so its gatherer) has finished and been
    // joined: the source is gone too, and only this test holds the gatherer.
    assert_eq!(Arc::strong_count(&g), 1);
}

#[test]
fn bad_devices_are_clear_errors() {
    for bad in ["tpu", "cuda:x", "cuda:-1", ""] {
        let e = parse_device(bad).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{bad}: {e}");
        assert!(e.to_string().contains("cpu, cuda or cuda:N"), "{bad}: {e}");
    }
    assert_eq!(parse_device("CPU").unwrap(), Device::Cpu);
    if !trajstore::torch::cuda_available() {
        let e = parse_device("cuda").unwrap_err();
        assert!(e.to_string().contains("no CUDA device"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let snap = dataset(dir.path(), false);
        let s = source(&snap, uniform(BoundaryPolicy::Strict, 4), &["observation"]);
        let e = TorchLoader::new(&s, TorchLoaderOptions::new(Device::Cuda(0))).unwrap_err();
        assert!(e.to_string().contains("no CUDA device"), "{e}");
    } else {
        let n = trajstore::torch::cuda_device_count();
        let e = parse_device(&format!("cuda:{n}")).unwrap_err();
        assert!(e.to_string().contains("CUDA device(s)"), "{e}");
    }
}

/// The CUDA device, or None (the test reports itself skipped). With `TRAJSTORE_REQUIRE_CUDA`
/// set (the GPU check, scripts/gpu-check.sh) a missing device fails the test instead, so that
/// a GPU run cannot pass by skipping.
fn cuda() -> Option<Device> {
    if trajstore::torch::cuda_available() {
        Some(Device::Cuda(0))
    } else if std::env::var_os("TRAJSTORE_REQUIRE_CUDA").is_some() {
        panic!("TRAJSTORE_REQUIRE_CUDA is set but libtorch sees no CUDA device");
    } else {
        common::skipped("no CUDA device");
        None
    }
}

#[test]
fn cuda_batches_equal_the_arrow_data() {
    let Some(dev) = cuda() else { return };
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), true);
    let s = sampler(&snap, BoundaryPolicy::Pad, 6);
    // The compact batch (the default on CUDA) expanded by the fused kernel (NVRTC, which
    // PyTorch's CUDA wheels ship: it must load here) and by libtorch operations; the full batch.
    for (compact, fused) in [(true, true), (true, false), (false, true)] {
        let opts = TorchLoaderOptions::new(dev)
            .with_loader(
                LoaderOptions::default()
                    .with_workers(2)
                    .with_max_batches(20),
            )
            .with_staging_slots(2)
            .with_compact(compact)
            .with_fused_expand(fused);
        let mut l = loader(&snap, uniform(BoundaryPolicy::Pad, 6), &COLUMNS, opts);
        let how = l.compact_expand();
        let want = compact.then_some(if fused { "fused" } else { "ops" });
        assert_eq!(how.as_deref(), want);
        let mut k = 0;
        while let Some(t) = l.next_batch() {
            let t = t.unwrap();
            for (name, x) in t.tensors() {
                assert_eq!(x.device(), dev, "{name}");
            }
            let b = gathered(&snap, s.as_ref(), &COLUMNS, k);
            assert_equals_gather(&t, &b, &format!("cuda ({how:?}) #{k}"));
            k += 1;
        }
        assert_eq!(k, 20);
    }
}

#[test]
fn cuda_resident_equals_streaming() {
    let Some(dev) = cuda() else { return };
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    for policy in [BoundaryPolicy::Pad, "span:3:5".parse().unwrap()] {
        let s = sampler(&snap, policy, 6);
        // The fused kernel (NVRTC, which PyTorch's CUDA wheels ship: it must load here),
        // reading the parameters from a copy on the device or in place in pinned host memory,
        // and libtorch operations.
        for (fused, mapped) in [(true, false), (true, true), (false, false)] {
            let opts = TorchLoaderOptions::new(dev)
                .with_loader(LoaderOptions::default().with_max_batches(5))
                .with_resident(1 << 30)
                .with_resident_fused(fused)
                .with_resident_mapped_params(mapped);
            let mut l = loader(&snap, uniform(policy, 6), &COLUMNS, opts);
            let kind = l.resident_gather().unwrap();
            assert_eq!(kind.starts_with("fused"), fused, "{kind}");
            assert_eq!(kind.contains("in place"), mapped, "{kind}");
            for k in 0..5 {
                let t = l.next_batch().unwrap().unwrap();
                assert_eq!(t.mask.device(), dev);
                let b = gathered(&snap, s.as_ref(), &COLUMNS, k);
                assert_equals_gather(&t, &b, &format!("cuda resident ({kind}) {policy:?} #{k}"));
            }
        }
    }
}

/// Frames decoded on the GPU (`TorchLoaderOptions::device_decode`: the NVRTC-compiled
/// `frame_decode.cu`) give the batches the workers' decode gives, byte for byte: 84 × 84
/// `zstd-dict` frames (`demo --frames`), windows of 4, compact or not, strict and pad.
#[test]
fn cuda_frames_decoded_on_the_device_equal_the_workers_decode() {
    let Some(dev) = cuda() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = trajstore::synth::SynthSpec {
        transitions: 3000,
        mean_episode_len: 60.0,
        seed: 4,
        ..Default::default()
    };
    let ds = trajstore::Dataset::create(dir.path().join("frames"), &spec.frame_schema().unwrap())
        .unwrap();
    let mut w = ds.writer(trajstore::WriterOptions::default()).unwrap();
    spec.write_frames(&mut w, None, |_| {}).unwrap();
    drop(w);
    let snap = ds.snapshot().unwrap();
    let stack = trajstore::FrameStack::new(4).unwrap().with_window(true);
    for policy in [BoundaryPolicy::Strict, BoundaryPolicy::Pad] {
        let sampler = SamplerSpec::uniform(16, 32)
            .with_policy(policy)
            .with_seed(8);
        let cols = ["observation", "next_observation", "action"];
        let spec = LoaderSpec::single(snap.clone(), sampler, &cols).with_frame_stack(stack);
        let source = BatchSource::open(spec).unwrap();
        for compact in [true, false] {
            let run = |on: bool, per_thread: bool| {
                let opts = TorchLoaderOptions::new(dev)
                    .with_loader(
                        LoaderOptions::default()
                            .with_workers(2)
                            .with_max_batches(20),
                    )
                    .with_compact(compact)
                    .with_device_decode(on)
                    .with_device_decode_per_thread(per_thread);
                TorchLoader::new(&source, opts)
                    .unwrap()
                    .map(|b| {
                        let b = b.unwrap();
                        assert_eq!(b.mask.device(), dev);
                        b.tensors()
                            .map(|(n, t)| (n.to_string(), bytes(&t.to(Device::Cpu))))
                            .collect::<Vec<_>>()
                    })
                    .collect::<Vec<_>>()
            };
            let workers = run(false, false);
            // A warp a frame (the default), and a thread a frame.
            for per_thread in [false, true] {
                let device = run(true, per_thread);
                assert_eq!(device.len(), 20);
                assert!(
                    workers == device,
                    "{policy:?} compact {compact} thread {per_thread}"
                );
            }
        }
    }
}

#[test]
fn pinned_memory_survives_a_transform() {
    let Some(_) = cuda() else { return };
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let s = uniform(BoundaryPolicy::Strict, 6);
    // A transform that replaces a column with a new (pageable) tensor, as TorchRL's transforms do.
    let opts = cpu(2, 4)
        .with_pinned_output(true)
        .with_transform(|b: &mut TensorBatch| {
            let x = b.get("observation").unwrap() + 1.0;
            b.insert("observation", x);
            Ok(())
        });
    let mut l = loader(&snap, s, &["observation", "reward"], opts);
    while let Some(t) = l.next_batch() {
        let t = t.unwrap();
        for (name, x) in t.tensors() {
            assert!(x.is_pinned(Device::Cuda(0)), "{name} is not pinned");
        }
    }
}

#[test]
fn loaders_and_batches_move_between_threads() {
    fn send<T: Send>() {}
    send::<TorchLoader>();
    send::<TensorBatch>();
    send::<TorchLoaderOptions>();
    // A loader started on one thread and consumed on another.
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let s = uniform(BoundaryPolicy::Strict, 4);
    let mut l = loader(&snap, s, &["reward"], cpu(2, 3));
    let n = std::thread::spawn(move || {
        let mut n = 0;
        while let Some(b) = l.next_batch() {
            assert_eq!(b.unwrap().get("reward").unwrap().size(), vec![24, 16]);
            n += 1;
        }
        n
    })
    .join()
    .unwrap();
    assert_eq!(n, 3);
}

/// The last batch of an epoch without `drop_last` holds fewer slices than B: the tensors keep
/// their `[B, L, ...]` shape, the real slices equal the gather, and the rest is padding (masked,
/// zeroed, ids -1), in streaming and resident mode alike.
#[test]
fn a_short_last_batch_of_an_epoch_is_padded() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let index = snap.slice_index(16, BoundaryPolicy::Strict).unwrap();
    let b = 24usize;
    let n = (index.num_windows() % b as u64) as usize;
    assert!(n > 0, "the fixture must leave a short last batch");
    let s: Arc<dyn Sampler> =
        Arc::new(trajstore::EpochSampler::windows(index, b, 3, false).unwrap());
    // The same sampler, as the loaders' spec.
    let epoch = SamplerSpec::new(SamplerKind::Epoch, 16, b)
        .with_seed(3)
        .with_drop_last(false);
    let per = s.batches_per_epoch().unwrap();
    let cols = ["observation", "action", "reward", "next_observation"];
    let want = gathered(&snap, s.as_ref(), &cols, per - 1);
    assert_eq!(want.num_slices, n);
    for resident in [false, true] {
        let mut opts = TorchLoaderOptions::new(Device::Cpu);
        if resident {
            opts = opts.with_resident(1 << 30);
        }
        let batches: Vec<TensorBatch> = loader(&snap, epoch.clone(), &cols, opts)
            .map(|t| t.unwrap())
            .collect();
        assert_eq!(batches.len() as u64, per, "one epoch");
        let last = batches.last().unwrap();
        assert_eq!(last.shape(), (b as i64, 16));
        let (head, tail) = (
            |t: &Tensor| t.narrow(0, 0, n as i64),
            |t: &Tensor| t.narrow(0, n as i64, (b - n) as i64),
        );
        for c in &want.columns {
            let x = last.get(&c.name).unwrap();
            assert_eq!(
                bytes(&head(x)),
                c.data.as_slice(),
                "resident={resident} {}",
                c.name
            );
            assert!(
                bytes(&tail(x)).iter().all(|&v| v == 0),
                "padding of {}",
                c.name
            );
        }
        assert_eq!(bytes(&head(&last.mask)), want.mask);
        for (name, t) in last.tensors().filter(|(_, t)| t.kind() == Kind::Bool) {
            assert!(
                bytes(&tail(t)).iter().all(|&v| v == 0),
                "resident={resident} {name}"
            );
        }
        let ids: Vec<i64> = Vec::try_from(&tail(&last.episode_id)).unwrap();
        assert!(ids.iter().all(|&i| i == -1), "{ids:?}");
    }
}

/// The device ring (its CPU stand-in here; `cuda_device_ring_never_overwrites_a_held_batch` on a
/// GPU): batches copied into a ring of buffers (or, resident, gathered into the output ring)
/// equal the gather, compact or not; a batch the
/// caller holds, or a view taken from one, keeps its values while later batches are made (the
/// ring grows, then replaces held buffers rather than overwrite them); a caller that drops each
/// batch gets buffers reused, with none replaced.
#[test]
fn the_device_ring_never_overwrites_a_held_batch() {
    ring_keeps_held_batches(Device::Cpu);
}

fn ring_keeps_held_batches(dev: Device) {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), true);
    let s = sampler(&snap, BoundaryPolicy::Pad, 8);
    let n = 40u64;
    // `step` (UInt32) is widened after the copy, which the ring does not do: it is left out here
    // and turns the ring off below.
    let cols = &COLUMNS[..4];
    let opts = |mode: &str| {
        let o = TorchLoaderOptions::new(dev)
            .with_loader(LoaderOptions::default().with_workers(2).with_max_batches(n))
            .with_ring_on_cpu(true)
            .with_compact(mode == "compact");
        match mode {
            "resident" => o.with_resident(1 << 30),
            _ => o,
        }
    };
    for compact in ["full", "compact", "resident"] {
        // Every batch held to the end (past the rings' size), and a view of the first.
        let mut l = loader(&snap, uniform(BoundaryPolicy::Pad, 8), cols, opts(compact));
        let first = l.next_batch().unwrap().unwrap();
        let view = first.get("observation").unwrap().narrow(0, 2, 3);
        drop(first);
        let held: Vec<TensorBatch> = l.by_ref().map(|t| t.unwrap()).collect();
        let stats = l.device_ring();
        assert_eq!(
            stats.batches, n,
            "compact={compact}: every batch through a ring"
        );
        assert!(stats.replaced > 0, "compact={compact}: {stats:?}");
        let b0 = gathered(&snap, s.as_ref(), cols, 0);
        let obs = &b0.columns.iter().find(|c| c.name == "observation").unwrap();
        let row = obs.data.len() / b0.num_slices;
        assert_eq!(
            bytes(&view),
            &obs.data[2 * row..5 * row],
            "compact={compact}: the view"
        );
        for (k, t) in held.iter().enumerate() {
            let b = gathered(&snap, s.as_ref(), cols, k as u64 + 1);
            assert_equals_gather(t, &b, &format!("ring compact={compact} #{}", k + 1));
        }
        // Each batch dropped as the next comes: buffers go round, none replaced.
        let mut l = loader(&snap, uniform(BoundaryPolicy::Pad, 8), cols, opts(compact));
        let mut k = 0;
        while let Some(t) = l.next_batch() {
            let b = gathered(&snap, s.as_ref(), cols, k);
            assert_equals_gather(&t.unwrap(), &b, &format!("ring compact={compact} #{k}"));
            k += 1;
        }
        assert_eq!(k, n);
        let stats = l.device_ring();
        assert_eq!((stats.batches, stats.replaced), (n, 0), "compact={compact}");
    }
    // A cast: the floats cast after the copy, the rest as gathered.
    let opts_cast = opts("compact").with_cast(FloatCast::BFloat16);
    let mut l = loader(&snap, uniform(BoundaryPolicy::Pad, 8), cols, opts_cast);
    for k in 0..3 {
        let t = l.next_batch().unwrap().unwrap();
        let b = gathered(&snap, s.as_ref(), cols, k);
        for c in &b.columns {
            let x = t.get(&c.name).unwrap();
            let want = Tensor::from_slice(&c.data)
                .view_dtype(trajstore::torch::kind_of(&c.data_type).unwrap())
                .view(x.size().as_slice());
            let want = want.to_kind(FloatCast::BFloat16.apply(want.kind()));
            assert_eq!(x.kind(), want.kind(), "{}", c.name);
            assert!(
                x.to_device(Device::Cpu).equal(&want),
                "cast #{k} {}",
                c.name
            );
        }
    }
    assert_eq!(l.device_ring().batches, 3);
    drop(l);
    // Dropped with workers mid-stream: they stop.
    let mut l = loader(
        &snap,
        uniform(BoundaryPolicy::Pad, 8),
        cols,
        opts("compact"),
    );
    assert!(l.next_batch().unwrap().is_ok());
    drop(l);
    // Off, or with a widened column: no ring.
    for (cols, ring) in [(cols, false), (&COLUMNS[..], true)] {
        let opts = opts("full").with_device_ring(ring);
        let mut l = loader(&snap, uniform(BoundaryPolicy::Pad, 8), cols, opts);
        assert!(l.next_batch().unwrap().is_ok());
        assert_eq!(l.device_ring().batches, 0);
    }
}

#[test]
fn cuda_device_ring_never_overwrites_a_held_batch() {
    let Some(dev) = cuda() else { return };
    ring_keeps_held_batches(dev);
}

/// An exact, order-sensitive checksum of every tensor of a batch, computed where the batch is
/// (integer arithmetic on the raw bytes, so the GPU and the CPU agree bit for bit).
fn checksum(t: &TensorBatch) -> Tensor {
    let mut total: Option<Tensor> = None;
    for (_, x) in t.tensors() {
        let dev = x.device();
        let bytes = x
            .contiguous()
            .view_dtype(Kind::Uint8)
            .view([-1])
            .to_kind(Kind::Int64);
        let n = bytes.size()[0];
        let w = Tensor::arange(n, (Kind::Int64, dev)).remainder(251) + 1;
        let s = (bytes * w).sum(Kind::Int64);
        total = Some(match total {
            Some(t) => t * 1_000_003 + s,
            None => s,
        });
    }
    total.expect("a batch has tensors")
}

#[test]
fn cuda_staging_ring_never_overwrites_a_batch_in_flight() {
    let Some(dev) = cuda() else { return };
    let dir = tempfile::tempdir().unwrap();
    let snap = TestData::new()
        .transitions(200_000)
        .obs_dim(17)
        .act_dim(6)
        .mean_episode_len(300.0)
        .seed(5)
        .snapshot(&dir.path().join("d"));
    let s = SamplerSpec::uniform(32, 64)
        .with_policy(BoundaryPolicy::Pad)
        .with_seed(21);
    let batches = 3000u64;
    let cols = ["observation", "action", "reward", "next_observation"];
    // Reference: the same plan on the CPU.
    let mut want = Vec::new();
    let mut l = loader(&snap, s.clone(), &cols, cpu(2, batches));
    while let Some(t) = l.next_batch() {
        let t = t.unwrap();
        want.push(i64::try_from(checksum(&t)).unwrap());
        l.recycle(t);
    }
    // Four workers through the smallest ring (two slots each). The consumer never waits for the
    // device and queues a matrix product per batch, so the copies of several batches are still
    // queued whenever a worker comes back to a slot.
    let opts = TorchLoaderOptions::new(dev)
        .with_loader(
            LoaderOptions::default()
                .with_workers(4)
                .with_max_batches(batches),
        )
        .with_staging_slots(2);
    let mut l = loader(&snap, s, &cols, opts);
    let load = Tensor::ones([1024, 1024], (Kind::Float, dev));
    let mut sums = Vec::new();
    let mut acc = load.shallow_clone();
    while let Some(t) = l.next_batch() {
        let t = t.unwrap();
        acc = acc.matmul(&load) / 1024.0;
        sums.push(checksum(&t));
    }
    let got: Vec<i64> = Vec::try_from(&Tensor::stack(&sums, 0).to_device(Device::Cpu)).unwrap();
    assert_eq!(got.len(), want.len());
    let torn: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    assert!(
        torn.is_empty(),
        "{} of {batches} batches differ from the CPU plan (first: {:?})",
        torn.len(),
        &torn[..torn.len().min(8)]
    );
    assert!(f64::try_from(acc.sum(Kind::Float)).unwrap().is_finite());
}

#[test]
fn cuda_staging_slots_are_pinned_when_the_transform_runs() {
    let Some(dev) = cuda() else { return };
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let s = sampler(&snap, BoundaryPolicy::Strict, 3);
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let unpinned = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (seen2, unpinned2) = (seen.clone(), unpinned.clone());
    let opts = TorchLoaderOptions::new(dev)
        .with_loader(
            LoaderOptions::default()
                .with_workers(2)
                .with_max_batches(12),
        )
        .with_transform(move |b: &mut TensorBatch| {
            // The host batch handed to the transform is the staging slot itself.
            for (name, x) in b.tensors() {
                if !x.is_pinned(dev) {
                    unpinned2.lock().unwrap().push(name.to_string());
                }
            }
            seen2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let x = b.get("observation").unwrap() * 2.0; // a new, pageable tensor
            b.insert("observation", x);
            Ok(())
        });
    let mut l = loader(
        &snap,
        uniform(BoundaryPolicy::Strict, 3),
        &["observation", "reward"],
        opts,
    );
    let mut k = 0;
    while let Some(t) = l.next_batch() {
        let t = t.unwrap();
        let b = gathered(&snap, s.as_ref(), &["observation", "reward"], k);
        let obs = t.get("observation").unwrap().to_device(Device::Cpu);
        let want = Tensor::from_slice(b.columns[0].values::<f32>()).view_as(&obs) * 2.0;
        assert!(
            obs.equal(&want),
            "batch {k}: the transformed column arrived changed"
        );
        k += 1;
    }
    assert_eq!(k, 12);
    assert_eq!(seen.load(std::sync::atomic::Ordering::Relaxed), 12);
    let bad = unpinned.lock().unwrap();
    assert!(bad.is_empty(), "staging tensors not pinned: {bad:?}");
}

#[test]
fn libtorch_cuda_is_loaded_on_first_use() {
    let maps = || std::fs::read_to_string("/proc/self/maps").unwrap();
    let cpu = maps()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5).map(str::to_string))
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .expect("libtorch_cpu is mapped");
    let cuda = std::path::Path::new(&cpu).with_file_name("libtorch_cuda.so");
    if !cuda.exists() {
        common::skipped("a libtorch without CUDA");
        return;
    }
    // Whether or not a device is present, asking loads libtorch's CUDA half.
    let _ = trajstore::torch::cuda_available();
    assert!(trajstore::torch::load_cuda());
    assert!(
        maps().contains("libtorch_cuda.so"),
        "libtorch_cuda was not loaded"
    );
}

/// A torch loader from a [`trajstore::BatchSource`]: a resumed mix of two datasets gives the
/// batches the CPU loader gives after the same state, on `device`.
fn source_resumes_a_mix(device: Device) {
    use trajstore::Loader;
    let dir = tempfile::tempdir().unwrap();
    let a = dataset(dir.path(), false);
    let b = TestData::new()
        .obs_dim(5)
        .act_dim(3)
        .seed(12)
        .episodes([40u64; 6])
        .snapshot(&dir.path().join("b"));
    let uniform = |seed| SamplerSpec::new(SamplerKind::Uniform, 16, 24).with_seed(seed);
    let spec = LoaderSpec::new(&COLUMNS)
        .part(a, uniform(1), 0.75)
        .part(b, uniform(2), 0.25);
    let mut cpu_loader = Loader::new(
        &BatchSource::open(spec.clone()).unwrap(),
        LoaderOptions::default(),
    )
    .unwrap();
    for _ in 0..7 {
        cpu_loader.next_batch().unwrap();
    }
    let state = cpu_loader.state();
    let want: Vec<Batch> = cpu_loader.by_ref().take(12).collect();
    assert!(
        want.iter()
            .all(|b| b.source.iter().filter(|&&s| s == 1).count() == 6)
    );
    let lo = LoaderOptions::default()
        .with_workers(3)
        .with_max_batches(12);
    let source = BatchSource::open(spec.with_resume(state)).unwrap();
    let opts = TorchLoaderOptions::new(device).with_loader(lo);
    let got: Vec<TensorBatch> = TorchLoader::new(&source, opts)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(got.len(), 12);
    for (i, (t, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(t.device(), device);
        assert_equals_gather(t, b, &format!("resumed batch {i}"));
    }
}

#[test]
fn a_torch_loader_from_a_source_resumes_a_mix() {
    source_resumes_a_mix(Device::Cpu);
}

#[test]
fn cuda_a_torch_loader_from_a_source_resumes_a_mix() {
    if let Some(d) = cuda() {
        source_resumes_a_mix(d);
    }
}

/// The compact batch (what CUDA loaders ship: a derived next_observation as one row per slice,
/// the flags as spans) expanded by the loader equals the gather, under every policy, for a
/// short last batch of an epoch, and where next_observation is gathered without the observation
/// (shipped whole).
#[test]
fn compact_batches_expand_to_the_gather_under_every_policy() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    for policy in [
        BoundaryPolicy::Strict,
        BoundaryPolicy::Pad,
        BoundaryPolicy::Span { left: 5, right: 7 },
    ] {
        // The fused kernel's C++ copy (the default) and the tensor operations.
        for (cols, fused) in [&COLUMNS[..], &["next_observation", "reward"]]
            .into_iter()
            .flat_map(|c| [(c, true), (c, false)])
        {
            let s = sampler(&snap, policy, 9);
            let opts = cpu(2, 6).with_compact(true).with_fused_expand(fused);
            let mut l = loader(&snap, uniform(policy, 9), cols, opts);
            let how = if fused { "fused" } else { "ops" };
            assert_eq!(l.compact_expand().as_deref(), Some(how));
            for k in 0..6 {
                let t = l.next_batch().unwrap().unwrap();
                let what = format!("{policy:?} {cols:?} {how} batch {k}");
                assert_equals_gather(&t, &gathered(&snap, s.as_ref(), cols, k), &what);
            }
            assert!(l.next_batch().is_none());
        }
    }
    // The short last batch of an epoch: trailing slices are empty spans and zero tails.
    let index = snap.slice_index(16, BoundaryPolicy::Pad).unwrap();
    let epoch: Arc<dyn Sampler> =
        Arc::new(trajstore::EpochSampler::windows(index, 24, 3, false).unwrap());
    let per = epoch.batches_per_epoch().unwrap();
    let spec = SamplerSpec::new(SamplerKind::Epoch, 16, 24)
        .with_policy(BoundaryPolicy::Pad)
        .with_seed(3)
        .with_drop_last(false);
    let cols = &COLUMNS[..4]; // no widened column: bytes compare as they are
    let want = gathered(&snap, epoch.as_ref(), cols, per - 1);
    let n = want.num_slices as i64;
    assert!(n < 24, "the fixture leaves a short last batch");
    for fused in [true, false] {
        let opts = TorchLoaderOptions::new(Device::Cpu)
            .with_compact(true)
            .with_fused_expand(fused);
        let last = loader(&snap, spec.clone(), cols, opts)
            .map(|t| t.unwrap())
            .last()
            .unwrap();
        short_last_batch_equals(&last, &want, n, fused);
    }
}

/// The short last batch `last` of an epoch (its first `n` slices) equals the gather `want`,
/// and its padding is zeros.
fn short_last_batch_equals(last: &TensorBatch, want: &Batch, n: i64, fused: bool) {
    for (name, t) in last.tensors() {
        let head = t.narrow(0, 0, n);
        let want: Vec<u8> = match want.columns.iter().find(|c| c.name == name) {
            Some(c) => c.data.as_slice().to_vec(),
            None => match name {
                "mask" => want.mask.clone(),
                "is_first" => want.is_first.clone(),
                "is_last" => want.is_last.clone(),
                "terminated" => want.terminated.clone(),
                "truncated" => want.truncated.clone(),
                "slice_end" => want.slice_end.clone(),
                "episode_id" => want
                    .episode_id
                    .iter()
                    .flat_map(|v| v.to_ne_bytes())
                    .collect(),
                _ => want
                    .start_step
                    .iter()
                    .flat_map(|v| v.to_ne_bytes())
                    .collect(),
            },
        };
        assert_eq!(
            bytes(&head),
            want,
            "short last batch (fused {fused}): {name}"
        );
        if t.kind() != Kind::Int64 {
            let pad = bytes(&t.narrow(0, n, 24 - n));
            assert!(
                pad.iter().all(|&v| v == 0),
                "short last batch (fused {fused}): padding of {name}"
            );
        }
    }
}

/// A dataset in a `file://` store, streamed through a cache that holds a few of its segments:
/// the torch loader gives the streaming loader's batches (windows rotating through the cache),
/// compact (derived `next_observation` as tails, expanded) or not; what a stream cannot do is
/// refused.
#[cfg(feature = "remote")]
#[test]
fn a_stream_through_a_small_cache_gives_the_stream_loaders_batches_as_tensors() {
    use trajstore::StreamLoader;
    use trajstore::remote::{Remote, Stream, StreamOptions};
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), false);
    let url = format!("file://{}", dir.path().join("store/d").display());
    let ds = trajstore::Dataset::open(dir.path().join("d")).unwrap();
    Remote::open(&url, Default::default())
        .unwrap()
        .push(&ds)
        .unwrap();
    let segments = &snap.manifest().segments;
    let largest = segments.iter().map(|s| s.bytes).max().unwrap();
    let total: u64 = segments.iter().map(|s| s.bytes).sum();
    let limit = 3 * largest + largest / 2;
    assert!(limit < total, "the cache holds part of the version");
    let source = |cache: &str| {
        let mut o = StreamOptions::new(limit);
        o.cache_dir = Some(dir.path().join(cache));
        o.reuse = 1.0;
        let stream = Stream::open(&url, o).unwrap();
        let spec = LoaderSpec::streamed(stream, uniform(BoundaryPolicy::Pad, 5), &COLUMNS);
        BatchSource::open(spec).unwrap()
    };
    let batches = 40;
    let mut plain = StreamLoader::new(
        &source("plain"),
        LoaderOptions::default().with_max_batches(batches),
    )
    .unwrap();
    let want: Vec<Batch> = plain.by_ref().map(Result::unwrap).collect();
    assert_eq!(want.len() as u64, batches);
    assert!(plain.stats().windows_opened >= 3, "{:?}", plain.stats());
    for compact in [false, true] {
        let src = source(if compact { "compact" } else { "full" });
        assert_eq!(
            src.tail_columns(),
            COLUMNS.map(|c| c == "next_observation").to_vec()
        );
        let opts = cpu(3, batches).with_compact(compact);
        let mut l = TorchLoader::new(&src, opts).unwrap();
        assert_eq!(l.transfer_bytes(), None, "no copy on CPU");
        let mut k = 0;
        while let Some(t) = l.next_batch() {
            let t = t.unwrap();
            assert_equals_gather(&t, &want[k], &format!("compact={compact} batch {k}"));
            l.recycle(t);
            k += 1;
        }
        assert_eq!(k as u64, batches);
        let e = l.state().unwrap_err();
        assert!(e.to_string().contains("with_start"), "{e}");
    }
    let e = TorchLoader::new(
        &source("resident"),
        TorchLoaderOptions::new(Device::Cpu).with_resident(1 << 30),
    )
    .expect_err("resident mode over a stream is refused");
    assert!(e.to_string().contains("pull the dataset"), "{e}");
}
