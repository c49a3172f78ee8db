//! Streaming reads of a dataset in object storage through a bounded cache, against a real
//! S3-compatible server (moto's; see `tests/common/s3.rs`): the cache never holds more than its
//! limit on disk, every batch comes from the resident window and equals the local dataset's
//! gather of the same plan, ranks download disjoint shares that cover the version, the ranks of
//! one node share its limit and take each other's files instead of downloading them, an
//! interrupted download resumes, and damaged objects are errors naming them.

#![cfg(feature = "remote")]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::common::s3::S3Server;
use crate::common::{TestData, assert_invalid_argument, err_of};
use trajstore::remote::{Stream, StreamOptions};
use trajstore::{
    Batch, BatchSource, Dataset, EpochSampler, Follow, Gatherer, LoaderOptions, LoaderSpec,
    Sampler, SamplerKind, SamplerSpec, SliceRef, SliceSampler, Snapshot, StreamLoader,
};

const COLUMNS: [&str; 3] = ["observation", "action", "reward"];

/// 24,000 transitions in 64 KiB segments (about 20 of them) at `dir/local`.
fn walker(dir: &Path, seed: u64) -> Dataset {
    TestData::new()
        .obs_dim(8)
        .seed(seed)
        .transitions(24_000)
        .mean_episode_len(60.0)
        .segment_bytes(64 << 10)
        .write(&dir.join("local"))
}

/// [`walker`] pushed to `bucket`.
fn pushed(s3: &S3Server, bucket: &str, dir: &Path) -> (String, Dataset) {
    let url = format!("{}/runs/walker", s3.bucket(bucket));
    let ds = walker(dir, 3);
    s3.remote(&url).push(&ds).unwrap();
    (url, ds)
}

fn options(s3: &S3Server, cache: &Path, limit: u64) -> StreamOptions {
    let mut o = StreamOptions::new(limit);
    o.cache_dir = Some(cache.to_path_buf());
    o.remote = s3.options();
    o
}

/// A streaming loader of `stream`'s [`COLUMNS`] sampled by `sampler`, as rank 0 of 1: a source
/// of the streamed spec, and a loader of it.
fn stream_loader(
    stream: &Stream,
    sampler: SamplerSpec,
    opts: LoaderOptions,
) -> trajstore::Result<StreamLoader> {
    let source = BatchSource::open(LoaderSpec::streamed(stream.clone(), sampler, &COLUMNS))?;
    StreamLoader::new(&source, opts)
}

/// The object name of `snap`'s segment `i` in a store (`<id>-<crc>.arrow`, as a push names it).
fn object_name(snap: &Snapshot, i: usize) -> String {
    let seg = &snap.manifest().segments[i];
    let crc = seg
        .checksum
        .trim_start_matches("crc32c:")
        .to_ascii_lowercase();
    format!("{:020}-{crc}.arrow", seg.id)
}

/// Bytes of the transition files of `snap`.
fn transition_bytes(snap: &Snapshot) -> u64 {
    snap.manifest().segments.iter().map(|s| s.bytes).sum()
}

/// Bytes of every file under `dir` (a cache directory), partial downloads included.
fn bytes_on_disk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The local snapshot's gather of the plan that `b` holds (episode ids and start steps).
fn local_gather(snap: &Snapshot, b: &Batch) -> Batch {
    let plan: Vec<SliceRef> = (0..b.num_slices)
        .map(|i| SliceRef {
            episode: (b.episode_id[i] - snap.episodes().first_id()) as u32,
            start: b.start_step[i],
            len: b.slice_len as u32,
        })
        .collect();
    let mut out = Batch::default();
    Gatherer::try_new(snap, &COLUMNS)
        .unwrap()
        .gather(&plan, &mut out)
        .unwrap();
    out
}

fn assert_same_batch(a: &Batch, b: &Batch, what: &str) {
    assert_eq!(a.episode_id, b.episode_id, "{what}: episode ids");
    assert_eq!(a.start_step, b.start_step, "{what}: start steps");
    assert_eq!(a.mask, b.mask, "{what}: masks");
    assert_eq!(a.is_first, b.is_first, "{what}");
    assert_eq!(a.terminated, b.terminated, "{what}");
    for (x, y) in a.columns.iter().zip(&b.columns) {
        assert_eq!(x.name, y.name);
        assert_eq!(x.data, y.data, "{what}: column {}", x.name);
    }
}

