//! Frame columns in object storage, against a real S3-compatible server (moto's; see
//! `tests/common/s3.rs`): a push carries the `dictionaries/` files a version references
//! (once, under their content-addressed names), a pull brings them into the mirror checked, a
//! catalog fetch (what a stream opens) brings them too, so that streamed windows of a frame
//! dataset open; and a damaged, truncated or missing dictionary, in the store or in a mirror,
//! is a named error, never a panic.

#![cfg(feature = "remote")]

use std::path::Path;

use crate::common::err_of;
use crate::common::s3::S3Server;
use crate::store::frames::{decode_all, frame_schema, write_episodes};
use trajstore::frames::FrameCodec;
use trajstore::remote::{Remote, Stream, StreamOptions};
use trajstore::{
    Batch, BatchSource, BoundaryPolicy, Dataset, Error, FrameStack, LoaderOptions, LoaderSpec,
    SamplerSpec, StagedLoader, StreamLoader,
};

const SHAPE: [usize; 2] = [84, 84];

/// A zstd-dict frame dataset under `dir/local`: an empty first version, then two commits.
fn frames_dataset(dir: &Path) -> (Dataset, Vec<Vec<Vec<u8>>>) {
    let ds = Dataset::create(
        dir.join("local"),
        &frame_schema(FrameCodec::ZstdDict, &SHAPE),
    )
    .unwrap();
    let mut want = write_episodes(&ds, &SHAPE, 6, 30);
    want.extend(write_episodes(&ds, &SHAPE, 4, 25));
    (ds, want)
}

/// The dictionary's key in `bucket` under `prefix`, and its name.
fn dictionary_key(ds: &Dataset, prefix: &str) -> (String, String) {
    let snap = ds.snapshot().unwrap();
    let d = snap
        .frame_column("observation")
        .unwrap()
        .spec
        .dictionary
        .clone();
    let path = d.expect("a trained dictionary").path;
    (format!("{prefix}/{path}"), path)
}

fn is_corrupt_naming(e: &Error, name: &str) -> bool {
    matches!(e, Error::Corrupt { .. }) && e.to_string().contains(name)
}

#[test]
fn a_frame_dataset_pushed_pulled_and_streamed_keeps_its_dictionary_and_frames() {
    let Some(s3) = S3Server::start() else { return };
    let url = format!("{}/atari/pong", s3.bucket("frames"));
    let dir = tempfile::tempdir().unwrap();
    let remote = s3.remote(&url);

    // The empty first version (a frame column without a dictionary yet) is pushed; the
    // commits that train and use the dictionary are a fast-forward of it.
    let empty = Dataset::create(
        dir.path().join("local"),
        &frame_schema(FrameCodec::ZstdDict, &SHAPE),
    )
    .unwrap();
    remote.push(&empty).unwrap();
    drop(empty);
    std::fs::remove_dir_all(dir.path().join("local")).unwrap();
    let (ds, want) = frames_dataset(dir.path());
    let p = remote.push(&ds).unwrap();
    assert_eq!(p.previous_version, Some(1));
    let (key, name) = dictionary_key(&ds, "atari/pong");
    let keys = s3.keys("frames", "atari/pong/dictionaries");
    assert_eq!(keys, vec![key.clone()], "the dictionary, once");
    let segs = ds.snapshot().unwrap().segments().len() as u64;
    assert_eq!(
        p.files_uploaded,
        2 * segs + 1,
        "segments and the dictionary"
    );
    assert_eq!(
        s3.get_raw("frames", &key),
        std::fs::read(ds.path().join(&name)).unwrap()
    );

    // Pulled: the mirror opens, its frames equal the source's, it verifies.
    let mirror = dir.path().join("mirror");
    let r = remote.pull(&mirror, None).unwrap();
    assert_eq!(r.files_downloaded, 2 * segs + 1);
    let pulled = Dataset::open(&mirror).unwrap().snapshot().unwrap();
    assert_eq!(decode_all(&pulled).unwrap(), want);
    trajstore::store::verify::verify(&pulled, |_| {}).unwrap();

    // One more commit: the dictionary is present in the store and in the mirror.
    let more = write_episodes(&ds, &SHAPE, 3, 20);
    let p = remote.push(&ds).unwrap();
    assert_eq!(p.files_uploaded, 2, "one new segment, no dictionary");
    assert!(p.files_present >= 1);
    let r = remote.pull(&mirror, None).unwrap();
    assert_eq!(r.files_downloaded, 2);
    let pulled = Dataset::open(&mirror).unwrap().snapshot().unwrap();
    let mut all = want.clone();
    all.extend(more);
    assert_eq!(decode_all(&pulled).unwrap(), all);
    assert!(mirror.join(&name).is_file(), "pruning keeps the dictionary");

    // A stream fetches the catalog and the dictionary, and its windows open (a loader of the
    // scalar columns; decoding frames is the gather's).
    let mut o = StreamOptions::new(1 << 30);
    o.cache_dir = Some(dir.path().join("cache"));
    o.remote = s3.options();
    let stream = Stream::open(&url, o).unwrap();
    assert!(stream.mirror().join(&name).is_file());
    let spec = LoaderSpec::streamed(stream, SamplerSpec::uniform(4, 8), &["action", "reward"]);
    let source = BatchSource::open(spec).unwrap();
    let mut loader =
        StreamLoader::new(&source, LoaderOptions::default().with_max_batches(3)).unwrap();
    for _ in 0..3 {
        let b = loader.next_batch().unwrap().unwrap();
        assert_eq!(b.num_slices, 8);
    }
}

