//! `trajstore bench`: sampling, gather and loader throughput against memcpy of the same bytes,
//! with the disk reads of each phase (cold or warm), and with `--io-floor` against the disk's own
//! random-read limit on the same files.

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use indicatif::{HumanBytes, HumanCount};
use serde_json::json;

use super::bench_text::{print_consumer, print_frame_cache, print_io_floor};
use super::bench_torch::*;
use super::sample::{slice_sampler, slice_spec};
use super::*;
use crate::open::*;
use crate::output::*;

/// `bench --help`, after the options: what the figures mean and how to measure a cold run.
const AFTER_HELP: &str = "\
What is measured, in this order:
  open + first batch   open the dataset, build the gatherer and sampler, gather batch 0.
  sample + gather      one thread plans and gathers batches 0 to 2*ITERS-1 (the first ITERS
                       warm up); medians, set against a memcpy of the same number of bytes.
  loader               WORKERS threads gather ITERS batches from batch 2*ITERS on: batches no
                       earlier phase read, so the loader is as cold as the data is.
  pages per batch      distinct memory pages one batch's gather reads from the mapped segments
                       (mean of 64 batches): on data not in memory, one random disk read each.
Each phase reports its major page faults (getrusage) and the bytes the process read from disk
(/proc/self/io): both near zero when the data is in the page cache (warm), large when it is not.

Cold runs: drop the page cache first (as root), so that every batch reads from disk:
  sync; echo 3 > /proc/sys/vm/drop_caches          # or: sync; echo 3 | sudo tee /proc/sys/vm/drop_caches
  trajstore bench big.trajstore --io-floor
A dataset larger than RAM is cold by nature: most of its pages are not in memory.

--io-floor measures, after everything else, what the disk can do at all on the same segment
files: random reads with O_DIRECT (they neither hit nor fill the page cache), 4 KiB at 1, 4, 16
and 64 in flight (IOPS), and 1 MiB at 16 in flight (bandwidth), about 2 s each. The floor is the
batches/s the disk serves if every page of a batch is one random read:
  floor = min(IOPS at queue depth 64 / pages per batch, bandwidth / (pages per batch x page size))
and loader / floor says how close the loader comes to it. Above 1, the loader's batches came
(in part) from the page cache, not from the disk.

Examples:
  trajstore bench demo.trajstore --json
  sync; echo 3 > /proc/sys/vm/drop_caches; trajstore bench big.trajstore --io-floor --workers 8";