#[test]
fn a_cache_that_holds_the_version_streams_the_local_datasets_batches() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (url, ds) = pushed(&s3, "whole", dir.path());
    let snap = ds.snapshot().unwrap();
    let slice = SamplerSpec::uniform(16, 32).with_seed(5);
    let opts = options(&s3, &dir.path().join("cache"), 1 << 30);
    let stream = Stream::open(&url, opts.clone()).unwrap();
    let gatherer = Gatherer::try_new(&snap, &COLUMNS).unwrap();
    let index = snap.slice_index(16, slice.policy).unwrap();
    let local = SliceSampler::try_new(index.clone(), snap.episodes(), &slice).unwrap();
    let mut loader = stream_loader(
        &stream,
        slice.clone(),
        LoaderOptions::default()
            .with_workers(3)
            .with_max_batches(40),
    )
    .unwrap();
    let mut plan = vec![];
    for k in 0..40 {
        let b = loader.next_batch().unwrap().unwrap();
        local.plan(k, &mut plan);
        let mut want = Batch::default();
        gatherer.gather(&plan, &mut want).unwrap();
        assert_same_batch(&b, &want, &format!("batch {k}"));
    }
    assert!(loader.next_batch().is_none());
    let st = loader.stats();
    assert_eq!(
        st.bytes_downloaded,
        transition_bytes(&snap),
        "each file once"
    );
    assert_eq!((st.files_evicted, st.windows_opened), (0, 1));
    drop(loader);

    // Without replacement too: the local epoch sampler's batches, one epoch, then the end. (The
    // stream's sampling used to be `StreamOptions::sampling`; it is the sampler's kind now.)
    let stream = Stream::open(&url, opts).unwrap();
    let epoch = EpochSampler::windows(index, 32, 5, true).unwrap();
    let per = epoch.batches_per_epoch().unwrap();
    let epoch_spec = SamplerSpec::new(SamplerKind::Epoch, 16, 32)
        .with_seed(5)
        .with_drop_last(true);
    let mut loader = stream_loader(
        &stream,
        epoch_spec,
        LoaderOptions::default().with_workers(2),
    )
    .unwrap();
    let mut n = 0;
    while let Some(b) = loader.next_batch() {
        let b = b.unwrap();
        if n % 50 == 0 {
            epoch.plan(n, &mut plan);
            let mut want = Batch::default();
            gatherer.gather(&plan, &mut want).unwrap();
            assert_same_batch(&b, &want, &format!("epoch batch {n}"));
        }
        n += 1;
    }
    assert_eq!(n, per, "one epoch");
    assert_eq!(loader.stats().bytes_downloaded, 0, "the cache was kept");
    drop(loader);
    // A stream samples uniform or epoch only; other samplers are refused by the source.
    for kind in [
        SamplerKind::EpochEpisodes,
        SamplerKind::Episodes,
        SamplerKind::Prioritized,
    ] {
        let spec = LoaderSpec::streamed(stream.clone(), SamplerSpec::new(kind, 16, 32), &COLUMNS);
        let e = err_of(BatchSource::open(spec));
        assert_invalid_argument(&e, Some("sampler"), kind.name());
    }
}

