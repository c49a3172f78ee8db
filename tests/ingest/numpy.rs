//! NumPy ingest (`.npz` stored and compressed, directories of `.npy`) through the public API,
//! against fixtures written by real NumPy (`tests/python/make_numpy_fixtures.py`, whose docstring
//! gives the formula of every value), plus the conventions that let common layouts ingest without
//! options, and bad input: truncated, corrupt, inconsistent or unsupported arrays are clear errors
//! that leave nothing behind.

use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float64Type, Int16Type, Int64Type};
use trajstore::ingest::{IngestOptions, InputFormat, infer_schema, ingest};
use trajstore::{ActionKind, Dataset, Error, Snapshot, WriterOptions};

use crate::common::{
    TestData, check_fixture_episodes, check_fixture_values, ends, fixture_episodes, fixture_path,
    fixture_truncated as timeout, payload_names, small_batches, small_segments,
};

const N: usize = 1000;

fn fixture(name: &str) -> PathBuf {
    fixture_path("numpy", name)
}

/// Ingests `input` into a fresh dataset and checks every value against the fixture formulas.
/// `infos` names the user columns of `infos/qpos` and `infos/step`.
fn check_d4rl(input: &Path, infos: (&str, &str)) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let format = InputFormat::detect(input).unwrap();
    let want_format = if input.extension().is_some_and(|e| e == "hdf5") {
        InputFormat::Hdf5
    } else {
        InputFormat::Numpy
    };
    assert_eq!(format, want_format);
    let inferred = infer_schema(input, format, &small_batches()).unwrap();
    let report = ingest(input, format, &out, &small_batches(), small_segments()).unwrap();
    let want = fixture_episodes(0, N);
    assert_eq!(report.rows, N as u64);
    assert_eq!(report.episodes, want.len() as u64);
    assert_eq!(report.boundaries, "flags terminals, timeouts");
    for pair in [
        ("observation", "observations"),
        ("action", "actions"),
        ("reward", "rewards"),
        ("next_observation", "next_observations"),
    ] {
        assert!(
            report
                .columns
                .contains(&(pair.0.to_string(), pair.1.to_string())),
            "{:?}",
            report.columns
        );
    }

    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(snap.schema(), &inferred);
    assert!(snap.segments().len() > 1, "small segments");
    assert_eq!(snap.schema().observation_shape(), &[3]);
    assert_eq!(
        snap.schema().action_kind(),
        &ActionKind::Continuous { dim: 2 }
    );
    check_fixture_episodes(&snap, &want);
    for (id, &(start, len, _, _)) in want.iter().enumerate() {
        let e = snap.episode(id as u64).unwrap().unwrap();
        check_fixture_values(&e, start, len);
        let rows = start..start + len;
        let qpos = e.column_by_name(infos.0).unwrap().as_fixed_size_list();
        assert_eq!(qpos.value_length(), 2);
        let want_qpos: Vec<f64> = rows
            .clone()
            .flat_map(|i| (0..2).map(move |j| i as f64 + 0.125 * j as f64))
            .collect();
        assert_eq!(
            qpos.values()
                .as_primitive::<Float64Type>()
                .values()
                .to_vec(),
            want_qpos
        );
        let step = e
            .column_by_name(infos.1)
            .unwrap()
            .as_primitive::<Int16Type>();
        let want_step: Vec<i16> = rows.map(|i| (i % 7) as i16).collect();
        assert_eq!(step.values().to_vec(), want_step);
        // Flags are consumed, not stored.
        assert!(e.column_by_name("terminals").is_none() && e.column_by_name("timeouts").is_none());
    }
    assert!(
        snap.manifest()
            .properties
            .get("source")
            .is_some_and(|s| s.ends_with(input.file_name().unwrap().to_str().unwrap()))
    );
}

#[test]
fn d4rl_npz_from_np_savez_ingests_without_options() {
    check_d4rl(&fixture("d4rl.npz"), ("infos/qpos", "infos/step"));
}

#[test]
fn d4rl_npz_from_np_savez_compressed_ingests_the_same() {
    check_d4rl(
        &fixture("d4rl_compressed.npz"),
        ("infos/qpos", "infos/step"),
    );
}

