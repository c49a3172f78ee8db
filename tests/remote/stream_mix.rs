//! A mix of streams (`LoaderSpec::stream_part`): every batch holds each stream's batch of its
//! share, in part order, exactly as that stream alone gives it, with windows rotating through
//! each stream's own small cache; host batches (`StreamLoader`) and the caller's slots
//! (`StagedLoader`, what the Python package's CUDA ring runs) alike; what a mix of streams
//! cannot do is refused with the reason.

#![cfg(feature = "remote")]

use std::path::Path;

use crate::common::TestData;
use crate::common::staging::{self, Slots};
use trajstore::remote::{Remote, Stream, StreamOptions};
use trajstore::{
    Batch, BatchSource, LoaderOptions, LoaderSpec, SamplerKind, SamplerSpec, StagedLoader,
    StreamLoader,
};

const COLUMNS: [&str; 3] = ["observation", "next_observation", "reward"];
const L: usize = 16;
/// Slices per batch: 15 from the first stream, 9 from the second (weights 5 : 3).
const B: usize = 24;
const SHARES: [usize; 2] = [15, 9];

/// Two datasets of 8-float observations pushed to a `file://` store, and their transition bytes.
fn pushed(dir: &Path) -> Vec<(String, u64)> {
    [(3u64, 70.0), (4, 40.0)]
        .iter()
        .enumerate()
        .map(|(i, &(seed, len))| {
            let ds = TestData::new()
                .obs_dim(8)
                .seed(seed)
                .transitions(12_000)
                .mean_episode_len(len)
                .segment_bytes(48 << 10)
                .write(&dir.join(format!("local{i}")));
            let url = format!("file://{}", dir.join(format!("store/d{i}")).display());
            Remote::open(&url, Default::default())
                .unwrap()
                .push(&ds)
                .unwrap();
            let bytes = ds
                .snapshot()
                .unwrap()
                .manifest()
                .segments
                .iter()
                .map(|s| s.bytes)
                .sum();
            (url, bytes)
        })
        .collect()
}

/// Stream `url` through a cache of a third of its `bytes` under `dir/cache`.
fn stream(dir: &Path, (url, bytes): &(String, u64), cache: &str) -> Stream {
    let mut o = StreamOptions::new(bytes / 3);
    o.cache_dir = Some(dir.join(cache));
    o.reuse = 1.0;
    Stream::open(url, o).unwrap()
}

fn sampler(i: usize, num_slices: usize) -> SamplerSpec {
    SamplerSpec::uniform(L as u32, num_slices).with_seed(10 + i as u64)
}

fn mixed(dir: &Path, data: &[(String, u64)], cache: &str) -> BatchSource {
    let spec = LoaderSpec::streamed(
        stream(dir, &data[0], &format!("{cache}0")),
        sampler(0, B),
        &COLUMNS,
    )
    .stream_part(
        stream(dir, &data[1], &format!("{cache}1")),
        sampler(1, B),
        0.6,
    );
    // Weights 1 and 0.6: 15 and 9 of 24 slices.
    BatchSource::open(spec).unwrap()
}

fn opts(batches: u64) -> LoaderOptions {
    LoaderOptions::default()
        .with_workers(2)
        .with_max_batches(batches)
}

/// Each stream alone, with its share of the slices: what every mixed batch must hold.
fn alone(dir: &Path, data: &[(String, u64)], batches: u64) -> Vec<Vec<Batch>> {
    (0..2)
        .map(|i| {
            let s = stream(dir, &data[i], &format!("alone{i}"));
            let spec = LoaderSpec::streamed(s, sampler(i, SHARES[i]), &COLUMNS);
            let source = BatchSource::open(spec).unwrap();
            let mut l = StreamLoader::new(&source, opts(batches)).unwrap();
            let out: Vec<Batch> = l.by_ref().map(Result::unwrap).collect();
            assert!(
                l.stats().windows_opened >= 3,
                "stream {i} rotates: {:?}",
                l.stats()
            );
            out
        })
        .collect()
}

/// Slices `at..at + n` of `b`'s per-slice data (`per` bytes a slice) equal `part`'s.
fn assert_part(mixed: &Batch, part: &Batch, at: usize, what: &str) {
    let n = part.num_slices;
    assert_eq!(mixed.episode_id[at..at + n], part.episode_id, "{what}: ids");
    assert_eq!(
        mixed.start_step[at..at + n],
        part.start_step,
        "{what}: starts"
    );
    assert_eq!(mixed.mask[at * L..(at + n) * L], part.mask, "{what}: mask");
    assert_eq!(
        mixed.is_last[at * L..(at + n) * L],
        part.is_last,
        "{what}: is_last"
    );
    for (m, p) in mixed.columns.iter().zip(&part.columns) {
        let per = L * p.step_bytes();
        assert_eq!(
            &m.data.as_slice()[at * per..(at + n) * per],
            p.data.as_slice(),
            "{what}: {}",
            p.name
        );
    }
}

