"""Ingest benchmark: trajstore's Parquet ingest against pyarrow's own Parquet -> Arrow IPC file
conversion of the same file, measured in the same run; with --format npz, trajstore's NumPy ingest
of a D4RL-style .npz against NumPy loading it and pyarrow writing the arrays as an Arrow IPC file.

    python scripts/bench_ingest.py --n 10000000 --bin target/release/trajstore
    python scripts/bench_ingest.py --n 10000000 --format npz [--compressed]

Writes a D4RL-shaped Parquet file (columns episode, observation [17] f32, action [6] f32, reward,
terminated, truncated; the peer script's layout), then times, best of --repeat runs each:
  pyarrow:   pq.read_table + ipc.new_file(...).write_table  (decode + IPC write, no episode logic)
  trajstore: trajstore ingest --episode-col episode --terminated-col terminated --truncated-col truncated
and prints one JSON line.

With --format hdf5 the same arrays are a D4RL .hdf5 file written by h5py (chunked; gzip with
--compressed; run with a Python that has h5py) and the baseline reads them with h5py instead.

With --format npz the input is np.savez (np.savez_compressed with --compressed) of D4RL's keys
(observations, actions, rewards, terminals, timeouts) and the times are:
  numpy+pyarrow: np.load of every array + ipc.new_file(...).write_table + sync (no episode logic)
  trajstore:     trajstore ingest data.npz DATASET (no options: the D4RL names are recognised)

With --format torchrl (run it with a Python that has torch and torchrl, e.g. the peer venv of
../shared/peers/README.md) the input is rb.dumps() of a TensorDictReplayBuffer over a
LazyMemmapStorage holding the same transitions (observation, action, next/observation,
next/reward, next/terminated, next/truncated, next/done), and the times are:
  copy:      shutil.copytree of the dump (reading and writing the same bytes: the floor)
  trajstore: trajstore ingest DUMP DATASET (no options)

With --format arrow the input is the same table as an Arrow IPC file written by pyarrow
(ipc.new_file, record batches of 1 Mi rows; LZ4 buffers with --compressed, as feather.write_feather
writes by default), and the times are:
  pyarrow:   ipc.open_file(...).read_all() + ipc.new_file(...).write_table + sync (no episode logic)
  trajstore: trajstore ingest INPUT.arrow DATASET --episode-col episode ...; its peak RSS too
With --format arrow --stream the input is in the IPC stream format and trajstore reads it from
stdin (`trajstore ingest - DATASET ... < input.arrows`, as a live collector's pipe would feed it);
the baseline reads the stream with ipc.open_stream instead.

With --format npydir the input is a directory of .npy files with D4RL's keys, written in chunks
through np.lib.format.open_memmap (so --n can exceed memory; episodes have the mean length but no
randomness beyond the flags), and the times are:
  copy:      shutil.copytree of the directory + sync (the floor)
  trajstore: trajstore ingest DIR DATASET (no options); its peak RSS is reported too
"""
import argparse, json, os, shutil, subprocess, tempfile, time

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq


def make_parquet(path, n, obs_dim, act_dim, mean_len, seed):
    rng = np.random.default_rng(seed)
    lens = []
    total = 0
    while total < n:
        l = int(min(max(rng.exponential(mean_len), 10), 4 * mean_len))
        l = min(l, n - total)
        lens.append(l)
        total += l
    lens = np.array(lens)
    ends = np.cumsum(lens) - 1
    terminated = np.zeros(n, dtype=bool)
    terminated[ends[rng.random(len(ends)) < 0.5]] = True
    truncated = np.zeros(n, dtype=bool)
    truncated[ends] = True
    truncated &= ~terminated
    cols = {
        "episode": pa.array(np.repeat(np.arange(len(lens)), lens)),
        "observation": pa.FixedSizeListArray.from_arrays(
            pa.array(rng.standard_normal(n * obs_dim, dtype=np.float32)), obs_dim),
        "action": pa.FixedSizeListArray.from_arrays(
            pa.array(rng.uniform(-1, 1, n * act_dim).astype(np.float32)), act_dim),
        "reward": pa.array(rng.standard_normal(n, dtype=np.float32)),
        "terminated": pa.array(terminated),
        "truncated": pa.array(truncated),
    }
    pq.write_table(pa.table(cols), path, row_group_size=1 << 20)
    return len(lens)


