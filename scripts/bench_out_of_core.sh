#!/usr/bin/env bash
# Sampling a dataset that does not fit in memory, against the disk's own random-read limit and
# against Lance, all in one run with the page cache dropped before each measurement.
#
#   scripts/bench_out_of_core.sh DIR
#
# Environment (all optional):
#   TRANSITIONS=300000000      transitions of the `demo` dataset written into DIR (once)
#   DEMO_ARGS="..."            extra `demo` arguments, e.g. "--obs-shape 84,84,4 --obs-dtype uint8"
#   BENCH_ARGS="..."           extra `bench` arguments, e.g. "--num-slices 32 --slice-len 16"
#   ITERS=200                  `bench --iters` (the loader then times ITERS batches nobody read)
#   MEM_LIMIT=8G               run every measured process in a memory cgroup of this size
#                              (page cache included): a machine with that much RAM, for datasets
#                              that fit this machine's disk twice but not its RAM 1.25 times
#   LANCE=1                    also convert the dataset to Lance and run ../shared/peers'
#                              lance_sampler.py on the same windows (needs ~/.cache/lance-venv,
#                              see ../shared/peers/README.md; disk: as much again as the dataset)
#   ROUNDS=1                   measurement rounds; the system that goes first alternates
#   KEEP=1                     keep the datasets afterwards (default: delete them)
#   BIN=target/release/trajstore
#
# Needs root (drop_caches, cgroups). Writes DIR/results.jsonl and prints a summary.
set -euo pipefail
dir="${1:?usage: bench_out_of_core.sh DIR}"
bin="${BIN:-target/release/trajstore}"
n="${TRANSITIONS:-300000000}"
iters="${ITERS:-200}"
rounds="${ROUNDS:-1}"
peers="${PEERS:-$(cd "$(dirname "$0")/../.." && pwd)/shared/peers}"
lance_py="${LANCE_PY:-$HOME/.cache/lance-venv/bin/python}"
mkdir -p "$dir"
ds="$dir/ooc.trajstore"
lance_ds="$dir/ooc.lance"
episodes="$dir/ooc.episodes.npz"
out="$dir/results.jsonl"
: > "$out"

if [ "$(id -u)" != 0 ]; then
    echo "bench_out_of_core.sh: needs root to drop the page cache" >&2
    exit 1
fi

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
pgpgin_kib() { awk '$1 == "pgpgin" { print $2 }' /proc/vmstat; }

cg=""
if [ -n "${MEM_LIMIT:-}" ]; then
    cg=/sys/fs/cgroup/memory/trajstore-ooc
    mkdir -p "$cg"
    echo "$MEM_LIMIT" > "$cg/memory.limit_in_bytes"
fi
# Runs "$@" inside the memory cgroup when there is one.
run() {
    if [ -n "$cg" ]; then
        bash -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$cg" "$@"
    else
        "$@"
    fi
}
# One measured run: drops the cache, runs "$@" (which prints one JSON line), and appends that
# line with the system's disk reads during the run (pgpgin) and the wall time to results.jsonl.
measure() {
    local name="$1"
    shift
    drop
    local before t0 t1 after json
    before=$(pgpgin_kib)
    t0=$(date +%s.%N)
    json=$(run "$@")
    t1=$(date +%s.%N)
    after=$(pgpgin_kib)
    python3 - "$name" "$before" "$after" "$t0" "$t1" "$json" >> "$out" <<'PY'
import json, sys
name, before, after, t0, t1, js = sys.argv[1:]
line = json.loads(js.strip().splitlines()[-1])
print(json.dumps({"system": name, "disk_read_bytes": (int(after) - int(before)) * 1024,
                  "process_wall_s": float(t1) - float(t0), "result": line}))
PY
}

if [ ! -d "$ds" ]; then
    echo "writing $n transitions to $ds" >&2
    # shellcheck disable=SC2086
    "$bin" demo "$ds" --transitions "$n" ${DEMO_ARGS:-} --json > "$dir/demo.json"
fi
"$bin" info "$ds" --json > "$dir/info.json"
if [ -n "${LANCE:-}" ] && [ ! -d "$lance_ds" ]; then
    echo "converting to Lance: $lance_ds" >&2
    "$lance_py" "$peers/convert_to_lance.py" "$ds" "$lance_ds" "$episodes" > "$dir/lance_convert.json"
