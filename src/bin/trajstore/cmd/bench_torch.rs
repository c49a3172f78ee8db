//! `bench --device`: the torch loader's figures (feature `torch`), and the message of a build
//! without it.

#[cfg(feature = "torch")]
use std::time::Instant;

use anyhow::Result;
use indicatif::{HumanBytes, HumanCount};
#[cfg(feature = "torch")]
use serde_json::json;

use super::bench::BenchArgs;
#[cfg(feature = "torch")]
use crate::output::*;

/// The torch loader's figures for `bench --device`.
#[cfg(feature = "torch")]
pub(crate) fn torch_bench(
    a: &BenchArgs,
    device: &str,
    source: &trajstore::BatchSource,
    batch_bytes: usize,
    start: u64,
) -> Result<serde_json::Value> {
    use trajstore::torch::{TorchLoader, TorchLoaderOptions, parse_device};
    let dev = parse_device(device).map_err(one_line)?;
    let cast = a.cast;
    let iters = a.iters as u64;
    let mut lo = trajstore::LoaderOptions::default()
        .with_workers(a.workers)
        .with_start(start)
        .with_max_batches(2 * iters);
    if let Some(p) = a.prefetch {
        lo = lo.with_prefetch(p);
    }
    let mut opts = TorchLoaderOptions::new(dev).with_cast(cast).with_loader(lo);
    if a.resident {
        opts = opts
            .with_resident(a.resident_budget)
            .with_resident_fused(!a.resident_unfused)
            .with_resident_mapped_params(a.resident_mapped_params);
    }
    if a.full_batch {
        opts = opts.with_compact(false);
    }
    opts = opts
        .with_fused_expand(!a.ops_expand)
        .with_device_ring(!a.no_device_ring)
        .with_device_decode(a.device_decode)
        .with_device_decode_per_thread(a.device_decode_per_thread);
    let sync = || {
        if let tch::Device::Cuda(n) = dev {
            tch::Cuda::synchronize(n as i64);
        }
    };
    let t = Instant::now();
    let mut loader = TorchLoader::new(source, opts).map_err(one_line)?;
    let setup_s = t.elapsed().as_secs_f64();
    // Warm-up: the first half of the batches (allocations, staging slots, kernels).
    for _ in 0..iters {
        let b = loader
            .next_batch()
            .expect("bounded stream")
            .map_err(one_line)?;
        loader.recycle(b);
    }
    sync();
    let before = loader.worker_times();
    let before_ring = loader.device_ring();
    let t = Instant::now();
    let mut n = 0u64;
    while let Some(b) = loader.next_batch() {
        let b = b.map_err(one_line)?;
        loader.recycle(b);
        n += 1;
    }
    sync();
    let secs = t.elapsed().as_secs_f64();
    // The workers' time per batch over the measured half (they run ahead by the prefetch).
    // The workers' figures are null where they made no batch in the measured half (resident
    // workers plan ahead of the consumer: a short run's may all be planned during the warm-up).
    let worker = loader.worker_times().zip(before).map(|(a, b)| {
        let n = a.batches.saturating_sub(b.batches) as f64;
        let us = |x: u64, y: u64| (n > 0.0).then(|| x.saturating_sub(y) as f64 / n / 1e3);
        json!({
            "batches": n,
            "wait": us(a.wait_ns, b.wait_ns),
            "gather": us(a.gather_ns, b.gather_ns),
            "device": us(a.device_ns, b.device_ns),
            // The consumer's time issuing a ring batch's copy (per batch it issued; resident:
            // the parameters' copy, the kernel's launch, the views), and waiting for the
            // workers (per batch it asked for).
            "consumer_issue": (a.issued > b.issued).then(|| {
                a.issue_ns.saturating_sub(b.issue_ns) as f64 / (a.issued - b.issued) as f64 / 1e3
            }),
            "consumer_wait": (a.asked > b.asked).then(|| {
                a.waited_ns.saturating_sub(b.waited_ns) as f64 / (a.asked - b.asked) as f64 / 1e3
            }),
        })
    });
    let transfer = loader.transfer_bytes();
    let gather = loader.resident_gather();
    // Resident: the fused kernel alone, as many launches as batches were measured (at most
    // 2,000), against the loader's µs a batch.
    let kernel_us = loader
        .time_resident_kernel(n.clamp(1, 2000) as u32)
        .transpose()
        .map_err(one_line)?;
    let expand = loader.compact_expand();
    let ring = {
        let (a, b) = (loader.device_ring(), before_ring);
        json!({"batches": a.batches - b.batches, "replaced": a.replaced - b.replaced})
    };
    let device_decode = loader.decodes_on_device();
    let shipped = loader.device_decode_bytes();
    drop(loader);
    let steps = (a.s.num_slices * a.s.slice_len as usize) as f64;
    let gbps = n as f64 * batch_bytes as f64 / secs / 1e9;
    // The anchor: a pinned copy of what one batch's copy carries (the compact batch), and of the
    // full batch's bytes.
    let pinned = |bytes: usize| -> Result<f64> {
        Ok(trajstore::torch::pinned_copy_bandwidth(bytes, dev, 200).map_err(one_line)? / 1e9)
    };
    let (baseline, full_baseline) = match (dev, transfer) {
        (tch::Device::Cuda(_), Some(t)) if !a.resident => {
            (Some(pinned(t as usize)?), Some(pinned(batch_bytes)?))
        }
        _ => (None, None),
    };
    // Batches per second a back-to-back pinned copy of one batch's transfer allows.
    let copy_bps = baseline.zip(transfer).map(|(g, t)| g * 1e9 / t as f64);
    Ok(json!({
        "device": device,
        "resident": a.resident,
        "resident_gather": gather,
        "resident_kernel_us_per_batch": kernel_us,
        "compact_expand": expand,
        "device_ring": ring,
        "worker_us_per_batch": worker,
        "device_decode": device_decode,
        "device_decode_bytes_per_batch": shipped,
        "device_decode_kernel": device_decode.then_some(if a.device_decode_per_thread { "thread" } else { "warp" }),
        "cast": a.cast.to_string(),
        "setup_s": setup_s,
        "batches": n,
        "batches_per_s": n as f64 / secs,
        "transitions_per_s": n as f64 * steps / secs,
        "gb_per_s": gbps,
        "transfer_bytes_per_batch": transfer,
        "pinned_copy_gb_per_s": baseline,
        "pinned_copy_full_batch_gb_per_s": full_baseline,
        "pinned_copy_batches_per_s": copy_bps,
        "over_pinned_copy": copy_bps.map(|c| n as f64 / secs / c),
    }))
}

