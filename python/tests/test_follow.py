"""Following a growing dataset: a collector in another process appends and commits episodes
while loaders sample with follow=...; every batch is consistent (one version, rows of the
slice's episode), versions only move forward, and new episodes are sampled soon after their
commit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import trajstore
from growing import append, check_batch, lengths
from trajref import batch_numpy, subprocess_env

torch = pytest.importorskip("torch")

# The collector: appends `per_commit` episodes (observations encoded as growing.episode does)
# and commits every `every` seconds, `commits` times; prints one JSON line per commit.
COLLECTOR = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import trajstore
    sys.path.insert(0, sys.argv[5])
    from growing import episode

    path, every, commits, per_commit = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(7)
    w = trajstore.create(path, observation_shape=(4,), action_shape=(2,), append=True)
    print(json.dumps({"ready": True}), flush=True)
    for _ in range(commits):
        time.sleep(every)
        ids = []
        for _ in range(per_commit):
            eid = w.next_episode_id
            obs, act, rew = episode(0.0, eid, int(rng.integers(8, 40)), rng)
            ids.append(w.append_episode(obs, act, rew, terminated=True))
        v = w.commit()
        print(json.dumps({"version": v, "ids": ids, "t": time.time()}), flush=True)
    w.close()
    """
)

REFRESH_S = 0.5  # the longest follow period of the loaders below
SLACK_S = 10.0


def start_collector(path, every, commits, per_commit):
    import os

    tests = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.Popen(
        [sys.executable, "-c", COLLECTOR, str(path), str(every), str(commits), str(per_commit), tests],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(),
    )
    commits_seen = []

    def read():
        for line in p.stdout:
            commits_seen.append(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return p, commits_seen, reader


def test_two_loaders_follow_a_collector_in_another_process(tmp_path):
    path = tmp_path / "live.trajstore"
    append(path, lengths(20, 8, 40, seed=0), seed=0)
    ds = trajstore.open(path)
    first_version = ds.version
    loaders = [
        ds.loader(slice_len=4, num_slices=64, follow=0.2, workers=1, seed=1, backend="numpy"),
        ds.loader(slice_len=4, num_slices=64, follow={"every": REFRESH_S, "every_batches": 20}, workers=2, seed=2),
    ]
    iters = [iter(l) for l in loaders]
    seen = [dict() for _ in loaders]  # episode id -> first time sampled
    last_versions = [[first_version] for _ in loaders]
    proc, commits, reader = start_collector(path, every=0.2, commits=15, per_commit=2)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            for i, (loader, it) in enumerate(zip(loaders, iters)):
                v = loader.versions
                assert v[0] >= last_versions[i][-1], f"loader {i}: version went back {last_versions[i][-1]} -> {v}"
                last_versions[i].append(v[0])
                b = batch_numpy(next(it))
                check_batch(b)
                now = time.time()
                for eid in np.unique(b["episode_id"]).tolist():
                    seen[i].setdefault(int(eid), now)
            done = proc.poll() is not None
            if done:
                reader.join(5)
                new = [eid for c in commits if "ids" in c for eid in c["ids"]]
                if all(eid in s for s in seen for eid in new):
                    break
            time.sleep(0.002)
        proc.wait(30)
        err = proc.stderr.read()
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
    made = [c for c in commits if "ids" in c]
    assert len(made) == 15
    final = made[-1]["version"]
    for i, loader in enumerate(loaders):
        stats = loader.follow_stats()
        assert stats["refreshes"] >= 1, stats
        # Moved to the newest version, passing through others on the way.
        assert last_versions[i][-1] == final, (i, last_versions[i][-1], final, stats)
        assert len(set(last_versions[i])) >= 3, f"loader {i} saw versions {sorted(set(last_versions[i]))}"
        for c in made:
            for eid in c["ids"]:
                assert eid in seen[i], f"loader {i} never sampled episode {eid} (committed in version {c['version']})"
                late = seen[i][eid] - c["t"]
                assert late < REFRESH_S + SLACK_S, f"loader {i} sampled episode {eid} {late:.1f} s after its commit"
    # Everything sampled was committed: the original episodes and the collector's.
    committed = set(range(20)) | {eid for c in made for eid in c["ids"]}
    for s in seen:
        assert set(s) <= committed


def test_follow_every_batches_moves_at_batch_boundaries(tmp_path):
    """A loader following every 5 batches (no time period) takes a new commit after about 5
    more batches, from a batch no worker had drawn: earlier batches keep the old version."""
    path = tmp_path / "grow.trajstore"
    append(path, lengths(10, 8, 30, seed=1), seed=1)
    ds = trajstore.open(path)
    loader = ds.loader(slice_len=4, num_slices=16, follow={"every_batches": 5}, seed=0, backend="numpy")
    it = iter(loader)
    for _ in range(3):
        check_batch(next(it))
    v0 = ds.version
    new_ids = append(path, [30] * 5, seed=2)
    versions, saw_new = [], False
    for _ in range(400):
        versions.append(loader.versions[0])
        b = next(it)
        check_batch(b)
        saw_new |= bool(set(b["episode_id"].tolist()) & set(new_ids))
        if saw_new:
            break
        time.sleep(0.005)
    assert versions == sorted(versions) and versions[-1] == v0 + 1, versions
    assert saw_new


def test_follow_arguments(demo_ds):
    for bad in (0, -1.0, "yes", {"every": 0}, {"every_batches": 0}, {"period": 1}, {}):
        with pytest.raises(trajstore.InvalidArgumentError, match="follow"):
            demo_ds.loader(follow=bad)
    # Samplers without replacement, prioritized, and subsets cannot follow (Rust's errors).
    for kw in (dict(sampler="epoch"), dict(sampler="prioritized"), dict(episodes=[0, 1])):
        with pytest.raises(trajstore.InvalidArgumentError, match="follow"):
            demo_ds.loader(follow=True, **kw)
    loader = demo_ds.loader(slice_len=4, num_slices=8, follow=True, max_batches=2)
    assert loader.versions == [demo_ds.version]
    assert loader.follow_stats() == {"refreshes": 0, "failures": 0, "last_error": None}
    state = loader.state_dict()
    assert state["parts"][0]["follow"] is True
