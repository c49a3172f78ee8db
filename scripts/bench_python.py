"""The Python loader against TorchRL and against the Rust loader, in one Python process, on the
same data.

One process, one dataset (the peer script's synthetic D4RL-shaped transitions: obs [17] f32,
action [6] f32, reward, terminated/truncated, episode lengths ~ exponential, mean 1000):

  (a) TorchRL: ReplayBuffer(LazyMemmapStorage(N)) + SliceSampler(num_slices=256,
      end_key="done" as ../shared/peers/torchrl_slice_bench.py does by default (--torchrl-key
      episode: traj_key="episode"), cache_values=True, strict_length=False),
      batch_size=256*64: `rb.sample()` timed one by one (median), first sample timed alone;
      timed with torch.set_num_threads(cpu_count) as the peer script runs it and with 1 thread
      (on a loaded 2-core machine 2 intra-op threads can take ~100 ms a sample), and the ratios
      are taken against the faster of the two (median sample time; stalls ignored: conservative).
  (b) trajstore's Python loader: `ds.loader(slice_len=64, num_slices=256, columns=...,
      device="cpu", workers=W, prefetch=4, max_batches=M)` iterated (CPU torch tensors, each batch
      touched by reading batch["observation"].shape, nothing copied), for
      weighting="episodes", policy="pad" (TorchRL's semantics) and weighting="windows",
      policy="strict" (the default), each with columns [observation, action, reward] and with
      next_observation too. A timed iteration starts a fresh stream (threads, buffer pool), as
      (c) does.
  (c) the Rust loader alone on the same plan: `loader._plan.time_rust_loader(start, M)` (same
      sampler, gatherer and options; no Python object per batch), over the very batch numbers
      the paired Python iteration consumed; Python and Rust alternate (which goes first
      alternates too), so Python/Rust is taken pairwise.
  (d) the memcpy floor: np.copyto of as many bytes as one batch holds (every tensor of the
      batch: columns, flag planes, ids), from a contiguous, moving place in the in-memory
      observation array (never the same bytes twice in a row), one thread.

Every system is warmed up before it is timed; the whole set is repeated --rounds times, in a
rotated order, so that the noise of this shared machine shows in the min-max spread. Prints one
JSON line per measurement ("kind": "run"), one per configuration ("kind": "summary"; Python/Rust
is the median of the pairwise ratios, also pooled over all variants) and markdown tables.

Setup (once) and run, from the repository root:

    ~/.cache/trajstore-torch/bin/pip install torchrl tensordict "torch==2.11.0"
    CARGO_TARGET_DIR=$HOME/.cache/trajstore-bench-target \
      PYO3_PYTHON=$HOME/.cache/trajstore-torch/bin/python PYO3_BUILD_EXTENSION_MODULE=1 \
      cargo build --release -p trajstore-python
    rm -rf /tmp/bench-pkg && mkdir -p /tmp/bench-pkg/trajstore
    cp python/trajstore/*.py python/trajstore/py.typed /tmp/bench-pkg/trajstore/
    cp $HOME/.cache/trajstore-bench-target/release/lib_native.so /tmp/bench-pkg/trajstore/_native.abi3.so
    PYTHONPATH=/tmp/bench-pkg ~/.cache/trajstore-torch/bin/python scripts/bench_python.py --n 2000000
    PYTHONPATH=/tmp/bench-pkg ~/.cache/trajstore-torch/bin/python scripts/bench_python.py --n 20000000

(scripts/bench_python.sh does all of this.) The package is taken from PYTHONPATH: use a release
build of the extension (a debug build is many times slower) and not python/trajstore, whose
_native.abi3.so is the test suite's debug symlink. --breakdown adds a per-batch account of the
Python layer's main-thread time (native next, DLPack wrapping, the Batch dict) and of a cheaper
wrapping (DLPack capsules handed to torch directly). --workers 1 is worth a run on 2 cores: the
gather is itself parallel (rayon), so 2 workers oversubscribe the cores. Big files go in --workdir
(default /tmp/trajstore-bench-python: Parquet, trajstore dataset, TorchRL memmap; ~6.5 GB at 20M)
and are removed at the end unless --keep.
"""
import argparse, gc, importlib.util, json, os, shutil, statistics, sys, tempfile, time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PEER = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "peers", "torchrl_slice_bench.py"))

