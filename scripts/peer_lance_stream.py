"""Lance reading the same transitions from the same S3-compatible server as
``scripts/bench_python_stream.py``'s streaming loader: the peer for "a dataset bigger than the
node's disk, sampled from object storage".

Writes the newest version of a trajstore dataset (its Arrow IPC segment files, as the manifest
lists them; the observation's tensor extension type stored as its fixed-size list) as a Lance
dataset at ``--uri`` (``s3://...``, with the server's settings from ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_REGION``), then draws batches of
``--num-slices`` slices of ``--slice-len`` steps inside episodes (uniform over the windows, as
trajstore's uniform sampler), each batch one ``take`` of its rows (the slices' consecutive rows)
of ``observation``, ``action`` and ``reward``, turned into numpy arrays
``[B, L, ...]``. Lance keeps no local copy: every ``take`` reads from the store (its own
metadata and index caches aside). Prints one JSON object: write time, batches/s, bytes of the
Lance dataset.

    python scripts/peer_lance_stream.py LOCAL.trajstore s3://bench/lance --batches 300
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import lance
import numpy as np
import pyarrow as pa

COLUMNS = ["observation", "action", "reward"]


def storage_options() -> dict[str, str]:
    env = os.environ
    return {
        "aws_endpoint": env["AWS_ENDPOINT_URL"],
        "aws_access_key_id": env.get("AWS_ACCESS_KEY_ID", ""),
        "aws_secret_access_key": env.get("AWS_SECRET_ACCESS_KEY", ""),
        "aws_region": env.get("AWS_REGION", "us-east-1"),
        "allow_http": "true",
    }


def segment_tables(local: str) -> list[pa.Table]:
    """The newest version's segments, with the observation as a plain fixed-size list."""
    newest = max(glob.glob(os.path.join(local, "_versions", "*.json")))
    with open(newest) as f:
        manifest = json.load(f)
    out = []
    for seg in manifest["segments"]:
        t = pa.ipc.open_file(os.path.join(local, seg["path"])).read_all()
        cols = []
        for name in t.column_names:
            c = t.column(name)
            if isinstance(c.type, pa.BaseExtensionType):
                c = pa.chunked_array([ch.storage for ch in c.chunks], type=c.type.storage_type)
            cols.append(c)
        out.append(pa.table(cols, names=t.column_names))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("local", help="a trajstore dataset directory")
    ap.add_argument("uri", help="where to write the Lance dataset (s3://bucket/prefix)")
    ap.add_argument("--slice-len", type=int, default=64)
    ap.add_argument("--num-slices", type=int, default=256)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    opts = storage_options()
    t0 = time.perf_counter()
    tables = segment_tables(a.local)
    table = pa.concat_tables(tables)
    lance.write_dataset(table, a.uri, storage_options=opts, mode="overwrite")
    write_s = time.perf_counter() - t0
    ds = lance.dataset(a.uri, storage_options=opts)
    # Episodes from the episode_id column: starts and lengths, and the windows of each.
    ids = table.column("episode_id").to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    lengths = np.diff(np.r_[starts, len(ids)])
    windows = np.maximum(lengths - a.slice_len + 1, 0)
    cum = np.cumsum(windows)
    del table, tables
    rng = np.random.default_rng(a.seed)
    steps = np.arange(a.slice_len)

    def batch() -> dict[str, np.ndarray]:
        w = rng.integers(0, cum[-1], a.num_slices)
        e = np.searchsorted(cum, w, side="right")
        first = starts[e] + (w - (cum[e] - windows[e]))
        rows = (first[:, None] + steps[None, :]).ravel()
        got = ds.take(rows, columns=COLUMNS)
        out = {}
        for name in COLUMNS:
            c = got.column(name).combine_chunks()
            v = (c.flatten() if pa.types.is_fixed_size_list(c.type) else c).to_numpy(zero_copy_only=False)
            out[name] = v.reshape(a.num_slices, a.slice_len, -1)
        return out

    for _ in range(a.warmup):
        batch()
    t = time.perf_counter()
    for _ in range(a.batches):
        b = batch()
    secs = time.perf_counter() - t
    assert b["observation"].shape[:2] == (a.num_slices, a.slice_len)
    print(json.dumps({
        "peer": f"lance {lance.__version__}", "write_s": write_s, "rows": len(ids),
        "batches": a.batches, "batches_per_s": a.batches / secs,
    }))


if __name__ == "__main__":
    main()