def make_npz(path, n, obs_dim, act_dim, mean_len, seed, compressed, hdf5=False):
    """The same transitions as make_parquet, as D4RL's get_dataset() dict: saved with np.savez,
    or as a D4RL .hdf5 file (h5py, chunked like D4RL's files, gzip when compressed)."""
    tmp = path + ".parquet"
    episodes = make_parquet(tmp, n, obs_dim, act_dim, mean_len, seed)
    t = pq.read_table(tmp)
    os.remove(tmp)
    arrays = {
        "observations": t["observation"].combine_chunks().flatten().to_numpy().reshape(n, obs_dim),
        "actions": t["action"].combine_chunks().flatten().to_numpy().reshape(n, act_dim),
        "rewards": t["reward"].to_numpy(),
        "terminals": t["terminated"].to_numpy(zero_copy_only=False),
        "timeouts": t["truncated"].to_numpy(zero_copy_only=False),
    }
    if hdf5:
        import h5py
        with h5py.File(path, "w") as f:
            for k, v in arrays.items():
                f.create_dataset(k, data=v, chunks=True, compression="gzip" if compressed else None)
    else:
        (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return episodes


def copy_floor(src, dst):
    """Copying the input's bytes and syncing: the floor for any converter that writes as much."""
    def run():
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        os.sync()
    return run


def ingest_without_options(binary, src, ds):
    def run():
        shutil.rmtree(ds, ignore_errors=True)
        subprocess.run([binary, "ingest", src, ds, "--json"], check=True, stdout=subprocess.DEVNULL)
    return run


def best(f, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10_000_000)
    p.add_argument("--obs-dim", type=int, default=17)
    p.add_argument("--act-dim", type=int, default=6)
    p.add_argument("--mean-len", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--bin", default="target/release/trajstore")
    p.add_argument("--dir", default=None)
    p.add_argument("--format", choices=["parquet", "npz", "torchrl", "npydir", "hdf5", "arrow"], default="parquet")
    p.add_argument("--compressed", action="store_true", help="npz: np.savez_compressed; hdf5: gzip; arrow: LZ4")
    p.add_argument("--stream", action="store_true", help="arrow: the IPC stream format, ingested from stdin")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="trajstore-bench-", dir=a.dir)
    try:
        if a.format in ("npz", "hdf5"):
            return bench_npz(a, work)
        if a.format == "torchrl":
            return bench_torchrl(a, work)
        if a.format == "npydir":
            return bench_npydir(a, work)
        if a.format == "arrow":
            return bench_arrow(a, work)
        src = os.path.join(work, "input.parquet")
        episodes = make_parquet(src, a.n, a.obs_dim, a.act_dim, a.mean_len, 0)
        out_ipc = os.path.join(work, "pyarrow.arrow")

        def pyarrow_convert():
            t = pq.read_table(src)
            with ipc.new_file(out_ipc, t.schema) as w:
                w.write_table(t, max_chunksize=1 << 20)

        ds = os.path.join(work, "ts.trajstore")

        def trajstore_ingest():
            shutil.rmtree(ds, ignore_errors=True)
            subprocess.run([a.bin, "ingest", src, ds, "--episode-col", "episode", "--terminated-col",
                            "terminated", "--truncated-col", "truncated", "--json"],
                           check=True, stdout=subprocess.DEVNULL)

        t_py = best(pyarrow_convert, a.repeat)
        t_ts = best(trajstore_ingest, a.repeat)
        print(json.dumps({
            "transitions": a.n, "episodes": episodes,
            "parquet_bytes": os.path.getsize(src),
            "pyarrow_parquet_to_ipc_s": round(t_py, 3),
            "trajstore_ingest_s": round(t_ts, 3),
            "pyarrow_rows_per_s": round(a.n / t_py),
            "trajstore_rows_per_s": round(a.n / t_ts),
            "trajstore_over_pyarrow_time": round(t_ts / t_py, 3),
            "cpus": os.cpu_count(),
        }))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_npz(a, work):
    hdf5 = a.format == "hdf5"
    src = os.path.join(work, "input.hdf5" if hdf5 else "input.npz")
    episodes = make_npz(src, a.n, a.obs_dim, a.act_dim, a.mean_len, 0, a.compressed, hdf5)
    out_ipc = os.path.join(work, "numpy.arrow")

    def numpy_convert():
        if hdf5:
            import h5py
            with h5py.File(src, "r") as f:
                z = {k: f[k][()] for k in f.keys()}
        else:
            z = np.load(src)
        cols = {}
        for k in (z.keys() if hdf5 else z.files):
            v = z[k]
            if v.ndim == 2:
                cols[k] = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1])
            else:
                cols[k] = pa.array(v)
        t = pa.table(cols)
        with ipc.new_file(out_ipc, t.schema) as w:
            w.write_table(t, max_chunksize=1 << 20)
        os.sync()  # trajstore's commit is durable (fsync); so is this baseline

    t_np = best(numpy_convert, a.repeat)
    t_ts = best(ingest_without_options(a.bin, src, os.path.join(work, "ts.trajstore")), a.repeat)
    print(json.dumps({
        "format": a.format, "transitions": a.n, "episodes": episodes, "compressed": a.compressed,
        "input_bytes": os.path.getsize(src),
        "numpy_load_to_ipc_s": round(t_np, 3),
        "trajstore_ingest_s": round(t_ts, 3),
        "numpy_rows_per_s": round(a.n / t_np),
        "trajstore_rows_per_s": round(a.n / t_ts),
        "trajstore_over_numpy_time": round(t_ts / t_np, 3),
        "cpus": os.cpu_count(),
    }))


