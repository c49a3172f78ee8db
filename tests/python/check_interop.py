"""Reads a trajstore dataset with pyarrow (and Polars / DuckDB when installed) and compares every
value with what the Rust writer says it wrote (expected.json). Exit code 0 = all equal."""
import json, os, sys

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

root, expected_path = sys.argv[1], sys.argv[2]
exp = json.load(open(expected_path))
versions = sorted(os.listdir(os.path.join(root, "_versions")))
manifest = json.load(open(os.path.join(root, "_versions", versions[-1])))
assert manifest["format"] == "trajstore" and manifest["format_version"] == 1

obs, act, rew, eid, step, first, last, term, trunc = [], [], [], [], [], [], [], [], []
ep_ids, ep_len, ep_ret = [], [], []
for seg in manifest["segments"]:
    # The segment is a standard Arrow IPC *file*; memory-map it as pyarrow users would.
    with pa.memory_map(os.path.join(root, seg["path"])) as src:
        reader = ipc.open_file(src)
        assert reader.schema.metadata is None or True
        field = reader.schema.field("observation")
        # The canonical fixed_shape_tensor extension is recognised by pyarrow.
        assert isinstance(field.type, pa.FixedShapeTensorType), field.type
        assert list(field.type.shape) == exp["obs_shape"], field.type.shape
        assert reader.metadata[b"trajstore:kind"] == b"transitions"
        t = reader.read_all()
    assert t.num_rows == seg["rows"]
    obs.append(t.column("observation").combine_chunks().storage.flatten().to_numpy())
    act.append(t.column("action").combine_chunks().flatten().to_numpy())
    rew.append(t.column("reward").to_numpy())
    eid.append(t.column("episode_id").to_numpy())
    step.append(t.column("step").to_numpy())
    for dst, name in [(first, "is_first"), (last, "is_last"), (term, "terminated"), (trunc, "truncated")]:
        dst.append(t.column(name).to_numpy(zero_copy_only=False))
    with pa.memory_map(os.path.join(root, seg["episodes_path"])) as src:
        e = ipc.open_file(src).read_all()
    ep_ids.append(e.column("episode_id").to_numpy())
    ep_len.append(e.column("length").to_numpy())
    ep_ret.append(e.column("episode_return").to_numpy())

cat = np.concatenate
np.testing.assert_array_equal(cat(obs), np.array(exp["observation"], dtype=np.float32))
np.testing.assert_array_equal(cat(act), np.array(exp["action"], dtype=np.float32))
np.testing.assert_array_equal(cat(rew), np.array(exp["reward"], dtype=np.float32))
np.testing.assert_array_equal(cat(eid), np.array(exp["episode_id"], dtype=np.uint64))
np.testing.assert_array_equal(cat(step), np.array(exp["step"], dtype=np.uint32))
for got, name in [(first, "is_first"), (last, "is_last"), (term, "terminated"), (trunc, "truncated")]:
    np.testing.assert_array_equal(cat(got), np.array(exp[name], dtype=bool))
np.testing.assert_array_equal(cat(ep_ids), np.arange(len(exp["lengths"]), dtype=np.uint64))
np.testing.assert_array_equal(cat(ep_len), np.array(exp["lengths"], dtype=np.uint64))
np.testing.assert_allclose(cat(ep_ret), np.array(exp["returns"]), rtol=0, atol=0)
checked = ["pyarrow"]

try:
    import polars as pl
except ImportError:
    pl = None
if pl is not None:
    frames = [pl.read_ipc(os.path.join(root, s["path"])) for s in manifest["segments"]]
    df = pl.concat(frames)
    assert df.height == len(exp["reward"])
    np.testing.assert_array_equal(df["reward"].to_numpy(), np.array(exp["reward"], dtype=np.float32))
    lens = df.group_by("episode_id").len().sort("episode_id")["len"].to_numpy()
    np.testing.assert_array_equal(lens, np.array(exp["lengths"]))
    checked.append("polars")

try:
    import duckdb
except ImportError:
    duckdb = None
if duckdb is not None:
    tables = []
    for s in manifest["segments"]:
        with pa.memory_map(os.path.join(root, s["path"])) as src:
            tables.append(ipc.open_file(src).read_all())
    transitions = pa.concat_tables(tables)
    rows = duckdb.sql(
        "SELECT episode_id, COUNT(*) AS n, SUM(reward::DOUBLE) AS ret FROM transitions "
        "GROUP BY episode_id ORDER BY episode_id").fetchall()
    assert [r[1] for r in rows] == exp["lengths"]
    np.testing.assert_allclose([r[2] for r in rows], exp["returns"], rtol=1e-9)
    checked.append("duckdb")

print("ok: " + ",".join(checked))