#[derive(Args)]
#[command(after_long_help = AFTER_HELP)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) s: SliceArgs,
    /// Timed iterations (after as many warm-up ones), 1 to 10000000.
    #[arg(
        long,
        default_value_t = 200,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000)
    )]
    pub(crate) iters: usize,
    /// Loader workers for the loader measurement (1 to 1024).
    #[arg(
        long,
        default_value_t = 2,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
            .range(1..=trajstore::loader::MAX_WORKERS as u64)
    )]
    pub(crate) workers: usize,
    /// Batches the loader queues ahead of the consumer (1 to 4096; default 4, for the CPU loader
    /// fewer where the batches in flight would not fit the library's memory limit). The workers
    /// run at most `workers * burst + prefetch` batches ahead of the consumer: a deeper queue
    /// rides out a worker that the OS deschedules for a while, at the cost of memory.
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096)
    )]
    pub(crate) prefetch: Option<usize>,
    /// How pages that are not in memory are read: `auto` asks the kernel for all the pages of
    /// a batch at once (and loader workers for their next batch's) while gathers take major page
    /// faults, and stops once the pages are found in memory; `always`; `never` (each page is
    /// faulted in when the copy reaches it).
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = |s: &str| s.parse::<trajstore::ReadAhead>())]
    read_ahead: trajstore::ReadAhead,
    /// Map every page before timing (MADV_POPULATE_READ): steady state from the first batch.
    #[arg(long)]
    prefault: bool,
    /// After every other measurement, measure the disk's random-read limit on the dataset's
    /// segment files (O_DIRECT, about 10 s) and report the loader as a fraction of the batches/s
    /// that limit allows (see below).
    #[arg(long)]
    io_floor: bool,
    /// Seconds of each of the five --io-floor measurements.
    #[arg(long, hide = true, default_value_t = 2.0, requires = "io_floor")]
    io_floor_secs: f64,
    /// Run the torch loader to this device (cpu, cuda, cuda:N) after the CPU figures: batches/s,
    /// GB/s, and on CUDA the bandwidth of a plain pinned host-to-device copy of the same bytes
    /// as the baseline. Needs a build with `--features torch`.
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    /// With --device: upload the columns to the device once and sample there (GPU-resident mode).
    #[arg(long, requires = "device")]
    pub(crate) resident: bool,
    /// Device memory the resident columns may take.
    #[arg(long, default_value = "8GiB", value_parser = parse_size, requires = "resident")]
    pub(crate) resident_budget: u64,
    /// With --resident: gather with libtorch operations (an index_select per column and a
    /// dozen element-wise kernels) instead of the one fused kernel a batch (NVRTC on a GPU):
    /// to compare the two.
    #[arg(long, requires = "resident")]
    pub(crate) resident_unfused: bool,
    /// With --resident: the fused kernel reads each batch's per-slice parameters in the
    /// workers' pinned buffer (mapped by the GPU) instead of a copy to the device before its
    /// launch: to compare the two.
    #[arg(long, requires = "resident", conflicts_with = "resident_unfused")]
    pub(crate) resident_mapped_params: bool,
    /// With --device and --frame-window: ship each window's stored frames (tens of bytes each)
    /// and decode them where the batch lands (a kernel of one thread per frame on a GPU, its
    /// C++ copy on the CPU) instead of in the workers.
    #[arg(long, requires = "device")]
    pub(crate) device_decode: bool,
    /// With --device: ship the full batch (every step's next_observation and flag planes)
    /// instead of the compact one (next_observation derived on the device from one row a slice,
    /// the flags from each slice's span): to compare the bytes and the rate.
    #[arg(long, requires = "device")]
    pub(crate) full_batch: bool,
    /// With --device: expand the compact batch with libtorch operations (~40 small kernels)
    /// instead of the one fused kernel (NVRTC on a GPU): to compare the two.
    #[arg(long, requires = "device", conflicts_with = "full_batch")]
    pub(crate) ops_expand: bool,
    /// With --device cuda: give each batch a new device allocation and views, made by the worker
    /// on the default stream, instead of the device ring (buffers and views made once, the copy
    /// on the worker's own stream): to compare the two.
    #[arg(long, requires = "device")]
    pub(crate) no_device_ring: bool,
    /// With --device-decode: a GPU thread decodes each frame instead of a warp of 32 lanes.
    #[arg(long, requires = "device_decode")]
    pub(crate) device_decode_per_thread: bool,
    /// With --device: measure the device loader only (no CPU phases; what the GPU check uses
    /// for batches too large to time on the CPU). JSON: {"transitions", ..., "torch": {...}}.
    #[arg(long, requires = "device")]
    device_only: bool,
    /// The loader phase follows new versions, looking every SECS seconds (at most a day; run
    /// a collector meanwhile, `trajstore demo DATASET --append` in a loop): following's cost.
    #[arg(long, value_name = "SECS", value_parser = positive_secs)]
    follow: Option<f64>,
    /// The loader phase spends US µs on every batch it takes, as a training step would (a busy
    /// wait on the consuming thread), and reports how long it waited for the next batch: whether
    /// the loader keeps a step of that length fed. JSON: loader_consumer.
    #[arg(long, value_name = "US", value_parser = step_us)]
    consumer_us: Option<f64>,
    /// With --device: cast floating columns on the device (none, bf16, f16).
    #[cfg(feature = "torch")]
    #[arg(long, default_value = "none", requires = "device")]
    pub(crate) cast: trajstore::torch::FloatCast,
}

