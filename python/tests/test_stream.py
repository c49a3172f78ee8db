"""Streaming from object storage through a bounded cache (``trajstore.open(url, cache_limit=...)``),
against a real S3-compatible server (moto, started here with the Python of
scripts/setup-python.sh, ``$TRAJSTORE_PYTHON``): the same batches as the local loader when the
cache holds the version, a cache that never exceeds its limit (measured on disk while batches are
drawn), exact resume from ``state_dict``, a ``torchrun --nproc_per_node 2`` job (gloo, CPU) whose ranks
draw disjoint batches, the same number each, covering the epoch, with the node's caches within
the node's limit on disk while they run, a rank killed mid-epoch that resumes its partial
download and its batches while the other rank runs on unaffected, subsets by SQL that download
only their segments, and a following stream that draws from a version pushed after it started
and resumes on it exactly."""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

import trajstore
from trajref import _bin, make_demo

# 60k transitions in 37 segments of ~180 KB (6.4 MiB): a cache of a quarter of it rotates.
STREAM_ARGS = ["--transitions", "60000", "--mean-episode-len", "200", "--seed", "4", "--segment-size", "200KB"]


def _moto_python() -> str:
    """A Python that can run moto's server; under CI=true, a missing one fails the test."""
    for py in (os.environ.get("TRAJSTORE_PYTHON"), sys.executable):
        if py and subprocess.run([py, "-c", "import moto.server"], capture_output=True).returncode == 0:
            return py
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but no Python with moto (scripts/setup-python.sh installs it; set TRAJSTORE_PYTHON)")
    pytest.skip("needs moto (scripts/setup-python.sh; set TRAJSTORE_PYTHON)")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: Any) -> Iterator[Dict[str, str]]:
    """A moto S3 server, its settings in the environment, and a dataset pushed to it."""
    py = _moto_python()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [py, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    settings = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "trajstore",
        "AWS_SECRET_ACCESS_KEY": "trajstore",
        "AWS_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/streams", method="PUT"), timeout=10)
        local = make_demo(tmp_path_factory.mktemp("stream") / "d.trajstore", *STREAM_ARGS)
        url = "s3://streams/d"
        subprocess.run([_bin(), "push", local, url], check=True, capture_output=True)
        yield {"url": url, "local": local, **settings}
    finally:
        server.kill()
        server.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _node_bytes(cache: Any) -> int:
    """Bytes of the files of every rank's streaming cache under ``cache`` (the ``_stream``
    directories of its mirrors), each inode once."""
    seen, total = set(), 0
    for d, _, files in os.walk(cache):
        if "_stream" not in d:
            continue
        for f in files:
            try:
                st = os.stat(os.path.join(d, f))
            except OSError:
                continue
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total


