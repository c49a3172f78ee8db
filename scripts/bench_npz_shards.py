"""Ingest speed for a directory of .npz shards in OGBench's layout (its 100M/1B datasets: one
`*-NNN.npz` per generation run, written with np.savez_compressed), against NumPy reading the same
shards, in the same run.

    python scripts/bench_npz_shards.py --shards 10 --rows 100000 --bin target/release/trajstore

Writes --shards files of --rows rows each (trajectories of --traj-len rows, the last row of each
flagged in `terminals`; observations [40] f32, actions [5] f32, qpos [25] f32, qvel [24] f32,
button_states [2] int64: the keys and dtypes of OGBench's scene datasets; np.savez with --stored)
into a temporary directory, then times, best of --repeat runs each:
  numpy:     np.load of every array of every shard, one shard at a time (the inflate floor:
             what ogbench.load_dataset does before its masks, no writing)
  trajstore: trajstore ingest DIR DATASET (no options: OGBench's convention is recognised)
and prints one JSON line: transitions ingested (rows less one state row per trajectory),
seconds, transitions/s, MB/s of input (on disk and inflated), trajstore's peak RSS, and the
ratio of the two times. The directory and the dataset are deleted at the end.
"""
import argparse, json, os, shutil, subprocess, tempfile, time

import numpy as np


def write_shards(root, shards, rows, traj_len, stored, seed):
    rng = np.random.default_rng(seed)
    save = np.savez if stored else np.savez_compressed
    for s in range(shards):
        terminals = np.zeros(rows, dtype=bool)
        terminals[traj_len - 1 :: traj_len] = True
        terminals[-1] = True  # every shard ends on a trajectory end
        # Smooth trajectories (a random walk), as simulator states are: they compress as real
        # OGBench data does, unlike white noise.
        walk = lambda d: np.cumsum(rng.normal(0, 0.01, (rows, d)).astype(np.float32), axis=0)
        save(
            os.path.join(root, f"bench-play-v0-{s:03d}.npz"),
            observations=walk(40),
            actions=rng.uniform(-1, 1, (rows, 5)).astype(np.float32),
            terminals=terminals,
            qpos=walk(25),
            qvel=walk(24),
            button_states=rng.integers(0, 2, (rows, 2), dtype=np.int64),
        )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shards", type=int, default=10)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--traj-len", type=int, default=1001)
    p.add_argument("--stored", action="store_true", help="np.savez instead of np.savez_compressed")
    p.add_argument("--bin", default="target/release/trajstore")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(dir=a.dir)
    try:
        shards = os.path.join(tmp, "shards")
        os.makedirs(shards)
        write_shards(shards, a.shards, a.rows, a.traj_len, a.stored, a.seed)
        files = sorted(os.path.join(shards, f) for f in os.listdir(shards))
        disk = sum(os.path.getsize(f) for f in files)

        def numpy_read():
            raw = 0
            for f in files:
                with np.load(f) as z:
                    raw += sum(z[k].nbytes for k in z.files)
            return raw

        raw = numpy_read()
        best_np = min(timed(numpy_read) for _ in range(a.repeat))
        out = os.path.join(tmp, "ds")
        best, rss, report = None, None, None

        def run():
            nonlocal rss, report
            shutil.rmtree(out, ignore_errors=True)
            cmd = [a.bin, "ingest", shards, out, "--json"]
            if shutil.which("/usr/bin/time"):
                cmd = ["/usr/bin/time", "-f", "%M"] + cmd
            r = subprocess.run(cmd, check=True, capture_output=True, text=True)
            report = json.loads(r.stdout.strip().splitlines()[-1])
            if cmd[0] == "/usr/bin/time":
                rss = int(r.stderr.strip().splitlines()[-1]) * 1024

        for _ in range(a.repeat):
            t = timed(run)
            best = t if best is None else min(best, t)
        n = report["rows"]
        print(
            json.dumps(
                {
                    "shards": a.shards,
                    "rows_per_shard": a.rows,
                    "transitions": n,
                    "episodes": report["episodes"],
                    "convention": report["convention"]["name"],
                    "compressed": not a.stored,
                    "input_mb_on_disk": disk / 1e6,
                    "input_mb_inflated": raw / 1e6,
                    "numpy_load_s": best_np,
                    "trajstore_s": best,
                    "trajstore_transitions_per_s": n / best,
                    "trajstore_mb_per_s_on_disk": disk / 1e6 / best,
                    "trajstore_mb_per_s_inflated": raw / 1e6 / best,
                    "trajstore_peak_rss_mb": rss / 1e6 if rss else None,
                    "ratio_time": best / best_np,
                }
            )
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
