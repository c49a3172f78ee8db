#!/usr/bin/env bash
# A loader that follows a growing dataset against the same loader on a static one (issue 22):
# `trajstore bench --follow 1` while another process commits new episodes every second, set
# against `trajstore bench` with no writer and against `trajstore bench` (not following) with the
# same writer running (the writer's own CPU on this 2-core machine, apart from following),
# alternated ROUNDS times; and what a loader state costs (bytes, save, resume) as `bench` reports.
#
#   scripts/bench_follow.sh BIN [TRANSITIONS] [ITERS] [ROUNDS] [WORKDIR]
#
# The collector is `trajstore demo DATASET --append` (one commit of 20,000 transitions per
# process, then a 1 s pause), a separate process as a live collector is. Batches are 256 slices x
# 64 steps of observation, action, reward; 2 workers (this machine has 2 cores).
set -euo pipefail
BIN=$(realpath "$1")
N=${2:-10000000}
ITERS=${3:-20000}
ROUNDS=${4:-3}
WORK=${5:-/tmp/bench-follow}
mkdir -p "$WORK"
DS=$WORK/d$N.trajstore
rm -rf "$DS"
"$BIN" demo "$DS" --transitions "$N" >/dev/null
collector() {
    local i=1000
    while :; do
        "$BIN" demo "$DS" --append --transitions 20000 --seed $i >/dev/null
        i=$((i + 1))
        sleep 1
    done
}
field() { python3 -c "import json,sys; v=json.loads(sys.argv[1]); print(eval(sys.argv[2], {}, v))" "$1" "$2"; }
for r in $(seq "$ROUNDS"); do
    s=$("$BIN" bench "$DS" --iters "$ITERS" --json)
    collector &
    C=$!
    w=$("$BIN" bench "$DS" --iters "$ITERS" --json)
    f=$("$BIN" bench "$DS" --iters "$ITERS" --follow 1 --json)
    kill $C; wait $C 2>/dev/null || true
    echo "round $r: static $(field "$s" 'round(loader_batches_per_s)') batches/s;" \
        "static with the writer running $(field "$w" 'round(loader_batches_per_s)') batches/s;" \
        "following $(field "$f" 'round(loader_batches_per_s)') batches/s" \
        "(versions $(field "$f" 'loader_follow["first_version"]') to $(field "$f" 'loader_follow["last_version"]')," \
        "$(field "$f" 'loader_follow["refreshes"]') refreshes taking $(field "$f" 'round(loader_follow["refresh_seconds"] * 1e3)') ms, $(field "$f" 'round(phases["loader"]["secs"], 1)') s);" \
        "following / static $(field "$f" "round(loader_batches_per_s / $(field "$s" loader_batches_per_s), 3)");" \
        "state $(field "$f" state_bytes) bytes, save $(field "$f" 'round(state_save_us)') us, resume $(field "$f" 'round(state_resume_ms, 2)') ms"
done