def _torchrun(script: Any, *args: str) -> subprocess.Popen[str]:
    """``torchrun --nproc_per_node 2 script *args`` on loopback, started (stderr piped)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(port), str(script), *args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def _ids(batch: Any) -> List[tuple]:
    return list(zip(batch["episode_id"].tolist(), batch["start_step"].tolist()))


def test_a_stream_with_room_for_the_version_samples_what_the_local_loader_samples(s3: Dict[str, str], tmp_path: Any) -> None:
    ds = trajstore.open(s3["url"], cache_limit="1GiB", cache_dir=tmp_path)
    local = trajstore.open(s3["local"])
    assert isinstance(ds, trajstore.StreamedSnapshot)
    assert (len(ds), ds.num_episodes, ds.version) == (len(local), local.num_episodes, local.version)
    assert ds.sample_columns == local.sample_columns
    assert ds.schema == local.schema
    # Nothing but the catalog was downloaded.
    cache = os.path.join(ds.path, "_stream")
    assert not os.path.exists(cache) or sum(len(f) for _, _, f in os.walk(cache)) == 0
    kw: Dict[str, Any] = dict(slice_len=16, num_slices=32, seed=7, max_batches=6)
    got = list(ds.loader(**kw))
    want = list(local.loader(**kw))
    assert len(got) == len(want) == 6
    for g, w in zip(got, want):
        assert sorted(g.keys()) == sorted(w.keys())
        for k in w:
            assert g[k].shape == w[k].shape and g[k].dtype == w[k].dtype, k
            assert bool((g[k] == w[k]).all()), k


def test_a_small_cache_stays_under_its_limit_and_a_restart_continues_exactly(s3: Dict[str, str], tmp_path: Any) -> None:
    probe = trajstore.open(s3["url"], cache_limit="1GiB", cache_dir=tmp_path / "probe")
    limit = probe.transition_bytes // 4
    # reuse=0.2: each window serves its minimum (16 batches), so that 96 batches rotate through
    # six windows of the cache.
    ds = trajstore.open(s3["url"], cache_limit=limit, cache_dir=tmp_path / "c", reuse=0.2)
    loader = ds.loader(slice_len=8, num_slices=64, seed=3, workers=2, max_batches=96)
    peak, seen, state = 0, [], None
    for i, b in enumerate(loader):
        used = loader.stream_stats()["cache_bytes"]
        peak = max(peak, used)
        assert used <= limit, f"batch {i}: {used} B in a cache of {limit}"
        seen.append(_ids(b))
        if i == 47:
            state = loader.state_dict()
    assert peak > 0 and len(seen) == 96
    # The batches rotated through more of the dataset than the cache (a quarter of it) holds.
    episodes = {e for ids in seen for e, _ in ids}
    assert len(episodes) > ds.num_episodes // 3
    assert state is not None and state["next_batch"] == 48
    stats = loader.stream_stats()
    assert stats["cache_limit"] == limit
    assert stats["peak_cache_bytes"] <= limit and stats["files_evicted"] > 0, stats
    assert stats["bytes_downloaded"] > limit, stats
    # The cache directory is one loader's at a time: the first one goes (as its process would
    # at a preemption), keeping the files it downloaded.
    del loader
    gc.collect()
    # Another loader (as after a restart), other workers, resumed from the state: the same
    # batches 48.. as the first run drew.
    again = trajstore.open(s3["url"], cache_limit=limit, cache_dir=tmp_path / "c", reuse=0.2)
    resumed = again.loader(slice_len=8, num_slices=64, seed=3, workers=1, max_batches=96)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = [_ids(b) for b in resumed]
    assert rest == seen[48:]
    # A state of other options is refused, naming what differs.
    elsewhere = trajstore.open(s3["url"], cache_limit=limit, cache_dir=tmp_path / "d", reuse=0.2)
    other = elsewhere.loader(slice_len=8, num_slices=64, seed=4)
    with pytest.raises(trajstore.InvalidArgumentError, match="seed"):
        other.load_state_dict(state)


def test_the_cuda_staging_ring_streams_the_host_loaders_batches(s3: Dict[str, str], tmp_path: Any, monkeypatch: Any) -> None:
    """A stream on CUDA runs the local loader's staging ring (workers gather into the pinned
    slots, one copy per batch; a derived next_observation crosses as one row per slice): here on
    CPU through the ring's test hook, against the host loader of the same stream."""
    pytest.importorskip("torch")
    import trajstore._cuda

    probe = trajstore.open(s3["url"], cache_limit="1GiB", cache_dir=tmp_path / "probe")
    limit = probe.transition_bytes // 4
    columns = ["observation", "action", "reward", "next_observation"]
    kw: Dict[str, Any] = dict(slice_len=8, num_slices=64, seed=5, workers=2, max_batches=64, columns=columns)
    host = trajstore.open(s3["url"], cache_limit=limit, cache_dir=tmp_path / "host", reuse=0.2)
    want = list(host.loader(**kw))
    monkeypatch.setenv("TRAJSTORE_STAGED_CPU", "1")
    monkeypatch.setattr(trajstore._cuda, "_TAIL_MIN_BYTES", 0)
    ds = trajstore.open(s3["url"], cache_limit=limit, cache_dir=tmp_path / "ring", reuse=0.2)
    loader = ds.loader(**kw)
    assert loader._staged_on_cpu
    assert loader._plan.tail_columns() == [c == "next_observation" for c in columns]
    got, peak = [], 0
    for b in loader:
        got.append(b)
        peak = max(peak, loader.stream_stats()["cache_bytes"])
    # Tails shipped: the host slot holds next_observation as one row per slice.
    assert tuple(loader._slots[0]["next_observation"].shape)[:1] == (64,)
    assert len(got) == len(want) == 64
    for k, (g, w) in enumerate(zip(got, want)):
        assert sorted(g.keys()) == sorted(w.keys())
        for name in w:
            assert g[name].shape == w[name].shape and g[name].dtype == w[name].dtype, name
            assert bool((g[name] == w[name]).all()), (k, name)
    stats = loader.stream_stats()
    assert 0 < peak <= limit and stats["files_evicted"] > 0, stats