#[test]
fn a_damaged_dictionary_is_a_named_error_in_the_store_and_in_a_mirror() {
    let Some(s3) = S3Server::start() else { return };
    let url = format!("{}/atari/breakout", s3.bucket("damage"));
    let dir = tempfile::tempdir().unwrap();
    let (ds, want) = frames_dataset(dir.path());
    let remote = s3.remote(&url);
    remote.push(&ds).unwrap();
    let (key, name) = dictionary_key(&ds, "atari/breakout");
    let good = s3.get_raw("damage", &key);

    let stream_opts = |cache: &str| {
        let mut o = StreamOptions::new(1 << 30);
        o.cache_dir = Some(dir.path().join(cache));
        o.remote = s3.options();
        o
    };
    // Same size with a byte flipped, truncated, and missing: pull, catalog and stream fail
    // naming the object, and nothing is renamed into the mirror.
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x5a;
    let damages: [(&str, Option<Vec<u8>>); 3] = [
        ("flipped", Some(flipped)),
        ("truncated", Some(good[..good.len() - 7].to_vec())),
        ("missing", None),
    ];
    for (what, bytes) in damages {
        match &bytes {
            Some(b) => s3.put_raw("damage", &key, b),
            None => s3.delete_raw("damage", &key),
        }
        let mirror = dir.path().join(format!("m-{what}"));
        let e = err_of(remote.pull(&mirror, None));
        assert!(e.to_string().contains(&name), "{what}: {e}");
        if bytes.is_some() {
            assert!(is_corrupt_naming(&e, &name), "{what}: {e:?}");
        }
        assert!(!mirror.join(&name).exists(), "{what}");
        let e = err_of(remote.catalog(&dir.path().join(format!("c-{what}")), None));
        assert!(e.to_string().contains(&name), "{what}: {e}");
        let e = err_of(Stream::open(&url, stream_opts(&format!("s-{what}"))));
        assert!(e.to_string().contains(&name), "{what}: {e}");
    }
    s3.put_raw("damage", &key, &good);

    // A mirror whose dictionary was damaged after the pull: opening it is a named error; the
    // next pull fetches the dictionary again and the frames come back.
    let mirror = dir.path().join("mirror");
    remote.pull(&mirror, None).unwrap();
    let mut bad = good.clone();
    bad[9] ^= 1;
    std::fs::write(mirror.join(&name), &bad).unwrap();
    let e = err_of(Dataset::open(&mirror).and_then(|d| d.snapshot()));
    assert!(is_corrupt_naming(&e, &name), "{e:?}");
    let r = remote.pull(&mirror, None).unwrap();
    assert_eq!(r.files_downloaded, 1, "the dictionary again");
    let snap = Dataset::open(&mirror).unwrap().snapshot().unwrap();
    assert_eq!(decode_all(&snap).unwrap(), want);

    // A local dictionary damaged before a push: the push fails naming it and uploads nothing.
    let url2 = format!("{}/again", s3.bucket("damage2"));
    std::fs::write(ds.path().join(&name), &bad).unwrap();
    let e = err_of(s3.remote(&url2).push(&ds));
    assert!(is_corrupt_naming(&e, &name), "{e:?}");
    assert!(s3.keys("damage2", "again/_versions").is_empty());
}

