//! The staged loader over a stream (what the Python package's CUDA ring runs for
//! `trajstore.open(url, cache_limit=...)`): against a real S3-compatible server, it gathers the
//! streaming loader's batches, window after window of a cache a quarter of the version, into the
//! caller's slots (a derived `next_observation` as one row per slice where asked), reuses a slot
//! only once released, reports the stream's cache, and drops cleanly while workers wait for
//! slots.

#![cfg(feature = "remote")]

use std::path::Path;

use crate::common::TestData;
use crate::common::s3::S3Server;
use crate::common::staging::{self, Slots};
use trajstore::remote::{Stream, StreamOptions};
use trajstore::{
    Batch, BatchSource, LoaderOptions, LoaderSpec, SamplerSpec, StagedLoader, StreamLoader,
};

const COLUMNS: [&str; 3] = ["observation", "next_observation", "reward"];
const OBS: usize = 8;
const B: usize = 16;
const L: usize = 32;

/// `n` slots for [`COLUMNS`] (`f32` observations of [`OBS`], `f32` reward), with
/// `next_observation` as one row per slice when `tails`.
fn slots(n: usize, tails: bool) -> Slots {
    let next_rows = if tails { B } else { B * L };
    let bytes = [B * L * OBS * 4, next_rows * OBS * 4, B * L * 4];
    staging::slots(n, &bytes, (B, L), tails.then(|| vec![false, true, false]))
}

/// 24,000 transitions in 64 KiB segments (about 20), pushed to `bucket`; a stream of it with a
/// cache of a quarter of its transition files under `dir/<cache>`.
fn stream(s3: &S3Server, bucket: &str, dir: &Path, cache: &str) -> (Stream, u64) {
    let url = format!("{}/runs/walker", s3.bucket(bucket));
    let local = dir.join("local");
    let ds = if local.exists() {
        trajstore::Dataset::open(&local).unwrap()
    } else {
        let ds = TestData::new()
            .obs_dim(OBS)
            .seed(3)
            .transitions(24_000)
            .mean_episode_len(60.0)
            .segment_bytes(64 << 10)
            .write(&local);
        s3.remote(&url).push(&ds).unwrap();
        ds
    };
    let snap = ds.snapshot().unwrap();
    let total: u64 = snap.manifest().segments.iter().map(|s| s.bytes).sum();
    let mut o = StreamOptions::new(total / 4);
    o.cache_dir = Some(dir.join(cache));
    o.remote = s3.options();
    o.reuse = 1.0;
    (Stream::open(&url, o).unwrap(), total / 4)
}

fn source(stream: &Stream) -> BatchSource {
    let slice = SamplerSpec::uniform(L as u32, B).with_seed(9);
    BatchSource::open(LoaderSpec::streamed(stream.clone(), slice, &COLUMNS)).unwrap()
}

fn opts(batches: u64) -> LoaderOptions {
    LoaderOptions::default()
        .with_workers(3)
        .with_max_batches(batches)
}

#[test]
fn a_staged_loader_gathers_a_rotating_streams_batches_into_the_callers_slots() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    // About 22 windows of one segment each, 16 batches apiece: 150 batches open about 9.
    let batches = 150u64;
    let (reference, _) = stream(&s3, "staged", dir.path(), "plain");
    let plain: Vec<Batch> = StreamLoader::new(&source(&reference), opts(batches))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(plain.len() as u64, batches);

    for tails in [false, true] {
        let cache = if tails { "tails" } else { "full" };
        let (stream, limit) = stream(&s3, "staged", dir.path(), cache);
        let src = source(&stream);
        assert_eq!(src.tail_columns(), vec![false, true, false]);
        let (boxed, mems) = slots(2, tails);
        let mut staged = StagedLoader::new(&src, opts(batches), boxed).unwrap();
        assert_eq!(staged.slots(), 2);
        let mut n = 0u64;
        while let Some(got) = staged.next_batch() {
            let got = got.unwrap();
            assert_eq!(
                (got.number, got.slot, got.num_slices),
                (n, n as usize % 2, B)
            );
            let want = &plain[n as usize];
            let m = mems[got.slot].lock().unwrap();
            assert_eq!(m.ids, want.episode_id, "batch {n}: episode ids");
            assert_eq!(m.starts, want.start_step, "batch {n}: start steps");
            assert_eq!(m.flags[0], want.mask, "batch {n}: mask");
            assert_eq!(m.flags[1], want.is_first, "batch {n}: is_first");
            assert_eq!(m.flags[3], want.terminated, "batch {n}: terminated");
            assert_eq!(
                m.columns[0],
                want.columns[0].data.as_slice(),
                "batch {n}: obs"
            );
            assert_eq!(
                m.columns[2],
                want.columns[2].data.as_slice(),
                "batch {n}: reward"
            );
            let next = want.columns[1].data.as_slice();
            if tails {
                // Strict slices: the tail is the next observation of each slice's last step.
                let row = OBS * 4;
                for i in 0..B {
                    let last = (i * L + L - 1) * row;
                    assert_eq!(
                        &m.columns[1][i * row..(i + 1) * row],
                        &next[last..last + row],
                        "batch {n}, slice {i}: tail"
                    );
                }
            } else {
                assert_eq!(m.columns[1], next, "batch {n}: next_observation");
            }
            drop(m);
            staged.release(n).unwrap();
            assert!(staged.release(n).is_err(), "a second release is refused");
            n += 1;
        }
        assert_eq!(n, batches);
        assert_eq!(staged.position(), batches);
        let st = staged
            .stream_stats()
            .expect("a streamed loader reports its cache");
        assert!(st.peak_cache_bytes <= limit, "{st:?}");
        assert!(st.windows_opened >= 6 && st.files_evicted > 0, "{st:?}");
        assert!(
            staged.state().is_err(),
            "a streaming loader restarts at a batch number, not from a state"
        );
    }
}

#[test]
fn dropping_a_staged_stream_whose_workers_wait_for_slots_returns() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (stream, _) = stream(&s3, "drop", dir.path(), "c");
    let (boxed, _mems) = slots(2, false);
    let mut staged = StagedLoader::new(&source(&stream), opts(100), boxed).unwrap();
    // Two batches held, never released: the workers wait for their slots.
    staged.next_batch().unwrap().unwrap();
    staged.next_batch().unwrap().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(staged);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .expect("dropping the loader joins its workers");
    // Too few slots are refused before anything is downloaded.
    let (one, _) = slots(1, false);
    let e = StagedLoader::new(&source(&stream), opts(10), one).unwrap_err();
    assert!(e.to_string().contains("at least 2"), "{e}");
}