@pytest.mark.parametrize("ring", [False, True], ids=["host", "staged-ring"])
def test_a_mix_of_streams_holds_each_streams_batches_in_its_slices(
    s3: Dict[str, str], tmp_path: Any, monkeypatch: Any, ring: bool
) -> None:
    """``trajstore.mix`` of two streams, each through a quarter cache: every batch holds each
    stream's own batch of its share (seed ``seed + i``), on the host and through the CUDA
    path's staging ring (its CPU hook; next_observation as tails); a restart from
    ``state_dict`` continues exactly; a mix of a stream and a local dataset is refused."""
    torch = pytest.importorskip("torch")
    import trajstore._cuda

    local_b = make_demo(tmp_path / "b.trajstore", "--transitions", "20000", "--mean-episode-len", "100",
                        "--seed", "9", "--segment-size", "100KB")
    url_b = f"s3://streams/mix-b-{ring}"
    subprocess.run([_bin(), "push", local_b, url_b], check=True, capture_output=True)

    def opened(tag: str) -> List[Any]:
        out = []
        for i, url in enumerate((s3["url"], url_b)):
            probe = trajstore.open(url, cache_limit="1GiB", cache_dir=tmp_path / f"probe{i}")
            out.append(trajstore.open(url, cache_limit=probe.transition_bytes // 4,
                                      cache_dir=tmp_path / f"{tag}{i}", reuse=0.2))
        return out

    columns = ["observation", "action", "reward", "next_observation"]
    kw: Dict[str, Any] = dict(slice_len=8, seed=5, workers=2, max_batches=40, columns=columns)
    a, b = opened("alone")
    want_a = list(a.loader(num_slices=32, **kw))
    want_b = list(b.loader(num_slices=16, **{**kw, "seed": 6}))
    if ring:
        monkeypatch.setenv("TRAJSTORE_STAGED_CPU", "1")
        monkeypatch.setattr(trajstore._cuda, "_TAIL_MIN_BYTES", 0)
    a, b = opened("mix")
    loader = trajstore.mix([a, b], weights=[2, 1], num_slices=48, **kw)
    assert loader._staged_on_cpu == ring
    got, state = [], None
    for k, batch in enumerate(loader):
        got.append(batch)
        if k == 19:
            state = loader.state_dict()
    assert len(got) == 40
    assert got[0]["source"].tolist() == [0] * 32 + [1] * 16
    for k, batch in enumerate(got):
        for name, w in want_a[k].items():
            both = torch.cat([w, want_b[k][name]])
            assert batch[name].shape == both.shape and bool((batch[name] == both).all()), (k, name)
    stats = loader.stream_stats()
    assert len(stats["cache_dirs"]) == 2 and stats["windows_opened"] >= 4, stats
    assert 0 < stats["cache_bytes"] <= stats["cache_limit"], stats
    del loader
    gc.collect()
    assert state is not None and state["next_batch"] == 20 and len(state["mix"]) == 2
    a, b = opened("mix")
    again = trajstore.mix([a, b], weights=[2, 1], num_slices=48, **kw)
    again.load_state_dict(json.loads(json.dumps(state)))
    rest = [_ids(x) for x in again]
    assert rest == [_ids(x) for x in got[20:]]
    # A state of another mix is refused, naming what differs.
    other = trajstore.mix(opened("other"), weights=[1, 1], num_slices=48, **kw)
    with pytest.raises(trajstore.InvalidArgumentError, match="mix"):
        other.load_state_dict(state)