NUM_SLICES, SLICE_LEN = 256, 64
BASE_COLS = ["observation", "action", "reward"]
VARIANTS = [
    # name, weighting, policy, columns
    ("episodes/pad, obs+act+rew", "episodes", "pad", BASE_COLS),
    ("episodes/pad, +next_obs", "episodes", "pad", BASE_COLS + ["next_observation"]),
    ("windows/strict, obs+act+rew", "windows", "strict", BASE_COLS),
    ("windows/strict, +next_obs", "windows", "strict", BASE_COLS + ["next_observation"]),
]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def emit(d):
    print(json.dumps(d), flush=True)


def load_peer(path):
    spec = importlib.util.spec_from_file_location("torchrl_slice_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_parquet(data, path, obs_dim, act_dim):
    """Exactly what the peer script writes with --parquet."""
    import pyarrow as pa, pyarrow.parquet as pq

    cols = {
        "episode": pa.array(data["episode"]),
        "observation": pa.FixedSizeListArray.from_arrays(pa.array(data["observation"].reshape(-1)), obs_dim),
        "action": pa.FixedSizeListArray.from_arrays(pa.array(data["action"].reshape(-1)), act_dim),
        "reward": pa.array(data["reward"]),
        "terminated": pa.array(data["terminated"]),
        "truncated": pa.array(data["truncated"]),
    }
    pq.write_table(pa.table(cols), path, row_group_size=1 << 20)


def spread(xs):
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs))


# --- the systems ------------------------------------------------------------------------------
class TorchRL:
    def __init__(self, data, n, scratch, key):
        from tensordict import TensorDict
        from torchrl.data import LazyMemmapStorage, ReplayBuffer
        from torchrl.data.replay_buffers.samplers import SliceSampler

        storage = LazyMemmapStorage(n, scratch_dir=scratch)
        if key == "done":
            sampler = SliceSampler(num_slices=NUM_SLICES, end_key="done", cache_values=True, strict_length=False)
        else:
            sampler = SliceSampler(num_slices=NUM_SLICES, traj_key="episode", cache_values=True, strict_length=False)
        self.rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=NUM_SLICES * SLICE_LEN)
        t0 = time.perf_counter()
        chunk = 1 << 20
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            td = TensorDict({k: torch.from_numpy(v[s:e]) for k, v in data.items()}, batch_size=[e - s])
            self.rb.extend(td)
        self.ingest_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        b = self.rb.sample()
        self.first_sample_s = time.perf_counter() - t0
        self.shape = tuple(b["observation"].shape)
        for _ in range(5):  # warm-up
            self.rb.sample()

    def run(self, iters, threads):
        times = []
        rb = self.rb
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        for _ in range(3):  # settle the thread pool
            rb.sample()
        for _ in range(iters):
            t0 = time.perf_counter()
            b = rb.sample()
            b["observation"].shape
            times.append(time.perf_counter() - t0)
            del b
        torch.set_num_threads(before)
        return times


class Memcpy:
    def __init__(self, src):
        self.src = src.reshape(-1).view(np.uint8)
        self.pos = 0

    def run(self, nbytes, reps):
        dst = np.empty(nbytes, dtype=np.uint8)
        dst.fill(1)  # fault the destination in once, as a recycled batch buffer is
        src, times = self.src, []
        step = nbytes + 4096 * 7  # contiguous source, moving on every copy
        for _ in range(reps):
            if self.pos + nbytes > src.shape[0]:
                self.pos = 0
            s = src[self.pos : self.pos + nbytes]
            t0 = time.perf_counter()
            np.copyto(dst, s)
            times.append(time.perf_counter() - t0)
            self.pos += step
        return times