#[test]
fn a_directory_of_npy_files_ingests_the_same() {
    check_d4rl(&fixture("d4rl_dir"), ("infos_qpos", "infos_step"));
}

/// D4RL's own file format: HDF5 written by h5py (chunked, gzip and shuffle filters, booleans,
/// nested `infos/`, a `metadata/` group that is not a column), read without libhdf5.
#[test]
fn d4rl_hdf5_from_h5py_ingests_the_same() {
    check_d4rl(
        &fixture_path("hdf5", "d4rl.hdf5"),
        ("infos/qpos", "infos/step"),
    );
}

#[test]
fn broken_hdf5_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let o = small_batches();
    let bytes = std::fs::read(fixture_path("hdf5", "d4rl.hdf5")).unwrap();
    let cut = dir.path().join("cut.hdf5");
    // Every cut (a download cut short) is an error.
    for at in (0..bytes.len()).step_by(bytes.len() / 97 + 1) {
        std::fs::write(&cut, &bytes[..at]).unwrap();
        let out = dir.path().join(format!("ds{at}"));
        let e = ingest(&cut, InputFormat::Hdf5, &out, &o, small_segments()).unwrap_err();
        assert!(
            matches!(e, Error::Corrupt { .. } | Error::InvalidData { .. }),
            "d4rl.hdf5 cut at {at}: {e:?}"
        );
        assert!(!out.exists());
    }
    // HDF5 has no checksum over raw data, so a flipped byte may go through as another value, but
    // never as a panic or a half-written dataset.
    for k in 0..120 {
        let at = bytes.len() * k / 120;
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x5a;
        std::fs::write(&cut, &flipped).unwrap();
        let out = dir.path().join(format!("flip{k}"));
        if let Err(e) = ingest(&cut, InputFormat::Hdf5, &out, &o, small_segments()) {
            assert!(
                matches!(e, Error::Corrupt { .. } | Error::InvalidData { .. }),
                "d4rl.hdf5 with byte {at} flipped: {e:?}"
            );
            assert!(!out.exists());
        }
    }
}

#[test]
fn integer_actions_stay_integers_and_gymnasium_flag_names_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let input = fixture("discrete.npz");
    let r = ingest(
        &input,
        InputFormat::Numpy,
        &out,
        &small_batches(),
        small_segments(),
    )
    .unwrap();
    assert_eq!(r.boundaries, "flags terminated, truncated");
    assert_eq!(r.episodes, fixture_episodes(0, N).len() as u64);
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert!(matches!(snap.schema().action_kind(), ActionKind::Discrete));
    let mut actions: Vec<i64> = vec![];
    for id in 0..snap.num_episodes() {
        let e = snap.episode(id).unwrap().unwrap();
        actions.extend(
            e.column_by_name("action")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .iter(),
        );
    }
    assert_eq!(actions, (0..N as i64).map(|i| i % 5).collect::<Vec<_>>());
}

#[test]
fn options_override_conventions_and_drop_cols_skips_arrays() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    // Only the time limits end episodes; the infos are dropped; next observations are derived.
    let o = small_batches()
        .with_truncated_col("timeouts")
        .with_drop_cols(["infos/qpos", "infos/step", "next_observations", "terminals"]);
    let r = ingest(
        &fixture("d4rl.npz"),
        InputFormat::Numpy,
        &out,
        &o,
        small_segments(),
    )
    .unwrap();
    assert_eq!(r.boundaries, "flags timeouts");
    let timeouts = (0..N).filter(|&i| timeout(i)).count();
    assert_eq!(r.episodes, timeouts as u64 + 1);
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    let names = payload_names(&snap);
    assert_eq!(names, ["observation", "action", "reward"]);
}

// ---------------------------------------------------------------------------------------------
// Bad input.
// ---------------------------------------------------------------------------------------------

