"""Pixel observations from Python: a NumPy dump of uint8 frames ingested by the CLI becomes a
frame column (compressed, one frame per step), and ``loader(frame_stack=K)`` hands out
``[B, L, K, H, W]`` stacks equal to a NumPy reference built from the raw frames, at episode
starts (repeat or zero padding) and ends (``next_observation`` is zeros after a step with no
stored next frame)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import trajstore
from trajref import run_cli

H, W = 12, 10
LENGTHS = [1, 3, 6, 17, 40]


@pytest.fixture(scope="module")
def frames_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("frames")
    rng = np.random.default_rng(0)
    n = sum(LENGTHS)
    # Game-like frames: a flat background with a moving bright square.
    obs = np.full((n, H, W), 87, np.uint8)
    terminals = np.zeros(n, bool)
    at = 0
    for length in LENGTHS:
        for t in range(length):
            y, x = (3 * t) % (H - 3), (5 * t + length) % (W - 3)
            obs[at + t, y : y + 3, x : x + 3] = 255
        at += length
        terminals[at - 1] = True
    npz = d / "frames.npz"
    np.savez(
        npz,
        observations=obs,
        actions=rng.integers(0, 4, n).astype(np.int64),
        rewards=rng.standard_normal(n).astype(np.float32),
        terminals=terminals,
        timeouts=np.zeros(n, bool),
    )
    out = d / "frames.trajstore"
    run_cli("ingest", str(npz), str(out), "--frame-codec", "zstd")
    return str(out), obs


def reference(obs, starts, episode_id, start_step, l, k, pad):
    """Stacks of the slices, from the raw frames (episode `e` is rows starts[e]..starts[e+1])."""
    b = len(episode_id)
    out = np.zeros((b, l, k, H, W), np.uint8)
    nxt = np.zeros((b, l, k, H, W), np.uint8)
    for i in range(b):
        e, s = int(episode_id[i]), int(start_step[i])
        lo, hi = starts[e], starts[e + 1]
        n = hi - lo

        def frame(u, lo=lo, n=n):
            if u < 0:
                return obs[lo] if pad == "repeat" else np.zeros((H, W), np.uint8)
            return obs[lo + u] if u < n else np.zeros((H, W), np.uint8)

        for j in range(l):
            t = s + j
            if 0 <= t < n:
                for slot in range(k):
                    out[i, j, slot] = frame(t - (k - 1 - slot))
                    nxt[i, j, slot] = frame(t + 1 - (k - 1 - slot))
    return out, nxt


def test_an_image_dump_becomes_a_frame_column(frames_path, trajstore_bin):
    path, obs = frames_path
    info = json.loads(run_cli("info", path, "--json").stdout)
    text = json.dumps(info)
    assert "frame" in text  # info reports the frame column and its bytes per frame
    ds = trajstore.open(path)
    assert ds.num_transitions == obs.shape[0]
    assert str(ds.schema.field("observation").type) == "large_binary"


@pytest.mark.parametrize("pad", ["repeat", "zeros"])
@pytest.mark.parametrize("policy", ["strict", "pad"])
def test_frame_stacks_equal_the_raw_frames(frames_path, pad, policy):
    path, obs = frames_path
    ds = trajstore.open(path)
    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    k, l, b = 4, 5, 16
    loader = ds.loader(
        slice_len=l, num_slices=b, columns=["observation", "next_observation"], policy=policy,
        frame_stack=k, frame_pad=pad, backend="numpy", max_batches=5, seed=11,
    )
    seen = 0
    for batch in loader:
        assert batch["observation"].shape == (b, l, k, H, W)
        assert batch["observation"].dtype == np.uint8
        ids = batch["episode_id"] - ds.first_episode_id
        want, want_next = reference(obs, starts, ids, batch["start_step"], l, k, pad)
        np.testing.assert_array_equal(batch["observation"], want)
        np.testing.assert_array_equal(batch["next_observation"], want_next)
        seen += 1
    assert seen == 5


def test_one_frame_per_step_without_a_stack_and_bad_stacks_are_refused(frames_path, demo_ds):
    path, _ = frames_path
    ds = trajstore.open(path)
    batch = next(iter(ds.loader(slice_len=2, num_slices=4, columns=["observation"], backend="numpy")))
    assert batch["observation"].shape == (4, 2, H, W)
    with pytest.raises(trajstore.InvalidArgumentError, match="frame_stack"):
        ds.loader(slice_len=2, num_slices=4, frame_stack=0, backend="numpy")
    with pytest.raises(trajstore.InvalidArgumentError, match="frame_pad"):
        ds.loader(slice_len=2, num_slices=4, frame_stack=4, frame_pad="edge", backend="numpy")  # type: ignore[arg-type]
    # A dataset of tensor observations has no frames to stack.
    with pytest.raises(trajstore.InvalidArgumentError, match="frame_stack"):
        demo_ds.loader(slice_len=2, num_slices=4, frame_stack=4, backend="numpy")


@pytest.mark.skipif(os.environ.get("TRAJSTORE_NO_TORCH") == "1", reason="needs torch")
def test_torch_batches_of_frames_are_uint8_stacks(frames_path):
    torch = pytest.importorskip("torch")
    path, _ = frames_path
    ds = trajstore.open(path)
    batch = next(iter(ds.loader(slice_len=3, num_slices=8, frame_stack=4, columns=["observation"])))
    assert batch["observation"].dtype == torch.uint8
    assert tuple(batch["observation"].shape) == (8, 3, 4, H, W)
