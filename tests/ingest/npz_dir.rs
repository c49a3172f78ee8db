//! Directories of `.npz` shards and the conventions of `.npz` files whose rows are not all
//! transitions: OGBench's (against what `ogbench.load_dataset` returns for real OGBench files,
//! `tests/python/make_ogbench_fixtures.py`) and one episode per file with `T + 1` observations;
//! a sharded directory against one file of the same rows, and mismatched or damaged shards as
//! named errors that leave no dataset.

use std::path::Path;

use trajstore::ingest::{Convention, IngestOptions, InputFormat, ingest};
use trajstore::{Batch, Dataset, Error, Gatherer, SliceRef, Snapshot};

use crate::common::{fixture_path, run_cli, small_segments};

// ---------------------------------------------------------------------------------------------
// Writing .npz files (stored members) by hand.
// ---------------------------------------------------------------------------------------------

/// One array of an `.npz`: key, NumPy descr, shape, little-endian bytes.
pub(crate) struct Npy {
    key: String,
    descr: &'static str,
    shape: Vec<usize>,
    data: Vec<u8>,
}

pub(crate) fn npy<T: Copy>(key: &str, descr: &'static str, shape: &[usize], values: &[T]) -> Npy {
    assert_eq!(shape.iter().product::<usize>(), values.len(), "{key}");
    let bytes = unsafe {
        // SAFETY: plain numbers (f32, f64, i64, u8, bool) viewed as their bytes, on a
        // little-endian test machine.
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    };
    Npy {
        key: key.to_string(),
        descr,
        shape: shape.to_vec(),
        data: bytes.to_vec(),
    }
}