#[test]
fn a_quarter_cache_rotates_windows_within_its_limit_on_disk() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (url, ds) = pushed(&s3, "quarter", dir.path());
    let snap = ds.snapshot().unwrap();
    let total = transition_bytes(&snap);
    assert!(
        snap.segments().len() >= 12,
        "{} segments",
        snap.segments().len()
    );
    let limit = total / 4;
    let mut o = options(&s3, &dir.path().join("cache"), limit);
    o.reuse = 1.0;
    let stream = Stream::open(&url, o).unwrap();
    let cache_dir = stream.cache_dir(0);
    // A watcher measures the cache directory on disk while the loader runs.
    let (stop, peak) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let watcher = {
        let (stop, peak, d) = (stop.clone(), peak.clone(), cache_dir.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(bytes_on_disk(&d), Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        })
    };
    let slice = SamplerSpec::uniform(16, 32).with_seed(9);
    // About 22 segments, one per window (a third of the cache); each window serves at least
    // WINDOW_BATCHES (16) batches, so a round is about 352 batches: more than one round.
    let batches = 400;
    let mut loader = stream_loader(
        &stream,
        slice.clone(),
        LoaderOptions::default()
            .with_workers(3)
            .with_max_batches(batches),
    )
    .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for k in 0..batches {
        let b = loader.next_batch().unwrap().unwrap();
        let window = loader.window_episodes(k);
        for &id in &b.episode_id {
            assert!(
                window.iter().any(|r| r.contains(&id)),
                "batch {k}: episode {id} is not in the resident window {window:?}"
            );
            seen.insert(id);
        }
        if k % 7 == 0 {
            assert_same_batch(&b, &local_gather(&snap, &b), &format!("batch {k}"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let st = loader.stats();
    assert!(st.peak_cache_bytes <= limit, "{st:?}");
    assert!(
        peak.load(Ordering::Relaxed) <= limit,
        "on disk {} > limit {limit}",
        peak.load(Ordering::Relaxed)
    );
    assert!(st.files_evicted > 0 && st.windows_opened >= 6, "{st:?}");
    // A round covers the version (it deals every segment to the one rank).
    assert!(st.bytes_downloaded >= total, "{st:?}");
    assert!(
        seen.len() as u64 > snap.num_episodes() / 2,
        "{} episodes",
        seen.len()
    );
    drop(loader);
    assert!(bytes_on_disk(&cache_dir) <= limit);

    // Too small a cache for two windows is refused up front, naming the need.
    let largest = snap
        .manifest()
        .segments
        .iter()
        .map(|s| s.bytes)
        .max()
        .unwrap();
    let stream = Stream::open(&url, options(&s3, &dir.path().join("c2"), largest)).unwrap();
    let e = err_of(stream_loader(&stream, slice, LoaderOptions::default()));
    assert!(e.to_string().contains("needs at least"), "{e}");
}

/// Bytes of the files under `dir`, recursively, each inode once (what `du` counts: a file
/// hard-linked into two caches takes its bytes once).
fn node_bytes_on_disk(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fn walk(d: &Path, seen: &mut std::collections::HashSet<u64>, sum: &mut u64) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                walk(&e.path(), seen, sum);
            } else if seen.insert(m.ino()) {
                *sum += m.len();
            }
        }
    }
    let (mut seen, mut sum) = (Default::default(), 0);
    walk(dir, &mut seen, &mut sum);
    sum
}

#[test]
fn the_ranks_of_a_node_share_its_limit_and_link_the_files_another_rank_holds() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (url, ds) = pushed(&s3, "node", dir.path());
    let snap = ds.snapshot().unwrap();
    let total = transition_bytes(&snap);
    // Two ranks on the node: each keeps half of the node's limit.
    let mut o = options(&s3, &dir.path().join("cache"), 2 * total);
    o.ranks_per_node = 2;
    let stream = Stream::open(&url, o).unwrap();
    assert_eq!(stream.rank_cache_limit(), total);
    let slice = SamplerSpec::uniform(16, 32).with_seed(4);
    let loader = |rank: u64, world: u64| {
        let spec =
            LoaderSpec::streamed(stream.clone(), slice.clone(), &COLUMNS).with_rank(rank, world);
        let source = BatchSource::open(spec).unwrap();
        StreamLoader::new(&source, LoaderOptions::default().with_max_batches(20)).unwrap()
    };
    // Rank 0 of one rank holds the whole version (its share fits): every file downloaded once.
    let mut first = loader(0, 1);
    first.next_batch().unwrap().unwrap();
    let st = first.stats();
    assert_eq!(st.cache_limit, total, "{st:?}");
    assert_eq!((st.bytes_downloaded, st.files_shared), (total, 0), "{st:?}");
    drop(first);
    // Rank 1 of two, on the same node: every file of its share is in rank 0's cache, so it
    // links them and downloads nothing; the node's disk holds each file once.
    let mut second = loader(1, 2);
    for _ in 0..20 {
        second.next_batch().unwrap().unwrap();
    }
    let st = second.stats();
    assert!(
        st.files_shared > 0 && st.bytes_downloaded == 0 && st.files_downloaded == 0,
        "{st:?}"
    );
    assert!(st.peak_cache_bytes <= total, "{st:?}");
    let on_disk = node_bytes_on_disk(&stream.mirror().join("_stream"));
    assert_eq!(on_disk, total, "each file once on the node's disk");
    // A limit too small to share, and no ranks, are refused.
    let mut o = options(&s3, &dir.path().join("c2"), 1 << 20);
    o.ranks_per_node = 0;
    assert_invalid_argument(
        &err_of(Stream::open(&url, o)),
        Some("ranks_per_node"),
        "no ranks",
    );
}