/// Frame stacks streamed from a store (`file://`) equal stacks of the written frames at every
/// valid step (the first frame repeated before an episode's start, `next_observation` reaching
/// the stored final frame), written out or as frame windows, which give the same batches for
/// the same seed: host batches, the staged loader's slots of `L + K - 1` frames a slice, and a
/// mix of two streams.
#[test]
fn a_streamed_frame_dataset_gives_frame_stacks_and_windows() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, want) = frames_dataset(dir.path());
    let url = format!("file://{}", dir.path().join("store").display());
    Remote::open(&url, Default::default())
        .unwrap()
        .push(&ds)
        .unwrap();
    let stream = |cache: &str| {
        let mut o = StreamOptions::new(1 << 30);
        o.cache_dir = Some(dir.path().join(cache));
        Stream::open(&url, o).unwrap()
    };
    let (k, l, b, f) = (4usize, 6usize, 8usize, 84 * 84);
    let cols = ["observation", "next_observation", "action"];
    let sampler = SamplerSpec::uniform(l as u32, b)
        .with_policy(BoundaryPolicy::Pad)
        .with_seed(3);
    let spec = |window: bool, cache: &str| {
        let stack = FrameStack::new(k).unwrap().with_window(window);
        LoaderSpec::streamed(stream(cache), sampler.clone(), &cols).with_frame_stack(stack)
    };
    let opts = || LoaderOptions::default().with_workers(2).with_max_batches(5);
    let batches = |window: bool, cache: &str| -> Vec<Batch> {
        let source = BatchSource::open(spec(window, cache)).unwrap();
        let lead = if window { k - 1 } else { 0 };
        assert_eq!(source.leads(), vec![lead, lead, 0]);
        StreamLoader::new(&source, opts())
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    // Stack of step `t` (shifted by `shift` for next_observation) of episode `e`, from the
    // written frames.
    let expect = |e: usize, t: i64, shift: i64| -> Vec<u8> {
        (0..k as i64)
            .flat_map(|q| want[e][(t + shift - (k as i64 - 1 - q)).max(0) as usize].clone())
            .collect()
    };
    // Every valid step's stack, written out and in the window, against the written frames.
    let check = |stacks: &[Batch], windows: &[Batch], what: &str| {
        assert_eq!((stacks.len(), windows.len()), (5, 5), "{what}");
        let mut checked = 0;
        for (s, w) in stacks.iter().zip(windows) {
            assert_eq!(
                (&s.episode_id, &s.start_step, &s.mask),
                (&w.episode_id, &w.start_step, &w.mask),
                "{what}"
            );
            assert_eq!(w.columns[0].lead, k - 1);
            assert_eq!(s.columns[2].data.as_slice(), w.columns[2].data.as_slice());
            for i in 0..s.num_slices {
                let e = s.episode_id[i] as usize;
                for j in 0..l {
                    if s.mask[i * l + j] == 0 {
                        continue;
                    }
                    let t = s.start_step[i] + j as i64;
                    for (c, shift) in [(0, 0), (1, 1)] {
                        let at = (i * l + j) * k * f;
                        let written = &s.columns[c].data.as_slice()[at..at + k * f];
                        let at = (i * (l + k - 1) + j) * f;
                        let window = &w.columns[c].data.as_slice()[at..at + k * f];
                        let want = expect(e, t, shift);
                        assert!(
                            written == &want[..],
                            "{what} stacks: episode {e} step {t} column {c}"
                        );
                        assert!(
                            window == &want[..],
                            "{what} window: episode {e} step {t} column {c}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100, "{what}: {checked} stacks checked");
    };
    let windows = batches(true, "c-windows");
    check(&batches(false, "c-stacks"), &windows, "one stream");
    // The staged loader over the stream gathers the same windows into the caller's slots.
    let need = [b * (l + k - 1) * f, b * (l + k - 1) * f, b * l * 8];
    let (slots, mems) = crate::common::staging::slots(2, &need, (b, l), None);
    let source = BatchSource::open(spec(true, "c-staged")).unwrap();
    let mut staged = StagedLoader::new(&source, opts(), slots).unwrap();
    let mut n = 0;
    while let Some(got) = staged.next_batch() {
        let got = got.unwrap();
        let m = mems[got.slot].lock().unwrap();
        for (c, col) in windows[n].columns.iter().enumerate() {
            assert!(
                m.columns[c] == col.data.as_slice(),
                "staged batch {n}: {}",
                col.name
            );
        }
        drop(m);
        staged.release(got.number).unwrap();
        n += 1;
    }
    assert_eq!(n, 5);
    // The tch loader over the stream, compact: next_observation crosses as one frame a slice and
    // is derived from the observation's window; every valid step equals the host windows'.
    #[cfg(feature = "torch")]
    {
        use trajstore::torch::{TorchLoader, TorchLoaderOptions};
        let source = BatchSource::open(spec(true, "c-torch")).unwrap();
        assert_eq!(source.tail_columns(), vec![false, true, false]);
        let opts = TorchLoaderOptions::new(tch::Device::Cpu)
            .with_loader(opts())
            .with_compact(true);
        let got: Vec<_> = TorchLoader::new(&source, opts)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(got.len(), 5);
        for (n, (t, w)) in got.iter().zip(&windows).enumerate() {
            let mask = t.get("mask").unwrap();
            for (c, name) in [(0, "observation"), (1, "next_observation")] {
                let stacks = t.get(name).unwrap().index(&[Some(mask)]).flatten(0, -1);
                let mut want = vec![];
                for i in 0..b {
                    for j in (0..l).filter(|&j| w.mask[i * l + j] == 1) {
                        let at = (i * (l + k - 1) + j) * f;
                        want.extend_from_slice(&w.columns[c].data.as_slice()[at..at + k * f]);
                    }
                }
                assert!(
                    Vec::<u8>::try_from(stacks).unwrap() == want,
                    "torch batch {n}: {name}"
                );
            }
        }
    }
    // A mix of two streams (8 + 8 slices) assembles each part's windows in its slices.
    let mixed = |window: bool, cache: &str| -> Vec<Batch> {
        let mix = spec(window, &format!("{cache}0")).stream_part(
            stream(&format!("{cache}1")),
            sampler.clone().with_seed(8),
            1.0,
        );
        let source = BatchSource::open(mix).unwrap();
        assert_eq!(source.leads()[0], if window { k - 1 } else { 0 });
        StreamLoader::new(&source, opts())
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    check(
        &mixed(false, "m-stacks"),
        &mixed(true, "m-windows"),
        "a mix of streams",
    );
}
