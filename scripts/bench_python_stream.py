"""The Python streaming loader (``trajstore.open(url, cache_limit=...)``) against the same loader
on a local copy, and the bytes a node downloads per epoch with 1, 2 and 4 ranks.

Writes a ``trajstore demo`` dataset, pushes it to a local S3-compatible server (moto, run with
``--moto-python``, default ``$TRAJSTORE_PYTHON``; or, with ``--store file``, a ``file://`` URL of
a second copy, which measures the cache without an HTTP server's costs), then, in one process:

1. **local**: ``open(local).loader(...)``, batches/s over ``--batches`` after ``--warmup``;
2. **stream, whole version cached**: ``open(url, cache_limit=2 x bytes)``, the same loader
   arguments, twice: cold (the first pass downloads the files) and warm (the second pass finds
   them in its cache: the streaming loader's own local figure);
3. **stream, a quarter cached**: ``cache_limit=bytes/4``, ``reuse`` 4 (the default) and 16,
   each from an empty cache: batches/s while it downloads and rotates windows, against the local
   loader and against the warm whole-version stream;
4. **ranks**: for W in 1, 2, 4, W processes on this one node (ranks 0..W-1 of a world of W,
   ``sampler="epoch"``, one cache directory with ``ranks_per_node=W`` and a node limit of W
   quarters of the dataset, so a quarter per rank) run one epoch at once; the bytes they
   downloaded together, against the dataset's transition bytes.

With ``--mix``, also **a mix of two streams** of the version (``trajstore.mix``, weights 1:1,
each stream through its own quarter cache at ``reuse`` 4): half of every batch from each,
assembled in place, against the single quarter-cached stream.

5. with ``--lance-python``, Lance (``scripts/peer_lance_stream.py``): the same transitions written
   as a Lance dataset to the same server, batches of the same shape read with ``take``.
6. with ``--mosaic-python``, Mosaic Streaming (``scripts/peer_mosaic_stream.py``): the same
   transitions as MDS shards on the same server, a quarter cache, shuffled iteration and random
   access.

Prints one JSON object. Run with a release build of the extension (``maturin develop
--release``, or ``cargo build --release -p trajstore-python`` linked as
``python/trajstore/_native.abi3.so``) and the ``trajstore`` binary (``--bin``):

    python scripts/bench_python_stream.py --bin target/release/trajstore --transitions 2000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Dict, List

RANK = r"""
import json, sys, time
import trajstore
url, limit, cache, rank, world, slice_len, num_slices = sys.argv[1:8]
# One node: the W ranks share the cache directory and the node's limit (W x a quarter).
ds = trajstore.open(url, cache_limit=int(limit), cache_dir=cache, ranks_per_node=int(world))
loader = ds.loader(slice_len=int(slice_len), num_slices=int(num_slices), sampler="epoch", seed=1,
                   rank=int(rank), world_size=int(world), backend="numpy")