def test_a_subset_by_sql_downloads_only_the_segments_that_hold_it(s3: Dict[str, str], tmp_path: Any) -> None:
    local = trajstore.open(s3["local"])
    q = "SELECT episode_id FROM episodes WHERE episode_id % 50 = 7 AND length >= 8"
    ds = trajstore.open(s3["url"], cache_limit="2MiB", cache_dir=tmp_path)
    ids = ds.episodes_where(q)
    assert ids.tolist() == local.episodes_where(q).tolist() and len(ids) >= 3
    loader = ds.loader(slice_len=8, num_slices=32, episodes=q, max_batches=40, seed=1)
    drawn = {e for b in loader for e in b["episode_id"].tolist()}
    assert drawn <= set(ids.tolist()) and len(drawn) >= 2, drawn
    stats = loader.stream_stats()
    # Each episode lives in one segment: at most that many files were downloaded, a fraction
    # of the version's.
    assert 0 < stats["files_downloaded"] <= len(ids) and stats["bytes_downloaded"] < ds.transition_bytes / 4, stats
    # The same subset as ids (the rank's cache is one loader's at a time).
    del loader
    gc.collect()
    again = ds.loader(slice_len=8, num_slices=32, episodes=ids.tolist(), max_batches=40, seed=1)
    assert {e for b in again for e in b["episode_id"].tolist()} <= set(ids.tolist())


def test_what_a_stream_cannot_do_is_refused_with_the_reason(s3: Dict[str, str], tmp_path: Any) -> None:
    ds = trajstore.open(s3["url"], cache_limit="64MiB", cache_dir=tmp_path)
    with pytest.raises(trajstore.InvalidArgumentError, match="uniform' only"):
        ds.loader(episodes=[0, 1, 2], sampler="epoch")
    with pytest.raises(trajstore.InvalidArgumentError, match="uniform or epoch"):
        ds.loader(sampler="prioritized")
    with pytest.raises(trajstore.InvalidArgumentError, match="cache_limit"):
        trajstore.open(s3["url"], cache_limit="lots", cache_dir=tmp_path)
    with pytest.raises(trajstore.InvalidArgumentError, match="not both"):
        trajstore.mix([ds, trajstore.open(s3["local"])])
    # A mix of streams samples uniform, and does not follow.
    other = trajstore.open(s3["url"], cache_limit="64MiB", cache_dir=tmp_path / "o")
    with pytest.raises(trajstore.InvalidArgumentError, match="samples uniform"):
        trajstore.mix([ds, other], sampler="epoch")
    with pytest.raises(trajstore.InvalidArgumentError, match="follow"):
        trajstore.mix([ds, other], follow=True)


RANK_SCRIPT = r"""
import json, os, sys
import torch.distributed as dist
import trajstore

dist.init_process_group("gloo")
rank = dist.get_rank()
ds = trajstore.open(sys.argv[1], cache_limit=int(sys.argv[2]), cache_dir=sys.argv[3])
loader = ds.loader(slice_len=8, num_slices=32, sampler="epoch", seed=11, rank="auto")
ids, peak = [], 0
for b in loader:
    ids.append(list(zip(b["episode_id"].tolist(), b["start_step"].tolist())))
    peak = max(peak, loader.stream_stats()["cache_bytes"])
stats = loader.stream_stats()
counts = [None, None]
dist.all_gather_object(counts, len(ids))
dist.barrier()
with open(os.path.join(sys.argv[4], f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "ids": ids, "peak": peak, "counts": counts, "limit": stats["cache_limit"],
               "node_limit": ds.cache_limit, "downloaded": stats["bytes_downloaded"]}, f)
dist.destroy_process_group()
"""


