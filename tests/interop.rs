//! Other readers: every segment is read with `pyarrow.ipc.open_file` (and Polars and DuckDB when
//! installed) and compared value by value with what was written. Runs when Python with pyarrow is
//! available (`TRAJSTORE_PYTHON`, else `python3`); under `CI=true` a missing pyarrow is a failure.

mod common;

use std::process::Command;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float32Type, UInt32Type, UInt64Type};
use serde_json::json;
use trajstore::format::col;
use trajstore::synth::SynthSpec;
use trajstore::{Dataset, WriterOptions};

fn python() -> Option<String> {
    common::python_with("pyarrow, numpy", "the interop test")
}

#[test]
fn pyarrow_polars_duckdb_read_what_we_wrote() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        transitions: 20_000,
        obs_dim: 5,
        act_dim: 3,
        discrete_actions: false,
        mean_episode_len: 80.0,
        seed: 11,
    };
    let root = dir.path().join("interop.trajstore");
    let ds = Dataset::create(&root, &spec.schema().unwrap()).unwrap();
    let mut w = ds
        .writer(WriterOptions::default().with_segment_bytes(300_000))
        .unwrap();
    spec.write(&mut w, Some(50), |_| {}).unwrap();
    drop(w);
    let snap = ds.snapshot().unwrap();
    assert!(snap.segments().len() > 3, "several segments");

    // What the Rust side holds, flattened in row order.
    let mut exp = json!({"obs_shape": [5], "observation": [], "action": [], "reward": [], "episode_id": [],
        "step": [], "is_first": [], "is_last": [], "terminated": [], "truncated": [], "lengths": [], "returns": []});
    let push = |v: &mut serde_json::Value, k: &str, x: serde_json::Value| {
        v[k].as_array_mut().unwrap().push(x)
    };
    for seg in snap.segments() {
        for b in seg.batches() {
            let c = |n: &str| b.column_by_name(n).unwrap().clone();
            for x in c(col::OBSERVATION)
                .as_fixed_size_list()
                .values()
                .as_primitive::<Float32Type>()
                .values()
            {
                push(&mut exp, "observation", json!(x));
            }
            for x in c(col::ACTION)
                .as_fixed_size_list()
                .values()
                .as_primitive::<Float32Type>()
                .values()
            {
                push(&mut exp, "action", json!(x));
            }
            for x in c(col::REWARD).as_primitive::<Float32Type>().values() {
                push(&mut exp, "reward", json!(x));
            }
            for x in c(col::EPISODE_ID).as_primitive::<UInt64Type>().values() {
                push(&mut exp, "episode_id", json!(x));
            }
            for x in c(col::STEP).as_primitive::<UInt32Type>().values() {
                push(&mut exp, "step", json!(x));
            }
            for name in [col::IS_FIRST, col::IS_LAST, col::TERMINATED, col::TRUNCATED] {
                let a = c(name);
                for i in 0..a.len() {
                    push(&mut exp, name, json!(a.as_boolean().value(i)));
                }
            }
        }
    }
    for i in 0..snap.episodes().len() {
        push(&mut exp, "lengths", json!(snap.episodes().get(i).length));
    }
    for a in snap
        .episode_column(trajstore::format::ep::EPISODE_RETURN)
        .unwrap()
    {
        for x in a.as_primitive::<arrow::datatypes::Float64Type>().values() {
            push(&mut exp, "returns", json!(x));
        }
    }
    let exp_path = dir.path().join("expected.json");
    std::fs::write(&exp_path, exp.to_string()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/check_interop.py");
    let out = Command::new(&py)
        .arg(script)
        .arg(&root)
        .arg(&exp_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ok: pyarrow"), "{stdout}");
    eprintln!("{stdout}");
}
