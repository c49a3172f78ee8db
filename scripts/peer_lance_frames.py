"""Lance on the same Atari frames as `scripts/bench_frames.sh`: the compressed frames that
trajstore stores (zstd at trajstore's level, 5 unless ``--level``, with the dataset's own trained
dictionary, one frame per row) in a Lance binary column, read with ``take`` and decoded with
``zstandard`` (its C decoder, one call per frame into one array), then stacked into the same
batches as trajstore's.

- "32 x (4-stack)": 32 steps drawn uniformly over all steps; each step's stack is frames
  t-3..t of its episode, the first frame repeated before the episode's start (trajstore's
  ``--frame-stack 4 --frame-pad repeat``).
- "256 x 64 x (4-stack)": 256 windows of 64 steps inside episodes (uniform over windows), each
  read as its 67 rows (64 steps plus 3 frames of history, clamped at the episode's start) and
  stacked into a contiguous ``[256, 64, 4, 84, 84]`` array, and (a second figure) given as a
  strided ``[256, 64, 4, 84, 84]`` view of the ``[256, 67, 84, 84]`` frames, the layout of
  trajstore's ``--frame-window``.

Per batch the whole of sampling, ``take``, decoding and stacking is timed. Prints one JSON line
per batch shape. ``--cold`` drops the page cache before each shape (needs root); the Lance
dataset is written once to ``--dir`` (reused when it exists). ``--tile N`` writes the frames N
times over as new episodes (each frame compressed once), to make a dataset larger than a memory
cgroup (``--cgroup``) or the machine.

    python scripts/peer_lance_frames.py pong.npz DICT.zdict --tile 2 --dir /tmp/pong.lance
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import lance
import numpy as np
import pyarrow as pa
import zstandard

H = W = 84
F = H * W


def load(npz: str, tile: int) -> np.ndarray:
    """The episode id of every row: the file's episodes, tiled `tile` times as new episodes."""
    episode = np.load(npz)["episode"].astype(np.int64)
    if tile > 1:
        span = int(episode.max()) + 1
        episode = np.concatenate([episode + i * span for i in range(tile)])
    return episode