fn npy_bytes(a: &Npy) -> Vec<u8> {
    let shape = match a.shape.as_slice() {
        [n] => format!("({n},)"),
        s => format!(
            "({})",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        a.descr
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(&a.data);
    out
}

/// Writes an `.npz` (stored members, as `np.savez`) holding `arrays`.
pub(crate) fn write_npz(path: &Path, arrays: &[Npy]) {
    let mut out = vec![];
    let mut central = vec![];
    for a in arrays {
        let name = format!("{}.npy", a.key);
        let data = npy_bytes(a);
        let crc = crc32fast::hash(&data);
        let offset = out.len() as u32;
        let fields = |sig: u32, central: bool| {
            let mut h = sig.to_le_bytes().to_vec();
            if central {
                h.extend(20u16.to_le_bytes()); // made by
            }
            h.extend(20u16.to_le_bytes()); // needed
            h.extend([0u8; 2]); // flags
            h.extend([0u8; 2]); // stored
            h.extend([0u8; 4]); // time, date
            h.extend(crc.to_le_bytes());
            h.extend((data.len() as u32).to_le_bytes());
            h.extend((data.len() as u32).to_le_bytes());
            h.extend((name.len() as u16).to_le_bytes());
            h.extend([0u8; 2]); // extra
            if central {
                h.extend([0u8; 6]); // comment, disk, internal attributes
                h.extend([0u8; 4]); // external attributes
                h.extend(offset.to_le_bytes());
            }
            h.extend(name.as_bytes());
            h
        };
        out.extend(fields(0x0403_4b50, false));
        out.extend(&data);
        central.extend(fields(0x0201_4b50, true));
    }
    let cd_offset = out.len() as u32;
    out.extend(&central);
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0u8; 4]);
    out.extend((arrays.len() as u16).to_le_bytes());
    out.extend((arrays.len() as u16).to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(cd_offset.to_le_bytes());
    out.extend([0u8; 2]);
    std::fs::write(path, out).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Reading a dataset back as a researcher does: whole episodes through the gatherer.
// ---------------------------------------------------------------------------------------------

/// Every episode of `snap` gathered whole (one slice each), `next_observation` included.
fn gather_all(snap: &Snapshot, columns: &[&str]) -> Vec<Batch> {
    let g = Gatherer::try_new(snap, columns).unwrap();
    (0..snap.episodes().len())
        .map(|e| {
            let len = snap.episodes().lengths()[e];
            let mut b = Batch::default();
            g.gather(
                &[SliceRef {
                    episode: e as u32,
                    start: 0,
                    len: len as u32,
                }],
                &mut b,
            )
            .unwrap();
            assert!(b.mask.iter().all(|&m| m == 1));
            b
        })
        .collect()
}

fn bytes_of(batches: &[Batch], column: &str) -> Vec<u8> {
    batches
        .iter()
        .flat_map(|b| b.column(column).unwrap().data.as_slice().to_vec())
        .collect()
}

fn open(out: &Path) -> Snapshot {
    Dataset::open(out).unwrap().snapshot().unwrap()
}

// ---------------------------------------------------------------------------------------------
// OGBench, against its own loader.
// ---------------------------------------------------------------------------------------------

#[test]
fn ogbench_shards_ingest_as_ogbench_load_dataset_returns_them() {
    let input = fixture_path("ogbench", "scene-sharded");
    let expected: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixture_path("ogbench", "scene-sharded.expected.json")).unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    assert_eq!(InputFormat::detect(&input).unwrap(), InputFormat::Numpy);
    // Recognised from its keys: no options.
    let report = ingest(
        &input,
        InputFormat::Numpy,
        &out,
        &IngestOptions::default().with_batch_rows(16),
        small_segments(),
    )
    .unwrap();
    let c = report.convention.clone().unwrap();
    assert_eq!(c.convention, Convention::Ogbench);
    assert!(c.recognised);
    assert_eq!(c.files, 3);
    let left: Vec<String> = c
        .left_out
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        [
            "scene-play-v0-0-val.npz",
            "scene-play-v0-1-val.npz",
            "scene-play-v0-2-val.npz"
        ]
    );
    assert!(
        report.boundaries.contains("OGBench"),
        "{}",
        report.boundaries
    );
    for pair in [
        ("observation", "observations"),
        ("action", "actions"),
        ("reward", "none (0.0)"),
    ] {
        assert!(
            report.columns.contains(&(pair.0.into(), pair.1.into())),
            "{:?}",
            report.columns
        );
    }

    let shards = expected["shards"].as_array().unwrap();
    let total: u64 = shards
        .iter()
        .map(|s| s["transitions"].as_u64().unwrap())
        .sum();
    assert_eq!(report.rows, total);
    let snap = open(&out);
    assert_eq!(snap.num_transitions(), total);
    assert!(!snap.schema().has_next_observation(), "derived, not stored");
    let names = [
        "observation",
        "action",
        "next_observation",
        "qpos",
        "qvel",
        "button_states",
    ];
    let batches = gather_all(&snap, &names);
    // Episodes in order, split by shard: each shard's trajectories.
    let mut at = 0;
    for shard in shards {
        let n = shard["transitions"].as_u64().unwrap() as usize;
        let terminals: Vec<u8> = shard["terminals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u8)
            .collect();
        let trajectories = terminals.iter().filter(|&&t| t == 1).count();
        let mine = &batches[at..at + trajectories];
        at += trajectories;
        assert_eq!(mine.iter().map(|b| b.slice_len).sum::<usize>(), n);
        // `terminals` of the loader: 1 on the last transition of a trajectory, which trajstore
        // ends truncated (a time limit), never terminated.
        let is_last: Vec<u8> = mine.iter().flat_map(|b| b.is_last.clone()).collect();
        let truncated: Vec<u8> = mine.iter().flat_map(|b| b.truncated.clone()).collect();
        assert_eq!(is_last, terminals, "{}", shard["file"]);
        assert_eq!(truncated, terminals, "{}", shard["file"]);
        assert!(mine.iter().all(|b| b.terminated.iter().all(|&t| t == 0)));
        let first: Vec<f32> = shard["first_observation"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(
            &mine[0].column("observation").unwrap().values::<f32>()[..first.len()],
            first
        );
        for (ours, theirs, dtype) in [
            ("observation", "observations", "float32"),
            ("action", "actions", "float32"),
            ("next_observation", "next_observations", "float32"),
            ("qpos", "qpos", "float32"),
            ("qvel", "qvel", "float32"),
            ("button_states", "button_states", "int64"),
        ] {
            let want = &shard["arrays"][theirs];
            assert_eq!(want["dtype"], dtype, "{theirs}");
            let bytes = bytes_of(mine, ours);
            let shape: Vec<usize> = want["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(shape[0], n, "{theirs}");
            let size = if dtype == "int64" { 8 } else { 4 };
            assert_eq!(
                bytes.len(),
                shape.iter().product::<usize>() * size,
                "{theirs}"
            );
            assert_eq!(
                crc32fast::hash(&bytes) as u64,
                want["crc32"].as_u64().unwrap(),
                "{}: `{ours}` differs from load_dataset's `{theirs}`",
                shard["file"]
            );
        }
    }
    assert_eq!(at, batches.len());
}

#[test]
fn ogbench_json_output_says_the_convention_was_recognised() {
    let input = fixture_path("ogbench", "scene-sharded");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let (code, stdout, stderr) = run_cli(&[
        "ingest",
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["convention"]["name"], "ogbench");
    assert_eq!(v["convention"]["recognised"], true);
    assert_eq!(v["convention"]["files"], 3);
    assert_eq!(v["convention"]["left_out"].as_array().unwrap().len(), 3);
    assert_eq!(v["columns"]["observation"], "observations");
    assert_eq!(v["rows"], 150);
    // The text output says it too.
    let out2 = dir.path().join("ds2");
    let (code, stdout, stderr) =
        run_cli(&["ingest", input.to_str().unwrap(), out2.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("convention ogbench (recognised); 3 .npz file(s) read, 3 left out"),
        "{stdout}"
    );
}

// ---------------------------------------------------------------------------------------------
// Sharded = one file.
// ---------------------------------------------------------------------------------------------

/// OGBench-format arrays of trajectories of `lens` rows (each ending with `terminals` set);
/// row values encode the global row `base + i`.
pub(crate) fn ogbench_arrays(base: usize, lens: &[usize]) -> Vec<Npy> {
    let n: usize = lens.iter().sum();
    let rows = base..base + n;
    let obs: Vec<f32> = rows
        .clone()
        .flat_map(|i| [i as f32, 0.5, -(i as f32)])
        .collect();
    let act: Vec<f32> = rows.clone().flat_map(|i| [i as f32 * 0.25, 1.0]).collect();
    let mut terminals = vec![false; n];
    let mut end = 0;
    for l in lens {
        end += l;
        terminals[end - 1] = true;
    }
    let qpos: Vec<f32> = rows.clone().flat_map(|i| [i as f32 + 0.125; 2]).collect();
    let buttons: Vec<i64> = rows.flat_map(|i| [i as i64 % 3, i as i64 % 5]).collect();
    vec![
        npy("observations", "<f4", &[n, 3], &obs),
        npy("actions", "<f4", &[n, 2], &act),
        npy("terminals", "|b1", &[n], &terminals),
        npy("qpos", "<f4", &[n, 2], &qpos),
        npy("button_states", "<i8", &[n, 2], &buttons),
    ]
}

fn ingest_ok(input: &Path, out: &Path, opts: &IngestOptions) -> trajstore::ingest::IngestReport {
    ingest(input, InputFormat::Numpy, out, opts, small_segments()).unwrap()
}

/// Every episode's stored rows and (terminated, truncated), and every gathered
/// `next_observation`, of the dataset at `out`.
fn contents(out: &Path) -> (Vec<arrow::array::RecordBatch>, Vec<u8>) {
    let snap = open(out);
    let eps = (0..snap.num_episodes())
        .map(|e| snap.episode(e).unwrap().unwrap())
        .collect();
    let next = bytes_of(
        &gather_all(&snap, &["next_observation"]),
        "next_observation",
    );
    (eps, next)
}

#[test]
fn a_sharded_directory_ingests_as_one_file_of_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    // OGBench shards (each ends on a trajectory end), named so that only natural order is right.
    let lens = [[5, 7, 4], [6, 6, 3], [9, 2, 5]];
    let mut base = 0;
    for (i, l) in lens.iter().enumerate() {
        let name = ["part-9.npz", "part-10.npz", "part-11.npz"][i];
        write_npz(&shards.join(name), &ogbench_arrays(base, l));
        base += l.iter().sum::<usize>();
    }
    let all: Vec<usize> = lens.iter().flatten().copied().collect();
    let one = dir.path().join("one.npz");
    write_npz(&one, &ogbench_arrays(0, &all));
    let opts = IngestOptions::default().with_batch_rows(4);
    let a = ingest_ok(&shards, &dir.path().join("a"), &opts);
    let b = ingest_ok(&one, &dir.path().join("b"), &opts);
    assert_eq!(
        a.convention.as_ref().unwrap().convention,
        Convention::Ogbench
    );
    assert_eq!(a.convention.as_ref().unwrap().files, 3);
    assert_eq!(b.convention.as_ref().unwrap().files, 1);
    assert_eq!((a.rows, a.episodes), (b.rows, b.episodes));
    assert_eq!(
        a.rows as usize,
        base - all.len(),
        "one state row per trajectory"
    );
    assert_eq!(a.episodes as usize, all.len());
    let (ea, na) = contents(&dir.path().join("a"));
    let (eb, nb) = contents(&dir.path().join("b"));
    assert_eq!(ea, eb);
    assert_eq!(na, nb);
    // Episode 3 (the second shard's first trajectory, rows 16..22): observations rows 16..21,
    // the next observation of its last step row 21's successor, row 21 (the state row).
    let e = &ea[3];
    assert_eq!(e.num_rows(), 5);
    let obs = crate::common::f32_values(e, "observation");
    assert_eq!(obs[0], 16.0);
    let snap = open(&dir.path().join("a"));
    let b3 = &gather_all(&snap, &["next_observation"])[3];
    assert_eq!(
        b3.column("next_observation").unwrap().values::<f32>()[12],
        21.0
    );

    // Plain rows (D4RL-style flags): an episode left open at a shard's end continues in the
    // next shard, as in one file.
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let d4rl = |lo: usize, hi: usize| {
        let obs: Vec<f32> = (lo..hi).flat_map(|i| [i as f32; 3]).collect();
        let act: Vec<f32> = (lo..hi).flat_map(|i| [i as f32; 2]).collect();
        let rew: Vec<f32> = (lo..hi).map(|i| i as f32).collect();
        let term: Vec<bool> = (lo..hi).map(|i| i % 13 == 12).collect();
        let time: Vec<bool> = (lo..hi).map(|i| i % 29 == 28).collect();
        let n = hi - lo;
        vec![
            npy("observations", "<f4", &[n, 3], &obs),
            npy("actions", "<f4", &[n, 2], &act),
            npy("rewards", "<f4", &[n], &rew),
            npy("terminals", "|b1", &[n], &term),
            npy("timeouts", "|b1", &[n], &time),
        ]
    };
    write_npz(&plain.join("d-0.npz"), &d4rl(0, 20));
    write_npz(&plain.join("d-1.npz"), &d4rl(20, 31));
    write_npz(&plain.join("d-2.npz"), &d4rl(31, 70));
    let one = dir.path().join("plain.npz");
    write_npz(&one, &d4rl(0, 70));
    let a = ingest_ok(&plain, &dir.path().join("pa"), &opts);
    let b = ingest_ok(&one, &dir.path().join("pb"), &opts);
    assert_eq!(a.convention.as_ref().unwrap().convention, Convention::Rows);
    assert!(!a.convention.as_ref().unwrap().recognised);
    assert!(b.convention.is_none(), "a plain .npz is read as before");
    assert_eq!((a.rows, a.episodes), (70, b.episodes));
    assert_eq!(
        contents(&dir.path().join("pa")),
        contents(&dir.path().join("pb"))
    );
}

// ---------------------------------------------------------------------------------------------
// Bad shards: named errors, no dataset.
// ---------------------------------------------------------------------------------------------

fn fails(input: &Path, out: &Path, opts: &IngestOptions) -> Error {
    let e = ingest(input, InputFormat::Numpy, out, opts, small_segments()).unwrap_err();
    assert!(!out.exists(), "{e}: a failed ingest leaves no dataset");
    e
}

#[test]
fn mismatched_shards_are_named_errors_that_leave_no_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let good = |base| ogbench_arrays(base, &[4, 4]);
    type Change = fn(&mut Vec<Npy>);
    let cases: [(&str, Change, &str, &str, &str); 4] = [
        (
            "missing",
            |a| a.retain(|x| x.key != "qpos"),
            "qpos",
            "an array `qpos`",
            "no such array",
        ),
        (
            "dtype",
            |a| {
                let n = a[1].shape[0];
                a[1] = npy("actions", "<f8", &[n, 2], &vec![0f64; n * 2]);
            },
            "actions",
            "float32",
            "float64",
        ),
        (
            "shape",
            |a| {
                let n = a[0].shape[0];
                a[0] = npy("observations", "<f4", &[n, 4], &vec![0f32; n * 4]);
            },
            "observations",
            "rows of shape [3]",
            "rows of shape [4]",
        ),
        (
            "extra",
            |a| {
                let n = a[0].shape[0];
                a.push(npy("extra", "<f4", &[n], &vec![0f32; n]));
            },
            "extra",
            "no such array",
            "an array `extra`",
        ),
    ];
    for (name, change, key, expected_text, found_text) in cases {
        let shards = dir.path().join(name);
        std::fs::create_dir(&shards).unwrap();
        write_npz(&shards.join("s-0.npz"), &good(0));
        let mut bad = good(8);
        change(&mut bad);
        write_npz(&shards.join("s-1.npz"), &bad);
        write_npz(&shards.join("s-2.npz"), &good(16));
        let e = fails(
            &shards,
            &dir.path().join(format!("{name}.out")),
            &IngestOptions::default(),
        );
        match &e {
            Error::SchemaMismatch {
                column,
                expected,
                found,
                reason,
            } => {
                assert_eq!(column.as_deref(), Some(key), "{name}: {e}");
                assert!(
                    expected.as_deref().unwrap().contains(expected_text),
                    "{name}: {e}"
                );
                assert!(
                    found.as_deref().unwrap().contains(found_text),
                    "{name}: {e}"
                );
                assert!(reason.contains("s-1.npz"), "{name}: names the file: {e}");
                assert!(
                    reason.contains("s-0.npz"),
                    "{name}: names the first file: {e}"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn an_ogbench_shard_that_ends_inside_a_trajectory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    write_npz(&shards.join("s-0.npz"), &ogbench_arrays(0, &[4, 4]));
    let mut cut = ogbench_arrays(8, &[4, 4]);
    // The last trajectory's end flag is gone (a truncated generation run).
    let n = cut[2].shape[0];
    cut[2] = npy("terminals", "|b1", &[n], &{
        let mut t = vec![false; n];
        t[3] = true;
        t
    });
    write_npz(&shards.join("s-1.npz"), &cut);
    write_npz(&shards.join("s-2.npz"), &ogbench_arrays(16, &[4, 4]));
    let e = fails(&shards, &dir.path().join("out"), &IngestOptions::default());
    match &e {
        Error::InvalidData { input, reason, .. } => {
            assert!(
                input.as_deref().is_some_and(|i| i.ends_with("s-1.npz")),
                "{e}"
            );
            assert!(reason.contains("ends inside a trajectory"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // A convention that does not fit is refused before anything is read.
    let e = fails(
        &shards,
        &dir.path().join("out2"),
        &IngestOptions::default()
            .with_convention(Some(Convention::Ogbench))
            .with_terminated_col("terminals"),
    );
    assert!(e.to_string().contains("--convention ogbench"), "{e}");
    let e = fails(
        &shards,
        &dir.path().join("out3"),
        &IngestOptions::default().with_convention(Some(Convention::EpisodeFiles)),
    );
    assert!(
        e.to_string().contains("one observation more than actions"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// One episode per file, T + 1 observations.
// ---------------------------------------------------------------------------------------------

/// Episode file `i`: `t` steps, observations `[t + 1, 3]` holding `100 i + row`, discrete
/// actions, rewards, and `terminals` set on the last step of every third episode.
pub(crate) fn episode_file(i: usize, t: usize) -> Vec<Npy> {
    let obs: Vec<f32> = (0..=t).flat_map(|r| [(100 * i + r) as f32; 3]).collect();
    let act: Vec<i64> = (0..t).map(|r| (r % 4) as i64).collect();
    let rew: Vec<f32> = (0..t).map(|r| r as f32 * 0.5).collect();
    let term: Vec<bool> = (0..t).map(|r| r + 1 == t && i.is_multiple_of(3)).collect();
    vec![
        npy("observations", "<f4", &[t + 1, 3], &obs),
        npy("actions", "<i8", &[t], &act),
        npy("rewards", "<f4", &[t], &rew),
        npy("terminals", "|b1", &[t], &term),
    ]
}

#[test]
fn episode_files_with_one_observation_more_are_one_episode_each() {
    let dir = tempfile::tempdir().unwrap();
    let eps = dir.path().join("episodes");
    std::fs::create_dir(&eps).unwrap();
    let steps = |i: usize| 3 + i % 4;
    for i in 0..12 {
        write_npz(&eps.join(format!("ep_{i}.npz")), &episode_file(i, steps(i)));
    }
    // A file of one state and no step holds no transition.
    write_npz(&eps.join("ep_12.npz"), &episode_file(12, 0));
    let report = ingest_ok(
        &eps,
        &dir.path().join("out"),
        &IngestOptions::default().with_batch_rows(2),
    );
    let c = report.convention.unwrap();
    assert_eq!(
        (c.convention, c.recognised, c.files),
        (Convention::EpisodeFiles, true, 13)
    );
    assert!(
        report.boundaries.contains("one episode per file"),
        "{}",
        report.boundaries
    );
    assert!(
        report
            .columns
            .contains(&("source_episode".into(), "episode_file".into()))
    );
    assert_eq!(report.episodes, 12);
    assert_eq!(report.rows as usize, (0..12).map(steps).sum::<usize>());
    let snap = open(&dir.path().join("out"));
    let batches = gather_all(
        &snap,
        &["observation", "next_observation", "action", "reward"],
    );
    for (i, b) in batches.iter().enumerate() {
        // Natural name order: ep_2 before ep_10.
        let t = steps(i);
        assert_eq!(b.slice_len, t, "episode {i}");
        let obs = b.column("observation").unwrap().values::<f32>();
        let next = b.column("next_observation").unwrap().values::<f32>();
        let want: Vec<f32> = (0..t).flat_map(|r| [(100 * i + r) as f32; 3]).collect();
        let want_next: Vec<f32> = (1..=t).flat_map(|r| [(100 * i + r) as f32; 3]).collect();
        assert_eq!(obs, want, "episode {i}");
        assert_eq!(next, want_next, "episode {i}: the last observation ends it");
        let act = b.column("action").unwrap().values::<i64>();
        assert_eq!(act, (0..t).map(|r| (r % 4) as i64).collect::<Vec<_>>());
        assert_eq!(
            b.terminated[t - 1],
            u8::from(i.is_multiple_of(3)),
            "episode {i}"
        );
        assert_eq!(
            b.truncated[t - 1],
            u8::from(!i.is_multiple_of(3)),
            "episode {i}"
        );
        let e = snap.episode(i as u64).unwrap().unwrap();
        let ids = e.column_by_name("source_episode").unwrap();
        let ids = ids
            .as_any()
            .downcast_ref::<arrow::array::UInt64Array>()
            .unwrap();
        assert!(ids.values().iter().all(|&id| id == i as u64));
    }
    // Mixed lengths in one file are named.
    let bad = dir.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    write_npz(&bad.join("ep_0.npz"), &episode_file(0, 3));
    let mut b = episode_file(1, 3);
    b[2] = npy("rewards", "<f4", &[2], &[0f32, 1.0]);
    write_npz(&bad.join("ep_1.npz"), &b);
    let e = fails(&bad, &dir.path().join("bad.out"), &IngestOptions::default());
    let text = e.to_string();
    assert!(
        text.contains("ep_1.npz") && text.contains("rewards"),
        "{text}"
    );
    // A terminated flag before the last step is refused, as in every other input.
    let mid = dir.path().join("mid");
    std::fs::create_dir(&mid).unwrap();
    let mut m = episode_file(1, 4);
    m[3] = npy("terminals", "|b1", &[4], &[false, true, false, false]);
    write_npz(&mid.join("ep_0.npz"), &m);
    let e = fails(&mid, &dir.path().join("mid.out"), &IngestOptions::default());
    assert!(
        e.to_string()
            .contains("row 1: `terminals` is set, but row 3 continues"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// Pixels: a sharded directory of uint8 frames becomes one frame column.
// ---------------------------------------------------------------------------------------------

#[test]
fn sharded_uint8_frames_become_one_frame_column() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("visual");
    std::fs::create_dir(&shards).unwrap();
    let (h, w, c) = (16, 16, 3);
    let frame = |i: usize| -> Vec<u8> {
        (0..h * w * c)
            .map(|k| ((k / c) % 7 * 20 + i * 3 + k % c) as u8)
            .collect()
    };
    let mut base = 0;
    let mut all_frames = vec![];
    for (s, lens) in [[6usize, 5], [7, 4]].iter().enumerate() {
        let n: usize = lens.iter().sum();
        let mut arrays = ogbench_arrays(base, lens);
        let pixels: Vec<u8> = (base..base + n).flat_map(frame).collect();
        all_frames.push((base, lens.to_vec()));
        arrays[0] = npy("observations", "|u1", &[n, h, w, c], &pixels);
        write_npz(&shards.join(format!("visual-{s}.npz")), &arrays);
        base += n;
    }
    let report = ingest_ok(&shards, &dir.path().join("out"), &IngestOptions::default());
    assert_eq!(report.convention.unwrap().convention, Convention::Ogbench);
    let snap = open(&dir.path().join("out"));
    let fc = snap.frame_column("observation").expect("a frame column");
    assert_eq!(fc.spec.shape, [h, w, c]);
    let batches = gather_all(&snap, &["observation", "next_observation"]);
    let mut e = 0;
    for (base, lens) in all_frames {
        let mut row = base;
        for l in lens {
            let b = &batches[e];
            let obs = b.column("observation").unwrap().values::<u8>();
            let next = b.column("next_observation").unwrap().values::<u8>();
            let want: Vec<u8> = (row..row + l - 1).flat_map(frame).collect();
            let want_next: Vec<u8> = (row + 1..row + l).flat_map(frame).collect();
            assert_eq!(obs, want, "episode {e}");
            assert_eq!(
                next, want_next,
                "episode {e}: the state row is the final frame"
            );
            row += l;
            e += 1;
        }
    }
    assert_eq!(e, batches.len());
}
