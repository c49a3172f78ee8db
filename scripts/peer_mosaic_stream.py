"""Mosaic Streaming (``mosaicml-streaming``) reading the same transitions from the same
S3-compatible server as ``scripts/bench_python_stream.py``'s streaming loader, with a local cache
limited to a quarter of the dataset: the peer for "a dataset bigger than the node's disk, sampled
from object storage".

Writes the newest version of a trajstore dataset (its Arrow IPC segment files, as the manifest
lists them) as MDS shards of ``--shard-size`` (8 MiB, as trajstore's demo segments) with
``streaming.MDSWriter(out=(tmp, --uri))`` (``s3://...``; the server's settings from
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_REGION``, the
endpoint passed on to Mosaic as ``S3_ENDPOINT_URL``), in one of two layouts:

* ``--layout episode`` (the default): one MDS sample per episode, the three columns as
  dynamic-shape ``ndarray:float32`` arrays ``[n, ...]`` (the usual Mosaic layout for sequences).
  In ``--mode access`` each batch is ``--num-slices`` calls of ``ds[e]``, each slice cut from its
  episode's arrays. The same bytes in the same shards as ``row``, and some 2x faster to read (64x
  fewer Python calls), so the fair default.
* ``--layout row``: one MDS sample per transition, ``observation``/``action`` as fixed-shape
  ``ndarray:float32:N`` and ``reward`` as ``float32`` (no per-sample header: the rows' bytes are
  the Arrow columns' bytes, plus MDS's 4-byte offset per sample). Each batch is
  ``--num-slices`` x ``--slice-len`` calls of ``ds[i]``. Writing is some 15x slower (one
  ``MDSWriter.write`` per transition). ``--mode access`` only.

Then opens a ``streaming.StreamingDataset(remote=--uri, local=<fresh dir>, cache_limit=...)``
(``--cache-limit`` bytes, or ``quarter``: a quarter of the MDS shards' bytes, the default) and
draws batches of ``--num-slices`` slices of ``--slice-len`` steps inside episodes, stacked into
numpy arrays ``[B, L, ...]`` (observation, action, reward), in one of two modes:

* ``--mode access`` (the default, as the first published figure): ``shuffle=False,
  batch_size=None``, slices uniform over the windows (as trajstore's uniform sampler and
  ``scripts/peer_lance_stream.py``), fetched by random access (``ds[i]``, Mosaic's map-style use:
  a missing shard is downloaded whole, the least recently used shards evicted to stay under the
  limit). A batch's samples are fetched in index order (``--order sorted``, the default: each
  shard at most once per batch) and put back in the order drawn; ``--order drawn`` fetches them
  as drawn, which with a quarter cache downloads a shard for most slices. With a quarter cache
  this re-downloads most of the dataset per batch: unfair to Mosaic, whose answer to a small
  cache is shuffled iteration.
* ``--mode iterate`` (episode layout): Mosaic's own answer to a small cache, shuffled iteration:
  ``shuffle=True, shuffle_seed=--seed, shuffle_algo`` default (``py1e``), ``batch_size=1``
  (iteration needs one; a sample is an episode, and batches are cut here),
  ``predownload=--predownload`` (64 samples, the default Mosaic gives ``batch_size=None``; with
  ``batch_size=1`` it would give 8, about 2 batches' episodes; 64 episodes are some 6 MB here,
  under one shard, well inside the cache, and some 15 batches ahead),
  ``shuffle_block_size=--shuffle-block-size``. ``py1e`` spreads each shard's samples over a range
  of about ``shuffle_block_size`` samples (0.75x to 1.25x) of the epoch's order, so at any point
  about ``shuffle_block_size / num_samples`` of the shards' bytes are live. ``fit`` (the default)
  sets it to the episodes in half the cache limit (1/8 of the episodes with a quarter cache),
  leaving the other half for the 1.25x jitter, the predownload and LRU eviction's lag; ``mosaic``
  leaves it to Mosaic (``max(4_000_000 // num_canonical_nodes, 1 << 18)``, 4,000,000 samples on
  one node: far more than all the episodes, so a whole-dataset shuffle, which thrashes a quarter
  cache much as random access does: measured some 6.6 batches/s, 64x the dataset downloaded in
  40 s, and Mosaic's own accounting some 20% over its limit); an integer sets it. The
  dataset is iterated directly (``--loader direct``, the default: a generator in this process,
  the same threads downloading ahead as under a DataLoader; the faster, measured 173-322 batches/s
  against 177-248 on a busy 2-core machine) or through
  ``torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)`` (``--loader dataloader``:
  the same, plus converting each sample's arrays to tensors). From each episode of ``n >= L``
  steps it cuts ``round(--reuse * n / L)`` slices at uniformly random window starts (what a
  sampler uniform over the windows draws from it on average when each transition is drawn
  ``--reuse`` = 4 times per epoch, trajstore's default ``reuse``; shorter episodes give none),
  and fills batches in the order the episodes come (so a batch's slices come from a few
  neighbouring episodes, as trajstore's rotating-window batches each come from one window of
  segments). The partial last batch is dropped. Each slice is checked against the source columns
  (the episode found by its length and first and last observation), the checks' time left out
  of batches/s and ``epoch_s``.

The first batch is timed on its own (``first_batch_s``: the cold cache; in ``iterate`` from the
call to ``iter``); batches/s is over the next ``--batches`` (``access``: 20; ``iterate``: the rest
of one epoch), or as many as fit in ``--max-seconds``. Prints one JSON object: write time, MDS
bytes, cache limit, batches/s, bytes downloaded (summed over Mosaic's file downloads), and
(``iterate``) the peak of Mosaic's own cache accounting and of the local directory's size
(sampled every 20 ms) against the limit.

    python scripts/peer_mosaic_stream.py LOCAL.trajstore s3://bench/mds --batches 20
    python scripts/peer_mosaic_stream.py LOCAL.trajstore s3://bench/mds --mode iterate
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlparse

import boto3
import numpy as np
import pyarrow as pa

COLUMNS = ["observation", "action", "reward"]


def s3_env() -> None:
    """Mosaic reads its S3 endpoint from ``S3_ENDPOINT_URL``; boto3 from ``AWS_ENDPOINT_URL``."""
    os.environ.setdefault("S3_ENDPOINT_URL", os.environ["AWS_ENDPOINT_URL"])
    os.environ.setdefault("AWS_DEFAULT_REGION", os.environ.get("AWS_REGION", "us-east-1"))


def s3_client() -> Any:
    env = os.environ
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID", ""),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY", ""),
        region_name=env.get("AWS_REGION", "us-east-1"),
    )


def s3_objects(uri: str) -> list[dict[str, Any]]:
    """The objects under ``uri`` (``s3://bucket/prefix``): key and size."""
    u = urlparse(uri)
    prefix = u.path.lstrip("/").rstrip("/") + "/"
    out: list[dict[str, Any]] = []
    for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=u.netloc, Prefix=prefix):
        out += page.get("Contents", [])
    return out


