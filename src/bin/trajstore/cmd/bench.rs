//! `trajstore bench`: sampling, gather and loader throughput against memcpy of the same bytes.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use indicatif::{HumanBytes, HumanCount};
use serde_json::json;

use super::sample::slice_sampler;
use super::*;
use crate::open::*;
use crate::output::*;

#[derive(Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    s: SliceArgs,
    /// Timed iterations (after as many warm-up ones), 1 to 10000000.
    #[arg(
        long,
        default_value_t = 200,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000)
    )]
    iters: usize,
    /// Loader workers for the loader measurement (1 to 1024).
    #[arg(
        long,
        default_value_t = 2,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
            .range(1..=trajstore::loader::MAX_WORKERS as u64)
    )]
    workers: usize,
    /// Let loader workers madvise(WILLNEED) the next batch's pages (for data not in the page cache).
    #[arg(long)]
    readahead: bool,
    /// Map every page before timing (MADV_POPULATE_READ), to measure steady state from the start
    /// instead of the first touches' page faults.
    #[arg(long)]
    prefault: bool,
    /// Run the torch loader to this device (cpu, cuda, cuda:N) after the CPU figures: batches/s,
    /// GB/s, and on CUDA the bandwidth of a plain pinned host-to-device copy of the same bytes
    /// as the baseline. Needs a build with `--features torch`.
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    /// With --device: upload the columns to the device once and sample there (GPU-resident mode).
    #[arg(long, requires = "device")]
    resident: bool,
    /// Device memory the resident columns may take.
    #[arg(long, default_value = "8GiB", value_parser = parse_size, requires = "resident")]
    resident_budget: u64,
    /// With --device: cast floating columns on the device (none, bf16, f16).
    #[cfg(feature = "torch")]
    #[arg(long, default_value = "none", requires = "device")]
    cast: trajstore::torch::FloatCast,
}

/// (anonymous, file-backed) resident memory of this process in MiB, from /proc/self/status
/// (file-backed pages are the mapped segments: page cache, not memory the process owns).
pub(crate) fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("RssAnon:"), field("RssFile:"))
}

