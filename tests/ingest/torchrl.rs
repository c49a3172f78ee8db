//! TorchRL replay buffers (`rb.dumps(DIR)` of a `LazyMemmapStorage`) through the public API,
//! against dumps written by real TorchRL (`tests/python/make_torchrl_fixtures.py`, whose docstring
//! gives the formula of every value): nested keys, `[N, 1]` tensors, a ring buffer that wrapped,
//! and bad dumps.

use std::path::{Path, PathBuf};

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use trajstore::Dataset;
use trajstore::ingest::{InputFormat, ingest};

use crate::common::{
    check_fixture_episodes, check_fixture_values, fixture_episodes as episodes, fixture_path,
    payload_names, small_batches, small_segments,
};

fn fixture(name: &str) -> PathBuf {
    fixture_path("torchrl", name)
}

/// Ingests the dump `name` and checks it holds transitions `lo..hi`, in order.
fn check_dump(name: &str, lo: usize, hi: usize) {
    let dir = tempfile::tempdir().unwrap();
    let input = fixture(name);
    let out = dir.path().join("ds");
    let format = InputFormat::detect(&input).unwrap();
    assert_eq!(format, InputFormat::TorchRl);
    let r = ingest(&input, format, &out, &small_batches(), small_segments()).unwrap();
    let want = episodes(lo, hi);
    assert_eq!(r.rows, (hi - lo) as u64);
    assert_eq!(r.episodes, want.len() as u64);
    assert_eq!(r.boundaries, "flags next/terminated, next/truncated");
    for pair in [
        ("reward", "next/reward"),
        ("next_observation", "next/observation"),
    ] {
        assert!(
            r.columns
                .contains(&(pair.0.to_string(), pair.1.to_string())),
            "{:?}",
            r.columns
        );
    }

    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    let names = payload_names(&snap);
    // `index` (the buffer's bookkeeping) and `next/done` (terminated OR truncated) are left out.
    assert_eq!(
        names,
        [
            "observation",
            "action",
            "reward",
            "next_observation",
            "collector/traj_ids"
        ]
    );
    check_fixture_episodes(&snap, &want);
    for (id, &(start, len, _, _)) in want.iter().enumerate() {
        let e = snap.episode(id as u64).unwrap().unwrap();
        check_fixture_values(&e, start, len);
        // The collector's trajectory id is constant within an episode.
        let traj = e
            .column_by_name("collector/traj_ids")
            .unwrap()
            .as_primitive::<Int64Type>();
        assert!(traj.values().iter().all(|&t| t == traj.value(0)));
    }
}

#[test]
fn a_dump_ingests_without_options() {
    check_dump("dump", 0, 700);
}

/// A ring buffer of 300 rows that saw 700 transitions holds the last 300, oldest at the writer's
/// cursor: they come out in the order they were added.
#[test]
fn a_wrapped_ring_buffer_ingests_oldest_first() {
    check_dump("wrapped", 400, 700);
}

#[test]
fn episode_ids_instead_of_flags() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let o = small_batches()
        .with_episode_col("collector/traj_ids")
        .with_drop_cols(["next/done", "next/terminated", "next/truncated"]);
    let r = ingest(
        &fixture("dump"),
        InputFormat::TorchRl,
        &out,
        &o,
        small_segments(),
    )
    .unwrap();
    assert_eq!(r.boundaries, "episode ids in `collector/traj_ids`");
    let want = episodes(0, 700);
    assert_eq!(r.episodes, want.len() as u64);
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(
        snap.episodes().lengths(),
        want.iter()
            .map(|e| e.1 as u64)
            .collect::<Vec<_>>()
            .as_slice()
    );
    for id in 0..snap.num_episodes() {
        let e = snap.episode(id).unwrap().unwrap();
        let src = e.column_by_name("source_episode").unwrap();
        assert!(
            src.as_primitive::<arrow::datatypes::Int64Type>()
                .values()
                .iter()
                .all(|&v| v as u64 == id)
        );
        assert!(e.column_by_name("terminated").is_some());
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let p = entry.unwrap().path();
        let q = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &q);
        } else {
            std::fs::copy(&p, &q).unwrap();
        }
    }
}

/// Ingesting `input` fails with an error containing `needle` and leaves no dataset.
fn fails(input: &Path, needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let err = ingest(
        input,
        InputFormat::TorchRl,
        &out,
        &small_batches(),
        small_segments(),
    )
    .unwrap_err();
    assert!(err.to_string().contains(needle), "{needle:?} not in: {err}");
    assert!(!out.exists());
}

#[test]
fn bad_dumps_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = |name: &str| {
        let d = dir.path().join(name);
        copy_dir(&fixture("dump"), &d);
        d
    };

    // A storage directory alone, without the number of valid rows.
    let d = fresh("no-len");
    std::fs::remove_file(d.join("storage/storage_metadata.json")).unwrap();
    fails(&d, "rb.dumps");

    // A tensor file shorter than its shape.
    let d = fresh("short");
    let f = d.join("storage/next/reward.memmap");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    fails(&d, "truncated");

    // A dtype Arrow has no type for.
    let d = fresh("bf16");
    let meta = d.join("storage/meta.json");
    let text =
        std::fs::read_to_string(&meta)
            .unwrap()
            .replacen("torch.float32", "torch.bfloat16", 1);
    std::fs::write(&meta, text).unwrap();
    fails(&d, "bfloat16");

    // Broken JSON, a missing tensor file, more valid rows than the capacity.
    let d = fresh("json");
    std::fs::write(d.join("storage/next/meta.json"), "{\"observation\": ").unwrap();
    fails(&d, "not valid JSON");
    let d = fresh("missing");
    std::fs::remove_file(d.join("storage/action.memmap")).unwrap();
    fails(&d, "action.memmap");
    let d = fresh("len");
    std::fs::write(
        d.join("storage/storage_metadata.json"),
        r#"{"metadata": {}, "is_pytree": false, "len": 5000}"#,
    )
    .unwrap();
    fails(&d, "do not fit");

    // Still fine after all that: the fixture itself was never touched.
    check_dump("dump", 0, 700);
}
