#!/usr/bin/env bash
# Opening and sampling a frame dataset cold, two trajstore binaries alternated (e.g. before and
# after a change), each case after `drop_caches`: `info` (time, peak RSS, major faults), `bench`
# at 32 x (4-stack), and the same bench inside a v1 memory cgroup. Needs root (drop_caches,
# cgroups). One JSON line per case on stdout.
#
#   scripts/bench_frame_open.sh DATASET BIN_A BIN_B [REPEATS=2] [CGROUP_LIMIT=2G] [ITERS=2000]
set -euo pipefail
if [ $# -lt 3 ]; then
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
dataset=$1 a=$2 b=$3 reps=${4:-2} limit=${5:-2G} iters=${6:-2000}
cg=/sys/fs/cgroup/memory/trajstore-bench-open
mkdir -p "$cg"
echo "$limit" > "$cg/memory.limit_in_bytes"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep 2; }
limited() { ( echo "$BASHPID" > "$cg/cgroup.procs"; exec "$@" ); }
bench=(bench "$dataset" --frame-stack 4 --columns observation,action,reward --slice-len 1
       --num-slices 32 --iters "$iters" --json)
for rep in $(seq "$reps"); do
    for bin in "$a" "$b"; do
        drop
        t=$({ /usr/bin/time -f '%e %M %F' "$bin" info "$dataset" --json > /dev/null; } 2>&1 | tail -1)
        read -r secs rss_kb faults <<< "$t"
        echo "{\"rep\":$rep,\"bin\":\"$bin\",\"what\":\"info\",\"secs\":$secs,\"max_rss_kib\":$rss_kb,\"major_faults\":$faults}"
        drop
        echo "{\"rep\":$rep,\"bin\":\"$bin\",\"what\":\"bench\",\"bench\":$("$bin" "${bench[@]}" 2>/dev/null | tail -1)}"
        drop
        echo "{\"rep\":$rep,\"bin\":\"$bin\",\"what\":\"cgroup $limit\",\"bench\":$(limited "$bin" "${bench[@]}" 2>/dev/null | tail -1)}"
    done
done
