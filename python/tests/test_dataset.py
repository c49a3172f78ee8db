"""The Dataset API (counts, schema, episode table, zero-copy episodes, repr, info, versions) against
the files read with pyarrow, and ingest() of Parquet files written with pyarrow."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trajstore
from trajref import Reference, assert_batch_matches, column_to_numpy, run_cli


def test_counts_and_version(demo_ds, ref):
    assert len(demo_ds) == demo_ds.num_transitions == ref.num_transitions == 20000
    assert demo_ds.num_episodes == len(ref.episodes) == ref.manifest["episodes"]
    assert demo_ds.version == ref.manifest["version"]
    assert demo_ds.first_episode_id == 0
    assert demo_ds.versions()[-1] == demo_ds.version
    assert sum(e.length for e in ref.episodes.values()) == len(demo_ds)


def test_schema(demo_ds, ref):
    s = demo_ds.schema
    assert isinstance(s, pa.Schema)
    assert s.names == ["episode_id", "step", "is_first", "is_last", "terminated", "truncated", "observation", "action", "reward"]
    assert s.field("episode_id").type == pa.uint64()
    assert s.field("step").type == pa.uint32()
    for f in ("is_first", "is_last", "terminated", "truncated"):
        assert s.field(f).type == pa.bool_()
    assert s.field("reward").type == pa.float32()
    obs = s.field("observation").type
    storage = obs.storage_type if isinstance(obs, pa.BaseExtensionType) else obs
    assert pa.types.is_fixed_size_list(storage) and storage.list_size == 17 and storage.value_type == pa.float32()
    assert s.field("action").type.list_size == 6 and s.field("action").type.value_type == pa.float32()
    # The same types as the segment files.
    assert s.types == ref.transitions.schema.types
    assert demo_ds.sample_columns == ["observation", "action", "reward", "next_observation"]


def test_episode_table_matches_episode_files(demo_ds, ref):
    t = demo_ds.episodes()
    assert isinstance(t, pa.Table)
    assert t.num_rows == demo_ds.num_episodes
    want = ref.episodes_table
    assert t.schema.names == want.schema.names
    for name in t.schema.names:
        if name == "final_observation":
            a, _ = column_to_numpy(t.column(name))
            b, _ = column_to_numpy(want.column(name))
            np.testing.assert_array_equal(a, b)
        else:
            assert t.column(name).to_pylist() == want.column(name).to_pylist(), name
    # And with the transitions: lengths, returns, flags.
    for eid, length, ret, term, trunc in zip(*(t.column(c).to_pylist() for c in ("episode_id", "length", "episode_return", "terminated", "truncated"))):
        rew = ref.steps(eid, "reward")
        assert len(rew) == length
        assert ret == pytest.approx(float(rew.astype(np.float64).sum()), rel=1e-9)
        assert term != trunc
        last = ref.episodes[eid].row + length - 1
        assert ref.columns["is_last"][last] and ref.columns["terminated"][last] == term and ref.columns["truncated"][last] == trunc


def test_episode_is_zero_copy_slice_of_segment(demo_ds, ref):
    for eid in (0, 51, 52, 100, demo_ds.num_episodes - 1):  # first/last of segments too
        rb = demo_ds.episode(eid)
        assert isinstance(rb, pa.RecordBatch)
        e = ref.episodes[eid]
        assert rb.num_rows == e.length
        assert rb.schema.names == demo_ds.schema.names
        for name in rb.schema.names:
            got, _ = column_to_numpy(rb.column(rb.schema.get_field_index(name)))
            np.testing.assert_array_equal(got, ref.steps(eid, name), err_msg=f"{name} of episode {eid}")
    # Zero copy: two calls view the same bytes, and those lie inside the memory map of the
    # segment file that holds the episode.
    a = demo_ds.episode(7).column(demo_ds.schema.get_field_index("reward")).buffers()[1]
    b = demo_ds.episode(7).column(demo_ds.schema.get_field_index("reward")).buffers()[1]
    assert a.address == b.address
    seg = os.path.realpath(os.path.join(demo_ds.path, ref.manifest["segments"][0]["path"]))
    maps = _mappings_of(seg)
    if maps is None:
        pytest.skip("no /proc/self/maps")
    assert any(lo <= a.address and a.address + a.size <= hi for lo, hi in maps), (hex(a.address), maps)


def _mappings_of(path):
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] == path:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi))
    return out


def test_episode_out_of_range(demo_ds):
    with pytest.raises(IndexError):
        demo_ds.episode(demo_ds.num_episodes)
    with pytest.raises(IndexError):
        demo_ds.episode(10**12)


def test_episode_negative_id_is_index_error(demo_ds):
    with pytest.raises(IndexError):
        demo_ds.episode(-1)


def test_open_returns_a_snapshot_as_in_rust(demo_ds):
    # Rust's `trajstore::open` and Python's `trajstore.open` return the same kind of object,
    # one committed version: a Snapshot; `Dataset` is the older name of the same class.
    assert type(demo_ds) is trajstore.Snapshot
    assert trajstore.Dataset is trajstore.Snapshot
    assert isinstance(demo_ds, trajstore.Dataset)


def test_repr_and_info(demo_ds, demo_path, ref):
    r = repr(demo_ds)
    assert r.startswith("<trajstore.Snapshot") and r.endswith(">")
    assert "transitions  20,000" in r
    assert f"episodes {demo_ds.num_episodes} " in r
    for line in ("observation", "fixed_size_list<float32>[17]", "action", "fixed_size_list<float32>[6]", "reward             float32", "episode_id         uint64"):
        assert line in r, line
    # info() is what `trajstore info` prints (less the CLI's timing line).
    cli = run_cli("info", demo_path).stdout
    mine = demo_ds.info()
    cli_lines = [l for l in cli.splitlines() if not l.startswith("opened in")]
    assert mine.splitlines() == cli_lines
    d = demo_ds.info_dict()
    assert d["transitions"] == 20000 and d["episodes"] == demo_ds.num_episodes
    assert d["terminated_episodes"] == sum(e.terminated for e in ref.episodes.values())
    assert d["truncated_episodes"] == sum(e.truncated for e in ref.episodes.values())


def test_refresh_and_versions(fresh_demo, trajstore_bin):
    path = fresh_demo()
    ds = trajstore.open(path)
    v, n, eps = ds.version, len(ds), ds.num_episodes
    loader = ds.loader(slice_len=8, num_slices=4, max_batches=2)
    assert ds.refresh() is False
    run_cli("demo", path, "--append", "--transitions", "3000", "--mean-episode-len", "50", "--seed", "1")
    assert ds.refresh() is True
    assert ds.version > v and len(ds) == n + 3000 and ds.num_episodes > eps
    assert ds.versions()[-1] == ds.version
    # The old version is still readable as it was.
    old = trajstore.open(path, version=v)
    assert len(old) == n and old.num_episodes == eps
    # A loader made before the refresh keeps its version.
    for b in loader:
        assert int(b["episode_id"].max()) < eps
    # The appended episodes have dense ids and equal the files.
    ref = Reference(path)
    assert ref.episode_ids == list(range(ds.num_episodes))
    for b in ds.loader(slice_len=8, num_slices=8, episodes=list(range(eps, ds.num_episodes)), max_batches=3):
        assert int(b["episode_id"].min()) >= eps
        assert_batch_matches(ref, b, ["observation", "action", "reward", "next_observation"])


# --- ingest -----------------------------------------------------------------------------------

def _fsl(a: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), a.shape[1])


def _episodes_data(seed=0, lens=(5, 9, 3, 12, 7), obs_dim=4, act_dim=2):
    rng = np.random.default_rng(seed)
    n = sum(lens)
    return dict(
        lens=list(lens),
        obs=rng.standard_normal((n, obs_dim)).astype(np.float32),
        act=rng.standard_normal((n, act_dim)).astype(np.float32),
        rew=rng.standard_normal(n).astype(np.float32),
        ends=np.cumsum(lens) - 1,
    )


def _check_ingested(ds, d, terminated, truncated):
    ref = Reference(ds.path)
    assert len(ds) == sum(d["lens"]) and ds.num_episodes == len(d["lens"])
    np.testing.assert_array_equal(ref.columns["observation"], d["obs"])
    np.testing.assert_array_equal(ref.columns["action"], d["act"])
    np.testing.assert_array_equal(ref.columns["reward"], d["rew"])
    ep = ds.episodes()
    assert ep.column("length").to_pylist() == d["lens"]
    assert ep.column("terminated").to_pylist() == terminated
    assert ep.column("truncated").to_pylist() == truncated
    starts = np.concatenate([[0], np.cumsum(d["lens"])[:-1]])
    for i, (s, l) in enumerate(zip(starts, d["lens"])):
        rb = ds.episode(i)
        obs, _ = column_to_numpy(rb.column(rb.schema.get_field_index("observation")))
        np.testing.assert_array_equal(obs, d["obs"][s : s + l])
        assert ep.column("episode_return").to_pylist()[i] == pytest.approx(float(d["rew"][s : s + l].astype(np.float64).sum()), rel=1e-9)
    # Batches from the ingested dataset equal the data (next_observation derived; no final
    # observation was given, so zeros at the last step).
    for b in ds.loader(slice_len=3, num_slices=6, policy="pad", seed=0, max_batches=4):
        assert_batch_matches(ref, b, ["observation", "action", "reward", "next_observation"])
    return ref


def test_ingest_parquet_with_episode_column(tmp_path):
    d = _episodes_data()
    ids = np.repeat(np.arange(len(d["lens"])) * 10 + 100, d["lens"])
    table = pa.table({"observation": _fsl(d["obs"]), "action": _fsl(d["act"]), "reward": d["rew"], "episode": ids})
    pq.write_table(table, tmp_path / "steps.parquet")
    report = trajstore.ingest(tmp_path / "steps.parquet", tmp_path / "out.trajstore", episode_col="episode")
    assert report["rows"] == sum(d["lens"]) and report["episodes"] == len(d["lens"])
    ds = trajstore.open(tmp_path / "out.trajstore")
    assert ds.version == report["version"]
    n = len(d["lens"])
    ref = _check_ingested(ds, d, [False] * n, [True] * n)
    # The original episode ids are kept as a column.
    np.testing.assert_array_equal(ref.columns["source_episode"], ids)


def test_ingest_parquet_with_flags(tmp_path):
    d = _episodes_data(seed=1)
    n = sum(d["lens"])
    term, trunc = np.zeros(n, bool), np.zeros(n, bool)
    term[d["ends"][[0, 2]]] = True
    trunc[d["ends"][[1, 3, 4]]] = True
    table = pa.table({"obs": _fsl(d["obs"]), "act": _fsl(d["act"]), "rew": d["rew"], "done": term, "timeout": trunc})
    pq.write_table(table, tmp_path / "flags.parquet")
    report = trajstore.ingest(
        tmp_path / "flags.parquet", tmp_path / "out.trajstore",
        observation_col="obs", action_col="act", reward_col="rew", terminated_col="done", truncated_col="timeout",
    )
    assert report["episodes"] == 5
    ds = trajstore.open(tmp_path / "out.trajstore")
    _check_ingested(ds, d, [True, False, True, False, False], [False, True, False, True, True])


def test_ingest_discrete_actions_from_scalar_columns(tmp_path):
    rng = np.random.default_rng(4)
    lens = [6, 4, 8]
    n = sum(lens)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    act = rng.integers(0, 3, n).astype(np.int64)
    rew = rng.standard_normal(n).astype(np.float32)
    term = np.zeros(n, bool)
    term[np.cumsum(lens) - 1] = True
    pq.write_table(pa.table({"x": x, "y": y, "action": act, "reward": rew, "terminated": term}), tmp_path / "d.parquet")
    trajstore.ingest(tmp_path / "d.parquet", tmp_path / "out.trajstore", observation_cols=["x", "y"])
    ds = trajstore.open(tmp_path / "out.trajstore")
    assert ds.schema.field("action").type == pa.int64()
    ref = Reference(ds.path)
    np.testing.assert_array_equal(ref.columns["observation"], np.stack([x, y], 1))
    np.testing.assert_array_equal(ref.columns["action"], act)
    assert ds.episodes().column("length").to_pylist() == lens
    b = next(iter(ds.loader(slice_len=4, num_slices=5, max_batches=1)))
    assert str(b["action"].dtype) == "torch.int64"
    assert_batch_matches(ref, b, ["observation", "action", "reward", "next_observation"])


def test_ingest_failure_commits_nothing(tmp_path):
    # An episode id that reappears after another episode: invalid, nothing is committed.
    d = _episodes_data(lens=(3, 3, 3))
    ids = np.array([0, 0, 0, 1, 1, 1, 0, 0, 0])
    pq.write_table(pa.table({"observation": _fsl(d["obs"]), "action": _fsl(d["act"]), "reward": d["rew"], "ep": ids}), tmp_path / "bad.parquet")
    with pytest.raises(trajstore.TrajstoreError) as e:
        trajstore.ingest(tmp_path / "bad.parquet", tmp_path / "out.trajstore", episode_col="ep")
    assert isinstance(e.value, ValueError)
    try:
        ds = trajstore.open(tmp_path / "out.trajstore")
    except trajstore.DatasetNotFoundError:
        return
    assert len(ds) == 0


def test_open_file_uri_mirrors_into_cache_dir(demo_path, tmp_path, ref):
    uri = "file://" + os.path.abspath(demo_path)
    ds = trajstore.open(uri, cache_dir=tmp_path / "cache")
    assert ds.uri == uri
    assert os.path.realpath(ds.path).startswith(os.path.realpath(tmp_path / "cache"))
    assert len(ds) == ref.num_transitions and ds.version == ref.manifest["version"]
    mirror = Reference(ds.path)
    for name in ("observation", "action", "reward"):
        np.testing.assert_array_equal(mirror.columns[name], ref.columns[name])
    for b in ds.loader(slice_len=8, num_slices=8, seed=1, max_batches=2):
        assert_batch_matches(ref, b, ["observation", "action", "reward", "next_observation"])


def test_open_older_version(fresh_demo):
    path = fresh_demo("--commit-every", "40")
    ds = trajstore.open(path)
    versions = ds.versions()
    assert len(versions) >= 4 and versions[-1] == ds.version
    prev = [trajstore.open(path, version=v) for v in versions]
    counts = [d.num_episodes for d in prev]
    assert counts == sorted(counts) and counts[-1] == ds.num_episodes and counts[0] < counts[-1]
    # An older version is a prefix of the newer one.
    mid = prev[len(prev) // 2]
    for eid in range(mid.num_episodes):
        a, b = mid.episode(eid), ds.episode(eid)
        assert a.equals(b)


def test_ingest_reads_an_ogbench_directory_and_says_so(tmp_path):
    """OGBench's sharded files (made by its own generator; tests/data/ogbench): the convention
    is recognised, the -val files are left out, and a convention that does not fit is refused."""
    import pathlib

    src = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "ogbench" / "scene-sharded"
    report = trajstore.ingest(src, tmp_path / "og.trajstore")
    conv = report["convention"]
    assert conv["name"] == "ogbench" and conv["recognised"] and conv["files"] == 3
    assert len(conv["left_out"]) == 3
    ds = trajstore.open(tmp_path / "og.trajstore")
    assert ds.num_transitions == report["rows"] and report["episodes"] > 0
    # OGBench trajectories end on a time limit: truncated, never terminated.
    eps = ds.episodes()
    assert not any(eps.column("terminated").to_pylist())
    with pytest.raises(trajstore.InvalidArgumentError, match="convention"):
        trajstore.ingest(src, tmp_path / "bad.trajstore", convention="d4rl")
    with pytest.raises(trajstore.TrajstoreError):
        trajstore.ingest(src, tmp_path / "bad2.trajstore", convention="episode-files")
    assert not (tmp_path / "bad2.trajstore" / "versions").exists()


def test_ingest_reads_an_rlds_directory(tmp_path):
    """An RLDS dataset written by tensorflow-datasets (tests/data/rlds): recognised, its images
    become a frame column, one split can be chosen, and column-mapping options are refused."""
    import pathlib

    src = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "rlds" / "rlds_robot"
    every = trajstore.ingest(src, tmp_path / "all.trajstore")
    assert sorted(every["splits"]) == ["test", "train"] and every["shards"] == 4
    train = trajstore.ingest(src, tmp_path / "train.trajstore", splits=["train"])
    assert train["splits"] == ["train"] and 0 < train["rows"] < every["rows"]
    ds = trajstore.open(tmp_path / "all.trajstore")
    assert ds.num_transitions == every["rows"]
    assert str(ds.schema.field("observation").type) == "large_binary"  # a frame column
    with pytest.raises(trajstore.InvalidArgumentError, match="episode_col"):
        trajstore.ingest(src, tmp_path / "bad.trajstore", episode_col="episode")
    with pytest.raises(trajstore.InvalidArgumentError, match="splits"):
        trajstore.ingest(tmp_path / "x.npz", tmp_path / "bad2.trajstore", splits=["train"])