fn step_us(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1e6).contains(&x) => Ok(x),
        _ => Err(format!("`{s}`: a step of 0 to 1,000,000 µs")),
    }
}

fn positive_secs(s: &str) -> std::result::Result<f64, String> {
    let x: f64 = s
        .parse()
        .map_err(|_| format!("`{s}`: a number of seconds"))?;
    trajstore::Follow::every_secs("--follow", x)
        .map(|_| x)
        .map_err(|e| e.to_string())
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

/// Batches of the "open + first batches" figure.
const FIRST_K: u64 = 50;

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What this process has read from disk so far: major page faults (a mapped page read from disk;
/// all threads, joined ones included) and bytes read from storage (`read_bytes` of
/// /proc/self/io; `None` where it cannot be read).
#[derive(Clone, Copy, Debug)]
struct DiskReads {
    major_faults: u64,
    read_bytes: Option<u64>,
}

impl DiskReads {
    fn now() -> Self {
        let read_bytes = std::fs::read_to_string("/proc/self/io").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("read_bytes:"))
                .and_then(|v| v.trim().parse().ok())
        });
        Self {
            major_faults: trajstore::gather::major_faults(),
            read_bytes,
        }
    }

    /// The reads between `before` and now.
    fn since(before: Self) -> Self {
        let now = Self::now();
        Self {
            major_faults: now.major_faults.saturating_sub(before.major_faults),
            read_bytes: now
                .read_bytes
                .zip(before.read_bytes)
                .map(|(a, b)| a.saturating_sub(b)),
        }
    }
}

/// One timed phase: its length, the batches it gathered and what it read from disk.
fn phase(secs: f64, batches: u64, r: DiskReads) -> serde_json::Value {
    json!({
        "secs": secs,
        "batches": batches,
        "major_faults": r.major_faults,
        "disk_read_bytes": r.read_bytes,
    })
}

/// The means of [`trajstore::Gatherer::reads_touched`] (pages, runs of adjacent pages) over 64
/// plans from batch `from` on.
fn pages_per_batch(
    sampler: &dyn trajstore::Sampler,
    gatherer: &trajstore::Gatherer,
    from: u64,
) -> (f64, f64) {
    let mut plan = vec![];
    let n = 64;
    let (pages, runs) = (from..from + n)
        .map(|k| {
            sampler.plan(k, &mut plan);
            gatherer.reads_touched(&plan)
        })
        .fold((0, 0), |(p, r), (a, b)| (p + a, r + b));
    (pages as f64 / n as f64, runs as f64 / n as f64)
}

/// `--io-floor`: random reads over the snapshot's segment files at several queue depths, and the
/// batches/s they allow for batches of `pages` pages of `page` bytes.
fn io_floor(
    snap: &trajstore::Snapshot,
    secs: f64,
    seed: u64,
    pages: f64,
    runs: f64,
    page: usize,
) -> Result<serde_json::Value> {
    use trajstore::iofloor::random_reads;
    let files: Vec<std::path::PathBuf> = snap
        .segments()
        .iter()
        .map(|s| snap.path().join(&s.entry().path))
        .collect();
    let file_bytes: u64 = snap.segments().iter().map(|s| s.entry().bytes).sum();
    let d = Duration::from_secs_f64(secs.max(0.01));
    let mut random_4k = vec![];
    let mut direct = true;
    let (mut iops_64, mut iops_max) = (0.0f64, 0.0f64);
    for qd in [1, 4, 16, 64, 256] {
        let r = random_reads(&files, 4096, qd, d, seed)?;
        direct &= r.direct;
        if qd == 64 {
            iops_64 = r.ios_per_s;
        }
        iops_max = iops_max.max(r.ios_per_s);
        random_4k.push(json!({
            "block": r.block,
            "queue_depth": r.queue_depth,
            "ios_per_s": r.ios_per_s,
            "bytes_per_s": r.bytes_per_s,
            "ios": r.ios,
            "secs": r.secs,
            "batches_per_s": r.ios_per_s / pages,
        }));
    }
    let bw = random_reads(&files, 1 << 20, 16, d, seed)?;
    direct &= bw.direct;
    let batch_touched = pages * page as f64;
    let floor = (iops_64 / pages).min(bw.bytes_per_s / batch_touched);
    // Stricter: one read per run of adjacent pages (what the kernel submits for a slice whose
    // pages are asked for at once), at the best queue depth measured.
    let runs_floor = (iops_max / runs.max(1.0)).min(bw.bytes_per_s / batch_touched);
    Ok(json!({
        "direct": direct,
        "files": files.len(),
        "file_bytes": file_bytes,
        "random_4k": random_4k,
        "bandwidth": {
            "block": bw.block,
            "queue_depth": bw.queue_depth,
            "ios_per_s": bw.ios_per_s,
            "bytes_per_s": bw.bytes_per_s,
            "ios": bw.ios,
            "secs": bw.secs,
            "batches_per_s": bw.bytes_per_s / batch_touched,
        },
        "floor_batches_per_s": floor,
        "runs_floor_batches_per_s": runs_floor,
    }))
}