#[cfg(not(feature = "torch"))]
pub(crate) const NO_TORCH: &str =
    "--device needs the torch loader: rebuild with `--features torch` (see README, GPU loading)";

#[cfg(not(feature = "torch"))]
pub(crate) fn torch_bench(
    _a: &BenchArgs,
    _device: &str,
    _source: &trajstore::BatchSource,
    _batch_bytes: usize,
    _start: u64,
) -> Result<serde_json::Value> {
    anyhow::bail!(NO_TORCH)
}

pub(crate) fn print_torch_bench(t: &serde_json::Value) {
    let f = |k: &str| t[k].as_f64().unwrap_or(f64::NAN);
    outln!(
        "torch loader ({}{})  {:>10.0} batches/s, {} transitions/s, {:.2} GB/s (setup {:.2} s)",
        t["device"].as_str().unwrap_or("?"),
        match (t["resident_gather"].as_str(), t["device_decode"].as_bool()) {
            (Some(g), _) => format!(", resident, {g}"),
            (None, Some(true)) => ", frames decoded on the device".to_string(),
            _ => {
                let ring = match t["device_ring"]["batches"].as_u64() {
                    Some(n) if n > 0 => ", device ring",
                    _ => "",
                };
                match t["compact_expand"].as_str() {
                    Some(e) => format!("{ring}, compact batch expanded by {e}"),
                    None => ring.to_string(),
                }
            }
        },
        f("batches_per_s"),
        HumanCount(f("transitions_per_s") as u64),
        f("gb_per_s"),
        f("setup_s")
    );
    if let Some(k) = t["resident_kernel_us_per_batch"].as_f64() {
        outln!(
            "the gather kernel alone {k:.1} µs a batch (launched back to back), against {:.1} µs \
             a batch from the loader",
            1e6 / f("batches_per_s")
        );
    }
    let w = &t["worker_us_per_batch"];
    // "-" where a figure has no batch to divide by (as a short run's planning workers).
    let us = |k: &str| {
        w[k].as_f64()
            .map_or("-".to_string(), |x| format!("{x:.1} µs"))
    };
    if w.is_object() && t["resident"].as_bool() == Some(true) {
        outln!(
            "per batch              a worker planning its parameters {}; the consumer waiting \
             for them {}, issuing it (parameters, kernel, views) {}",
            us("gather"),
            us("consumer_wait"),
            us("consumer_issue")
        );
    } else if w.is_object() {
        outln!(
            "one worker, per batch   waiting for a slot {}, gathering {}, then {} to hand it over \
             (on CUDA without the device ring: the copy's issue, views, expansion, event)",
            us("wait"),
            us("gather"),
            us("device")
        );
        if w["consumer_issue"].is_number() {
            outln!(
                "the consumer, per batch {} issuing its copy into the device ring, {} waiting for \
                 the workers",
                us("consumer_issue"),
                us("consumer_wait")
            );
        }
    }
    if t["pinned_copy_gb_per_s"].is_number() {
        outln!(
            "pinned H2D copy        {:>10.2} GB/s of the {} each batch's copy carries: {:.0} \
             batches/s; the loader delivers {:.0}% of it",
            f("pinned_copy_gb_per_s"),
            HumanBytes(f("transfer_bytes_per_batch") as u64),
            f("pinned_copy_batches_per_s"),
            100.0 * f("over_pinned_copy")
        );
    }
}
