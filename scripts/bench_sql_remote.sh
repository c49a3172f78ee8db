#!/usr/bin/env bash
# `trajstore sql` on a URL (ranged GETs of the projected columns) against the same query after a
# pull (the mirror, memory-mapped), against a moto S3 server on this machine.
#
#   scripts/bench_sql_remote.sh BIN [TRANSITIONS] [WORKDIR]
#
# Writes a `demo` dataset (obs [17] f32, action [6] f32), pushes it to a fresh bucket, then for
# each query: (1) `sql URL Q --timer` with an empty cache (no pull), (2) `sql URL Q --pull` with an
# empty cache (pull, then query), (3) the same after the pull (the mirror is complete). Prints one
# line per run: wall seconds, peak RSS, and what the process says it fetched.
set -euo pipefail
BIN=$(realpath "$1")
N=${2:-10000000}
WORK=${3:-/tmp/bench-sql-remote}
PY=${TRAJSTORE_PYTHON:-$HOME/.cache/trajstore-py/bin/python}
mkdir -p "$WORK"
DS=$WORK/d$N.trajstore
[ -d "$DS" ] || "$BIN" demo "$DS" --transitions "$N" >/dev/null

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
echo "dataset: $N transitions, $(du -sb "$DS/segments" | cut -f1) bytes of segment files"

run() { # label, query, args...
  local label=$1 q=$2; shift 2
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "rss_kb=%M" "$BIN" sql "$URL" "$q" --timer --format csv "$@" \
    >"$WORK/out.csv" 2>"$WORK/err.txt"
  t1=$(date +%s.%N)
  printf '%-12s %-8s wall %6.2f s  %s | %s\n' "$label" "${*:-}" "$(echo "$t1 - $t0" | bc)" \
    "$(grep -o 'rss_kb=[0-9]*' "$WORK/err.txt")" \
    "$(grep -E 'fetched|pulled|run time' "$WORK/err.txt" | tr '\n' ' ')"
  head -3 "$WORK/out.csv" | tr '\n' ' '; echo
}

Q_PROJ="SELECT avg(vec_norm(observation)) AS n, max(fsl_get(action, 1)) AS a FROM transitions"
Q_AGG="SELECT episode_id, sum(reward) AS r, count(*) AS n FROM transitions GROUP BY episode_id ORDER BY r DESC LIMIT 3"
Q_REWARD="SELECT count(*) AS n, avg(reward) AS r FROM transitions WHERE step < 100"
Q_EP="SELECT count(*) AS n, avg(episode_return) AS r, max(length) AS l FROM episodes"
for pair in "projection:$Q_PROJ" "aggregate:$Q_AGG" "filtered:$Q_REWARD" "episodes:$Q_EP"; do
  label=${pair%%:*} q=${pair#*:}
  export TRAJSTORE_CACHE=$WORK/cache-$label
  rm -rf "$TRAJSTORE_CACHE"
  run "$label" "$q"
  rm -rf "$TRAJSTORE_CACHE"
  run "$label" "$q" --pull
  run "$label" "$q" --pull
  rm -rf "$TRAJSTORE_CACHE"
done