def s3_clear(uri: str) -> None:
    """Delete what an earlier run left under ``uri`` (the Lance peer writes with ``overwrite``)."""
    bucket = urlparse(uri).netloc
    client = s3_client()
    for o in s3_objects(uri):
        client.delete_object(Bucket=bucket, Key=o["Key"])


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
            if isinstance(c.type, pa.BaseExtensionType):  # canonical types (fixed_shape_tensor) too
                c = pa.chunked_array([ch.storage for ch in c.chunks], type=c.type.storage_type)
            cols.append(c)
        out.append(pa.table(cols, names=t.column_names))
    return out


def column_arrays(table: pa.Table) -> dict[str, np.ndarray]:
    """``observation``, ``action`` and ``reward`` as float32 numpy arrays ``[rows, ...]``."""
    out = {}
    for name in COLUMNS:
        c = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(c.type):
            out[name] = c.flatten().to_numpy(zero_copy_only=False).reshape(len(c), c.type.list_size)
        else:
            out[name] = c.to_numpy(zero_copy_only=False)
        assert out[name].dtype == np.float32, (name, out[name].dtype)
    return out


def write_mds(cols: dict[str, np.ndarray], starts: np.ndarray, lengths: np.ndarray, layout: str,
              tmp: str, uri: str, shard_size: int) -> None:
    from streaming import MDSWriter

    if layout == "row":
        spec = {
            name: f"ndarray:float32:{v.shape[1]}" if v.ndim == 2 else "float32" for name, v in cols.items()
        }
    else:
        spec = {name: "ndarray:float32" for name in cols}
    with MDSWriter(out=(tmp, uri), columns=spec, size_limit=shard_size, exist_ok=True) as w:
        if layout == "row":
            obs, act, rew = (cols[n] for n in COLUMNS)
            for i in range(len(rew)):
                w.write({"observation": obs[i], "action": act[i], "reward": rew[i]})
        else:
            for s, n in zip(starts.tolist(), lengths.tolist()):
                w.write({name: v[s:s + n] for name, v in cols.items()})


