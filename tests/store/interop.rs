//! Other readers: every segment is read with `pyarrow.ipc.open_file` (and Polars and DuckDB when
//! installed) and compared value by value with what was written. Runs when Python with pyarrow is
//! available (`TRAJSTORE_PYTHON`, else `python3`); under `CI=true` a missing pyarrow is a failure.

use std::process::Command;

use crate::common::TestData;
use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float32Type, UInt32Type, UInt64Type};
use serde_json::json;
use trajstore::Dataset;
use trajstore::format::col;

fn python() -> Option<String> {
    crate::common::python_with("pyarrow, numpy", "the interop test")
}

#[test]
fn pyarrow_polars_duckdb_read_what_we_wrote() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("interop.trajstore");
    let snap = TestData::new()
        .transitions(20_000)
        .obs_dim(5)
        .act_dim(3)
        .mean_episode_len(80.0)
        .seed(11)
        .segment_bytes(300_000)
        .commit_every(50)
        .snapshot(&root);
    assert!(snap.segments().len() > 3, "several segments");

    // What the Rust side holds, flattened in row order.
    let mut exp = json!({"obs_shape": [5], "observation": [], "action": [], "reward": [], "episode_id": [],
        "step": [], "is_first": [], "is_last": [], "terminated": [], "truncated": [], "lengths": [], "returns": []});
    let push = |v: &mut serde_json::Value, k: &str, x: serde_json::Value| {
        v[k].as_array_mut().unwrap().push(x)
    };
    for seg in snap.segments() {
        for b in seg.batches().unwrap() {
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

/// A Python collector (pyarrow) pipes finished episodes, one record batch each, into
/// `trajstore ingest -` as an Arrow IPC stream, the way the README shows; the dataset holds
/// exactly what it sent.
#[test]
fn a_pyarrow_collector_streams_episodes_into_trajstore_ingest() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("live.trajstore");
    let script = r#"
import subprocess, sys
import numpy as np, pyarrow as pa
binary, out = sys.argv[1], sys.argv[2]
schema = pa.schema([("observation", pa.list_(pa.float32(), 4)), ("action", pa.int64()),
                    ("reward", pa.float32()), ("terminated", pa.bool_()), ("truncated", pa.bool_())])
proc = subprocess.Popen([binary, "ingest", "-", out, "--commit-every", "2", "--json"],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
row = 0
with pa.ipc.new_stream(proc.stdin, schema) as w:
    for ep in range(7):
        n = 5 + 3 * ep
        i = np.arange(row, row + n)
        last = np.arange(n) == n - 1
        w.write_batch(pa.record_batch([
            pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(i, 4).astype(np.float32)), 4),
            pa.array(i % 3),
            pa.array((i * 0.5).astype(np.float32)),
            pa.array(last & (ep % 2 == 0)),
            pa.array(last & (ep % 2 == 1)),
        ], schema=schema))
        row += n
out, _ = proc.communicate()  # closes stdin: the end of the stream
sys.exit(proc.returncode)
"#;
    let status = Command::new(&py)
        .args([
            "-c",
            script,
            env!("CARGO_BIN_EXE_trajstore"),
            out.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    let lengths: Vec<u64> = (0..7).map(|e| 5 + 3 * e).collect();
    assert_eq!(snap.episodes().lengths(), lengths.as_slice());
    assert!(
        snap.version() >= 4,
        "commits while streaming: version {}",
        snap.version()
    );
    let mut row = 0u64;
    for (ep, &n) in lengths.iter().enumerate() {
        let b = snap.episode(ep as u64).unwrap().unwrap();
        let reward = b.column_by_name(col::REWARD).unwrap();
        let want: Vec<f32> = (row..row + n).map(|i| i as f32 * 0.5).collect();
        assert_eq!(reward.as_primitive::<Float32Type>().values(), &want[..]);
        let action = b.column_by_name(col::ACTION).unwrap();
        let want: Vec<i64> = (row..row + n).map(|i| (i % 3) as i64).collect();
        assert_eq!(
            action
                .as_primitive::<arrow::datatypes::Int64Type>()
                .values(),
            &want[..],
            "integer actions stay integers"
        );
        let flag = |name| {
            b.column_by_name(name)
                .unwrap()
                .as_boolean()
                .value(n as usize - 1)
        };
        assert_eq!(
            (flag(col::TERMINATED), flag(col::TRUNCATED)),
            (ep % 2 == 0, ep % 2 == 1),
            "episode {ep}"
        );
        row += n;
    }
}
