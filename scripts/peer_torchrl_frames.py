"""TorchRL on the same Atari frames as `scripts/bench_frames.sh`: single 84x84 frames in a
``LazyMemmapStorage`` (TorchRL's AtariDQN layout: raw frames, stacked at sample time) sampled by
``SliceSampler``, and the same frames in a ``CompressedListStorage`` (each frame compressed in
RAM, decoded in Python on sampling).

A stack of K frames ending at step t is the K-step slice ending at t, so:

- "32 x (4-stack)": 32 slices of 4 steps (strict: inside episodes), i.e. 32 stacks;
- "256 x 64 x (4-stack)": 256 slices of 67 steps (64 steps plus 3 frames of history), whose
  stacks are made with ``unfold`` (a view: no copy is counted for stacking).

Prints one JSON line per storage and batch shape: median seconds per ``sample()`` and batches/s.
With ``--cold`` only the memmap storage is timed, each shape after dropping the page cache; with
``--cgroup DIR`` as well, the sampling process first joins that memory cgroup, so that its reads
go through less memory than the frames take (a dataset larger than RAM).

    python scripts/peer_torchrl_frames.py pong.npz --tile 4 --iters 20
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator

import numpy as np
from tensordict import TensorDict
from torchrl.data import CompressedListStorage, LazyMemmapStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import SliceSampler

import torch


def load(npz: str) -> tuple[np.ndarray, np.ndarray]:
    d = np.load(npz)
    return d["frames"], d["episode"].astype(np.int64)


def tiles(frames: np.ndarray, episode: np.ndarray, tile: int, chunk: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yields (frames, episode ids) chunks of `tile` copies of the frames, one after another;
    the copies are new episodes (ids shifted), as bench_frames.sh ingests them. Never more than
    one chunk is copied at a time: the tiled frames may be larger than RAM."""
    span = int(episode.max()) + 1
    for i in range(tile):
        for j in range(0, frames.shape[0], chunk):
            yield frames[j : j + chunk], episode[j : j + chunk] + i * span


