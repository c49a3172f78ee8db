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
use trajstore::remote::{Stream, StreamOptions};
use trajstore::{
    BatchSource, Dataset, Error, LoaderOptions, LoaderSpec, SamplerSpec, StreamLoader,
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