/// The loader's queue depth for `bench`: the default 4, fewer where the batches in flight
/// (`workers` + queue + 1, of `batch_bytes` each) would not fit the library's memory limit.
pub(crate) fn prefetch_that_fits(batch_bytes: usize, workers: usize) -> usize {
    let fit = trajstore::sample::max_batch_bytes() / (batch_bytes as u64).max(1);
    fit.saturating_sub(workers as u64 + 1).clamp(1, 4) as usize
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn run(a: BenchArgs) -> Result<()> {
    use std::hint::black_box;
    use trajstore::Sampler;
    // A device that cannot work is an error before minutes of measurements, not after.
    #[cfg(feature = "torch")]
    if let Some(d) = &a.device {
        trajstore::torch::parse_device(d).map_err(one_line)?;
    }
    #[cfg(not(feature = "torch"))]
    if a.device.is_some() {
        anyhow::bail!(NO_TORCH);
    }
    let t0 = Instant::now();
    let snap = open_snapshot(&a.s.dataset, None)?;
    let mut prefault_ms = 0.0;
    if a.prefault {
        let t = Instant::now();
        snap.prefault();
        prefault_ms = t.elapsed().as_secs_f64() * 1e3;
    }
    let cols: Vec<&str> = a.s.columns.iter().map(String::as_str).collect();
    let gatherer = std::sync::Arc::new(trajstore::Gatherer::try_new(&snap, &cols)?);
    check_batch_size(&gatherer, &a.s)?;
    let sampler = std::sync::Arc::new(slice_sampler(&snap, &a.s)?);
    let mut plan = vec![];
    let mut batch = trajstore::Batch::default();
    sampler.plan(0, &mut plan);
    gatherer.gather(&plan, &mut batch)?;
    let first_batch_ms = t0.elapsed().as_secs_f64() * 1e3;
    let iters = a.iters;
    let mut index_us = Vec::with_capacity(iters);
    let mut sample_us = Vec::with_capacity(iters);
    let mut memcpy_us = Vec::with_capacity(iters);
    // The memcpy floor: the same number of bytes as one batch's data, copied in one go from the
    // mapped data into a destination allocated once. The source moves through the largest segment
    // every iteration, so that it comes from memory (as the gathered slices do), not from a CPU
    // cache that a repeated copy of the same bytes would hit.
    let bytes = batch.data_bytes();
    let big = snap
        .segments()
        .iter()
        .max_by_key(|s| s.num_rows())
        .expect("a segment");
    let src = big.mapped_bytes();
    let n = bytes.min(src.len()).max(1);
    let spots = (src.len() / n).max(1);
    let mut dst = vec![0u8; n];
    for k in 0..2 * iters as u64 {
        let t = Instant::now();
        sampler.plan(k, &mut plan);
        let index = t.elapsed().as_secs_f64();
        black_box(&plan);
        let t = Instant::now();
        sampler.plan(k, &mut plan);
        gatherer.gather(&plan, &mut batch)?;
        black_box(&batch);
        let both = t.elapsed().as_secs_f64();
        let from = ((k as usize * 7919) % spots) * n;
        let t = Instant::now();
        dst.copy_from_slice(&src[from..from + n]);
        black_box(&dst);
        let copy = t.elapsed().as_secs_f64();
        if k >= iters as u64 {
            index_us.push(index * 1e6);
            sample_us.push(both * 1e6);
            memcpy_us.push(copy * 1e6);
        }
    }
    let (index_med, sample_med, memcpy_med) = (
        median(&mut index_us),
        median(&mut sample_us),
        median(&mut memcpy_us),
    );
    let steps = (a.s.num_slices * a.s.slice_len as usize) as f64;
    // The loader: background workers sampling and gathering ahead.
    let loader_batches = iters as u64;
    let t = Instant::now();
    let mut loader = trajstore::Loader::try_new(
        sampler.clone(),
        gatherer.clone(),
        trajstore::LoaderOptions::default()
            .with_workers(a.workers)
            .with_prefetch(prefetch_that_fits(bytes, a.workers))
            .with_readahead(a.readahead)
            .with_max_batches(loader_batches),
    )
    .map_err(|e| anyhow::anyhow!("--workers {}: {e}", a.workers))?;
    let mut got = 0u64;
    while let Some(b) = loader.next_batch() {
        got += 1;
        loader.recycle(b);
    }
    let loader_s = t.elapsed().as_secs_f64();
    drop(loader);
    let torch = match &a.device {
        Some(d) => Some(torch_bench(
            &a,
            d,
            sampler.clone(),
            gatherer.clone(),
            bytes,
        )?),
        None => None,
    };
    let (rss_anon, rss_file) = rss_mib();
    let v = json!({
        "rss_anon_mib": rss_anon,
        "rss_file_mib": rss_file,
        "transitions": snap.num_transitions(),
        "episodes": snap.num_episodes(),
        "slice_len": a.s.slice_len,
        "num_slices": a.s.num_slices,
        "batch_bytes": bytes,
        "open_and_first_batch_ms": first_batch_ms,
        "prefault_ms": prefault_ms,
        "index_median_us": index_med,
        "sample_median_us": sample_med,
        "memcpy_floor_us": memcpy_med,
        "memcpy_floor_gb_per_s": bytes as f64 / (memcpy_med * 1e3),
        "sample_over_memcpy": sample_med / memcpy_med,
        "transitions_per_s": steps / (sample_med * 1e-6),
        "loader_workers": a.workers,
        "loader_batches_per_s": got as f64 / loader_s,
        "loader_transitions_per_s": got as f64 * steps / loader_s,
        "torch": torch,
    });
    if a.s.json {
        outln!("{v}");
    } else {
        outln!(
            "{} transitions, {} episodes; batches of {} slices x {} steps ({})",
            HumanCount(snap.num_transitions()),
            HumanCount(snap.num_episodes()),
            a.s.num_slices,
            a.s.slice_len,
            HumanBytes(bytes as u64)
        );
        outln!("open + first batch     {first_batch_ms:>10.2} ms");
        if a.prefault {
            outln!("prefault (excluded)    {prefault_ms:>10.2} ms");
        }
        outln!("index-only sampling    {index_med:>10.1} us (median of {iters})");
        outln!(
            "sample + gather        {sample_med:>10.1} us  = {:.2}x the memcpy floor",
            sample_med / memcpy_med
        );
        outln!("memcpy of same bytes   {memcpy_med:>10.1} us");
        outln!(
            "throughput             {:>10} transitions/s",
            HumanCount((steps / (sample_med * 1e-6)) as u64)
        );
        outln!(
            "loader ({} workers)    {:>10.0} batches/s, {} transitions/s",
            a.workers,
            got as f64 / loader_s,
            HumanCount((got as f64 * steps / loader_s) as u64)
        );
        if let Some(t) = &torch {
            print_torch_bench(t);
        }
        outln!(
            "resident memory        {rss_anon:>10.1} MiB anonymous, {rss_file:.1} MiB of mapped segments (page cache)"
        );
    }
    Ok(())
}

/// The torch loader's figures for `bench --device`.
#[cfg(feature = "torch")]
pub(crate) fn torch_bench(
    a: &BenchArgs,
    device: &str,
    sampler: std::sync::Arc<trajstore::SliceSampler>,
    gatherer: std::sync::Arc<trajstore::Gatherer>,
    batch_bytes: usize,
) -> Result<serde_json::Value> {
    use trajstore::torch::{TorchLoader, TorchLoaderOptions, parse_device};
    let dev = parse_device(device).map_err(one_line)?;
    let cast = a.cast;
    let iters = a.iters as u64;
    let mut opts = TorchLoaderOptions::new(dev).with_cast(cast).with_loader(
        trajstore::LoaderOptions::default()
            .with_workers(a.workers)
            .with_readahead(a.readahead)
            .with_max_batches(2 * iters),
    );
    if a.resident {
        opts = opts.with_resident(a.resident_budget);
    }
    let sync = || {
        if let tch::Device::Cuda(n) = dev {
            tch::Cuda::synchronize(n as i64);
        }
    };
    let t = Instant::now();
    let mut loader = TorchLoader::try_new(sampler, gatherer, opts).map_err(one_line)?;
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
    let t = Instant::now();
    let mut n = 0u64;
    while let Some(b) = loader.next_batch() {
        let b = b.map_err(one_line)?;
        loader.recycle(b);
        n += 1;
    }
    sync();
    let secs = t.elapsed().as_secs_f64();
    let steps = (a.s.num_slices * a.s.slice_len as usize) as f64;
    let gbps = n as f64 * batch_bytes as f64 / secs / 1e9;
    let baseline = match dev {
        tch::Device::Cuda(_) if !a.resident => Some(
            trajstore::torch::pinned_copy_bandwidth(batch_bytes, dev, 200).map_err(one_line)? / 1e9,
        ),
        _ => None,
    };
    Ok(json!({
        "device": device,
        "resident": a.resident,
        "cast": a.cast.to_string(),
        "setup_s": setup_s,
        "batches": n,
        "batches_per_s": n as f64 / secs,
        "transitions_per_s": n as f64 * steps / secs,
        "gb_per_s": gbps,
        "pinned_copy_gb_per_s": baseline,
        "over_pinned_copy": baseline.map(|b| gbps / b),
    }))
}

#[cfg(not(feature = "torch"))]
pub(crate) const NO_TORCH: &str =
    "--device needs the torch loader: rebuild with `--features torch` (see README, GPU loading)";

#[cfg(not(feature = "torch"))]
pub(crate) fn torch_bench(
    _a: &BenchArgs,
    _device: &str,
    _sampler: std::sync::Arc<trajstore::SliceSampler>,
    _gatherer: std::sync::Arc<trajstore::Gatherer>,
    _batch_bytes: usize,
) -> Result<serde_json::Value> {
    anyhow::bail!(NO_TORCH)
}

pub(crate) fn print_torch_bench(t: &serde_json::Value) {
    let f = |k: &str| t[k].as_f64().unwrap_or(f64::NAN);
    outln!(
        "torch loader ({}{})  {:>10.0} batches/s, {} transitions/s, {:.2} GB/s (setup {:.2} s)",
        t["device"].as_str().unwrap_or("?"),
        if t["resident"].as_bool() == Some(true) {
            ", resident"
        } else {
            ""
        },
        f("batches_per_s"),
        HumanCount(f("transitions_per_s") as u64),
        f("gb_per_s"),
        f("setup_s")
    );
    if t["pinned_copy_gb_per_s"].is_number() {
        outln!(
            "pinned H2D copy        {:>10.2} GB/s; the loader delivers {:.0}% of it",
            f("pinned_copy_gb_per_s"),
            100.0 * f("over_pinned_copy")
        );
    }
}