def drop_caches() -> None:
    subprocess.run(["sync"], check=False)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(rb: ReplayBuffer, iters: int, stack: int, slice_len: int, contiguous: bool) -> list[float]:
    out = []
    for _ in range(iters):
        t = time.perf_counter()
        b = rb.sample()
        obs = b["obs"]
        if slice_len > stack:
            # [B * (L + K - 1), H, W] -> [B, L, K, H, W] as views; `contiguous` makes the stacks
            # one buffer, as trajstore's batch is (what a conv over [B * L, K, H, W] needs).
            n = obs.shape[0] // slice_len
            obs = obs.reshape(n, slice_len, *obs.shape[1:]).unfold(1, stack, 1).permute(0, 1, 4, 2, 3)
            if contiguous:
                obs = obs.contiguous()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("npz")
    p.add_argument("--tile", type=int, default=1)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--compressed-frames", type=int, default=200_000, help="frames put in CompressedListStorage (its extend is slow)")
    p.add_argument("--cold", action="store_true",
                   help="LazyMemmapStorage only, with the page cache dropped before each batch shape (needs root)")
    p.add_argument("--tmp", help="where the memmap storage is written (default: the system's temporary directory)")
    p.add_argument("--cgroup", help="a memory cgroup (v1) directory to join once the storage is written "
                                    "(with --cold: 32 x (4-stack) only, read through that cgroup's memory)")
    p.add_argument("--both-shapes", action="store_true",
                   help="with --cgroup: 256 x 64 x (4-stack) as well (slow: a few seconds a batch)")
    a = p.parse_args()
    frames, episode = load(a.npz)
    n = frames.shape[0] * a.tile
    shapes = [("32x(4-stack)", 32, 4), ("256x64x(4-stack)", 256, 67)]
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        t = time.perf_counter()
        # With --cold the storage is written where rb.dumps puts it, so that saving it (below)
        # writes only metadata, not a second copy of frames that may be larger than RAM.
        storage = LazyMemmapStorage(n, scratch_dir=tmp + ("/dump/storage" if a.cold else "/scratch"))
        rb = ReplayBuffer(storage=storage)
        for f, e in tiles(frames, episode, a.tile, 100_000):
            rb.extend(TensorDict({"obs": torch.from_numpy(f), "episode": torch.from_numpy(e)}, batch_size=[len(f)]))
        load_s = time.perf_counter() - t
        cache = "warm"
        if a.cold:
            # A memmap that this process wrote stays mapped, and mapped pages survive
            # drop_caches: save it (rb.dumps, in place: the storage already lies in the dump's
            # storage/ directory) and map the files afresh, untouched (TorchRL maps rather than
            # copies when the new storage's scratch_dir is the saved storage).
            del frames
            rb.dumps(tmp + "/dump")
            del rb, storage
            gc.collect()
            storage = LazyMemmapStorage(n, scratch_dir=tmp + "/dump/storage")
            rb = ReplayBuffer(storage=storage)
            rb.loads(tmp + "/dump")
            if a.cgroup:
                with open(f"{a.cgroup}/cgroup.procs", "w") as f:
                    f.write(f"{os.getpid()}\n")
                shapes = shapes if a.both_shapes else shapes[:1]
            cache = "cold" + (" (memory cgroup)" if a.cgroup else "")
        for name, slices, length in shapes:
            if a.cold:
                drop_caches()
            rb._sampler = SliceSampler(slice_len=length, traj_key="episode", strict_length=True, cache_values=True)
            rb._batch_size = slices * length
            for contiguous in ([False, True] if length > 4 else [False]):
                times = timed(rb, a.iters, 4, length, contiguous)
                med = statistics.median(times[1:])
                print(json.dumps({"peer": "torchrl LazyMemmapStorage + SliceSampler", "frames": n, "shape": name,
                                  "stacks": "contiguous" if contiguous else "unfold view", "cache": cache,
                                  "load_s": load_s, "sample_median_s": med, "batches_per_s": 1 / med}))
        if a.cold:
            return
        # CompressedListStorage over a prefix (its extend compresses each item in Python). TorchRL
        # 0.14's SliceSampler cannot read episodes out of it (nor take them as `trajectories=`:
        # it fails in `_finalize_index`), so the slices are drawn by the same SliceSampler over
        # the memmap storage's prefix and the compressed storage is read at those indices:
        # sampling + `get` (decompression of each frame) + stacking.
        m = min(frames.shape[0], a.compressed_frames)
        t = time.perf_counter()
        cs = CompressedListStorage(max_size=m)
        rbc = ReplayBuffer(storage=cs)
        chunk = 10_000
        for i in range(0, m, chunk):
            j = min(i + chunk, m)
            rbc.extend(TensorDict({"obs": torch.from_numpy(frames[i:j])}, batch_size=[j - i]))
        load_s = time.perf_counter() - t
        prefix = LazyMemmapStorage(m, scratch_dir=tmp + "/prefix")
        prefix.set(torch.arange(m), TensorDict({"episode": torch.from_numpy(episode[:m])}, batch_size=[m]))
        for name, slices, length in shapes:
            sampler = SliceSampler(slice_len=length, traj_key="episode", strict_length=True, cache_values=True)
            times = []
            for _ in range(max(3, a.iters // 4)):
                t = time.perf_counter()
                idx, _ = sampler.sample(prefix, slices * length)
                got = cs.get(idx)
                obs = torch.stack([g["obs"] for g in got]) if isinstance(got, list) else got["obs"]
                if length > 4:
                    obs = obs.reshape(slices, length, *obs.shape[1:]).unfold(1, 4, 1)
                times.append(time.perf_counter() - t)
            med = statistics.median(times[1:])
            print(json.dumps({"peer": "torchrl CompressedListStorage (SliceSampler indices)", "frames": m, "shape": name,
                              "load_s": load_s, "sample_median_s": med, "batches_per_s": 1 / med}))


if __name__ == "__main__":
    main()