#[test]
fn a_mix_of_streams_holds_each_streams_batches_in_its_slices() {
    let dir = tempfile::tempdir().unwrap();
    let data = pushed(dir.path());
    let batches = 60;
    let want = alone(dir.path(), &data, batches);
    let source = mixed(dir.path(), &data, "mix");
    assert_eq!(
        source.slice_sources(),
        [vec![0u16; 15], vec![1; 9]].concat()
    );
    assert_eq!(source.tail_columns(), vec![false, true, false]);
    let mut l = StreamLoader::new(&source, opts(batches)).unwrap();
    let mut k = 0;
    while let Some(b) = l.next_batch() {
        let b = b.unwrap();
        assert_eq!((b.num_slices, b.slice_len), (B, L));
        assert_eq!(b.source, source.slice_sources());
        assert_part(&b, &want[0][k], 0, &format!("batch {k}, stream 0"));
        assert_part(&b, &want[1][k], 15, &format!("batch {k}, stream 1"));
        l.recycle(b);
        k += 1;
    }
    assert_eq!(k as u64, batches);
    let st = l.stats();
    assert!(st.windows_opened >= 6, "{st:?}");
    assert!(
        st.peak_cache_bytes <= data[0].1 / 3 + data[1].1 / 3,
        "{st:?}"
    );

    // The caller's slots (3 of them, next_observation as one row per slice): the same batches.
    let source = mixed(dir.path(), &data, "staged");
    let (slots, mems) = slots(3);
    let mut staged = StagedLoader::new(&source, opts(batches), slots).unwrap();
    let mut k = 0;
    while let Some(got) = staged.next_batch() {
        let got = got.unwrap();
        assert_eq!((got.number, got.slot, got.num_slices), (k as u64, k % 3, B));
        let m = mems[got.slot].lock().unwrap();
        let row = 8 * 4;
        for (i, at) in [(0, 0), (1, 15)] {
            let part = &want[i][k];
            let n = part.num_slices;
            assert_eq!(m.ids[at..at + n], part.episode_id, "batch {k}, stream {i}");
            let obs = part.columns[0].data.as_slice();
            assert_eq!(
                &m.columns[0][at * L * row..(at + n) * L * row],
                obs,
                "batch {k}"
            );
            let next = part.columns[1].data.as_slice();
            for s in 0..n {
                let last = (s * L + L - 1) * row;
                assert_eq!(
                    &m.columns[1][(at + s) * row..(at + s + 1) * row],
                    &next[last..last + row],
                    "batch {k}, stream {i}, slice {s}: tail"
                );
            }
        }
        drop(m);
        staged.release(k as u64).unwrap();
        k += 1;
    }
    assert_eq!(k as u64, batches);
    assert!(staged.stream_stats().unwrap().windows_opened >= 6);
}

#[test]
fn what_a_mix_of_streams_cannot_do_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = pushed(dir.path());
    let s = |i: usize, c: &str| stream(dir.path(), &data[i], c);
    let epoch = SamplerSpec::new(SamplerKind::Epoch, L as u32, B);
    let e = BatchSource::open(
        LoaderSpec::streamed(s(0, "a"), epoch.clone(), &COLUMNS).stream_part(s(1, "b"), epoch, 1.0),
    )
    .unwrap_err();
    assert!(e.to_string().contains("samples uniform"), "{e}");
    let e = BatchSource::open(
        LoaderSpec::streamed(s(0, "c"), sampler(0, B), &COLUMNS)
            .stream_part(s(1, "d"), sampler(1, B), 1.0)
            .follow(trajstore::Follow::default()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("follow"), "{e}");
    // A dataset of other observations cannot join the mix.
    let other = TestData::new()
        .obs_dim(5)
        .seed(9)
        .transitions(2_000)
        .write(&dir.path().join("other"));
    let url = format!("file://{}", dir.path().join("store/other").display());
    Remote::open(&url, Default::default())
        .unwrap()
        .push(&other)
        .unwrap();
    let mut o = StreamOptions::new(1 << 30);
    o.cache_dir = Some(dir.path().join("e"));
    let e = BatchSource::open(
        LoaderSpec::streamed(s(0, "f"), sampler(0, B), &COLUMNS).stream_part(
            Stream::open(&url, o).unwrap(),
            sampler(1, B),
            1.0,
        ),
    )
    .unwrap_err();
    assert!(e.to_string().contains("same types"), "{e}");
}

/// `n` slots of [`B`] slices: 8-float observations, next_observation as one row per slice, an
/// f32 reward.
fn slots(n: usize) -> Slots {
    let bytes = [B * L * 32, B * 32, B * L * 4];
    staging::slots(n, &bytes, (B, L), Some(vec![false, true, false]))
}