def iterate(loader):
    """One iteration of the loader (a fresh native stream), each batch touched, not copied.
    Returns (seconds, per-batch intervals, batches)."""
    stamps = []
    t0 = time.perf_counter()
    for b in loader:
        b["observation"].shape
        stamps.append(time.perf_counter())
    t1 = time.perf_counter()
    intervals = np.diff(np.array([t0] + stamps))
    return t1 - t0, intervals, len(stamps)


def batch_bytes(loader):
    """Bytes of one batch as handed out (every tensor), from one real batch."""
    it = iter(loader)
    b = next(it)
    nb = sum(t.numel() * t.element_size() for t in b.values())
    shapes = {k: tuple(v.shape) for k, v in b.items()}
    del b
    for _ in it:  # finish the iteration (the loader continues where it stopped otherwise)
        pass
    return nb, shapes


def breakdown(loader, m, reps=3):
    """Where the main thread's time goes per batch: the steps of Loader._iter_host, cumulatively,
    each over a fresh stream of m batches (wall and this thread's CPU per batch, medians of reps
    runs in rotated order), plus the cost of each step on a batch already at hand. Uses the
    package's internals on purpose. "proposed_wrap" is _iter_host with the DLPack capsules handed
    to torch directly (torch.utils.dlpack.from_dlpack(buf.__dlpack__()), or torch._C._from_dlpack)
    instead of torch.from_dlpack(buf), whose Python-level protocol negotiation costs ~1 us per
    tensor."""
    from trajstore import _native
    from trajstore._loader import FLAGS, PER_SLICE, Batch

    plan = loader._plan
    names = loader._names + list(FLAGS) + list(PER_SLICE)
    fd = torch.from_dlpack
    cfd = torch._C._from_dlpack

    def native_next_only():
        native = _native.BatchLoader(plan, loader.position, m)
        while native.next() is not None:
            pass

    def next_plus_from_dlpack():
        native = _native.BatchLoader(plan, loader.position, m)
        while True:
            got = native.next()
            if got is None:
                break
            ts = [fd(x) for x in got[2]]

    def next_dlpack_batch():
        native = _native.BatchLoader(plan, loader.position, m)
        while True:
            got = native.next()
            if got is None:
                break
            k, _, bufs = got
            b = Batch(k, zip(names, [fd(x) for x in bufs]))
            b["observation"].shape

    def proposed_wrap():
        native = _native.BatchLoader(plan, loader.position, m)
        while True:
            got = native.next()
            if got is None:
                break
            k, _, bufs = got
            b = Batch(k, zip(names, [cfd(x.__dlpack__()) for x in bufs]))
            b["observation"].shape

    def the_loader():
        for b in loader:
            b["observation"].shape

    steps = dict(native_next_only=native_next_only, next_plus_from_dlpack=next_plus_from_dlpack,
                 next_dlpack_batch=next_dlpack_batch, proposed_wrap=proposed_wrap, loader=the_loader)
    acc = {k: [] for k in list(steps) + ["rust"]}
    order = list(steps) + ["rust"]
    for r in range(reps):
        for name in order[r % len(order):] + order[: r % len(order)]:
            if name == "rust":
                acc["rust"].append((plan.time_rust_loader(loader.position, m) / m, None))
                continue
            t0, c0 = time.perf_counter(), time.thread_time()
            steps[name]()
            acc[name].append(((time.perf_counter() - t0) / m, (time.thread_time() - c0) / m))
    out = {}
    for k, v in acc.items():
        out[k] = (statistics.median(x[0] for x in v),
                  None if v[0][1] is None else statistics.median(x[1] for x in v))
    # Costs on one batch at hand (no waiting). A Buffer may be exported any number of times
    # (each export holds a reference to the batch), so these loops are valid.
    ready = []
    for _ in range(10):  # next() on batches already queued (the queue filled during a sleep)
        native = _native.BatchLoader(plan, loader.position, loader._options["prefetch"])
        time.sleep(0.1)
        while True:
            t0 = time.perf_counter()
            got = native.next()
            ready.append(time.perf_counter() - t0)
            if got is None:
                break
            del got
    out["cost_native_next_ready"] = (statistics.median(ready), None)
    native = _native.BatchLoader(plan, loader.position, 8)
    got = native.next()
    bufs = got[2]
    n = 2000

    def per(f):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        return ((time.perf_counter() - t0) / n, None)

    out["cost_torch_from_dlpack_all"] = per(lambda: [fd(x) for x in bufs])
    out["cost_torch_from_dlpack_of_capsule_all"] = per(lambda: [fd(x.__dlpack__()) for x in bufs])
    out["cost_C_from_dlpack_all"] = per(lambda: [cfd(x.__dlpack__()) for x in bufs])
    out["cost_np_from_dlpack_all"] = per(lambda: [np.from_dlpack(x) for x in bufs])
    ts = [fd(x) for x in bufs]
    out["cost_batch_dict"] = per(lambda: Batch(0, zip(names, ts)))
    del ts, bufs, got, native
    out["num_buffers"] = len(names)
    return out