class PeakSize(threading.Thread):
    """Samples, every ``every`` seconds, the bytes of the files under ``path`` and Mosaic's own
    cache accounting (``ds.cache_usage``), keeping the peaks."""

    def __init__(self, path: str, ds: Any, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.path, self.ds, self.every = path, ds, every
        self.peak_dir = self.peak_usage = 0
        self.halt = threading.Event()

    def sample(self) -> None:
        size = 0
        for root, _, files in os.walk(self.path):
            for f in files:
                try:
                    size += os.path.getsize(os.path.join(root, f))
                except FileNotFoundError:  # evicted meanwhile
                    pass
        self.peak_dir = max(self.peak_dir, size)
        self.peak_usage = max(self.peak_usage, self.ds.cache_usage)

    def run(self) -> None:
        while not self.halt.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self.halt.set()
        self.join()
        self.sample()


def slice_batches(samples: Iterator[dict[str, Any]], episode_of: dict[tuple[int, bytes, bytes], int],
                  slice_len: int, num_slices: int, reuse: float, rng: np.random.Generator,
                  seen: list[int]) -> Iterator[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
    """Batches ``(episodes, offsets, {column: [B, L, ...]})`` cut from episode samples as they
    come: ``round(reuse * n / L)`` slices at uniform window starts from each episode of ``n >= L``
    steps. Appends each sample's episode (found in ``episode_of``) to ``seen``."""
    L, B = slice_len, num_slices
    steps = np.arange(L)
    pending: dict[str, list[np.ndarray]] = {n: [] for n in COLUMNS}
    src_e: list[np.ndarray] = []
    src_off: list[np.ndarray] = []
    have = 0
    for s in samples:
        arrs = {n: np.asarray(s[n]) for n in COLUMNS}
        obs = arrs["observation"]
        n = len(obs)
        e = episode_of[(n, obs[0].tobytes(), obs[-1].tobytes())]
        seen.append(e)
        k = round(reuse * n / L) if n >= L else 0
        if k == 0:
            continue
        off = rng.integers(0, n - L + 1, k)
        idx = off[:, None] + steps[None, :]
        for name in COLUMNS:
            pending[name].append(arrs[name][idx])
        src_e.append(np.full(k, e))
        src_off.append(off)
        have += k
        while have >= B:
            cat = {name: np.concatenate(v) for name, v in pending.items()}
            ce, co = np.concatenate(src_e), np.concatenate(src_off)
            yield ce[:B], co[:B], {name: v[:B].reshape(B, L, -1) for name, v in cat.items()}
            pending = {name: [v[B:]] for name, v in cat.items()}
            src_e, src_off = [ce[B:]], [co[B:]]
            have -= B


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("local", help="a trajstore dataset directory")
    ap.add_argument("uri", help="where to write the MDS shards (s3://bucket/prefix)")
    ap.add_argument("--mode", choices=["access", "iterate"], default="access",
                    help="random access ds[i] (default) or shuffled iteration (episode layout)")
    ap.add_argument("--layout", choices=["episode", "row"], default="episode",
                    help="one MDS sample per episode (default) or per transition")
    ap.add_argument("--order", choices=["sorted", "drawn"], default="sorted",
                    help="access: fetch a batch's samples in index order (each shard once per batch; "
                         "default) or in the order drawn")
    ap.add_argument("--slice-len", type=int, default=64)
    ap.add_argument("--num-slices", type=int, default=256)
    ap.add_argument("--batches", type=int, default=None,
                    help="timed batches after the first (access: 20; iterate: the rest of one epoch)")
    ap.add_argument("--max-seconds", type=float, default=300.0,
                    help="stop the timed batches after this long (reports how many ran)")
    ap.add_argument("--cache-limit", default="quarter",
                    help="bytes (Mosaic's syntax, e.g. 64mb), or 'quarter' of the MDS bytes")
    ap.add_argument("--shard-size", type=int, default=8 << 20, help="MDS size_limit in bytes")
    ap.add_argument("--shuffle-block-size", default="fit",
                    help="iterate: samples, or 'fit' (the episodes in half the cache limit; default), "
                         "or 'mosaic' (Mosaic's default, 4_000_000 on one node)")
    ap.add_argument("--predownload", type=int, default=64,
                    help="iterate: samples to download ahead (default 64, Mosaic's own default)")
    ap.add_argument("--reuse", type=float, default=4.0,
                    help="iterate: times each transition is drawn per epoch on average (default 4)")
    ap.add_argument("--loader", choices=["direct", "dataloader"], default="direct",
                    help="iterate: the StreamingDataset itself (default) or a torch DataLoader over it")
    ap.add_argument("--work-dir", default=None, help="where the writer's and reader's local dirs go")
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    if a.mode == "iterate" and a.layout != "episode":
        ap.error("--mode iterate needs --layout episode")
    s3_env()

    import streaming
    from streaming import StreamingDataset
    from streaming.base.stream import Stream
    from streaming.base.util import bytes_to_int, clean_stale_shared_memory

    work = tempfile.mkdtemp(prefix="mosaic-", dir=a.work_dir)
    t0 = time.perf_counter()
    table = pa.concat_tables(segment_tables(a.local))
    cols = column_arrays(table)
    # Episodes from the episode_id column: starts and lengths, and the windows of each.
    ids = table.column("episode_id").to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    lengths = np.diff(np.r_[starts, len(ids)])
    windows = np.maximum(lengths - a.slice_len + 1, 0)
    cum = np.cumsum(windows)
    del table
    s3_clear(a.uri)
    write_mds(cols, starts, lengths, a.layout, os.path.join(work, "out"), a.uri, a.shard_size)
    write_s = time.perf_counter() - t0
    objects = s3_objects(a.uri)
    mds_bytes = sum(o["Size"] for o in objects if o["Key"].endswith(".mds"))
    cache_limit: int | str = mds_bytes // 4 if a.cache_limit == "quarter" else a.cache_limit

    # Bytes downloaded: every file Mosaic fetches goes through Stream._download_file.
    downloaded = {"bytes": 0, "files": 0}
    fetch = Stream._download_file

    def counted(self: Stream, from_basename: str, to_basename: str | None = None) -> str:
        path = fetch(self, from_basename, to_basename)
        downloaded["bytes"] += os.path.getsize(path)
        downloaded["files"] += 1
        return path

    Stream._download_file = counted  # type: ignore[method-assign]
    clean_stale_shared_memory()
    cache_dir = os.path.join(work, "cache")
    common: dict[str, Any] = {
        "peer": f"mosaicml-streaming {streaming.__version__}", "mode": a.mode, "layout": a.layout,
        "write_s": write_s, "rows": len(ids), "episodes": len(starts), "mds_shards": len(objects) - 1,
        "mds_bytes": mds_bytes,
    }
    rng = np.random.default_rng(a.seed)
    steps = np.arange(a.slice_len)
    L = a.slice_len

    def check(e: np.ndarray, off: np.ndarray, b: dict[str, np.ndarray]) -> None:
        """The right rows, in order."""
        rows = ((starts[e] + off)[:, None] + steps[None, :]).ravel()
        for n in COLUMNS:
            assert np.array_equal(b[n].reshape(len(rows), -1), cols[n][rows].reshape(len(rows), -1)), n

    if a.mode == "iterate":
        if a.shuffle_block_size == "fit":
            limit_bytes = bytes_to_int(cache_limit) if isinstance(cache_limit, str) else cache_limit
            block: int | None = max(1, round(len(starts) * limit_bytes / mds_bytes / 2))
        elif a.shuffle_block_size == "mosaic":
            block = None
        else:
            block = int(a.shuffle_block_size)
        ds = StreamingDataset(remote=a.uri, local=cache_dir, cache_limit=cache_limit, shuffle=True,
                              shuffle_seed=a.seed, batch_size=1, predownload=a.predownload,
                              shuffle_block_size=block)
        assert ds.num_samples == len(starts), ds.num_samples
        first_obs = cols["observation"][starts]
        last_obs = cols["observation"][starts + lengths - 1]
        episode_of = {(int(n), f.tobytes(), la.tobytes()): e
                      for e, (n, f, la) in enumerate(zip(lengths, first_obs, last_obs))}
        assert len(episode_of) == len(starts), "episodes not told apart by length, first and last obs"
        if a.loader == "dataloader":
            from torch.utils.data import DataLoader

            source: Iterable[dict[str, Any]] = DataLoader(ds, batch_size=None, num_workers=0)
        else:
            source = ds
        peak = PeakSize(cache_dir, ds)
        peak.start()
        seen: list[int] = []
        t = time.perf_counter()
        it = slice_batches(iter(source), episode_of, L, a.num_slices, a.reuse, rng, seen)
        e, off, b = next(it)
        first_batch_s = time.perf_counter() - t
        check(e, off, b)
        before = downloaded["bytes"]
        limit = a.batches if a.batches is not None else 1 << 62
        done = 0
        check_s = 0.0  # checking every batch, not counted in batches/s
        t = time.perf_counter()
        try:
            while done < limit and time.perf_counter() - t < a.max_seconds + check_s:
                e, off, b = next(it)
                tc = time.perf_counter()
                check(e, off, b)
                check_s += time.perf_counter() - tc
                done += 1
        except StopIteration:
            pass
        secs = time.perf_counter() - t - check_s
        epoch = len(seen) == len(starts)
        if epoch:
            assert sorted(seen) == list(range(len(starts))), "an epoch yields each episode once"
        else:  # stopped early: let Mosaic's download threads go
            ds._iterator.exit()
        peak.stop()
        assert b["observation"].shape[:2] == (a.num_slices, a.slice_len)
        print(json.dumps({
            **common, "loader": a.loader, "shuffle_algo": ds.shuffle_algo,
            "shuffle_block_size": ds.shuffle_block_size, "predownload": ds.predownload,
            "reuse": a.reuse, "cache_limit": ds.cache_limit, "first_batch_s": first_batch_s,
            "batches": done, "batches_per_s": done / secs, "full_epoch": epoch,
            "episodes_read": len(seen), "epoch_s": first_batch_s + secs if epoch else None, "check_s": check_s,
            "downloaded_bytes": downloaded["bytes"], "downloaded_files": downloaded["files"],
            "downloaded_bytes_per_batch": (downloaded["bytes"] - before) / max(done, 1),
            "downloaded_over_mds_bytes": downloaded["bytes"] / mds_bytes,
            "peak_cache_usage": peak.peak_usage, "peak_cache_dir_bytes": peak.peak_dir,
            "cache_limit_held": max(peak.peak_usage, peak.peak_dir) <= ds.cache_limit,
        }))
        shutil.rmtree(work, ignore_errors=True)
        return

    ds = StreamingDataset(remote=a.uri, local=cache_dir, cache_limit=cache_limit,
                          shuffle=False, batch_size=None)
    assert ds.num_samples == (len(ids) if a.layout == "row" else len(starts)), ds.num_samples

    def batch() -> tuple[np.ndarray, dict[str, np.ndarray]]:
        w = rng.integers(0, cum[-1], a.num_slices)
        e = np.searchsorted(cum, w, side="right")
        off = w - (cum[e] - windows[e])
        first = starts[e] + off
        ids = (first[:, None] + steps[None, :]).ravel() if a.layout == "row" else e
        samples: list[Any] = [None] * len(ids)
        order = np.argsort(ids, kind="stable") if a.order == "sorted" else range(len(ids))
        for j in order:
            samples[j] = ds[int(ids[j])]
        if a.layout == "row":
            out = {n: np.stack([s[n] for s in samples]) for n in COLUMNS}
        else:
            out = {n: np.stack([s[n][o:o + L] for s, o in zip(samples, off.tolist())]) for n in COLUMNS}
        return first, {n: v.reshape(a.num_slices, L, -1) for n, v in out.items()}

    t = time.perf_counter()
    first, b = batch()
    first_batch_s = time.perf_counter() - t
    rows = (first[:, None] + steps[None, :]).ravel()
    for n in COLUMNS:  # the right rows, in order
        assert np.array_equal(b[n].reshape(len(rows), -1), cols[n][rows].reshape(len(rows), -1)), n
    before = downloaded["bytes"]
    limit = a.batches if a.batches is not None else 20
    done = 0
    t = time.perf_counter()
    while done < limit and time.perf_counter() - t < a.max_seconds:
        _, b = batch()
        done += 1
    secs = time.perf_counter() - t
    assert b["observation"].shape[:2] == (a.num_slices, a.slice_len)
    print(json.dumps({
        **common, "order": a.order, "cache_limit": ds.cache_limit, "first_batch_s": first_batch_s,
        "batches": done, "batches_per_s": done / secs,
        "downloaded_bytes": downloaded["bytes"], "downloaded_files": downloaded["files"],
        "downloaded_bytes_per_batch": (downloaded["bytes"] - before) / max(done, 1),
    }))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
