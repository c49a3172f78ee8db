//! The golden dataset `tests/data/golden-v1.trajstore` was written by the first release of format
//! v1; its expected values were computed independently with pyarrow
//! (`tests/python/golden_expected.py`). Every later version must keep reading it exactly, and keep
//! appending to it.

use std::path::{Path, PathBuf};

use crate::common::TestData;
use arrow::array::AsArray;
use arrow::datatypes::{Float32Type, Float64Type};
use serde_json::Value;
use trajstore::format::{col, ep};
use trajstore::{Dataset, Snapshot, WriterOptions};

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden-v1.trajstore")
}

fn expected() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden-v1.expected.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn check(snap: &Snapshot, exp: &Value) {
    assert_eq!(snap.num_transitions(), exp["transitions"].as_u64().unwrap());
    assert_eq!(snap.num_episodes(), exp["episodes"].as_u64().unwrap());
    let lengths: Vec<u64> = exp["lengths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(snap.episodes().lengths(), lengths.as_slice());
    let returns: Vec<f64> = snap
        .episode_column(ep::EPISODE_RETURN)
        .unwrap()
        .iter()
        .flat_map(|a| a.as_primitive::<Float64Type>().values().to_vec())
        .collect();
    for (i, r) in returns.iter().enumerate() {
        let want = exp["returns"][i].as_f64().unwrap();
        assert!(
            (r - want).abs() <= 1e-9 * want.abs().max(1.0),
            "episode {i} return {r} vs {want}"
        );
        let e = snap.episode(i as u64).unwrap().unwrap();
        let obs = e
            .column_by_name(col::OBSERVATION)
            .unwrap()
            .as_fixed_size_list();
        let vals = obs.values().as_primitive::<Float32Type>().values();
        let sum: f64 = vals.iter().map(|&x| x as f64).sum();
        assert!(
            (sum - exp["obs_sums"][i].as_f64().unwrap()).abs() < 1e-6,
            "episode {i} observations"
        );
        let first = vals[..obs.value_length() as usize].to_vec();
        // f32 values written by pyarrow as decimal text: equal after rounding back to f32.
        let want: Vec<f32> = exp["first_obs"][i]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(first, want, "episode {i} first observation");
        let act = e.column_by_name(col::ACTION).unwrap().as_fixed_size_list();
        let asum: f64 = act
            .values()
            .as_primitive::<Float32Type>()
            .values()
            .iter()
            .map(|&x| x as f64)
            .sum();
        assert!(
            (asum - exp["act_sums"][i].as_f64().unwrap()).abs() < 1e-6,
            "episode {i} actions"
        );
        let term = e
            .column_by_name(col::TERMINATED)
            .unwrap()
            .as_boolean()
            .value(e.num_rows() - 1);
        assert_eq!(
            term,
            exp["terminated"][i].as_bool().unwrap(),
            "episode {i} terminated"
        );
    }
}

#[test]
fn golden_v1_reads_exactly_at_every_version() {
    let ds = Dataset::open(golden()).unwrap();
    let exp = expected();
    let versions = ds.versions().unwrap();
    assert_eq!(versions.len(), exp["versions"].as_object().unwrap().len());
    for v in versions {
        let snap = ds.snapshot_at(v).unwrap();
        check(&snap, &exp["versions"][v.to_string()]);
        trajstore::store::verify::verify(&snap, |_| {}).unwrap();
    }
}

#[test]
fn golden_v1_stays_writable() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("golden.trajstore");
    for sub in ["_versions", "segments"] {
        std::fs::create_dir_all(copy.join(sub)).unwrap();
        for e in std::fs::read_dir(golden().join(sub)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), copy.join(sub).join(e.file_name())).unwrap();
        }
    }
    let ds = Dataset::open(&copy).unwrap();
    let before = ds.snapshot().unwrap();
    let mut w = ds.writer(WriterOptions::default()).unwrap();
    let spec = TestData::new()
        .obs_dim(3)
        .mean_episode_len(60.0)
        .seed(1)
        .spec();
    let (b, e) = spec.episode(0, 25);
    assert_eq!(w.append_episode(&b, e).unwrap(), before.num_episodes());
    w.commit().unwrap();
    let after = ds.snapshot().unwrap();
    assert_eq!(after.num_transitions(), before.num_transitions() + 25);
    // The old episodes are untouched.
    let old = ds.snapshot_at(before.version()).unwrap();
    check(&old, &expected()["versions"][before.version().to_string()]);
    for id in 0..before.num_episodes() {
        assert_eq!(
            after.episode(id).unwrap().unwrap(),
            before.episode(id).unwrap().unwrap()
        );
    }
    assert_eq!(after.episodes().lengths().last(), Some(&25));
    trajstore::store::verify::verify(&after, |_| {}).unwrap();
}