#[test]
fn episode_subsets_and_weights_download_only_their_segments_and_draw_as_weighted() {
    use trajstore::sql::{SnapshotSql, StreamSql};
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (url, ds) = pushed(&s3, "subset", dir.path());
    let snap = ds.snapshot().unwrap();
    let total = transition_bytes(&snap);
    let stream = Stream::open(&url, options(&s3, &dir.path().join("cache"), total / 4)).unwrap();
    // A SQL subset, answered from the catalog: the local snapshot's answer.
    let q = "SELECT episode_id FROM episodes WHERE episode_id % 97 < 3 AND length >= 16";
    let ids = stream.episodes_where(q).unwrap();
    assert_eq!(ids, snap.episodes_where(q).unwrap());
    assert!(ids.len() >= 6, "{ids:?}");
    let holding: Vec<&trajstore::store::manifest::SegmentEntry> = snap
        .manifest()
        .segments
        .iter()
        .filter(|s| {
            ids.iter()
                .any(|&i| (s.first_episode_id..s.first_episode_id + s.episodes).contains(&i))
        })
        .collect();
    assert!(
        holding.len() * 3 < snap.segments().len(),
        "a subset of the segments"
    );
    let subset = SamplerSpec::uniform(16, 32)
        .with_seed(2)
        .with_episode_ids(ids.clone());
    let mut loader = stream_loader(
        &stream,
        subset,
        LoaderOptions::default().with_max_batches(120),
    )
    .unwrap();
    let mut drawn = std::collections::BTreeSet::new();
    for k in 0..120 {
        let b = loader.next_batch().unwrap().unwrap();
        for id in &b.episode_id {
            assert!(
                ids.contains(id),
                "batch {k}: episode {id} is outside the subset"
            );
            drawn.insert(*id);
        }
        if k % 11 == 0 {
            assert_same_batch(&b, &local_gather(&snap, &b), &format!("batch {k}"));
        }
    }
    assert!(drawn.len() * 2 > ids.len(), "{drawn:?} of {ids:?}");
    // Only the segments holding the subset were downloaded.
    let st = loader.stats();
    let held: u64 = holding.iter().map(|s| s.bytes).sum();
    assert!(
        st.bytes_downloaded > 0 && st.bytes_downloaded <= held,
        "{st:?}: {held} B hold the subset"
    );
    drop(loader);

    // Weights: 0 for even ids, 3 for ids ≡ 1 (mod 4), 1 for the others; the draws follow them
    // (every batch from one window, windows apportioned by their weighted slices).
    let eps = snap.episodes();
    let factor = |id: u64| match id % 4 {
        0 | 2 => 0.0,
        1 => 3.0,
        _ => 1.0,
    };
    let weights: Vec<f64> = (0..eps.len())
        .map(|p| factor(eps.get(p).episode_id))
        .collect();
    let index = snap
        .slice_index(16, trajstore::BoundaryPolicy::Strict)
        .unwrap();
    let mass = |r: u64| -> f64 {
        (0..eps.len())
            .filter(|&p| eps.get(p).episode_id % 4 == r)
            .map(|p| index.windows(p) as f64 * weights[p])
            .sum()
    };
    let want = mass(1) / (mass(1) + mass(3));
    let weighted = SamplerSpec::uniform(16, 32)
        .with_seed(8)
        .with_episode_weights(weights);
    let stream = Stream::open(&url, {
        let mut o = options(&s3, &dir.path().join("c2"), total / 4);
        o.reuse = 8.0;
        o
    })
    .unwrap();
    let mut loader = stream_loader(&stream, weighted, LoaderOptions::default()).unwrap();
    let (mut ones, mut threes) = (0u64, 0u64);
    for _ in 0..600 {
        let b = loader.next_batch().unwrap().unwrap();
        for id in &b.episode_id {
            match id % 4 {
                1 => ones += 1,
                3 => threes += 1,
                _ => panic!("episode {id} has weight 0"),
            }
        }
    }
    let got = ones as f64 / (ones + threes) as f64;
    assert!(
        (got - want).abs() < 0.05,
        "share of weight-3 episodes {got}, expected {want}"
    );

    // Subsets are for the uniform sampler; an unknown id and an empty subset are refused.
    let epoch = SamplerSpec::new(SamplerKind::Epoch, 16, 32).with_episode_ids(ids.clone());
    let e = err_of(stream_loader(&stream, epoch, LoaderOptions::default()));
    assert!(e.to_string().contains("uniform"), "{e}");
    let unknown = SamplerSpec::uniform(16, 32).with_episode_ids(vec![u64::MAX - 1]);
    let e = err_of(stream_loader(&stream, unknown, LoaderOptions::default()));
    assert!(e.to_string().contains("not in this version"), "{e}");
    let empty = SamplerSpec::uniform(16, 32).with_episode_ids(vec![]);
    assert!(stream_loader(&stream, empty, LoaderOptions::default()).is_err());
}