def bench_torchrl(a, work):
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer

    tmp = os.path.join(work, "input.parquet")
    episodes = make_parquet(tmp, a.n, a.obs_dim, a.act_dim, a.mean_len, 0)
    t = pq.read_table(tmp)
    os.remove(tmp)
    n = a.n
    obs = torch.from_numpy(t["observation"].combine_chunks().flatten().to_numpy().reshape(n, a.obs_dim))
    term = torch.from_numpy(t["terminated"].to_numpy(zero_copy_only=False))
    trunc = torch.from_numpy(t["truncated"].to_numpy(zero_copy_only=False))
    ep = torch.from_numpy(t["episode"].to_numpy())
    # o_{t+1}: the next row inside an episode, the row itself at an episode's end.
    nxt = torch.cat([obs[1:], obs[-1:]])
    last = torch.cat([ep[1:] != ep[:-1], torch.tensor([True])])
    nxt[last] = obs[last]
    td = TensorDict({
        "observation": obs,
        "action": torch.from_numpy(t["action"].combine_chunks().flatten().to_numpy().reshape(n, a.act_dim)),
        ("next", "observation"): nxt,
        ("next", "reward"): torch.from_numpy(t["reward"].to_numpy())[:, None],
        ("next", "terminated"): term[:, None],
        ("next", "truncated"): trunc[:, None],
        ("next", "done"): (term | trunc)[:, None],
    }, batch_size=[n])
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=os.path.join(work, "scratch")))
    rb.extend(td)
    src = os.path.join(work, "dump")
    rb.dumps(src)
    del rb, td
    shutil.rmtree(os.path.join(work, "scratch"), ignore_errors=True)
    dump_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs)
    t_cp = best(copy_floor(src, os.path.join(work, "copy")), a.repeat)
    t_ts = best(ingest_without_options(a.bin, src, os.path.join(work, "ts.trajstore")), a.repeat)
    print(json.dumps({
        "transitions": a.n, "episodes": episodes, "dump_bytes": dump_bytes,
        "copytree_s": round(t_cp, 3),
        "trajstore_ingest_s": round(t_ts, 3),
        "trajstore_rows_per_s": round(a.n / t_ts),
        "trajstore_over_copy_time": round(t_ts / t_cp, 3),
        "cpus": os.cpu_count(),
    }))