def write(path: str, npz: str, tile: int, dictionary: bytes, level: int) -> float:
    """The frames of `npz` compressed as trajstore's zstd-dict codec does, `tile` times over as new
    episodes, in a Lance dataset. Each frame is compressed once (a tile's bytes are the same), so
    that a dataset larger than memory is written without holding more than one copy of the
    frames."""
    cctx = zstandard.ZstdCompressor(level=level, dict_data=zstandard.ZstdCompressionDict(dictionary))
    t = time.perf_counter()
    data = np.load(npz)
    frames, base = data["frames"], data["episode"].astype(np.int64)
    chunk = 50_000
    blobs = [
        pa.array([cctx.compress(f.tobytes()) for f in frames[i : i + chunk]], pa.binary())
        for i in range(0, len(frames), chunk)
    ]
    del frames
    span = int(base.max()) + 1

    def batches():
        for k in range(tile):
            for j, col in enumerate(blobs):
                ep = base[j * chunk : j * chunk + len(col)] + k * span
                yield pa.record_batch([pa.array(ep), col], names=["episode", "frame"])

    schema = pa.schema([("episode", pa.int64()), ("frame", pa.binary())])
    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), path, mode="overwrite")
    return time.perf_counter() - t


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def drop_caches() -> None:
    subprocess.run(["sync"], check=False)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("npz")
    p.add_argument("dictionary", help="the .zdict of the trajstore dataset (its dictionaries/ folder)")
    p.add_argument("--tile", type=int, default=1)
    p.add_argument("--level", type=int, default=5, help="the zstd level (trajstore's default: 5)")
    p.add_argument("--dir", required=True, help="where the Lance dataset is written (reused if there)")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--cold", action="store_true", help="drop the page cache before each batch shape")
    p.add_argument("--cgroup", help="a memory cgroup (v1) directory to join before sampling, so that the "
                                    "dataset is read through that cgroup's memory (32 x (4-stack) only, unless "
                                    "--all-shapes: the 256 x 64 batches need 0.5 GB of the cgroup)")
    p.add_argument("--all-shapes", action="store_true", help="with --cgroup: every batch shape")
    a = p.parse_args()
    episode = load(a.npz, a.tile)
    n = len(episode)
    write_s = None
    if not os.path.isdir(a.dir):
        with open(a.dictionary, "rb") as f:
            write_s = write(a.dir, a.npz, a.tile, f.read(), a.level)
    if a.cgroup:
        with open(f"{a.cgroup}/cgroup.procs", "w") as f:
            f.write(f"{os.getpid()}\n")
    ds = lance.dataset(a.dir)
    with open(a.dictionary, "rb") as f:
        dctx = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(f.read()))
    # Episode table: first row and length of each episode (rows are in episode order).
    change = np.flatnonzero(np.diff(episode)) + 1
    first = np.concatenate([[0], change]).astype(np.int64)
    length = np.diff(np.concatenate([first, [n]]))
    ep_of_row = np.repeat(np.arange(len(first)), length)
    rng = np.random.default_rng(0)

    def decode(rows: np.ndarray) -> np.ndarray:
        """Frames at `rows` (sorted, unique), decoded into one [len(rows), H, W] array."""
        col = ds.take(rows, columns=["frame"]).column("frame").combine_chunks()
        # Straight from the Arrow buffers into one array (measured faster here than zstandard's
        # multi-threaded multi_decompress_to_buffer, whose segments must then be joined).
        offsets = np.frombuffer(col.buffers()[1], np.int32)[col.offset : col.offset + len(col) + 1]
        data = memoryview(col.buffers()[2])
        out = np.empty((len(col), H, W), np.uint8)
        flat = out.reshape(len(col), F)
        for i in range(len(col)):
            flat[i] = np.frombuffer(dctx.decompress(data[offsets[i] : offsets[i + 1]]), np.uint8)
        return out

    def batch_32() -> np.ndarray:
        t = rng.integers(0, n, 32)
        lo = first[ep_of_row[t]]
        rows = np.maximum(t[:, None] + np.arange(-3, 1), lo[:, None])  # [32, 4], repeat padding
        uniq, inv = np.unique(rows, return_inverse=True)
        return decode(uniq)[inv.reshape(32, 4)]

    keep = length >= 64
    windows = np.where(keep, length - 63, 0)
    cum = np.cumsum(windows)

    def window_256() -> np.ndarray:
        """A batch's [256, 67, H, W] frames: each window's 64 steps and 3 frames of history."""
        r = rng.integers(0, int(cum[-1]), 256)
        e = np.searchsorted(cum, r, side="right")
        start = first[e] + (r - (cum[e] - windows[e]))
        rows = np.maximum(start[:, None] + np.arange(-3, 64), first[e][:, None])  # [256, 67]
        uniq, inv = np.unique(rows, return_inverse=True)
        return decode(uniq)[inv]

    def view_256() -> np.ndarray:
        """[256, 64, 4, H, W] as a strided view of the frames (trajstore's frame window)."""
        return np.lib.stride_tricks.sliding_window_view(window_256(), 4, axis=1).transpose(0, 1, 4, 2, 3)

    def batch_256() -> np.ndarray:
        return np.ascontiguousarray(view_256())

    few = max(3, a.iters // 10)
    shapes = [
        ("32x(4-stack)", batch_32, a.iters),
        ("256x64x(4-stack)", batch_256, few),
        ("256x64x(4-stack) view", view_256, few),
    ]
    if a.cgroup and not a.all_shapes:
        shapes = shapes[:1]
    for name, fn, iters in shapes:
        if a.cold:
            drop_caches()
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            b = fn()
            times.append(time.perf_counter() - t)
        assert b.shape[-3:] == (4, H, W), b.shape
        med = statistics.median(times[1:])
        print(json.dumps({
            "peer": "lance take + zstandard decode", "frames": n, "shape": name, "cache": ("cold" + (" (memory cgroup)" if a.cgroup else "")) if a.cold else "warm",
            "lance_bytes": du(a.dir), "write_s": write_s, "first_batch_s": times[0],
            "sample_median_s": med, "batches_per_s": 1 / med,
        }))


if __name__ == "__main__":
    main()
