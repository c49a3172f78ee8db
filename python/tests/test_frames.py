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


def assert_valid_stacks(batch, obs, first, l, k):
    """The batch's observation and next_observation stacks equal the raw frames' (repeat
    padding) at every valid step; padded steps are not compared (a window's may hold its
    neighbours' frames)."""
    got = {n: np.asarray(t) for n, t in batch.items()}
    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    want, want_next = reference(obs, starts, got["episode_id"] - first, got["start_step"], l, k, "repeat")
    mask = got["mask"].astype(bool)
    np.testing.assert_array_equal(got["observation"][mask], want[mask])
    np.testing.assert_array_equal(got["next_observation"][mask], want_next[mask])


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


# Every frame (67 of 120 B each), a part of them (the first 30 frames), one frame per step.
@pytest.mark.parametrize("cache,k", [("1MiB", 4), (30 * H * W, 4), ("1MiB", None)])
def test_a_frame_cache_gives_the_same_batches(frames_path, cache, k):
    """frame_cache: the frames copied from memory equal the frames decoded, batch for batch,
    whether the cache holds every frame or only the first ones."""
    path, obs = frames_path
    ds = trajstore.open(path)
    args = dict(
        slice_len=5, num_slices=16, columns=["observation", "next_observation"], policy="pad",
        frame_stack=k, backend="numpy", max_batches=6, seed=5,
    )
    plain = list(ds.loader(**args))  # type: ignore[arg-type]
    cached = list(ds.loader(frame_cache=cache, **args))  # type: ignore[arg-type]
    assert len(plain) == len(cached) == 6
    for a, b in zip(plain, cached):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    if k is not None:
        starts = np.concatenate([[0], np.cumsum(LENGTHS)])
        b0 = cached[0]
        want, want_next = reference(obs, starts, b0["episode_id"] - ds.first_episode_id, b0["start_step"], 5, k, "repeat")
        mask = b0["mask"].astype(bool)
        np.testing.assert_array_equal(b0["observation"][mask], want[mask])


def test_a_frame_cache_refuses_bad_sizes_and_following(frames_path):
    path, _ = frames_path
    ds = trajstore.open(path)
    with pytest.raises(trajstore.InvalidArgumentError, match="frame_cache"):
        ds.loader(slice_len=2, num_slices=4, frame_cache="lots", backend="numpy")
    with pytest.raises(trajstore.InvalidArgumentError, match="frame_cache"):
        ds.loader(slice_len=2, num_slices=4, frame_cache="1MiB", follow=True, backend="numpy")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("policy", ["strict", "pad", "span:2:3"])
def test_frame_windows_are_strided_views_of_the_same_stacks(frames_path, backend, policy):
    """frame_window=True: [B, L, K, H, W] views over each slice's L + K - 1 frames, equal to the
    raw frames' stacks at every valid step, the step and frame axes both one frame apart."""
    if backend == "torch":
        if os.environ.get("TRAJSTORE_NO_TORCH") == "1":
            pytest.skip("needs torch")
        pytest.importorskip("torch")
    path, obs = frames_path
    ds = trajstore.open(path)
    k, l, b = 4, 5, 16
    loader = ds.loader(
        slice_len=l, num_slices=b, columns=["observation", "next_observation"], policy=policy,
        frame_stack=k, frame_window=True, backend=backend, max_batches=4, seed=13,
    )
    seen = 0
    for batch in loader:
        got = {n: np.asarray(t) for n, t in batch.items()}
        o = got["observation"]
        assert o.shape == (b, l, k, H, W) and o.dtype == np.uint8
        frame = H * W
        # Bytes: the window's rows are one frame apart for the step axis and the stack axis alike.
        assert o.strides == ((l + k - 1) * frame, frame, frame, W, 1)
        assert_valid_stacks(got, obs, ds.first_episode_id, l, k)
        seen += 1
    assert seen == 4
    with pytest.raises(trajstore.InvalidArgumentError, match="frame_stack"):
        ds.loader(slice_len=2, num_slices=4, frame_window=True, backend="numpy")
    with pytest.raises(trajstore.InvalidArgumentError, match="frame_window"):
        ds.loader(slice_len=2, num_slices=4, frame_stack=4, frame_window=True,
                  frame_channels_last=True, backend="numpy")