pub(crate) fn run(a: BenchArgs) -> Result<()> {
    use std::hint::black_box;
    // A device that cannot work is an error before minutes of measurements, not after.
    #[cfg(feature = "torch")]
    if let Some(d) = &a.device {
        trajstore::torch::parse_device(d).map_err(one_line)?;
    }
    #[cfg(not(feature = "torch"))]
    if a.device.is_some() {
        anyhow::bail!(NO_TORCH);
    }
    if !(a.io_floor_secs > 0.0 && a.io_floor_secs <= 600.0) {
        anyhow::bail!(
            "--io-floor-secs {}: must be more than 0 and at most 600",
            a.io_floor_secs
        );
    }
    let iters = a.iters;
    // Batch numbers of each phase, none used twice: the single-threaded loop gathers 0..2*iters,
    // the loader 2*iters..3*iters, the torch loader 3*iters..5*iters; pages are counted on
    // 64 batches after those (counting reads no data).
    let loader_start = 2 * iters as u64;
    let torch_start = 3 * iters as u64;
    let pages_from = 5 * iters as u64;
    let reads0 = DiskReads::now();
    let t0 = Instant::now();
    let snap = open_snapshot(&a.s.dataset, None)?;
    let mut prefault_ms = 0.0;
    if a.prefault {
        let t = Instant::now();
        snap.prefault();
        prefault_ms = t.elapsed().as_secs_f64() * 1e3;
    }
    let cols: Vec<&str> = a.s.columns.iter().map(String::as_str).collect();
    let gatherer = std::sync::Arc::new(a.s.gatherer(&snap)?);
    gatherer.set_read_ahead(a.read_ahead);
    check_batch_size(&gatherer, &a.s)?;
    let sampler = slice_sampler(&snap, &a.s)?;
    let mut plan = vec![];
    let mut batch = trajstore::Batch::default();
    sampler.plan(0, &mut plan);
    gatherer.gather(&plan, &mut batch)?;
    let first_batch_s = t0.elapsed().as_secs_f64();
    let first_batch_ms = first_batch_s * 1e3;
    if a.device_only {
        let device = a.device.as_deref().expect("clap: requires --device");
        let source = trajstore::BatchSource::open(
            a.s.stacked(
                trajstore::LoaderSpec::single(snap.clone(), slice_spec(&snap, &a.s)?, &cols)
                    .with_read_ahead(a.read_ahead),
            )?,
        )?;
        let torch = torch_bench(&a, device, &source, batch.data_bytes(), 0)?;
        let v = json!({
            "transitions": snap.num_transitions(),
            "episodes": snap.num_episodes(),
            "slice_len": a.s.slice_len,
            "num_slices": a.s.num_slices,
            "batch_bytes": batch.data_bytes(),
            "open_and_first_batch_ms": first_batch_ms,
            "torch": torch,
        });
        if a.s.json {
            outln!("{v}");
        } else {
            print_torch_bench(&v["torch"]);
        }
        return Ok(());
    }
    let open_reads = DiskReads::since(reads0);
    let bytes = batch.data_bytes();
    // The single-threaded loop: index-only sampling, then sample + gather, of batches
    // 0..2*iters (the first half warms up).
    let mut index_us = Vec::with_capacity(iters);
    let mut sample_us = Vec::with_capacity(iters);
    // Open + the first FIRST_K batches of this loop (batch 0 again is not counted twice): the
    // time until a training loop that gathers on its own thread has had FIRST_K batches.
    let mut first_k_s = first_batch_s;
    let reads = DiskReads::now();
    let t = Instant::now();
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
        if (1..FIRST_K).contains(&k) {
            first_k_s += both;
        }
        if k >= iters as u64 {
            index_us.push(index * 1e6);
            sample_us.push(both * 1e6);
        }
    }
    let loop_s = t.elapsed().as_secs_f64();
    let loop_reads = DiskReads::since(reads);
    // The compact batch of the same plans (what the CUDA loaders gather into pinned memory and
    // ship): its bytes and the median of sample + gather, on batches the loop warmed.
    let (compact_bytes, compact_med) = compact_gather(
        sampler.as_ref(),
        &gatherer,
        (a.s.num_slices, a.s.slice_len as usize),
        iters as u64..2 * iters as u64,
    )?;
    let (index_med, sample_med) = (median(&mut index_us), median(&mut sample_us));
    let steps = (a.s.num_slices * a.s.slice_len as usize) as f64;
    // The loader: background workers sampling and gathering ahead, on batches nothing above read.
    let loader_batches = iters as u64;
    let reads = DiskReads::now();
    let t = Instant::now();
    let mut spec = a.s.stacked(
        trajstore::LoaderSpec::single(snap.clone(), slice_spec(&snap, &a.s)?, &cols)
            .with_read_ahead(a.read_ahead),
    )?;
    if let Some(secs) = a.follow {
        spec = spec.follow(trajstore::Follow::every_secs("--follow", secs)?);
    }
    let source = trajstore::BatchSource::open(spec.clone())?;
    let mut loader = trajstore::Loader::new(
        &source,
        trajstore::LoaderOptions::default()
            .with_workers(a.workers)
            .with_prefetch(
                a.prefetch
                    .unwrap_or_else(|| prefetch_that_fits(bytes, a.workers)),
            )
            .with_start(loader_start)
            .with_max_batches(loader_batches),
    )
    .map_err(|e| anyhow::anyhow!("--workers {}: {e}", a.workers))?;
    let first_version = loader.versions()[0];
    let mut got = 0u64;
    // Under --consumer-us: the time spent waiting for each batch after the first (the first
    // waits for the workers' start), and the batches that waited over 10 µs.
    let (mut waited, mut waits) = (Duration::ZERO, 0u64);
    let step = a.consumer_us.map(|us| Duration::from_secs_f64(us * 1e-6));
    loop {
        let asked = Instant::now();
        let Some(b) = loader.next_batch() else { break };
        if let Some(step) = step {
            let wait = asked.elapsed();
            if got > 0 {
                waited += wait;
                waits += u64::from(wait > Duration::from_micros(10));
            }
            let until = Instant::now() + step;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        got += 1;
        loader.recycle(b);
    }
    let loader_s = t.elapsed().as_secs_f64();
    let timed = got.saturating_sub(1).max(1) as f64;
    let consumer = json!({
        "step_us": a.consumer_us,
        "wait_us_per_batch": step.map(|_| waited.as_secs_f64() * 1e6 / timed),
        "waited_share": step.map(|_| waits as f64 / timed),
    });
    // Batches the workers made rather than reused (every batch is recycled: the window's worth).
    let batches_made = loader.recycler().batches_made();
    // How evenly the workers' cores ran: each takes the next batch no worker has.
    let per_worker = loader.batches_per_worker();
    // What a checkpoint of the loader costs: its state, as bytes, and a source opened from it.
    let t_state = Instant::now();
    let state_bytes = loader.state().to_bytes();
    let state_save_us = t_state.elapsed().as_secs_f64() * 1e6;
    let follow = json!({
        "every_s": a.follow,
        "first_version": first_version,
        "last_version": loader.versions()[0],
        "refreshes": loader.follow_stats().refreshes,
        "failures": loader.follow_stats().failures,
        "refresh_seconds": loader.follow_stats().refresh_seconds,
    });
    // Joined workers' faults and reads count in the process's totals.
    drop(loader);
    let t_state = Instant::now();
    let state = trajstore::LoaderState::from_bytes(&state_bytes)?;
    let resumed = trajstore::BatchSource::open(spec.with_resume(state))?;
    let state_resume_ms = t_state.elapsed().as_secs_f64() * 1e3;
    drop(resumed);
    let loader_reads = DiskReads::since(reads);
    let loader_bps = got as f64 / loader_s;
    let torch = match &a.device {
        Some(d) => Some(torch_bench(&a, d, &source, bytes, torch_start)?),
        None => None,
    };
    let page = trajstore::iofloor::page_size();
    let (pages, runs) = pages_per_batch(sampler.as_ref(), &gatherer, pages_from);
    // The memcpy floor: the same number of bytes as one batch's data, copied in one go from the
    // mapped data into a destination allocated once. The source moves through the largest segment
    // every iteration, so that it comes from memory (as the gathered slices do), not from a CPU
    // cache that a repeated copy of the same bytes would hit. Measured after the loader (whose
    // batches its reads would warm), with its sources read into the page cache first: a floor of
    // copies from memory, not from disk.
    let big = snap
        .segments()
        .iter()
        .max_by_key(|s| s.num_rows())
        .expect("a segment");
    let src = big.mapped_bytes();
    let n = bytes.min(src.len()).max(1);
    let spots = (src.len() / n).max(1);
    let spot = |k: u64| ((k as usize * 7919) % spots) * n;
    for k in 0..2 * iters as u64 {
        big.advise_willneed(&src[spot(k)..spot(k) + n]);
    }
    let mut memcpy_us = Vec::with_capacity(iters);
    let mut dst = vec![0u8; n];
    for k in 0..2 * iters as u64 {
        let from = spot(k);
        let t = Instant::now();
        dst.copy_from_slice(&src[from..from + n]);
        black_box(&dst);
        if k >= iters as u64 {
            memcpy_us.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let memcpy_med = median(&mut memcpy_us);
    let (rss_anon, rss_file) = rss_mib();
    // Last: the disk's own limit (O_DIRECT reads leave the page cache as the phases left it).
    let floor = if a.io_floor {
        Some(io_floor(
            &snap,
            a.io_floor_secs,
            a.s.seed,
            pages,
            runs,
            page,
        )?)
    } else {
        None
    };
    let floor_bps = floor
        .as_ref()
        .and_then(|f| f["floor_batches_per_s"].as_f64());
    let per_batch =
        |r: DiskReads, batches: u64| r.read_bytes.map(|b| b as f64 / batches.max(1) as f64);
    let mut v = json!({
        "rss_anon_mib": rss_anon,
        "rss_file_mib": rss_file,
        "transitions": snap.num_transitions(),
        "episodes": snap.num_episodes(),
        "slice_len": a.s.slice_len,
        "num_slices": a.s.num_slices,
        "batch_bytes": bytes,
        "bytes_per_batch": bytes,
        "page_size": page,
        "pages_per_batch": pages,
        "page_runs_per_batch": runs,
        "bytes_touched_per_batch": pages * page as f64,
        "open_and_first_batch_ms": first_batch_ms,
        "first_50_batches_s": (2 * iters as u64 >= FIRST_K).then_some(first_k_s),
        "read_ahead": a.read_ahead.to_string(),
        "reading_ahead_at_end": gatherer.reading_ahead(),
        "plans_read_ahead": gatherer.plans_read_ahead(),
        "prefault_ms": prefault_ms,
        "index_median_us": index_med,
        "sample_median_us": sample_med,
        "memcpy_floor_us": memcpy_med,
        "memcpy_floor_gb_per_s": bytes as f64 / (memcpy_med * 1e3),
        "sample_over_memcpy": sample_med / memcpy_med,
        "compact": json!({
            "batch_bytes": compact_bytes,
            "sample_median_us": compact_med,
            "over_full": compact_med / sample_med,
        }),
        "transitions_per_s": steps / (sample_med * 1e-6),
        "loader_workers": a.workers,
        "loader_first_batch": loader_start,
        "loader_batches_per_s": loader_bps,
        "loader_batches_made": batches_made,
        "loader_transitions_per_s": got as f64 * steps / loader_s,
        "loader_disk_bytes_per_batch": per_batch(loader_reads, got),
        "loader_follow": follow,
        "state_bytes": state_bytes.len(),
        "state_save_us": state_save_us,
        "state_resume_ms": state_resume_ms,
        "phases": {
            "open_and_first_batch": phase(first_batch_s, 1, open_reads),
            "single_thread": phase(loop_s, 2 * iters as u64, loop_reads),
            "loader": phase(loader_s, got, loader_reads),
        },
        "io_floor": floor,
        "floor_batches_per_s": floor_bps,
        "loader_over_floor": floor_bps.map(|f| loader_bps / f),
        "loader_over_runs_floor": floor
            .as_ref()
            .and_then(|f| f["runs_floor_batches_per_s"].as_f64())
            .map(|f| loader_bps / f),
        "torch": torch,
    });
    // (Beside the macro: more keys there pass serde_json's recursion limit.)
    v["loader_consumer"] = consumer;
    v["loader_batches_per_worker"] = json!(per_worker);
    let fc = gatherer.frame_cache();
    v["frame_cache"] = json!({
        "frames": fc.frames,
        "frames_stored": fc.frames_stored,
        "bytes": fc.bytes,
        "fill_seconds": fc.fill_seconds,
    });
    if a.s.json {
        outln!("{v}");
        return Ok(());
    }
    outln!(
        "{} transitions, {} episodes; batches of {} slices x {} steps ({})",
        HumanCount(snap.num_transitions()),
        HumanCount(snap.num_episodes()),
        a.s.num_slices,
        a.s.slice_len,
        HumanBytes(bytes as u64)
    );
    outln!(
        "pages per batch        {pages:>10.1} pages of {} = {} read from the mapped segments, in {runs:.0} runs of adjacent pages",
        HumanBytes(page as u64),
        HumanBytes((pages * page as f64) as u64)
    );
    outln!("open + first batch     {first_batch_ms:>10.2} ms");
    print_frame_cache(&v["frame_cache"]);
    if 2 * iters as u64 >= FIRST_K {
        outln!("open + first {FIRST_K} batches {first_k_s:>9.3} s (one thread)");
    }
    if a.prefault {
        outln!("prefault (excluded)    {prefault_ms:>10.2} ms");
    }
    outln!("index-only sampling    {index_med:>10.1} us (median of {iters})");
    outln!(
        "sample + gather        {sample_med:>10.1} us  = {:.2}x the memcpy floor",
        sample_med / memcpy_med
    );
    outln!(
        "compact batch          {compact_med:>10.1} us  ({}: next_observation one row per slice, \
         flags as spans; what CUDA loaders ship)",
        HumanBytes(compact_bytes as u64)
    );
    outln!("memcpy of same bytes   {memcpy_med:>10.1} us");
    outln!(
        "throughput             {:>10} transitions/s",
        HumanCount((steps / (sample_med * 1e-6)) as u64)
    );
    outln!(
        "{:<23}{loader_bps:>10.0} batches/s, {} transitions/s (from batch {loader_start})",
        format!("loader ({} workers)", a.workers),
        HumanCount((got as f64 * steps / loader_s) as u64)
    );
    if let (Some(lo), Some(hi), true) = (
        per_worker.iter().min(),
        per_worker.iter().max(),
        per_worker.len() > 1,
    ) {
        outln!("  batches per worker   {lo} to {hi} (a worker takes the next batch free)");
    }
    if let Some(secs) = a.follow {
        outln!(
            "  following (every {secs} s): versions {} to {}, {} refreshes",
            follow["first_version"],
            follow["last_version"],
            follow["refreshes"]
        );
    }
    print_consumer(&v);
    outln!(
        "loader state           {:>10} bytes; state() + to_bytes {state_save_us:.1} us, resume \
         (check + open) {state_resume_ms:.2} ms",
        state_bytes.len()
    );
    if let Some(t) = &torch {
        print_torch_bench(t);
    }
    outln!(
        "resident memory        {rss_anon:>10.1} MiB anonymous, {rss_file:.1} MiB of mapped segments (page cache)"
    );
    outln!("");
    outln!(
        "read from disk         {:>10} {:>14} {:>14}",
        "batches",
        "major faults",
        "bytes"
    );
    let disk = |r: DiskReads| {
        r.read_bytes
            .map_or("?".to_string(), |b| HumanBytes(b).to_string())
    };
    for (name, batches, r) in [
        ("open + first batch", 1, open_reads),
        ("single-threaded loop", 2 * iters as u64, loop_reads),
        ("loader", got, loader_reads),
    ] {
        outln!(
            "  {name:<21}{:>10} {:>14} {:>14}",
            HumanCount(batches).to_string(),
            HumanCount(r.major_faults).to_string(),
            disk(r)
        );
    }
    if let Some(b) = per_batch(loader_reads, got) {
        outln!(
            "  loader, per batch    {:>10} {:>14} {:>14} of {} touched{}",
            "",
            "",
            HumanBytes(b as u64).to_string(),
            HumanBytes((pages * page as f64) as u64),
            if b < 0.01 * pages * page as f64 {
                " (warm: the pages were in memory)"
            } else {
                ""
            }
        );
    }
    if let Some(f) = &floor {
        print_io_floor(f, loader_bps);
    }
    Ok(())
}

/// Samples and gathers the compact batch ([`trajstore::CompactInto`]) of `batches` into host
/// buffers allocated once: its bytes and the median time per batch in µs.
fn compact_gather(
    sampler: &dyn trajstore::Sampler,
    gatherer: &trajstore::Gatherer,
    (b, l): (usize, usize),
    batches: std::ops::Range<u64>,
) -> Result<(usize, f64)> {
    let tails = gatherer.tail_columns().to_vec();
    let full = gatherer.column_bytes(b, l);
    let mut columns: Vec<Vec<u8>> = gatherer
        .step_bytes()
        .iter()
        .zip(gatherer.leads())
        .zip(&tails)
        .zip(full)
        .map(|(((&s, lead), &t), full)| match t {
            true => vec![0u8; b * trajstore::gather::tail_bytes(s, lead)],
            false => vec![0u8; full.expect("the batch's size was checked")],
        })
        .collect();
    let (mut spans, mut ids, mut starts) = (vec![0i32; 3 * b], vec![0u64; b], vec![0i64; b]);
    let bytes = columns.iter().map(Vec::len).sum::<usize>() + b * (12 + 16);
    let mut plan = vec![];
    let mut us = Vec::with_capacity(batches.end.saturating_sub(batches.start) as usize);
    for k in batches {
        let t = Instant::now();
        sampler.plan(k, &mut plan);
        gatherer.gather_compact(
            &plan,
            l,
            trajstore::CompactInto {
                columns: columns.iter_mut().map(Vec::as_mut_slice).collect(),
                spans: &mut spans,
                episode_id: &mut ids,
                start_step: &mut starts,
            },
        )?;
        std::hint::black_box(&columns);
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok((bytes, median(&mut us)))
}
