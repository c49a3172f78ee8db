#!/usr/bin/env bash
# The streaming loader (`trajstore stream`) against a moto S3 server on this machine: batches/s
# with a cache of 1/4 of the dataset against the same loader with the whole version cached (what
# a local dataset gives), the same with --follow, and the bytes each rank downloads per epoch with
# 1, 2 and 4 ranks.
#
#   scripts/bench_stream.sh BIN [TRANSITIONS] [WORKDIR]
#
# Writes a `demo` dataset (obs [17] f32, action [6] f32) in 32 MiB segments and pushes it to a
# fresh bucket. Batches are 256 slices x 64 steps of observation, action, reward; 4 workers.
set -euo pipefail
BIN=$(realpath "$1")
N=${2:-5000000}
WORK=${3:-/tmp/bench-stream}
PY=${TRAJSTORE_PYTHON:-$HOME/.cache/trajstore-py/bin/python}
mkdir -p "$WORK"
DS=$WORK/d$N.trajstore
[ -d "$DS" ] || "$BIN" demo "$DS" --transitions "$N" --segment-size 32MiB >/dev/null
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$PY" -m moto.server -H 127.0.0.1 -p "$PORT" >/dev/null 2>&1 &
MOTO=$!
trap 'kill $MOTO' EXIT
until curl -s -o /dev/null "http://127.0.0.1:$PORT/"; do sleep 0.2; done
curl -s -X PUT "http://127.0.0.1:$PORT/bench" >/dev/null
export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT AWS_ALLOW_HTTP=true AWS_REGION=us-east-1 \
  AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench
URL=s3://bench/d$N
"$BIN" push "$DS" "$URL" >/dev/null
BYTES=$(du -sb --apparent-size "$DS/segments" | cut -f1)
echo "dataset: $N transitions, $BYTES bytes of segment files, $(ls "$DS"/segments/*[0-9].arrow | wc -l) segments"

summary() { # the JSON of one run -> one line
  "$PY" -c '
import json, sys
j = json.load(sys.stdin); s = j["stats"]; M = 2**20
print("%6d batches %8.0f batches/s  downloaded %8.1f MiB in %3d files  evicted %3d  peak cache %7.1f of %7.1f MiB  waited %.2f s  first batch %.2f s" % (
    j["batches"], j["batches_per_second"], s["bytes_downloaded"] / M, s["files_downloaded"],
    s["files_evicted"], s["peak_cache_bytes"] / M, s["cache_limit"] / M, s["wait_seconds"],
    j["first_batch_seconds"] or 0))'
}
stream() { # label, cache dir, args...
  local label=$1 cache=$2; shift 2
  printf '%-34s ' "$label"
  TRAJSTORE_CACHE=$cache "$BIN" stream "$URL" --json --workers 4 "$@" | summary
}

B=${BATCHES:-3000}
rm -rf "$WORK/cache-full" "$WORK/cache-quarter"*
stream "whole version cached (cold)" "$WORK/cache-full" --cache-limit "$BYTES" --batches "$B"
stream "whole version cached (warm)" "$WORK/cache-full" --cache-limit "$BYTES" --batches "$B"
for reuse in 4 16 64; do
  stream "1/4 cache, reuse $reuse" "$WORK/cache-quarter-$reuse" --cache-limit $((BYTES / 4)) --reuse "$reuse" --batches "$B"
done
# Following (no version is pushed meanwhile): the cost of looking for one at every round boundary.
stream "1/4 cache, reuse 4, --follow" "$WORK/cache-quarter-follow" --cache-limit $((BYTES / 4)) --reuse 4 --batches "$B" --follow
for world in 1 2 4; do
  total=0
  for rank in $(seq 0 $((world - 1))); do
    cache=$WORK/cache-epoch-$world
    rm -rf "$cache"
    line=$(TRAJSTORE_CACHE=$cache "$BIN" stream "$URL" --json --workers 4 --sampling epoch \
      --cache-limit $((BYTES / 2)) --rank "$rank" --world-size "$world")
    got=$(echo "$line" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["stats"]["bytes_downloaded"])')
    total=$((total + got))
    printf '%-34s ' "epoch, rank $rank of $world"; echo "$line" | summary
  done
  echo "epoch with $world ranks: $total bytes downloaded in total ($(echo "scale=3; $total / $BYTES" | bc) x the dataset)"
done
