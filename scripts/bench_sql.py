"""SQL benchmark: `trajstore sql` against DuckDB on the same data, measured in the same run.

    python scripts/bench_sql.py --n 20000000 --bin target/release/trajstore

Writes a synthetic dataset with `trajstore demo` (or uses --dataset), exports it to Parquet with
`trajstore export`, then times, best of --repeat runs each:
  trajstore:       `trajstore sql DATASET QUERY --format arrow --output FILE` (whole process: start,
                   open the dataset, plan, run, write the result file)
  trajstore_query: the query alone inside that process (`--timer --repeat N`: plan, execute,
                   collect the result in memory; no process start, no output)
  duckdb_arrow:    DuckDB over the segments' Arrow IPC files, memory-mapped by pyarrow (the table
                   is built once, outside the timing), result collected as an Arrow table
  duckdb_arrow_file: the same, then the result written as an Arrow IPC file like trajstore's
  duckdb_parquet:  DuckDB reading the exported Parquet file
for
  group_by:  SELECT episode_id, SUM(reward), COUNT(*) FROM transitions GROUP BY episode_id
  filtered:  SELECT episode_id, step, reward FROM transitions WHERE episode_id BETWEEN lo AND hi
             AND reward > 0.5   (lo..hi: the middle 10% of episodes)
and prints one JSON line per query. Needs pyarrow and duckdb (scripts/setup-python.sh).
"""
import argparse, glob, json, os, shutil, subprocess, tempfile, time

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc


def best(f, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        rows = f()
        times.append(time.perf_counter() - t)
    return min(times), rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--bin", default="target/release/trajstore")
    ap.add_argument("--dataset", help="use this dataset instead of writing one")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="DuckDB threads (0: its default)")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="trajstore-bench-sql-")
    try:
        run(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(a, tmp):
    ds = a.dataset
    if ds is None:
        ds = os.path.join(tmp, "d.trajstore")
        subprocess.run([a.bin, "demo", ds, "--transitions", str(a.n), "--json"], check=True,
                       stdout=subprocess.DEVNULL)
    pq_path = os.path.join(tmp, "d.parquet")
    subprocess.run([a.bin, "export", ds, pq_path], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)

    files = sorted(f for f in glob.glob(os.path.join(ds, "segments", "*.arrow"))
                   if not f.endswith(".episodes.arrow"))
    tables = [ipc.open_file(pa.memory_map(f)).read_all() for f in files]
    transitions = pa.concat_tables(tables)
    episodes = transitions.num_rows and int(pc.max(transitions["episode_id"]).as_py()) + 1
    lo, hi = int(episodes * 0.45), int(episodes * 0.55)

    con = duckdb.connect()
    if a.threads:
        con.execute(f"SET threads={a.threads}")
    con.register("transitions", transitions)
    con.execute(f"CREATE VIEW transitions_pq AS SELECT * FROM read_parquet('{pq_path}')")

    queries = {
        "group_by": "SELECT episode_id, SUM(reward), COUNT(*) FROM {t} GROUP BY episode_id",
        "filtered": "SELECT episode_id, step, reward FROM {t} "
                    f"WHERE episode_id BETWEEN {lo} AND {hi} AND reward > 0.5",
    }
    out_file = os.path.join(tmp, "out.arrow")
    for name, q in queries.items():
        def ts():
            subprocess.run([a.bin, "sql", ds, q.format(t="transitions"), "--format", "arrow",
                            "--output", out_file], check=True)
            with pa.memory_map(out_file) as m:
                return ipc.open_file(m).read_all().num_rows

        def ts_query():
            p = subprocess.run([a.bin, "sql", ds, q.format(t="transitions"), "--format", "arrow",
                                "--output", out_file, "--timer", "--repeat", str(a.repeat + 1)],
                               check=True, capture_output=True, text=True)
            runs = [l for l in p.stderr.splitlines() if l.startswith("run time: query ")]
            ms = [float(l.split()[3]) for l in runs[1:]]  # the first run warms up
            return min(ms) / 1e3, int(runs[-1].split(", ")[-1].split()[0])

        def duck(t):
            return lambda: con.sql(q.format(t=t)).to_arrow_table().num_rows

        def duck_file():
            table = con.sql(q.format(t="transitions")).to_arrow_table()
            with pa.OSFile(out_file, "wb") as f, ipc.new_file(f, table.schema) as w:
                w.write_table(table)
            return table.num_rows

        r = {"query": name, "transitions": transitions.num_rows, "episodes": episodes}
        for label, f in [("trajstore", ts), ("duckdb_arrow", duck("transitions")),
                         ("duckdb_arrow_file", duck_file),
                         ("duckdb_parquet", duck("transitions_pq"))]:
            f()  # warm-up (page cache, plan caches)
            secs, rows = best(f, a.repeat)
            r[label + "_s"] = round(secs, 4)
            r[label + "_rows"] = rows
        secs, rows = ts_query()
        r["trajstore_query_s"] = round(secs, 4)
        r["trajstore_query_rows"] = rows
        r["trajstore_over_duckdb_arrow"] = round(r["trajstore_s"] / r["duckdb_arrow_s"], 2)
        r["trajstore_query_over_duckdb_arrow"] = round(secs / r["duckdb_arrow_s"], 2)
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