@pytest.mark.skipif(os.environ.get("TRAJSTORE_NO_TORCH") == "1", reason="needs torch")
@pytest.mark.parametrize("policy", ["strict", "pad", "span:2:3"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_staged_compact_frame_stacks_equal_the_raw_frames(frames_path, monkeypatch, policy, channels_last):
    """The CUDA ring's batch (one stack of next_observation per slice, expanded by torch; run on
    CPU through TRAJSTORE_STAGED_CPU=1) against stacks of the raw frames."""
    pytest.importorskip("torch")
    import trajstore._cuda

    monkeypatch.setenv("TRAJSTORE_STAGED_CPU", "1")
    monkeypatch.setattr(trajstore._cuda, "_TAIL_MIN_BYTES", 0)
    path, obs = frames_path
    ds = trajstore.open(path)
    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    k, l, b = 3, 5, 16
    loader = ds.loader(
        slice_len=l, num_slices=b, columns=["observation", "next_observation"], policy=policy,
        frame_stack=k, frame_channels_last=channels_last, max_batches=4, seed=7, staging_slots=2,
    )
    assert loader._staged_on_cpu
    seen = 0
    for batch in loader:
        assert loader._plan.tail_columns() == [False, True]
        stack = (H, W, k) if channels_last else (k, H, W)
        assert tuple(loader._slots[0]["next_observation"].shape) == (b, *stack)
        got = {n: t.numpy() for n, t in batch.items()}
        ids = got["episode_id"] - ds.first_episode_id
        want, want_next = reference(obs, starts, ids, got["start_step"], l, k, "repeat")
        if channels_last:
            want, want_next = want.transpose(0, 1, 3, 4, 2), want_next.transpose(0, 1, 3, 4, 2)
        np.testing.assert_array_equal(got["observation"], want)
        np.testing.assert_array_equal(got["next_observation"], want_next)
        seen += 1
    assert seen == 4


def streamed(frames_path, tmp_path):
    """The frame dataset pushed to a store (file://) and opened from it: (dataset, the raw
    frames, the first episode id)."""
    path, obs = frames_path
    store = "file://" + str(tmp_path / "store")
    trajstore.push(path, store)
    ds = trajstore.open(store, cache_limit="1GiB", cache_dir=str(tmp_path / "cache"))
    return ds, obs, trajstore.open(path).first_episode_id


@pytest.mark.parametrize("window", [False, True])
def test_a_streamed_frame_dataset_gives_the_raw_frames_stacks(frames_path, tmp_path, window):
    """A frame dataset pushed to a store (file://) and streamed: stacks, written out or as a
    frame window's strided view, equal to the raw frames' stacks at every valid step."""
    ds, obs, first = streamed(frames_path, tmp_path)
    k, l, b = 4, 5, 8
    seen = 0
    for batch in ds.loader(slice_len=l, num_slices=b, columns=["observation", "next_observation"], policy="pad",
                           frame_stack=k, frame_window=window, backend="numpy", max_batches=4, seed=2):
        o = batch["observation"]
        assert o.shape == (b, l, k, H, W)
        if window:
            assert o.strides == ((l + k - 1) * H * W, H * W, H * W, W, 1)
        assert_valid_stacks(batch, obs, first, l, k)
        seen += 1
    assert seen == 4


@pytest.mark.skipif(os.environ.get("TRAJSTORE_NO_TORCH") == "1", reason="needs torch")
def test_a_streamed_frame_window_crosses_one_next_frame_per_slice(frames_path, tmp_path, monkeypatch):
    """A streamed frame dataset (file://) through the CUDA ring (its CPU stand-in) with
    frame_window=True: a slot holds the observation's window and one next_observation frame per
    slice, and the batch's stacks, next_observation derived from the window, equal the raw
    frames' at every valid step."""
    pytest.importorskip("torch")
    import trajstore._cuda

    monkeypatch.setenv("TRAJSTORE_STAGED_CPU", "1")
    monkeypatch.setattr(trajstore._cuda, "_TAIL_MIN_BYTES", 0)
    ds, obs, first = streamed(frames_path, tmp_path)
    k, l, b = 4, 5, 8
    loader = ds.loader(
        slice_len=l, num_slices=b, columns=["observation", "next_observation"], policy="pad",
        frame_stack=k, frame_window=True, max_batches=4, seed=3, staging_slots=2,
    )
    assert loader._staged_on_cpu
    seen = 0
    for batch in loader:
        assert loader._plan.tail_columns() == [False, True]
        assert tuple(loader._slots[0]["observation"].shape) == (b, l + k - 1, H, W)
        assert tuple(loader._slots[0]["next_observation"].shape) == (b, H, W)
        assert tuple(batch["next_observation"].shape) == (b, l, k, H, W)
        assert_valid_stacks({n: t.numpy() for n, t in batch.items()}, obs, first, l, k)
        seen += 1
    assert seen == 4


@pytest.mark.skipif(os.environ.get("TRAJSTORE_NO_TORCH") == "1", reason="needs torch")
@pytest.mark.parametrize("policy", ["strict", "pad", "span:2:3"])
@pytest.mark.parametrize("transform", [False, True])
def test_staged_frame_windows_cross_as_windows_and_equal_the_raw_frames(frames_path, monkeypatch, policy, transform):
    """The CUDA ring with frame_window=True (run on CPU through TRAJSTORE_STAGED_CPU=1): each host
    slot holds [B, L + K - 1, H, W] frames, a quarter of the stacks' bytes at K = 4 (what the one
    copy per batch carries), and the batch's [B, L, K, H, W] stacks are views of the device
    buffer equal to stacks of the raw frames at every valid step; through a transform too.
    Without a transform next_observation crosses as one frame per slice (the frame after its
    last valid step) and is derived from the observation's window on the device."""
    pytest.importorskip("torch")
    import trajstore._cuda

    monkeypatch.setenv("TRAJSTORE_STAGED_CPU", "1")
    monkeypatch.setattr(trajstore._cuda, "_TAIL_MIN_BYTES", 0)
    path, obs = frames_path
    ds = trajstore.open(path)
    k, l, b = 4, 5, 16
    seen_by_transform = []

    def keep(batch):
        seen_by_transform.append(tuple(batch["observation"].shape))
        return batch

    loader = ds.loader(
        slice_len=l, num_slices=b, columns=["observation", "next_observation"], policy=policy,
        frame_stack=k, frame_window=True, max_batches=4, seed=5, staging_slots=2,
        transform=keep if transform else None,
    )
    assert loader._staged_on_cpu
    seen = 0
    for batch in loader:
        assert loader._plan.leads() == [k - 1, k - 1]
        assert loader._plan.tail_columns() == [False, True]
        assert tuple(loader._slots[0]["observation"].shape) == (b, l + k - 1, H, W)
        tail = (b, H, W) if not transform else (b, l + k - 1, H, W)
        assert tuple(loader._slots[0]["next_observation"].shape) == tail
        for name in ("observation", "next_observation"):
            o = batch[name]
            assert tuple(o.shape) == (b, l, k, H, W)
            if not transform:
                frame = H * W
                # A view of a device tensor: steps and stack slots both one frame apart.
                assert o.stride() == ((l + k - 1) * frame, frame, frame, W, 1), name
        assert_valid_stacks({n: t.numpy() for n, t in batch.items()}, obs, ds.first_episode_id, l, k)
        seen += 1
    assert seen == 4
    assert seen_by_transform == ([(b, l, k, H, W)] * 4 if transform else [])


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


def test_channels_last_stacks_put_the_frame_axis_last(frames_path):
    path, obs = frames_path
    ds = trajstore.open(path)
    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    loader = ds.loader(
        slice_len=4, num_slices=16, policy="pad", frame_stack=4, frame_channels_last=True,
        backend="numpy", max_batches=3, seed=5,
    )
    for batch in loader:
        assert batch["observation"].shape == (16, 4, H, W, 4)
        want, want_next = reference(obs, starts, batch["episode_id"], batch["start_step"], 4, 4, "repeat")
        mask = batch["mask"].astype(bool)
        # [B, L, K, H, W] -> [B, L, H, W, K]
        np.testing.assert_array_equal(batch["observation"][mask], want.transpose(0, 1, 3, 4, 2)[mask])
        np.testing.assert_array_equal(batch["next_observation"][mask], want_next.transpose(0, 1, 3, 4, 2)[mask])
    with pytest.raises(trajstore.InvalidArgumentError, match="frame_stack"):
        ds.loader(slice_len=2, num_slices=4, frame_channels_last=True, backend="numpy")


def _episodes_of(obs):
    at = 0
    for length in LENGTHS:
        yield obs[at : at + length]
        at += length


def test_the_python_writer_compresses_raw_frames(tmp_path, frames_path):
    _, obs = frames_path
    path = tmp_path / "written.trajstore"
    finals = []
    with trajstore.create(path, (H, W), observation_dtype="uint8", frame_codec="zstd-dict") as w:
        for e, frames in enumerate(_episodes_of(obs)):
            final = np.full((H, W), e + 1, np.uint8)
            finals.append(final)
            n = len(frames)
            w.append_episode(frames, np.zeros(n, np.int64), np.zeros(n, np.float32),
                             truncated=True, final_observation=final)
    ds = trajstore.open(path)
    assert str(ds.schema.field("observation").type) == "large_binary"
    assert ds.num_transitions == obs.shape[0]
    # Whole episodes, one frame per step: the frames as written, then the final frame.
    loader = ds.loader(slice_len=max(LENGTHS), num_slices=len(LENGTHS), policy="pad",
                       sampler="episodes", backend="numpy", max_batches=1)
    batch = next(iter(loader))
    for i in range(len(LENGTHS)):
        e, s = int(batch["episode_id"][i]), int(batch["start_step"][i])
        frames = list(_episodes_of(obs))[e]
        n = len(frames)
        np.testing.assert_array_equal(batch["observation"][i, : n - s], frames[s:])
        np.testing.assert_array_equal(batch["next_observation"][i, n - s - 1], finals[e])
    with pytest.raises(trajstore.InvalidArgumentError, match="frame"):
        trajstore.create(tmp_path / "f32", (H, W), frame_codec="zstd")
    with pytest.raises(trajstore.InvalidArgumentError, match="frame_codec"):
        trajstore.create(tmp_path / "bad", (H, W), observation_dtype="uint8", frame_codec="png")  # type: ignore[arg-type]


def _save_npz(path, observations) -> None:
    """``observations`` (one row per step of the episodes of ``LENGTHS``) as a D4RL-keyed ``.npz``:
    zero actions and rewards, each episode terminated at its last step."""
    n = observations.shape[0]
    terminals = np.zeros(n, bool)
    terminals[np.cumsum(LENGTHS) - 1] = True
    np.savez(path, observations=observations, actions=np.zeros(n, np.int64), rewards=np.zeros(n, np.float32),
             terminals=terminals, timeouts=np.zeros(n, bool))


def test_ingest_unstacks_stacked_observations_from_python(tmp_path, frames_path):
    """Atari-style [H, W, 4] stacks (channels last, repeat padding) ingested with unstack=4
    come back from frame_stack=4, frame_channels_last=True equal to the stacks given."""
    _, obs = frames_path
    k = 4
    stacks = []
    for frames in _episodes_of(obs):
        for t in range(len(frames)):
            idx = [max(t - (k - 1 - s), 0) for s in range(k)]
            stacks.append(np.stack([frames[i] for i in idx], axis=-1))
    stacked = np.stack(stacks)
    n = stacked.shape[0]
    npz = tmp_path / "stacked.npz"
    _save_npz(npz, stacked)
    out = tmp_path / "unstacked.trajstore"
    report = trajstore.ingest(npz, out, unstack=k, frame_codec="zstd")
    assert report["rows"] == n
    ds = trajstore.open(out)
    assert str(ds.schema.field("observation").type) == "large_binary"
    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    loader = ds.loader(slice_len=3, num_slices=16, policy="strict", frame_stack=k,
                       frame_channels_last=True, backend="numpy", max_batches=3, seed=2)
    for batch in loader:
        for i in range(16):
            row = starts[int(batch["episode_id"][i])] + int(batch["start_step"][i])
            np.testing.assert_array_equal(batch["observation"][i], stacked[row : row + 3])
    # Stacks that do not overlap as stacks do are refused, naming the input row.
    broken = stacked.copy()
    broken[5, :, :, 0] ^= 1
    _save_npz(npz, broken)
    with pytest.raises(trajstore.TrajstoreError, match="5"):
        trajstore.ingest(npz, tmp_path / "refused.trajstore", unstack=k)
    assert not (tmp_path / "refused.trajstore" / "versions").exists() or not list(
        (tmp_path / "refused.trajstore" / "versions").iterdir()
    )


def _frame_level(path) -> int:
    meta = trajstore.open(path).schema.field("observation").metadata
    return int(json.loads(meta[b"trajstore:frame"])["level"])


def test_frame_level_sets_a_new_datasets_zstd_level(tmp_path, frames_path):
    """``frame_level=`` of ``create`` and ``ingest``: the level a new dataset's frames are written
    at (recorded in the column's metadata); an append at another level is refused."""
    _, obs = frames_path
    path = tmp_path / "level12.trajstore"
    with trajstore.create(path, (H, W), observation_dtype="uint8", frame_codec="zstd", frame_level=12) as w:
        frames = next(_episodes_of(obs))
        w.append_episode(frames, np.zeros(len(frames), np.int64), np.zeros(len(frames), np.float32),
                         terminated=True)
    assert _frame_level(path) == 12
    with pytest.raises(trajstore.InvalidArgumentError, match="1 to 22"):
        trajstore.create(tmp_path / "l30", (H, W), observation_dtype="uint8", frame_codec="zstd", frame_level=30)
    with pytest.raises(trajstore.InvalidArgumentError, match="frame_codec"):
        trajstore.create(tmp_path / "nocodec", (H, W), observation_dtype="uint8", frame_level=5)
    n = obs.shape[0]
    npz = tmp_path / "frames.npz"
    _save_npz(npz, obs)
    out = tmp_path / "level7.trajstore"
    assert trajstore.ingest(npz, out, frame_level=7)["rows"] == n
    assert _frame_level(out) == 7
    with pytest.raises(trajstore.InvalidArgumentError, match="zstd level 7"):
        trajstore.ingest(npz, out, frame_level=3)
    assert trajstore.open(out).num_transitions == n
    with pytest.raises(trajstore.InvalidArgumentError, match="1 to 22"):
        trajstore.ingest(npz, tmp_path / "l0.trajstore", frame_level=0)
    with pytest.raises(trajstore.InvalidArgumentError, match="no frame column"):
        trajstore.ingest(npz, tmp_path / "tensor.trajstore", frame_level=9, keep_tensor=True)
    assert not (tmp_path / "tensor.trajstore").exists()
