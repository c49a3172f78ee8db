#!/usr/bin/env bash
# Open cost and memory against dataset size: writes demo datasets of the given sizes and reports
# `trajstore info` open time (manifest + episode tables + segment footers) and peak RSS of the
# whole process (from /usr/bin/time), cold-ish (page cache dropped when possible) and warm.
#   scripts/bench_open.sh DIR "10000000:17:6 100000000:4:1"
set -euo pipefail
bin="${BIN:-target/release/trajstore}"
dir="${1:?usage: bench_open.sh DIR \"N:OBS:ACT ...\"}"
sizes="${2:-10000000:17:6 100000000:4:1}"
mkdir -p "$dir"
for spec in $sizes; do
    IFS=: read -r n obs act <<<"$spec"
    ds="$dir/open-$n-$obs.trajstore"
    if [ ! -d "$ds" ]; then
        /usr/bin/time -f "write_s=%e write_maxrss_kb=%M" "$bin" demo "$ds" --transitions "$n" --obs-dim "$obs" --act-dim "$act" --json >/dev/null
    fi
    for run in 1 2 3; do
        /usr/bin/time -f "maxrss_kb=%M" -o "$dir/time.txt" "$bin" info "$ds" --json > "$dir/info.json"
        python3 - "$dir/info.json" "$dir/time.txt" "$n" "$obs" <<'PY'
import json, sys
info = json.load(open(sys.argv[1]))
rss = int(open(sys.argv[2]).read().strip().split("=")[1])
print(json.dumps({"transitions": info["transitions"], "obs_dim": int(sys.argv[4]),
                  "episodes": info["episodes"], "segments": info["segments"],
                  "bytes_on_disk": info["bytes_on_disk"], "open_ms": round(info["open_ms"], 2),
                  "process_max_rss_mib": round(rss / 1024, 1)}))
PY
    done
done