#[test]
fn a_following_stream_moves_to_a_version_committed_after_it_started_and_resumes_there() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (url, ds) = pushed(&s3, "follow", dir.path());
    let before = ds.snapshot().unwrap();
    let old_ids = before.manifest().next_episode_id;
    // Short rounds: the whole version cached (one window) and rounds of 16 batches.
    let mut o = options(&s3, &dir.path().join("cache"), 1 << 30);
    o.reuse = 0.1;
    let stream = Stream::open(&url, o).unwrap();
    let slice = SamplerSpec::uniform(16, 32).with_seed(3);
    let spec =
        || LoaderSpec::streamed(stream.clone(), slice.clone(), &COLUMNS).follow(Follow::default());
    let source = BatchSource::open(spec()).unwrap();
    let mut loader = StreamLoader::new(&source, LoaderOptions::default()).unwrap();
    let mut drawn: Vec<Batch> = vec![];
    for _ in 0..20 {
        let b = loader.next_batch().unwrap().unwrap();
        assert!(b.episode_id.iter().all(|&id| id < old_ids));
        drawn.push(b);
    }
    assert_eq!(source.stream_cursor(), Some((before.version(), 0)));
    // A collector commits new episodes and pushes them.
    TestData::new()
        .seed(9)
        .obs_dim(8)
        .episodes([60u64; 40])
        .append_to(&ds);
    s3.remote(&url).push(&ds).unwrap();
    let after = ds.snapshot().unwrap();
    assert!(after.version() > before.version());
    let mut moved_at = None;
    while drawn.len() < 80 {
        let k = drawn.len() as u64;
        let b = loader.next_batch().unwrap().unwrap();
        if moved_at.is_none() && b.episode_id.iter().any(|&id| id >= old_ids) {
            moved_at = Some(k);
        }
        drawn.push(b);
    }
    let (version, base) = source.stream_cursor().unwrap();
    assert_eq!(version, after.version());
    assert!(
        (20..=48).contains(&base) && base % 16 == 0,
        "moved at batch {base}, a round boundary after the commit"
    );
    assert!(
        moved_at.is_some_and(|k| k >= base),
        "{moved_at:?}, base {base}"
    );
    assert_eq!(loader.follow_refreshes(), 1);
    // The stats cover both versions' runs, and the files the versions share were downloaded
    // once: the new version's run fetched only its new segments.
    let st = loader.stats();
    let (old_bytes, new_bytes) = (transition_bytes(&before), transition_bytes(&after));
    assert!(
        st.bytes_downloaded >= new_bytes && st.bytes_downloaded < old_bytes + new_bytes,
        "{st:?}: versions of {old_bytes} and {new_bytes} B"
    );
    // Every batch of the new version reads the new snapshot's rows.
    for (k, b) in drawn.iter().enumerate().skip(base as usize).step_by(7) {
        assert_same_batch(b, &local_gather(&after, b), &format!("batch {k}"));
    }
    drop(loader);
    // A restart from (version, base, batch) draws the same batches.
    let again = BatchSource::open(spec()).unwrap();
    again.set_stream_cursor(version, base).unwrap();
    let k = base + 5;
    let mut resumed = StreamLoader::new(&again, LoaderOptions::default().with_start(k)).unwrap();
    for j in k..k + 10 {
        let b = resumed.next_batch().unwrap().unwrap();
        assert_same_batch(&b, &drawn[j as usize], &format!("resumed batch {j}"));
    }
    drop(resumed);
    // Following needs one rank.
    let e = err_of(BatchSource::open(spec().with_rank(0, 2)));
    assert!(e.to_string().contains("one rank"), "{e}");
}