def bench_arrow(a, work):
    tmp = os.path.join(work, "input.parquet")
    episodes = make_parquet(tmp, a.n, a.obs_dim, a.act_dim, a.mean_len, 0)
    t = pq.read_table(tmp)
    os.remove(tmp)
    src = os.path.join(work, "input.arrows" if a.stream else "input.arrow")
    opts = ipc.IpcWriteOptions(compression="lz4" if a.compressed else None)
    with (ipc.new_stream if a.stream else ipc.new_file)(src, t.schema, options=opts) as w:
        w.write_table(t, max_chunksize=1 << 20)
    del t
    out_ipc = os.path.join(work, "pyarrow.arrow")

    def pyarrow_convert():
        with (ipc.open_stream if a.stream else ipc.open_file)(src) as r:
            table = r.read_all()
        with ipc.new_file(out_ipc, table.schema) as w:
            w.write_table(table, max_chunksize=1 << 20)
        os.sync()

    ds = os.path.join(work, "ts.trajstore")
    args = ["ingest", "-" if a.stream else src, ds, "--episode-col", "episode", "--terminated-col",
            "terminated", "--truncated-col", "truncated", "--json"]

    def run(cmd, **kw):
        if a.stream:
            with open(src, "rb") as f:
                return subprocess.run(cmd, stdin=f, check=True, **kw)
        return subprocess.run(cmd, check=True, **kw)

    def trajstore_ingest():
        shutil.rmtree(ds, ignore_errors=True)
        run([a.bin] + args, stdout=subprocess.DEVNULL)

    t_py = best(pyarrow_convert, a.repeat)
    t_ts = best(trajstore_ingest, a.repeat)
    shutil.rmtree(ds, ignore_errors=True)
    timed = run(["/usr/bin/time", "-f", "%M", a.bin] + args, capture_output=True, text=True)
    rss = int(timed.stderr.strip().splitlines()[-1]) * 1024
    print(json.dumps({
        "format": "arrow", "stream": a.stream, "transitions": a.n, "episodes": episodes, "compressed": a.compressed,
        "input_bytes": os.path.getsize(src),
        "pyarrow_ipc_to_ipc_s": round(t_py, 3),
        "trajstore_ingest_s": round(t_ts, 3),
        "trajstore_rows_per_s": round(a.n / t_ts),
        "trajstore_over_pyarrow_time": round(t_ts / t_py, 3),
        "trajstore_peak_rss_bytes": rss,
        "cpus": os.cpu_count(),
    }))


def bench_npydir(a, work):
    from numpy.lib.format import open_memmap

    src = os.path.join(work, "arrays")
    os.makedirs(src)
    n, chunk = a.n, 1 << 22
    rng = np.random.default_rng(0)
    arrays = {
        "observations": open_memmap(os.path.join(src, "observations.npy"), "w+", np.float32, (n, a.obs_dim)),
        "actions": open_memmap(os.path.join(src, "actions.npy"), "w+", np.float32, (n, a.act_dim)),
        "rewards": open_memmap(os.path.join(src, "rewards.npy"), "w+", np.float32, (n,)),
        "terminals": open_memmap(os.path.join(src, "terminals.npy"), "w+", np.bool_, (n,)),
        "timeouts": open_memmap(os.path.join(src, "timeouts.npy"), "w+", np.bool_, (n,)),
    }
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        k = hi - lo
        arrays["observations"][lo:hi] = rng.standard_normal((k, a.obs_dim), dtype=np.float32)
        arrays["actions"][lo:hi] = rng.uniform(-1, 1, (k, a.act_dim)).astype(np.float32)
        arrays["rewards"][lo:hi] = rng.standard_normal(k, dtype=np.float32)
        i = np.arange(lo, hi)
        arrays["terminals"][lo:hi] = (i + 1) % (2 * a.mean_len) == 0
        arrays["timeouts"][lo:hi] = ((i + 1) % a.mean_len == 0) & ((i + 1) % (2 * a.mean_len) != 0)
    for v in arrays.values():
        v.flush()
    del arrays
    src_bytes = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
    copy = os.path.join(work, "copy")
    t_cp = best(copy_floor(src, copy), a.repeat)
    shutil.rmtree(copy, ignore_errors=True)
    ds = os.path.join(work, "ts.trajstore")
    t_ts = best(ingest_without_options(a.bin, src, ds), a.repeat)
    # Peak RSS of one more ingest, taken by /usr/bin/time in its own small process (this
    # process's children would report this Python's size from before their exec).
    shutil.rmtree(ds, ignore_errors=True)
    timed = subprocess.run(["/usr/bin/time", "-f", "%M", a.bin, "ingest", src, ds, "--json"],
                           check=True, capture_output=True, text=True)
    rss = int(timed.stderr.strip().splitlines()[-1]) * 1024
    print(json.dumps({
        "transitions": n, "input_bytes": src_bytes,
        "copytree_s": round(t_cp, 3),
        "trajstore_ingest_s": round(t_ts, 3),
        "trajstore_rows_per_s": round(n / t_ts),
        "trajstore_over_copy_time": round(t_ts / t_cp, 3),
        "trajstore_peak_rss_bytes": rss,
        "cpus": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