# --- main -------------------------------------------------------------------------------------
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2_000_000)
    p.add_argument("--workdir", default="/tmp/trajstore-bench-python")
    p.add_argument("--peer", default=DEFAULT_PEER, help="torchrl_slice_bench.py (its make_dataset is used)")
    p.add_argument("--batches", type=int, default=2000, help="batches per timed trajstore iteration (M)")
    p.add_argument("--pairs", type=int, default=3, help="Python/Rust pairs per variant per round")
    p.add_argument("--torchrl-iters", type=int, default=200, help="TorchRL samples timed per round")
    p.add_argument("--memcpy-reps", type=int, default=500)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--workers", type=int, default=None,
                   help="loader workers (default: the package's, 1 on two cores or fewer, else 2)")
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--torchrl-key", default="done", choices=["done", "episode"])
    p.add_argument("--torchrl-threads", default="",
                   help="torch thread counts TorchRL is timed with, comma-separated (default: "
                        "cpu_count as the peer script, and 1); ratios are taken against the fastest")
    p.add_argument("--breakdown", action="store_true", help="also account the Python layer's per-batch time")
    p.add_argument("--breakdown-reps", type=int, default=5, help="runs of each breakdown step")
    p.add_argument("--keep", action="store_true", help="keep the Parquet file and datasets")
    a = p.parse_args()

    import trajstore

    threads_list = [int(x) for x in a.torchrl_threads.split(",") if x] or sorted({os.cpu_count() or 1, 1}, reverse=True)

    so = trajstore._native.__file__
    log(f"trajstore {trajstore.__version__} from {so}")
    if not os.path.exists(a.peer):
        sys.exit(f"peer script not found: {a.peer} (pass --peer)")
    peer = load_peer(a.peer)
    torch.set_num_threads(os.cpu_count() or 1)  # as the peer script does
    import torchrl, tensordict

    env = dict(n=a.n, torch=torch.__version__, torchrl=torchrl.__version__, tensordict=tensordict.__version__,
               trajstore=trajstore.__version__, native=so, cpus=os.cpu_count(),
               workers=a.workers, prefetch=a.prefetch, batches=a.batches, torchrl_iters=a.torchrl_iters,
               rounds=a.rounds, pairs=a.pairs, torchrl_key=a.torchrl_key, torchrl_threads=threads_list)
    emit(dict(kind="env", **env))

    os.makedirs(a.workdir, exist_ok=True)
    pq_path = os.path.join(a.workdir, f"peer-{a.n}.parquet")
    ds_path = os.path.join(a.workdir, f"peer-{a.n}.trajstore")
    scratch = tempfile.mkdtemp(prefix="torchrl-memmap-", dir=a.workdir)
    try:
        t0 = time.perf_counter()
        data, lens = peer.make_dataset(a.n, 17, 6, 1000, 0)
        log(f"dataset: {a.n} transitions, {len(lens)} episodes ({time.perf_counter() - t0:.1f} s)")
        t0 = time.perf_counter()
        write_parquet(data, pq_path, 17, 6)
        log(f"parquet: {os.path.getsize(pq_path) / 1e9:.2f} GB ({time.perf_counter() - t0:.1f} s)")
        shutil.rmtree(ds_path, ignore_errors=True)
        t0 = time.perf_counter()
        rep = trajstore.ingest(pq_path, ds_path, episode_col="episode", terminated_col="terminated",
                               truncated_col="truncated")
        ingest_s = time.perf_counter() - t0
        os.remove(pq_path)
        log(f"trajstore ingest: {rep.get('rows')} rows, {rep.get('episodes')} episodes ({ingest_s:.1f} s)")

        trl = TorchRL(data, a.n, scratch, a.torchrl_key)
        log(f"torchrl: extend {trl.ingest_s:.1f} s, first sample {trl.first_sample_s * 1e3:.1f} ms, shape {trl.shape}")
        emit(dict(kind="setup", n=a.n, episodes=int(len(lens)), trajstore_ingest_s=round(ingest_s, 3),
                  torchrl_extend_s=round(trl.ingest_s, 3), torchrl_first_sample_s=round(trl.first_sample_s, 5),
                  torchrl_batch_shape=list(trl.shape)))
        src = data["observation"]
        del data
        gc.collect()
        memcpy = Memcpy(src)

        ds = trajstore.open(ds_path)
        assert len(ds) == a.n, (len(ds), a.n)
        loaders, nbytes = {}, {}
        for name, weighting, policy, cols in VARIANTS:
            t0 = time.perf_counter()
            ld = ds.loader(slice_len=SLICE_LEN, num_slices=NUM_SLICES, columns=cols, weighting=weighting,
                           policy=policy, device="cpu", workers=a.workers, prefetch=a.prefetch,
                           max_batches=a.batches)
            made = time.perf_counter() - t0
            nbytes[name], shapes = batch_bytes(ld)  # also the warm-up iteration
            assert shapes["observation"] == (NUM_SLICES, SLICE_LEN, 17), shapes
            ld._plan.time_rust_loader(ld.position, min(a.batches, 200))  # Rust warm-up
            loaders[name] = ld
            log(f"loader {name}: made in {made * 1e3:.1f} ms, {nbytes[name]} bytes/batch, {len(shapes)} tensors")

        res = {}
        for t in threads_list:
            res[f"torchrl{t}"], res[f"torchrl{t}_med"] = [], []
        for name, *_ in VARIANTS:
            res[name] = dict(py=[], rust=[], ratio=[], py_interval_med=[])
        memcpy_res = {nb: [] for nb in set(nbytes.values())}

        systems = [f"torchrl{t}" for t in threads_list] + ["memcpy"] + [v[0] for v in VARIANTS]
        for r in range(a.rounds):
            order = systems[r % len(systems):] + systems[: r % len(systems)]
            if r % 2:
                order = order[::-1]
            log(f"-- round {r}: {order}")
            for sysname in order:
                if sysname.startswith("torchrl"):
                    threads = int(sysname[len("torchrl"):])
                    times = trl.run(a.torchrl_iters, threads)
                    med = statistics.median(times)
                    res[sysname].append(a.torchrl_iters / sum(times))
                    res[sysname + "_med"].append(med)
                    emit(dict(kind="run", n=a.n, round=r, system="torchrl", torch_threads=threads, iters=a.torchrl_iters,
                              sample_median_s=round(med, 6), sample_min_s=round(min(times), 6),
                              sample_max_s=round(max(times), 6), batches_per_s_total=round(a.torchrl_iters / sum(times), 1),
                              batches_per_s_median=round(1 / med, 1)))
                elif sysname == "memcpy":
                    for nb in memcpy_res:
                        times = memcpy.run(nb, a.memcpy_reps)
                        med = statistics.median(times)
                        memcpy_res[nb].append(med)
                        emit(dict(kind="run", n=a.n, round=r, system="memcpy", bytes=nb, reps=a.memcpy_reps,
                                  median_s=round(med, 7), min_s=round(min(times), 7),
                                  batches_per_s=round(1 / med, 1), gb_per_s=round(nb / med / 1e9, 2)))
                else:
                    ld = loaders[sysname]
                    for i in range(a.pairs):
                        start = ld.position
                        py_first = (r + i) % 2 == 0
                        if not py_first:
                            rust_s = ld._plan.time_rust_loader(start, a.batches)
                        secs, intervals, got = iterate(ld)
                        assert got == a.batches, got
                        if py_first:
                            rust_s = ld._plan.time_rust_loader(start, a.batches)
                        py_bps, rust_bps = a.batches / secs, a.batches / rust_s
                        d = res[sysname]
                        d["py"].append(py_bps)
                        d["rust"].append(rust_bps)
                        d["ratio"].append(py_bps / rust_bps)
                        d["py_interval_med"].append(float(np.median(intervals)))
                        emit(dict(kind="run", n=a.n, round=r, pair=i, system="trajstore", variant=sysname,
                                  first="python" if py_first else "rust", start=start, batches=a.batches,
                                  python_s=round(secs, 5), python_batches_per_s=round(py_bps, 1),
                                  python_interval_median_us=round(float(np.median(intervals)) * 1e6, 1),
                                  rust_s=round(rust_s, 5), rust_batches_per_s=round(rust_bps, 1),
                                  python_over_rust=round(py_bps / rust_bps, 3)))

        if a.breakdown:
            for name in (VARIANTS[0][0], VARIANTS[2][0]):
                bd = breakdown(loaders[name], a.batches, a.breakdown_reps)
                emit(dict(kind="breakdown", n=a.n, variant=name,
                          **{k: ([round(x * 1e6, 2) if x is not None else None for x in v] if isinstance(v, tuple) else v)
                             for k, v in bd.items()},
                          units="[wall us/batch, main-thread CPU us/batch]"))

        # --- summary ------------------------------------------------------------------------
        # TorchRL's batches/s: 1 / (median over rounds of the per-round median sample time), for
        # each thread count; ratios are taken against the fastest thread count (conservative).
        trl_by_threads = {}
        for t in threads_list:
            med = statistics.median(res[f"torchrl{t}_med"])
            trl_by_threads[t] = med
            emit(dict(kind="summary", n=a.n, system="torchrl", torch_threads=t,
                      first_sample_s=round(trl.first_sample_s, 5),
                      sample_median_s=round(med, 6), batches_per_s=round(1 / med, 1),
                      sample_median_s_rounds=[round(x, 6) for x in res[f"torchrl{t}_med"]],
                      batches_per_s_total_rounds=[round(x, 1) for x in res[f"torchrl{t}"]]))
        best_t = min(trl_by_threads, key=trl_by_threads.get)
        trl_med = trl_by_threads[best_t]
        trl_bps = 1 / trl_med
        rows = []
        for name, *_ in VARIANTS:
            d = res[name]
            py, ru, ra = spread(d["py"]), spread(d["rust"]), spread(d["ratio"])
            floor = statistics.median(memcpy_res[nbytes[name]])
            s = dict(kind="summary", n=a.n, system="trajstore", variant=name, batch_bytes=nbytes[name],
                     python_batches_per_s=round(py["median"], 1),
                     python_batches_per_s_all=[round(x, 1) for x in d["py"]],
                     rust_batches_per_s=round(ru["median"], 1),
                     rust_batches_per_s_all=[round(x, 1) for x in d["rust"]],
                     python_over_rust_median=round(ra["median"], 3),
                     python_over_rust_all=[round(x, 3) for x in d["ratio"]],
                     torchrl_batches_per_s=round(trl_bps, 1), torchrl_threads=best_t,
                     python_vs_torchrl=round(py["median"] / trl_bps, 2),
                     rust_vs_torchrl=round(ru["median"] / trl_bps, 2),
                     memcpy_floor_s=round(floor, 7), memcpy_floor_batches_per_s=round(1 / floor, 1),
                     python_us_per_batch=round(1e6 / py["median"], 1))
            emit(s)
            rows.append((name, py, ru, ra, floor, nbytes[name]))

        pooled = [x for name, *_ in VARIANTS for x in res[name]["ratio"]]
        pooled_s = spread(pooled)
        geo = float(np.exp(np.mean(np.log(pooled))))
        emit(dict(kind="summary", n=a.n, system="trajstore", variant="all (pooled pairs)",
                  python_over_rust_median=round(pooled_s["median"], 3), python_over_rust_geomean=round(geo, 3),
                  pairs=len(pooled), pairs_below_0_9=sum(x < 0.9 for x in pooled)))
        print()
        print(f"N = {a.n:,} transitions, {len(lens):,} episodes; {a.rounds} rounds x {a.pairs} pairs of "
              f"{a.batches} batches per variant; TorchRL {a.rounds} x {a.torchrl_iters} samples; "
              f"batches of {NUM_SLICES} x {SLICE_LEN}; workers={a.workers}, prefetch={a.prefetch}")
        print()
        print(f"TorchRL (SliceSampler {a.torchrl_key}, cache_values=True, strict_length=False): first sample "
              f"{trl.first_sample_s * 1e3:.1f} ms")
        print()
        print("| N | TorchRL torch threads | median sample (median of rounds) | per-round medians | batches/s (1 / median) |")
        print("| --- | ---: | ---: | --- | ---: |")
        for t in threads_list:
            med = trl_by_threads[t]
            print(f"| {a.n / 1e6:g}M | {t}{' (used for ratios)' if t == best_t else ''} | {med * 1e3:.2f} ms "
                  f"| {', '.join(f'{x * 1e3:.2f}' for x in res[f'torchrl{t}_med'])} ms | {1 / med:,.0f} |")
        print()
        print("| N | trajstore loader variant | batch bytes | Python loader batches/s (median, min-max) "
              "| Rust loader batches/s (median, min-max) | Python/Rust (median of pairs, min-max) | Python vs TorchRL "
              "| memcpy floor (1 thread) |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, py, ru, ra, floor, nb in rows:
            print(f"| {a.n / 1e6:g}M | {name} | {nb / 2**20:.2f} MiB "
                  f"| {py['median']:,.0f} ({py['min']:,.0f}-{py['max']:,.0f}) "
                  f"| {ru['median']:,.0f} ({ru['min']:,.0f}-{ru['max']:,.0f}) "
                  f"| {ra['median']:.3f}x ({ra['min']:.3f}-{ra['max']:.3f}) "
                  f"| **{py['median'] / trl_bps:.1f}x** "
                  f"| {floor * 1e6:.1f} us = {1 / floor:,.0f} batches/s |")
        print(f"| {a.n / 1e6:g}M | all variants, pooled pairs | | | | {pooled_s['median']:.3f}x median, "
              f"{geo:.3f}x geomean ({len(pooled)} pairs, {sum(x < 0.9 for x in pooled)} below 0.9) | | |")
        print()
        print("Targets: Python loader >= 20x TorchRL, Python loader >= 0.9x the Rust loader.")
    finally:
        if not a.keep:
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(ds_path, ignore_errors=True)
            if os.path.exists(pq_path):
                os.remove(pq_path)
            try:
                os.rmdir(a.workdir)
            except OSError:
                pass


if __name__ == "__main__":
    main()