def test_torchrun_ranks_draw_disjoint_equal_shares_of_an_epoch(s3: Dict[str, str], tmp_path: Any) -> None:
    pytest.importorskip("torch.distributed")
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    probe = trajstore.open(s3["url"], cache_limit="1GiB", cache_dir=tmp_path / "probe")
    # The node's limit: torchrun's LOCAL_WORLD_SIZE=2 gives each rank half, a third of the version.
    limit = 2 * (probe.transition_bytes // 3)
    out = tmp_path / "out"
    out.mkdir()
    job = _torchrun(script, s3["url"], str(limit), str(tmp_path / "cache"), str(out))
    # The node's caches on disk (each file once, as `du` counts), measured while the ranks run.
    node_peak = 0
    while job.poll() is None:
        node_peak = max(node_peak, _node_bytes(tmp_path / "cache"))
        time.sleep(0.002)
    _, err = job.communicate(timeout=600)
    assert job.returncode == 0, err[-4000:]
    assert 0 < node_peak <= limit, (node_peak, limit)
    ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(2)]
    counts = [len(x["ids"]) for x in ranks]
    assert counts[0] == counts[1] > 0, counts
    assert ranks[0]["counts"] == counts
    for x in ranks:
        assert (x["limit"], x["node_limit"]) == (limit // 2, limit), x
        assert 0 < x["peak"] <= x["limit"], x["peak"]
    # The node downloaded the dataset about once for the epoch (each rank its share, once).
    downloaded = sum(x["downloaded"] for x in ranks)
    assert 0.5 * probe.transition_bytes <= downloaded <= 1.25 * probe.transition_bytes, (
        downloaded,
        probe.transition_bytes,
    )
    slices = [{tuple(s) for b in x["ids"] for s in b} for x in ranks]
    # Disjoint: no slice of one rank's epoch is in the other's, and within a rank every slice
    # is drawn once (an epoch visits each window once).
    assert not slices[0] & slices[1]
    for x, s in zip(ranks, slices):
        assert len(s) == sum(len(b) for b in x["ids"])
    # Together they cover the epoch: every slice of the version, but the few windows' worth an
    # epoch skips so that the ranks stop together.
    local = trajstore.open(s3["local"])
    eps = local.episodes()
    lengths = np.asarray(eps.column("length"))
    total = int(np.maximum(lengths - 8 + 1, 0).sum())
    covered = len(slices[0] | slices[1])
    assert covered >= 0.7 * total, (covered, total)


def test_the_torchrun_example_trains_from_s3_and_resumes_from_its_checkpoints(s3: Dict[str, str], tmp_path: Any) -> None:
    pytest.importorskip("torch.distributed")
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_s3_torchrun.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def run(steps: int) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        r = subprocess.run(
            [
                sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(port), example, s3["url"],
                "--cache-limit", "2MiB", "--cache-dir", str(tmp_path / "cache"), "--steps", str(steps),
                "--batch-size", "64", "--save-every", "10", "--log-every", "10",
                "--checkpoint-dir", str(tmp_path / "ckpt"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-4000:]
        return r.stdout

    first = run(30)
    assert "step 30 loss" in first and "resumed at step" not in first
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["rank0-of-2.pt", "rank1-of-2.pt"]
    for r in (0, 1):
        assert f"rank {r}: 30 steps; downloaded" in first
    second = run(50)
    assert "resumed at step 30" in second and "step 50 loss" in second


KILL_SCRIPT = r"""
import json, os, sys
import trajstore

url, limit, cache, log_path, state_path, n = sys.argv[1:7]
ds = trajstore.open(url, cache_limit=int(limit), cache_dir=cache, reuse=0.2)
loader = ds.loader(slice_len=8, num_slices=64, seed=5, workers=2, max_batches=int(n), rank="auto")
if os.path.exists(state_path):
    with open(state_path) as f:
        loader.load_state_dict(json.load(f))
with open(log_path, "a") as log:
    for b in loader:
        k = loader.state_dict()["next_batch"] - 1
        log.write(json.dumps([k, list(zip(b["episode_id"].tolist(), b["start_step"].tolist()))]) + "\n")
        log.flush()
        # The checkpoint a training loop would save after its step (written whole, then renamed).
        with open(state_path + ".tmp", "w") as f:
            json.dump(loader.state_dict(), f)
        os.replace(state_path + ".tmp", state_path)
with open(log_path + ".stats", "w") as f:
    json.dump(loader.stream_stats(), f)
"""


def test_a_rank_killed_mid_epoch_resumes_its_downloads_and_batches_and_the_other_rank_is_unaffected(
    s3: Dict[str, str], tmp_path: Any
) -> None:
    script = tmp_path / "rank.py"
    script.write_text(KILL_SCRIPT)
    probe = trajstore.open(s3["url"], cache_limit="1GiB", cache_dir=tmp_path / "probe")
    # The node's limit is half the version: each of its two ranks keeps a quarter.
    limit, n = probe.transition_bytes // 2, 96
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def start(rank: int, node: str, crash: str | None = None) -> subprocess.Popen[bytes]:
        env = {**base, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}
        env.pop("TRAJSTORE_CRASH_AT", None)
        if crash:
            env["TRAJSTORE_CRASH_AT"] = crash
        d = tmp_path / node
        d.mkdir(exist_ok=True)
        args = [s3["url"], str(limit), str(d / "cache"), str(d / f"rank{rank}.log"), str(d / f"rank{rank}.state"), str(n)]
        return subprocess.Popen([sys.executable, str(script), *args], env=env, stderr=subprocess.PIPE)

    def batches(node: str, rank: int) -> Dict[int, Any]:
        out: Dict[int, Any] = {}
        for line in (tmp_path / node / f"rank{rank}.log").read_text().splitlines():
            k, ids = json.loads(line)
            assert out.setdefault(k, ids) == ids, f"batch {k} differs when drawn again"
        return out

    def finish(p: subprocess.Popen[bytes]) -> int:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0 and b"simulated crash" not in err:
            raise AssertionError(err.decode()[-4000:])
        return p.returncode

    # Both ranks, uninterrupted.
    ref = [start(r, "ref") for r in (0, 1)]
    assert [finish(p) for p in ref] == [0, 0]
    # The same node again, rank 1 killed (as by SIGKILL) in the middle of its 9th download,
    # after its first window's batches; rank 0 runs on.
    node = [start(0, "node"), start(1, "node", crash="stream-download@9")]
    codes = [finish(p) for p in node]
    assert codes[0] == 0 and codes[1] != 0, codes
    killed = batches("node", 1)
    assert 16 <= len(killed) < n, len(killed)
    assert batches("node", 0) == batches("ref", 0), "the other rank is unaffected"
    rank1 = tmp_path / "node" / "cache"
    partial = [
        os.path.join(d, f) for d, _, files in os.walk(rank1) for f in files if "rank-1" in d and f.endswith(".partial")
    ]
    # The killed download left its first bytes (other downloads in flight may have none yet).
    assert any(os.path.getsize(p) > 0 for p in partial), partial
    # Restarted from its checkpoint: the batches continue exactly, and the partial download is
    # resumed, not fetched again.
    assert finish(start(1, "node")) == 0
    assert batches("node", 1) == batches("ref", 1)
    assert sorted(batches("node", 1)) == list(range(n))
    stats = json.loads((tmp_path / "node" / "rank1.log.stats").read_text())
    assert stats["bytes_resumed"] > 0, stats
    assert stats["cache_limit"] == limit // 2 and stats["node_cache_limit"] == limit, stats


def test_a_following_stream_sees_a_version_committed_after_it_started(s3: Dict[str, str], tmp_path: Any) -> None:
    # A dataset of its own in the bucket, so that committing to it changes no other test's data.
    local = make_demo(tmp_path / "grow.trajstore", "--transitions", "20000", "--mean-episode-len", "100",
                      "--seed", "6", "--segment-size", "200KB")
    url = "s3://streams/grow"
    subprocess.run([_bin(), "push", local, url], check=True, capture_output=True)
    ds = trajstore.open(url, cache_limit="1GiB", cache_dir=tmp_path / "cache", reuse=0.05)
    first_new = trajstore.open(local).num_episodes
    loader = ds.loader(slice_len=8, num_slices=32, seed=2, follow=True)
    it = iter(loader)
    for _ in range(5):
        assert max(next(it)["episode_id"].tolist()) < first_new
    # A collector appends episodes and pushes the new version.
    w = trajstore.create(local, observation_shape=(17,), action_shape=(6,), append=True)
    rng = np.random.default_rng(1)
    for _ in range(30):
        n = 60
        obs = rng.standard_normal((n, 17)).astype(np.float32)
        act = rng.standard_normal((n, 6)).astype(np.float32)
        w.append_episode(obs, act, rng.standard_normal(n).astype(np.float32), terminated=True)
    w.commit()
    w.close()
    # The collector pushes from Python: only the new files go up.
    before = trajstore.open(url, cache_limit="1GiB", cache_dir=tmp_path / "probe").version
    report = trajstore.push(local, url)
    assert report["previous_version"] == before and report["version"] > before, report
    assert report["files_present"] > 0 and report["files_uploaded"] > 0 and not report["up_to_date"], report
    again = trajstore.push(local, url)
    assert again["up_to_date"] and again["files_uploaded"] == 0, again
    with pytest.raises(ValueError, match="not a URL"):
        trajstore.push(local, str(tmp_path / "elsewhere"))
    seen_new_at, states = None, {}
    for k in range(5, 400):
        b = next(it)
        states[k] = loader.state_dict()
        if max(b["episode_id"].tolist()) >= first_new:
            seen_new_at = k
            break
    assert seen_new_at is not None, "the new episodes were never drawn"
    state = loader.state_dict()
    assert state["version"] == ds.version + 1 and 0 < state["version_base"] <= seen_new_at, state
    want = [_ids(next(it)) for _ in range(6)]
    del it, loader
    gc.collect()
    # A restart from the state continues on the new version, exactly.
    again = trajstore.open(url, cache_limit="1GiB", cache_dir=tmp_path / "cache", reuse=0.05, version=ds.version)
    resumed = again.loader(slice_len=8, num_slices=32, seed=2, follow=True)
    resumed.load_state_dict(state)
    rit = iter(resumed)
    assert [_ids(next(rit)) for _ in range(6)] == want
    # Following needs one rank.
    with pytest.raises(trajstore.InvalidArgumentError, match="one rank"):
        ds.loader(slice_len=8, num_slices=32, follow=True, rank=0, world_size=2)


FOLLOW_RANK_SCRIPT = r"""
import json, os, sys, time
import torch.distributed as dist
import trajstore

dist.init_process_group("gloo")
rank = dist.get_rank()
url, cache, out = sys.argv[1], sys.argv[2], sys.argv[3]
ds = trajstore.open(url, cache_limit="1GiB", cache_dir=cache, reuse=0.05)
loader = ds.loader(slice_len=8, num_slices=16, seed=4, follow=True, rank="auto", max_batches=120)
rows = []
for k, b in enumerate(loader):
    st = loader.state_dict()
    rows.append([k, sorted(set(b["episode_id"].tolist())), st["version"], st["version_base"]])
    if k == 10:
        # Batch 10 drawn: the test pushes a new version, then lets the ranks go on.
        open(os.path.join(out, f"at10-{rank}"), "w").close()
        while not os.path.exists(os.path.join(out, "go")):
            time.sleep(0.05)
        dist.barrier()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(rows, f)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("ring", [False, True], ids=["host", "staged-ring"])
def test_torchrun_ranks_follow_a_stream_together(s3: Dict[str, str], tmp_path: Any, monkeypatch: Any, ring: bool) -> None:
    """With ``ring``, the ranks' loaders run the CUDA path's staging ring (on CPU, through the
    test hook), whose native loader is replaced at every round boundary."""
    pytest.importorskip("torch.distributed")
    if ring:
        monkeypatch.setenv("TRAJSTORE_STAGED_CPU", "1")
    local = make_demo(tmp_path / "grow2.trajstore", "--transitions", "20000", "--mean-episode-len", "100",
                      "--seed", "8", "--segment-size", "100KB")
    url = f"s3://streams/grow2-{'ring' if ring else 'host'}"
    subprocess.run([_bin(), "push", local, url], check=True, capture_output=True)
    first_new = trajstore.open(local).num_episodes
    script = tmp_path / "follow_rank.py"
    script.write_text(FOLLOW_RANK_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    job = _torchrun(script, url, str(tmp_path / "cache"), str(out))
    deadline = time.time() + 300
    while not all((out / f"at10-{r}").exists() for r in (0, 1)):
        assert job.poll() is None, job.communicate()[1][-4000:]
        assert time.time() < deadline
        time.sleep(0.05)
    w = trajstore.create(local, observation_shape=(17,), action_shape=(6,), append=True)
    rng = np.random.default_rng(2)
    for _ in range(40):
        w.append_episode(rng.standard_normal((50, 17)).astype(np.float32),
                         rng.standard_normal((50, 6)).astype(np.float32),
                         rng.standard_normal(50).astype(np.float32), terminated=True)
    w.commit()
    w.close()
    subprocess.run([_bin(), "push", local, url], check=True, capture_output=True)
    (out / "go").touch()
    _, err = job.communicate(timeout=600)
    assert job.returncode == 0, err[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 120
    # Both ranks moved to the new version at the same batch, after the push.
    for k in range(120):
        a, b = ranks[0][k], ranks[1][k]
        assert (a[2], a[3]) == (b[2], b[3]), (k, a, b)
        # Every batch: the ranks' episodes are disjoint (disjoint shares of the round).
        assert not set(a[1]) & set(b[1]), (k, a[1], b[1])
    version, base = ranks[0][-1][2], ranks[0][-1][3]
    assert version == trajstore.open(local).version and 10 < base < 120, (version, base)
    drawn = {e for x in ranks for row in x[base:] for e in row[1]}
    assert any(e >= first_new for e in drawn), "the new episodes were drawn after the move"