t = time.perf_counter()
n = sum(1 for _ in loader)
s = loader.stream_stats()
print(json.dumps({"rank": int(rank), "batches": n, "seconds": time.perf_counter() - t,
                  "bytes_downloaded": s["bytes_downloaded"], "peak_cache_bytes": s["peak_cache_bytes"],
                  "files_shared": s["files_shared"]}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) that process `pid` has used so far (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rate(loader: Any, warmup: int, batches: int) -> Dict[str, float]:
    it = iter(loader)
    t0 = time.perf_counter()
    for _ in range(warmup):
        next(it)
    t1 = time.perf_counter()
    for _ in range(batches):
        next(it)
    t2 = time.perf_counter()
    return {"first_batches_s": t1 - t0, "batches_per_s": batches / (t2 - t1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the trajstore binary")
    ap.add_argument("--transitions", type=int, default=2_000_000)
    ap.add_argument("--segment-size", default="16MiB")
    ap.add_argument("--slice-len", type=int, default=64)
    ap.add_argument("--num-slices", type=int, default=256)
    ap.add_argument("--columns", default=None,
                    help="comma-separated columns to gather (default: every sample column), e.g. "
                         "observation,action,reward as scripts/bench_stream.sh gathers")
    ap.add_argument("--workers", type=int, default=None, help="loader workers (default: the loader's)")
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--store", choices=["s3", "file"], default="s3")
    ap.add_argument("--moto-python", default=os.environ.get("TRAJSTORE_PYTHON", sys.executable))
    ap.add_argument("--ranks", default="1,2,4", help="world sizes to run on one node ('' for none)")
    ap.add_argument("--mix", action="store_true", help="also a mix of two quarter-cached streams")
    ap.add_argument("--lance-python", default=None,
                    help="a Python with pylance: also run scripts/peer_lance_stream.py on the same server")
    ap.add_argument("--mosaic-python", default=None,
                    help="a Python with mosaicml-streaming: also run scripts/peer_mosaic_stream.py on the same server")
    ap.add_argument("--work", default=None, help="working directory (default: a temporary one, removed)")
    a = ap.parse_args()
    import trajstore

    work = a.work or tempfile.mkdtemp(prefix="trajstore-stream-bench-")
    os.makedirs(work, exist_ok=True)
    server = None
    try:
        local = os.path.join(work, "local.trajstore")
        if not os.path.exists(local):
            subprocess.run(
                [a.bin, "demo", local, "--transitions", str(a.transitions), "--segment-size", a.segment_size],
                check=True, capture_output=True,
            )
        if a.store == "s3":
            port = free_port()
            server = subprocess.Popen(
                [a.moto_python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            endpoint = f"http://127.0.0.1:{port}"
            os.environ.update({
                "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
            })
            deadline = time.time() + 60
            while True:
                try:
                    urllib.request.urlopen(endpoint, timeout=2)
                    break
                except OSError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.2)
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/bench", method="PUT"), timeout=10)
            url = "s3://bench/d"
        else:
            url = "file://" + os.path.join(work, "store")
        t = time.perf_counter()
        subprocess.run([a.bin, "push", local, url], check=True, capture_output=True)
        push_s = time.perf_counter() - t
        kw: Dict[str, Any] = {"slice_len": a.slice_len, "num_slices": a.num_slices, "seed": 5, "backend": "numpy"}
        if a.columns:
            kw["columns"] = a.columns.split(",")
        if a.workers:
            kw["workers"] = a.workers
        out: Dict[str, Any] = {"store": a.store, "transitions": a.transitions, "push_s": push_s, "loader": kw}
        ds_local = trajstore.open(local)
        out["local"] = rate(ds_local.loader(**kw), a.warmup, a.batches)
        probe = trajstore.open(url, cache_limit="1TiB", cache_dir=os.path.join(work, "probe"))
        total = probe.transition_bytes
        limit = total // 4
        out["transition_bytes"], out["cache_limit"] = total, limit
        # (name, cache limit, reuse, cache directory): the whole version cached (cold: the
        # first pass downloads it; warm: the second pass reads the files the first left, the
        # stream's own "local" figure), then a quarter of it at two reuse factors.
        runs = [
            ("whole_cold", 2 * total, 4.0, "whole"),
            ("whole_warm", 2 * total, 4.0, "whole"),
            ("quarter_reuse4", limit, 4.0, "q4"),
            ("quarter_reuse16", limit, 16.0, "q16"),
        ]
        for name, lim, reuse, sub in runs:
            cache = os.path.join(work, "cache-" + sub)
            if name != "whole_warm":
                shutil.rmtree(cache, ignore_errors=True)
            ds = trajstore.open(url, cache_limit=lim, cache_dir=cache, reuse=reuse)
            loader = ds.loader(**kw)
            server_cpu = cpu_seconds(server.pid) if server is not None else 0.0
            r = rate(loader, a.warmup, a.batches)
            if server is not None:
                # What the S3 server (on this machine's cores) spent serving this run's downloads.
                r["server_cpu_s"] = cpu_seconds(server.pid) - server_cpu
            s = loader.stream_stats()
            r.update({k: s[k] for k in ("bytes_downloaded", "peak_cache_bytes", "windows_opened", "wait_seconds")})
            out[name] = r
            del loader
        # The local loader again: its rate moves between runs on a shared machine, so the ratios
        # are against the mean of the figures before and after the streams.
        again = rate(ds_local.loader(**kw), a.warmup, a.batches)["batches_per_s"]
        out["local"]["batches_per_s_after"] = again
        local_mean = (out["local"]["batches_per_s"] + again) / 2
        out["local"]["batches_per_s_mean"] = local_mean
        for name, _, _, _ in runs:
            out[name]["vs_local"] = out[name]["batches_per_s"] / local_mean
        for name in ("quarter_reuse4", "quarter_reuse16"):
            out[name]["vs_whole_warm"] = out[name]["batches_per_s"] / out["whole_warm"]["batches_per_s"]
        if a.mix:
            # The version twice, each copy through its own quarter cache: every batch takes half
            # its slices from each stream (the same bytes per batch as one quarter stream).
            parts = []
            for i in range(2):
                cache = os.path.join(work, f"cache-mix{i}")
                shutil.rmtree(cache, ignore_errors=True)
                parts.append(trajstore.open(url, cache_limit=limit, cache_dir=cache, reuse=4.0))
            loader = trajstore.mix(parts, weights=[1, 1], **kw)
            r = rate(loader, a.warmup, a.batches)
            s = loader.stream_stats()
            r.update({k: s[k] for k in ("bytes_downloaded", "peak_cache_bytes", "windows_opened", "wait_seconds")})
            r["vs_local"] = r["batches_per_s"] / local_mean
            r["vs_quarter_reuse4"] = r["batches_per_s"] / out["quarter_reuse4"]["batches_per_s"]
            out["quarter_mix2"] = r
            del loader
        ranks: List[Dict[str, Any]] = []
        for w in [int(x) for x in a.ranks.split(",") if x]:
            root = os.path.join(work, f"ranks{w}")
            shutil.rmtree(root, ignore_errors=True)
            t = time.perf_counter()
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", RANK, url, str(w * limit), root, str(r), str(w),
                     str(a.slice_len), str(a.num_slices)],
                    stdout=subprocess.PIPE, text=True,
                )
                for r in range(w)
            ]
            res = [json.loads(p.communicate()[0]) for p in procs]
            wall = time.perf_counter() - t
            got = sum(x["bytes_downloaded"] for x in res)
            ranks.append({
                "world_size": w, "wall_s": wall, "batches_per_rank": [x["batches"] for x in res],
                "bytes_downloaded": got, "vs_dataset": got / total,
                "peak_cache_bytes": [x["peak_cache_bytes"] for x in res],
                "files_shared": [x["files_shared"] for x in res],
            })
        out["ranks"] = ranks
        if a.lance_python and a.store == "s3":
            peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_lance_stream.py")
            r = subprocess.run(
                [a.lance_python, peer, local, "s3://bench/lance", "--slice-len", str(a.slice_len),
                 "--num-slices", str(a.num_slices), "--batches", str(max(10, a.batches // 10))],
                check=True, capture_output=True, text=True,
            )
            lance_r = json.loads(r.stdout.strip().splitlines()[-1])
            lance_r["vs_stream_quarter_reuse4"] = lance_r["batches_per_s"] / out["quarter_reuse4"]["batches_per_s"]
            out["lance"] = lance_r
        if a.mosaic_python and a.store == "s3":
            peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_mosaic_stream.py")
            out["mosaic"] = {}
            for mode, extra in (("iterate", []), ("access", ["--batches", "5"])):
                r = subprocess.run(
                    [a.mosaic_python, peer, local, f"s3://bench/mds-{mode}", "--mode", mode,
                     "--slice-len", str(a.slice_len), "--num-slices", str(a.num_slices), *extra],
                    check=True, capture_output=True, text=True,
                )
                m = json.loads(r.stdout.strip().splitlines()[-1])
                m["vs_stream_quarter_reuse4"] = m["batches_per_s"] / out["quarter_reuse4"]["batches_per_s"]
                out["mosaic"][mode] = m
        print(json.dumps(out, indent=1))
    finally:
        if server is not None:
            server.kill()
            server.wait()
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