/// A `.npy` file written by hand (format 1.0), for inputs NumPy would not write by default.
pub(crate) fn write_npy(path: &Path, descr: &str, fortran: bool, shape: &[usize], data: &[u8]) {
    let shape_text = match shape {
        [n] => format!("({n},)"),
        s => format!(
            "({})",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let fo = if fortran { "True" } else { "False" };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {fo}, 'shape': {shape_text}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

/// A directory with valid `observations`, `actions`, `rewards`, `terminals` of `n` rows.
fn npy_dir(root: &Path, n: usize) -> PathBuf {
    let d = root.join("arrays");
    std::fs::create_dir_all(&d).unwrap();
    let f32s =
        |k: usize| -> Vec<u8> { (0..n * k).flat_map(|i| (i as f32).to_le_bytes()).collect() };
    write_npy(&d.join("observations.npy"), "<f4", false, &[n, 2], &f32s(2));
    write_npy(&d.join("actions.npy"), "<f4", false, &[n, 1], &f32s(1));
    write_npy(&d.join("rewards.npy"), "<f4", false, &[n], &f32s(1));
    let terms: Vec<u8> = (0..n).map(|i| u8::from(i % 10 == 9)).collect();
    write_npy(&d.join("terminals.npy"), "|b1", false, &[n], &terms);
    d
}

/// Ingesting `input` fails, with an error whose text contains `needle`, and leaves no dataset.
fn fails(input: &Path, o: &IngestOptions, needle: &str) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let err = InputFormat::detect(input)
        .and_then(|f| ingest(input, f, &out, o, small_segments()))
        .unwrap_err();
    assert!(err.to_string().contains(needle), "{needle:?} not in: {err}");
    assert!(!out.exists(), "a failed ingest left {}", out.display());
    err
}

#[test]
fn hand_written_npy_directory_ingests() {
    let dir = tempfile::tempdir().unwrap();
    let d = npy_dir(dir.path(), 40);
    let out = dir.path().join("ds");
    let r = ingest(
        &d,
        InputFormat::Numpy,
        &out,
        &small_batches(),
        small_segments(),
    )
    .unwrap();
    assert_eq!((r.rows, r.episodes), (40, 4));
}

#[test]
fn inconsistent_or_unsupported_arrays_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = npy_dir(dir.path(), 40);
    let o = small_batches();

    // One row short: named, with the way out.
    write_npy(&d.join("extra.npy"), "<f8", false, &[39], &[0; 39 * 8]);
    let e = fails(&d, &o, "`extra` has 39 rows");
    assert!(
        matches!(e, Error::SchemaMismatch { .. }) && e.to_string().contains("--drop-cols extra")
    );
    // ... which works.
    let out = dir.path().join("ok");
    ingest(
        &d,
        InputFormat::Numpy,
        &out,
        &small_batches().with_drop_cols(["extra"]),
        small_segments(),
    )
    .unwrap();

    write_npy(&d.join("extra.npy"), "<u2", false, &[], &[0; 2]);
    fails(&d, &o, "is a scalar");
    write_npy(&d.join("extra.npy"), ">f4", false, &[40], &[0; 160]);
    fails(&d, &o, "big-endian");
    write_npy(&d.join("extra.npy"), "<c8", false, &[40], &[0; 320]);
    fails(&d, &o, "not supported");
    write_npy(&d.join("extra.npy"), "<f4", true, &[40, 2], &[0; 320]);
    fails(&d, &o, "Fortran");
    // Data shorter than the shape says.
    write_npy(&d.join("extra.npy"), "<f4", false, &[40], &[0; 100]);
    fails(&d, &o, "truncated");
    std::fs::write(d.join("extra.npy"), b"not numpy at all").unwrap();
    fails(&d, &o, "not a NumPy .npy array");
    std::fs::remove_file(d.join("extra.npy")).unwrap();

    // A single array, an unknown file, an empty directory.
    fails(&d.join("rewards.npy"), &o, "single .npy array");
    let csv = dir.path().join("data.csv");
    std::fs::write(&csv, "a,b\n1,2\n").unwrap();
    fails(&csv, &o, "unknown input format");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails(&empty, &o, "holds no .npy arrays");
    // No way to find episodes.
    std::fs::remove_file(d.join("terminals.npy")).unwrap();
    fails(&d, &o, "--episode-col");
}

/// Every prefix of an archive (a download cut short) is an error, never a panic, and never a
/// dataset.
#[test]
fn truncated_archives_are_errors() {
    for name in ["d4rl.npz", "d4rl_compressed.npz"] {
        let bytes = std::fs::read(fixture(name)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cut = dir.path().join(name);
        let mut at = 0;
        while at < bytes.len() {
            std::fs::write(&cut, &bytes[..at]).unwrap();
            let out = dir.path().join(format!("ds{at}"));
            let e = ingest(
                &cut,
                InputFormat::Numpy,
                &out,
                &small_batches(),
                small_segments(),
            )
            .unwrap_err();
            // Too short to hold the zip magic: not recognised as an archive at all.
            let not_an_archive = at < 4
                && matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "input");
            assert!(
                not_an_archive || matches!(e, Error::Corrupt { .. } | Error::InvalidData { .. }),
                "{name} cut at {at} of {}: {e:?}",
                bytes.len()
            );
            assert!(!out.exists());
            at += 1 + bytes.len() / 97;
        }
    }
}

/// Every episode of `a` equals the same episode of `b`, column by column.
fn same_data(a: &Snapshot, b: &Snapshot) -> bool {
    a.num_episodes() == b.num_episodes()
        && (0..a.num_episodes()).all(|id| {
            let (x, y) = (
                a.episode(id).unwrap().unwrap(),
                b.episode(id).unwrap().unwrap(),
            );
            x.schema() == y.schema()
                && x.columns()
                    .iter()
                    .zip(y.columns())
                    .all(|(p, q)| p.to_data() == q.to_data())
        })
}

/// A flipped byte in an array's data is caught by the archive's CRC-32, stored or compressed; a
/// flip that goes through (in a zip field the reader does not use) changes no value.
#[test]
fn corrupt_archives_are_errors_never_wrong_data() {
    for name in ["d4rl.npz", "d4rl_compressed.npz"] {
        let good = std::fs::read(fixture(name)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let reference = dir.path().join("ref");
        ingest(
            &fixture(name),
            InputFormat::Numpy,
            &reference,
            &small_batches(),
            small_segments(),
        )
        .unwrap();
        let reference = Dataset::open(&reference).unwrap().snapshot().unwrap();
        let bad = dir.path().join(name);
        let mut errors = 0;
        let flips = 60;
        for k in 0..flips {
            let at = good.len() * k / flips;
            let mut bytes = good.clone();
            bytes[at] ^= 0x5a;
            std::fs::write(&bad, &bytes).unwrap();
            let out = dir.path().join(format!("ds{k}"));
            match ingest(
                &bad,
                InputFormat::Numpy,
                &out,
                &small_batches(),
                small_segments(),
            ) {
                Err(_) => {
                    errors += 1;
                    assert!(!out.exists());
                }
                Ok(_) => {
                    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
                    assert!(
                        same_data(&snap, &reference),
                        "{name} with byte {at} flipped ingested different data"
                    );
                }
            }
        }
        assert!(
            errors >= flips * 3 / 4,
            "{name}: only {errors} of {flips} flips detected"
        );
    }
}

/// `trajstore export` writes a Parquet file that ingests back, without options, into the same
/// episodes and transitions.
#[test]
fn an_export_ingests_back_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestData::new()
        .transitions(3000)
        .obs_dim(4)
        .mean_episode_len(50.0)
        .seed(5)
        .snapshot(&dir.path().join("a"));
    let pq = dir.path().join("a.parquet");
    trajstore::store::export::export_parquet(&a, &pq, |_| {}).unwrap();

    let out = dir.path().join("b");
    let r = ingest(
        &pq,
        InputFormat::detect(&pq).unwrap(),
        &out,
        &IngestOptions::default(),
        WriterOptions::default(),
    )
    .unwrap();
    assert!(
        r.boundaries.starts_with("episode ids in `episode_id`"),
        "{}",
        r.boundaries
    );
    let b = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(b.num_episodes(), a.num_episodes());
    assert_eq!(b.episodes().lengths(), a.episodes().lengths());
    assert_eq!(ends(&b), ends(&a));
    for id in 0..a.num_episodes() {
        let (x, y) = (
            a.episode(id).unwrap().unwrap(),
            b.episode(id).unwrap().unwrap(),
        );
        for c in [
            "observation",
            "action",
            "reward",
            "step",
            "is_first",
            "is_last",
        ] {
            assert_eq!(
                x.column_by_name(c).unwrap().to_data(),
                y.column_by_name(c).unwrap().to_data(),
                "episode {id} column {c}"
            );
        }
        let src = y.column_by_name("source_episode").unwrap();
        assert!(
            src.as_primitive::<arrow::datatypes::UInt64Type>()
                .values()
                .iter()
                .all(|&v| v == id)
        );
    }
}

/// Minari datasets recorded with minari.DataCollector (`tests/python/make_minari_fixtures.py`),
/// ingested from the dataset directory without options and compared with what Minari's own
/// `iterate_episodes()` returned: the episodes are Minari's, observation t is row t and the next
/// observation row t + 1 (so the final observation is kept), flags on each last step.
#[test]
fn minari_datasets_ingest_as_minari_reads_them() {
    for name in ["cartpole", "pendulum"] {
        let input = fixture_path("minari", name);
        let expected: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixture_path("minari", &format!("{name}.expected.json")))
                .unwrap(),
        )
        .unwrap();
        let expected = expected.as_array().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ds");
        let format = InputFormat::detect(&input).unwrap();
        assert_eq!(format, InputFormat::Hdf5);
        let r = ingest(&input, format, &out, &small_batches(), small_segments()).unwrap();
        assert_eq!(
            r.boundaries,
            "episode ids in `episode` (flags terminations, truncations on each episode's last row)"
        );
        assert_eq!(r.episodes, expected.len() as u64, "{name}");
        let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
        let f32s_of = |v: &serde_json::Value| -> Vec<f32> {
            v.as_array()
                .unwrap()
                .iter()
                .flat_map(|x| match x.as_array() {
                    Some(row) => row.iter().map(|y| y.as_f64().unwrap() as f32).collect(),
                    None => vec![x.as_f64().unwrap() as f32],
                })
                .collect()
        };
        for (k, want) in expected.iter().enumerate() {
            let e = snap.episode(k as u64).unwrap().unwrap();
            let obs = want["observations"].as_array().unwrap();
            let steps = obs.len() - 1;
            assert_eq!(e.num_rows(), steps, "{name} episode {k}");
            let all = f32s_of(&want["observations"]);
            let dim = all.len() / obs.len();
            assert_eq!(
                crate::common::f32_values(&e, "observation"),
                all[..steps * dim]
            );
            assert_eq!(
                crate::common::f32_values(&e, "next_observation"),
                all[dim..]
            );
            assert_eq!(
                crate::common::f32_values(&e, "reward"),
                f32s_of(&want["rewards"])
            );
            let action = e.column_by_name("action").unwrap();
            let got: Vec<f32> = if name == "cartpole" {
                action
                    .as_primitive::<Int64Type>()
                    .values()
                    .iter()
                    .map(|&a| a as f32)
                    .collect()
            } else {
                crate::common::f32_values(&e, "action")
            };
            assert_eq!(got, f32s_of(&want["actions"]), "{name} episode {k}");
            let last = |key: &str| want[key].as_array().unwrap()[steps - 1].as_bool().unwrap();
            let flag = |c: &str| e.column_by_name(c).unwrap().as_boolean().value(steps - 1);
            assert_eq!(flag("terminated"), last("terminations"), "{name} {k}");
            assert_eq!(
                flag("truncated"),
                last("truncations") || !last("terminations"),
                "{name} {k}"
            );
            let src = e
                .column_by_name("source_episode")
                .unwrap()
                .as_primitive::<arrow::datatypes::UInt64Type>();
            assert!(
                src.values()
                    .iter()
                    .all(|&v| v == want["id"].as_u64().unwrap())
            );
        }
    }
}