fi

trajstore_run() {
    # shellcheck disable=SC2086
    measure trajstore "$bin" bench "$ds" --io-floor --iters "$iters" ${BENCH_ARGS:-} --json
}
lance_run() {
    local slices len
    slices=$(python3 -c "import sys; a=sys.argv[1].split(); print(a[a.index('--num-slices')+1] if '--num-slices' in a else 256)" "${BENCH_ARGS:-}")
    len=$(python3 -c "import sys; a=sys.argv[1].split(); print(a[a.index('--slice-len')+1] if '--slice-len' in a else 64)" "${BENCH_ARGS:-}")
    measure lance "$lance_py" "$peers/lance_sampler.py" "$lance_ds" "$episodes" \
        --num-slices "$slices" --slice-len "$len" --batches 50 --first 50 \
        --threads 2 --thread-batches "$iters"
}

for ((r = 0; r < rounds; r++)); do
    if [ -n "${LANCE:-}" ] && ((r % 2 == 1)); then
        lance_run
        trajstore_run
    else
        trajstore_run
        [ -n "${LANCE:-}" ] && lance_run
    fi
done

python3 - "$out" "$dir/info.json" "${MEM_LIMIT:-}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
info = json.load(open(sys.argv[2]))
mem = sys.argv[3]
total = int(open("/proc/meminfo").readline().split()[1]) * 1024
ram = mem or f"{total / 2**30:.1f} GiB (all of this machine's RAM)"
print(f"dataset: {info['transitions']:,} transitions, {info['episodes']:,} episodes, "
      f"{info['bytes_on_disk'] / 1e9:.1f} GB on disk; memory: {ram}")
for r in rows:
    j = r["result"]
    if r["system"] == "trajstore":
        f = j.get("io_floor") or {}
        print(
            f"trajstore: open+first batch {j['open_and_first_batch_ms']:.0f} ms, "
            f"first 50 batches {j.get('first_50_batches_s', float('nan')):.2f} s, "
            f"loader {j['loader_batches_per_s']:.1f} batches/s "
            f"(floor {j.get('floor_batches_per_s', float('nan')):.1f}: "
            f"{100 * j.get('loader_over_floor', float('nan')):.0f}%; runs floor "
            f"{(j.get('io_floor') or {}).get('runs_floor_batches_per_s', float('nan')):.1f}: "
            f"{100 * (j.get('loader_over_runs_floor') or float('nan')):.0f}%), "
            f"pages/batch {j.get('pages_per_batch', float('nan')):.0f} "
            f"in {j.get('page_runs_per_batch', float('nan')):.0f} runs, "
            f"loader disk read/batch {j.get('loader_disk_bytes_per_batch', float('nan')) / 2**20:.2f} MiB, "
            f"anon RSS {j['rss_anon_mib']:.0f} MiB; process {r['process_wall_s']:.1f} s, "
            f"{r['disk_read_bytes'] / 1e9:.2f} GB read"
        )
    else:
        s, t = j["single"], j.get("threads") or {}
        nb = s["batches"] + (t.get("batches") or 0)
        print(
            f"lance:     open+first batch {1e3 * (j['open_s'] + s['first_batch_ms'] / 1e3):.0f} ms, "
            f"first 50 batches {s['open_plus_first_k_s']:.2f} s, "
            f"{t.get('threads', 0)} threads {t.get('batches_per_s', float('nan')):.1f} batches/s "
            f"(after first 50: {t.get('after_first_k_batches_per_s') or float('nan'):.1f}), "
            f"disk read/batch {r['disk_read_bytes'] / max(nb, 1) / 2**20:.2f} MiB, "
            f"RSS {j['rss_mib'].get('RssAnon', float('nan')):.0f} MiB anon; "
            f"process {r['process_wall_s']:.1f} s, {r['disk_read_bytes'] / 1e9:.2f} GB read"
        )
PY

if [ -z "${KEEP:-}" ]; then
    rm -rf "$ds" "$lance_ds" "$episodes"
fi
