//! `trajstore stream`: a loader over a dataset in object storage through a bounded cache, timed.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::HumanBytes;
use serde_json::json;
use trajstore::remote::{Stream, StreamOptions};
use trajstore::{BatchSource, LoaderOptions, LoaderSpec, SamplerKind, SamplerSpec, StreamLoader};

use super::*;

#[derive(Args)]
pub(crate) struct StreamArgs {
    #[command(flatten)]
    s: SliceArgs,
    /// Bytes of transition files the node's caches may hold (e.g. 2GiB), shared equally by the
    /// node's ranks (--ranks-per-node). A rank's share is at least three times the largest
    /// segment, unless it holds the whole version.
    #[arg(long, value_parser = parse_size)]
    cache_limit: u64,
    /// Ranks on this node streaming at once (default: $LOCAL_WORLD_SIZE as torchrun sets it,
    /// else 1): each keeps cache-limit / ranks-per-node, and takes files another rank of the
    /// node holds (hard links) instead of downloading them again.
    #[arg(long)]
    ranks_per_node: Option<u64>,
    /// uniform (with replacement, over a rotating window of resident segments) or epoch
    /// (without replacement: every slice of this rank's share once per epoch).
    #[arg(long, default_value = "uniform", value_parser = ["uniform", "epoch"])]
    sampling: String,
    /// Uniform sampling: draws per transition before its segment rotates out, on average.
    #[arg(long, default_value_t = 4.0)]
    reuse: f64,
    /// This process's rank (default: $RANK as torchrun sets it, else 0).
    #[arg(long)]
    rank: Option<u64>,
    /// Number of ranks, each streaming a disjoint share (default: $WORLD_SIZE, else 1).
    #[arg(long)]
    world_size: Option<u64>,
    /// Batches to load (default: 200, or one epoch with --sampling epoch).
    #[arg(long)]
    batches: Option<u64>,
    /// Loader worker threads.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Read this version instead of the newest.
    #[arg(long)]
    version: Option<u64>,
    /// Move to newer versions as they are pushed: at the end of every round the loader reads
    /// the store's newest manifest and continues with it (one rank only).
    #[arg(long)]
    follow: bool,
}

/// `flag`, else the environment variable `var` (as torchrun sets it), else `default`.
fn from_env(flag: Option<u64>, var: &str, default: u64) -> Result<u64> {
    match (flag, std::env::var(var)) {
        (Some(v), _) => Ok(v),
        (None, Ok(s)) => s
            .trim()
            .parse()
            .with_context(|| format!("${var} is `{s}`, not a number")),
        (None, Err(_)) => Ok(default),
    }
}

pub(crate) fn run(mut a: StreamArgs) -> Result<()> {
    a.rank = Some(from_env(a.rank, "RANK", 0)?);
    a.world_size = Some(from_env(a.world_size, "WORLD_SIZE", 1)?);
    let (rank, world_size) = (a.rank.unwrap_or(0), a.world_size.unwrap_or(1));
    let url = a.s.dataset.to_string_lossy().into_owned();
    if !trajstore::format::is_url(&url) {
        bail!(
            "`trajstore stream` reads a URL (s3://BUCKET/PREFIX or file:///PATH); for a local dataset use `trajstore bench`"
        );
    }
    let mut o = StreamOptions::new(a.cache_limit);
    o.ranks_per_node = from_env(a.ranks_per_node, "LOCAL_WORLD_SIZE", 1)?;
    o.reuse = a.reuse;
    o.version = a.version;
    o.remote = crate::open::reader_remote_options();
    let t0 = Instant::now();
    let stream = Stream::open(&url, o)
        .map_err(crate::output::one_line)
        .with_context(|| format!("cannot open {url} for streaming"))?;
    let opened = t0.elapsed().as_secs_f64();
    let kind: SamplerKind = a.sampling.parse()?;
    let mut sampler = SamplerSpec::new(kind, a.s.slice_len, a.s.num_slices)
        .with_policy(a.s.policy)
        .with_weighting(a.s.weighting)
        .with_seed(a.s.seed);
    if let Some(q) = &a.s.episodes {
        // From the catalog (and ranged reads of `transitions`): only the segments holding the
        // subset's episodes are downloaded.
        use trajstore::sql::StreamSql;
        let ids = stream
            .episodes_where(q)
            .map_err(crate::output::one_line)
            .with_context(|| format!("the --episodes query failed: {q}"))?;
        sampler = sampler.with_episode_ids(ids);
    }
    let mut opts = LoaderOptions::default().with_workers(a.workers);
    let batches = match (a.batches, kind) {
        (Some(n), _) => Some(n),
        (None, SamplerKind::Epoch) => None,
        (None, _) => Some(200),
    };
    if let Some(n) = batches {
        opts = opts.with_max_batches(n);
    }
    let cols: Vec<&str> = a.s.columns.iter().map(String::as_str).collect();
    let mut spec = LoaderSpec::streamed(stream.clone(), sampler, &cols).with_rank(rank, world_size);
    if a.follow {
        spec = spec.follow(trajstore::Follow::default());
    }
    let spec = a.s.stacked(spec)?;
    let mut loader = BatchSource::open(spec)
        .and_then(|source| StreamLoader::new(&source, opts))
        .map_err(crate::output::one_line)?;
    let t = Instant::now();
    let (mut n, mut first) = (0u64, None);
    let mut episodes = std::collections::BTreeSet::new();
    while let Some(b) = loader.next_batch() {
        let b = b.map_err(crate::output::one_line)?;
        first.get_or_insert(t.elapsed().as_secs_f64());
        episodes.extend(b.episode_id.iter().copied());
        n += 1;
        loader.recycle(b);
    }
    let secs = t.elapsed().as_secs_f64();
    let st = loader.stats();
    let per = (a.s.num_slices * a.s.slice_len as usize) as f64;
    if a.s.json {
        outln!(
            "{}",
            json!({
                "url": url, "version": stream.catalog().version(), "rank": rank,
                "world_size": world_size, "sampling": a.sampling,
                "batches": n, "seconds": secs, "first_batch_seconds": first,
                "open_seconds": opened,
                "batches_per_second": n as f64 / secs, "transitions_per_second": n as f64 * per / secs,
                "episodes_seen": episodes.len(), "stats": st,
                "follow": {"refreshes": loader.follow_refreshes(), "failures": loader.follow_failures()},
                "cache_dir": stream.cache_dir(rank),
            })
        );
        return Ok(());
    }
    outln!(
        "streamed {n} batches of {} x {} from {url} (rank {} of {}) in {secs:.2} s: {:.0} batches/s, first batch after {:.2} s",
        a.s.num_slices,
        a.s.slice_len,
        rank,
        world_size,
        n as f64 / secs,
        first.unwrap_or(0.0)
    );
    outln!(
        "  downloaded {} in {} files ({} resumed), {} from the node's other ranks, {} evicted, {} windows; workers waited {:.2} s for downloads",
        HumanBytes(st.bytes_downloaded),
        st.files_downloaded,
        HumanBytes(st.bytes_resumed),
        st.files_shared,
        st.files_evicted,
        st.windows_opened,
        st.wait_seconds
    );
    outln!(
        "  cache {} of {} (peak {}) in {}",
        HumanBytes(st.cache_bytes),
        HumanBytes(st.cache_limit),
        HumanBytes(st.peak_cache_bytes),
        stream.cache_dir(rank).display()
    );
    Ok(())
}