#[test]
fn ranks_in_two_processes_download_disjoint_shares_that_cover_the_version() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (url, ds) = pushed(&s3, "ranks", dir.path());
    let snap = ds.snapshot().unwrap();
    let total = transition_bytes(&snap);
    let run = |rank: u64| {
        let mut c = s3.cli(&dir.path().join(format!("node{rank}")));
        c.args([
            "stream",
            &url,
            "--cache-limit",
            &total.to_string(),
            "--sampling",
            "epoch",
            "--slice-len",
            "16",
            "--num-slices",
            "32",
            "--world-size",
            "2",
            "--json",
        ]);
        c.env("RANK", rank.to_string());
        c
    };
    let (a, b) = (run(0).output().unwrap(), run(1).output().unwrap());
    let parse = |o: &std::process::Output| -> serde_json::Value {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (ja, jb) = (parse(&a), parse(&b));
    assert_eq!(ja["rank"], 0);
    assert_eq!(jb["rank"], 1);
    assert_eq!(ja["batches"], jb["batches"], "ranks stay in step");
    let files = |j: &serde_json::Value| -> std::collections::BTreeSet<String> {
        std::fs::read_dir(j["cache_dir"].as_str().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let (fa, fb) = (files(&ja), files(&jb));
    assert!(fa.is_disjoint(&fb), "{fa:?} {fb:?}");
    let all: std::collections::BTreeSet<String> = snap
        .manifest()
        .segments
        .iter()
        .map(|s| {
            let crc = s
                .checksum
                .trim_start_matches("crc32c:")
                .to_ascii_lowercase();
            format!("{:020}-{crc}.arrow", s.id)
        })
        .collect();
    let union: std::collections::BTreeSet<String> = fa.union(&fb).cloned().collect();
    assert_eq!(union, all, "together the ranks hold every segment once");
    let bytes = |j: &serde_json::Value| j["stats"]["bytes_downloaded"].as_u64().unwrap();
    assert_eq!(bytes(&ja) + bytes(&jb), total, "the version once in total");
}

#[test]
fn an_interrupted_download_resumes_and_damaged_objects_are_errors_naming_them() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (url, ds) = pushed(&s3, "damage", dir.path());
    let snap = ds.snapshot().unwrap();
    let opts = options(&s3, &dir.path().join("cache"), 1 << 30);
    let stream = Stream::open(&url, opts.clone()).unwrap();
    // A killed download leaves a partial file: the first half of segment 2's object.
    let name = object_name(&snap, 2);
    let key = format!("runs/walker/segments/{name}");
    let object = s3.get_raw("damage", &key);
    let cache_dir = stream.cache_dir(0);
    std::fs::create_dir_all(&cache_dir).unwrap();
    let half = object.len() / 2;
    std::fs::write(cache_dir.join(format!("{name}.partial")), &object[..half]).unwrap();
    let slice = SamplerSpec::uniform(16, 32);
    let source = BatchSource::open(LoaderSpec::streamed(
        stream.clone(),
        slice.clone(),
        &COLUMNS,
    ))
    .unwrap();
    let mut loader =
        StreamLoader::new(&source, LoaderOptions::default().with_max_batches(3)).unwrap();
    let b = loader.next_batch().unwrap().unwrap();
    assert_same_batch(&b, &local_gather(&snap, &b), "after the resume");
    let st = loader.stats();
    assert_eq!(st.bytes_resumed, half as u64);
    assert_eq!(st.bytes_downloaded, transition_bytes(&snap) - half as u64);
    // A second loader of the same rank's cache is refused while the first runs, whether of the
    // same source or of another source of the stream.
    let e = err_of(StreamLoader::new(&source, LoaderOptions::default()));
    assert!(e.to_string().contains("in use by another loader"), "{e}");
    let e = err_of(stream_loader(
        &stream,
        slice.clone(),
        LoaderOptions::default(),
    ));
    assert!(e.to_string().contains("in use by another loader"), "{e}");
    drop(loader);

    // Damaged (same size, one byte flipped) and missing objects, in a fresh cache.
    let mut damaged = object.clone();
    damaged[half] ^= 0xff;
    s3.put_raw("damage", &key, &damaged);
    let stream = Stream::open(&url, options(&s3, &dir.path().join("c2"), 1 << 30)).unwrap();
    let mut loader = stream_loader(&stream, slice.clone(), LoaderOptions::default()).unwrap();
    let e = loader.next_batch().unwrap().unwrap_err();
    assert!(matches!(e, trajstore::Error::Corrupt { .. }), "{e:?}");
    assert!(e.to_string().contains(&name), "{e}");
    drop(loader);
    assert!(
        !stream.cache_dir(0).join(&name).exists(),
        "a damaged file is never renamed into place"
    );
    s3.delete_raw("damage", &key);
    let stream = Stream::open(&url, options(&s3, &dir.path().join("c3"), 1 << 30)).unwrap();
    let mut loader = stream_loader(&stream, slice, LoaderOptions::default()).unwrap();
    let e = loader.next_batch().unwrap().unwrap_err();
    assert!(e.to_string().contains(&name), "{e}");
}

/// A `file://` store hands the cache an open file, which it copies itself (not through the
/// store's stream): the same resume, checks and batches as over S3.
#[test]
fn a_file_store_streams_resumes_and_names_damage_through_its_own_copy() {
    let dir = tempfile::tempdir().unwrap();
    let ds = walker(dir.path(), 5);
    let store = dir.path().join("store/walker");
    let url = format!("file://{}", store.display());
    trajstore::remote::Remote::open(&url, Default::default())
        .unwrap()
        .push(&ds)
        .unwrap();
    let snap = ds.snapshot().unwrap();
    let name = object_name(&snap, 2);
    let object_path = store.join("segments").join(&name);
    let object = std::fs::read(&object_path).unwrap();
    let half = object.len() / 2;
    let mut opts = StreamOptions::new(transition_bytes(&snap) / 3);
    opts.cache_dir = Some(dir.path().join("cache"));
    opts.reuse = 1.0;
    let stream = Stream::open(&url, opts.clone()).unwrap();
    std::fs::create_dir_all(stream.cache_dir(0)).unwrap();
    std::fs::write(
        stream.cache_dir(0).join(format!("{name}.partial")),
        &object[..half],
    )
    .unwrap();
    let source = BatchSource::open(LoaderSpec::streamed(
        stream.clone(),
        SamplerSpec::uniform(16, 32),
        &COLUMNS,
    ))
    .unwrap();
    let mut loader =
        StreamLoader::new(&source, LoaderOptions::default().with_max_batches(400)).unwrap();
    let mut n = 0;
    while let Some(b) = loader.next_batch() {
        let b = b.unwrap();
        assert_same_batch(&b, &local_gather(&snap, &b), &format!("batch {n}"));
        n += 1;
    }
    assert_eq!(n, 400);
    let st = loader.stats();
    assert_eq!(
        st.bytes_resumed, half as u64,
        "the partial file was resumed"
    );
    assert!(
        st.bytes_downloaded > transition_bytes(&snap),
        "the third-of-the-version cache rotated: {st:?}"
    );
    assert!(st.peak_cache_bytes <= opts.cache_limit, "{st:?}");
    drop(loader);

    // A damaged object (one byte flipped) is an error naming it, and never renamed into place.
    let mut damaged = object;
    damaged[half + 7] ^= 0xff;
    std::fs::write(&object_path, &damaged).unwrap();
    opts.cache_dir = Some(dir.path().join("c2"));
    let stream = Stream::open(&url, opts).unwrap();
    let mut loader = stream_loader(
        &stream,
        SamplerSpec::uniform(16, 32),
        LoaderOptions::default(),
    )
    .unwrap();
    let e = loop {
        match loader.next_batch() {
            Some(Ok(_)) => continue,
            Some(Err(e)) => break e,
            None => panic!("the damaged segment was never read"),
        }
    };
    assert!(matches!(e, trajstore::Error::Corrupt { .. }), "{e:?}");
    assert!(e.to_string().contains(&name), "{e}");
    drop(loader);
    assert!(!stream.cache_dir(0).join(&name).exists());
}

#[test]
fn the_cli_streams_and_reports_its_cache() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (url, ds) = pushed(&s3, "cli", dir.path());
    let total = transition_bytes(&ds.snapshot().unwrap());
    let out = s3
        .cli(&dir.path().join("cache"))
        .args(["stream", &url, "--cache-limit", &(total / 3).to_string()])
        .args(["--batches", "60", "--reuse", "1", "--slice-len", "16"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("streamed 60 batches"), "{text}");
    assert!(text.contains("evicted"), "{text}");
    let out = crate::common::bin()
        .args(["stream", "/tmp/not-a-url", "--cache-limit", "1GiB"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reads a URL"));
}
