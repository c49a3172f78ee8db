#!/usr/bin/env bash
# trajstore against LeRobot's own reader (`LeRobotDataset` + a torch `DataLoader`) on the same
# LeRobot v3 dataset, in the same run (issue 33):
#
#   1. LeRobot's own writer makes the dataset (scripts/peer_lerobot.py make: AV1 MP4s, data/,
#      meta/), in the venv of scripts/setup-lerobot-peer.sh (Python 3.12, lerobot[dataset]);
#   2. `trajstore ingest DIR DS --json` decodes its cameras into frame columns;
#   3. bytes on disk (du -sb): the LeRobot directory, its MP4s, the trajstore dataset;
#   4. batches of B slices of L steps, every camera's frames decoded, both ways, alternately,
#      ROUNDS times with the page cache warm, then (as root, unless --no-cold) once each with it
#      dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) before each side:
#      - trajstore: `trajstore bench DS --slice-len L --num-slices B --workers W --columns
#        observation,action,reward,<cameras>` (its loader phase: W gather threads; the frame
#        columns are decoded into each batch);
#      - LeRobot: scripts/peer_lerobot.py bench (`delta_timestamps` of L steps for every camera,
#        state, action and reward; `DataLoader(batch_size=B, shuffle=True, num_workers=W)`;
#        video_backend="pyav", uint8 frames);
#   5. a table: slices/s (LeRobot's samples/s), decoded frames/s (slices x L x cameras) of each,
#      and trajstore / LeRobot per round (the issue's target: >= 5x), with the 1-min load
#      average before each run (the machine may be shared).
#
# The commands BENCHMARKS.md reports ("Against LeRobot's own reader"; trajstore built with the
# `video` feature: `scripts/setup-video.sh && cargo build --release --features video`):
#
#   BIN=target/release/trajstore scripts/bench_lerobot.sh --work /tmp/lrbench \
#       --episodes 30 --frames 200 --height 96 --width 128 --slice-len 16
#   BIN=target/release/trajstore scripts/bench_lerobot.sh --work /tmp/lrbench240 \
#       --episodes 10 --frames 200 --height 240 --width 320 --slice-len 8 --lerobot-batches 4
#
# Disk: the trajstore dataset holds the decoded frames (only 1.1-1.2x smaller than raw RGB), e.g. 383 MiB
# and 712 MiB for those two; the LeRobot venv is ~2 GB (more without the torch venv to link).
#
# Options (defaults in brackets):
#   --work DIR        where the datasets and JSON results go [/tmp/trajstore-lerobot-bench]
#   --episodes N      episodes [30]          --frames T   steps per episode [200]
#   --height H        frame height [96]      --width W    frame width [128]
#   --cameras C       cameras, 1 to 4 [2]    --fps F      [30]
#   --slice-len L     steps per slice [16]   --batch B    slices per batch [256]
#   --workers W       trajstore loader threads and DataLoader workers [2]
#   --iters N         trajstore bench --iters (its loader phase times N batches) [10]
#   --lerobot-batches N  timed DataLoader batches, after 2 warm-up batches [6]
#   --rounds R        warm rounds, each trajstore then LeRobot [2]
#   --no-cold         skip the cold runs (they need root to drop the page cache)
#   --reuse           keep an existing LeRobot dataset and trajstore dataset in --work
# Environment: BIN (the trajstore binary, with the `video` feature) [target/release/trajstore];
# LEROBOT_PYTHON (an interpreter with lerobot) [the one scripts/setup-lerobot-peer.sh prints].
# Prints progress on stderr and the table on stdout; --work keeps every JSON (ingest.json,
# sizes.json, trajstore-*.json, lerobot-*.json, summary.json).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work=/tmp/trajstore-lerobot-bench
episodes=30 frames=200 height=96 width=128 cameras=2 fps=30
slice_len=16 batch=256 workers=2 iters=10 lr_batches=6 rounds=2 cold=1 reuse=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --work) work="$2"; shift ;;
        --episodes) episodes="$2"; shift ;;
        --frames) frames="$2"; shift ;;
        --height) height="$2"; shift ;;
        --width) width="$2"; shift ;;
        --cameras) cameras="$2"; shift ;;
        --fps) fps="$2"; shift ;;
        --slice-len) slice_len="$2"; shift ;;
        --batch) batch="$2"; shift ;;
        --workers) workers="$2"; shift ;;
        --iters) iters="$2"; shift ;;
        --lerobot-batches) lr_batches="$2"; shift ;;
        --rounds) rounds="$2"; shift ;;
        --no-cold) cold=0 ;;
        --reuse) reuse=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
bin="${BIN:-target/release/trajstore}"
[ -x "$bin" ] || { echo "error: no trajstore binary at $bin (set BIN; it needs --features video)" >&2; exit 1; }
py="${LEROBOT_PYTHON:-$("$here/setup-lerobot-peer.sh" | tail -n1)}"
peer="$here/peer_lerobot.py"
mkdir -p "$work"
lr="$work/lerobot"
ds="$work/lerobot.trajstore"
log() { echo "== $*" >&2; }

if [ "$reuse" = 1 ] && [ -f "$lr/meta/info.json" ]; then
    log "reusing $lr"
else
    rm -rf "$lr" "$ds"
    log "LeRobot's writer: $episodes episodes x $frames steps, $cameras cameras of ${height}x${width} -> $lr"
    "$py" "$peer" make "$lr" --episodes "$episodes" --frames "$frames" --height "$height" \
        --width "$width" --cameras "$cameras" --fps "$fps" 2>"$work/make.log" | tee "$work/make.json" >&2
fi
if [ "$reuse" = 1 ] && [ -d "$ds/_versions" ]; then
    log "reusing $ds"
else
    rm -rf "$ds"
    log "trajstore ingest $lr $ds"
    "$bin" ingest "$lr" "$ds" --json | tee "$work/ingest.json" >&2
fi

# The camera columns, in the LeRobot dataset's order.
cams=$("$py" -c 'import json, sys; f = json.load(open(sys.argv[1]))["features"]; print(",".join(k for k, v in f.items() if v["dtype"] == "video"))' "$lr/meta/info.json")
steps=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["total_frames"])' "$lr/meta/info.json")
shape=$("$py" -c 'import json, sys; f = json.load(open(sys.argv[1]))["features"]; print(next(v["shape"] for v in f.values() if v["dtype"] == "video"))' "$lr/meta/info.json")
mp4=$(find "$lr/videos" -name '*.mp4' -print0 | du -cb --files0-from=- | tail -n1 | cut -f1)
printf '{"lerobot_dir_bytes": %s, "lerobot_mp4_bytes": %s, "trajstore_bytes": %s, "steps": %s, "cameras": "%s", "frame_shape": %s}\n' \
    "$(du -sb "$lr" | cut -f1)" "$mp4" "$(du -sb "$ds" | cut -f1)" "$steps" "$cams" "$shape" > "$work/sizes.json"
cat "$work/sizes.json" >&2

trajstore_bench() {  # $1: result name
    log "trajstore bench ($1)"
    cut -d' ' -f1 /proc/loadavg > "$work/trajstore-$1.load"
    "$bin" bench "$ds" --slice-len "$slice_len" --num-slices "$batch" --workers "$workers" \
        --iters "$iters" --columns "observation,action,reward,$cams" --json > "$work/trajstore-$1.json"
}
lerobot_bench() {  # $1: result name
    log "LeRobotDataset + DataLoader ($1)"
    cut -d' ' -f1 /proc/loadavg > "$work/lerobot-$1.load"
    "$py" "$peer" bench "$lr" --slice-len "$slice_len" --batch "$batch" --workers "$workers" \
        --batches "$lr_batches" 2>"$work/lerobot-$1.log" > "$work/lerobot-$1.json" \
        || { cat "$work/lerobot-$1.log" >&2; exit 1; }
}
drop_caches() {
    sync
    echo 3 > /proc/sys/vm/drop_caches
}

rm -f "$work"/trajstore-*.json "$work"/trajstore-*.load "$work"/lerobot-*.json "$work"/lerobot-*.load \
    "$work"/lerobot-*.log "$work/summary.json"
for r in $(seq 1 "$rounds"); do
    trajstore_bench "warm-$r"
    lerobot_bench "warm-$r"
done
if [ "$cold" = 1 ]; then
    if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ]; then
        drop_caches; trajstore_bench cold
        drop_caches; lerobot_bench cold
    else
        log "not root (or /proc/sys/vm/drop_caches not writable): no cold runs"
    fi
fi

"$py" - "$work" "$slice_len" "$batch" "$workers" "$(uptime)" <<'EOF'
import json, sys
from pathlib import Path

work, L, B, W, uptime = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sizes = json.loads((work / "sizes.json").read_text())
ncam = len(sizes["cameras"].split(","))
h, w, c = sizes["frame_shape"]
raw = sizes["steps"] * ncam * h * w * c
rows, summary = [], {"sizes": sizes, "raw_frame_bytes": raw, "slice_len": L, "batch": B, "workers": W, "runs": []}
def load(name):
    p = work / f"{name}.load"
    return float(p.read_text()) if p.exists() else float("nan")


tags = sorted((p.stem.removeprefix("trajstore-") for p in work.glob("trajstore-*.json")),
              key=lambda t: (t == "cold", t))
for tag in tags:
    ts = json.loads((work / f"trajstore-{tag}.json").read_text())
    lrp = work / f"lerobot-{tag}.json"
    lr = json.loads(lrp.read_text()) if lrp.exists() else None
    ts_slices = ts["loader_batches_per_s"] * B
    ts_single = 1e6 / ts["sample_median_us"] * B
    run = {"run": tag, "trajstore_slices_per_s": ts_slices, "trajstore_frames_per_s": ts_slices * L * ncam,
           "trajstore_single_thread_slices_per_s": ts_single,
           "trajstore_open_and_first_batch_s": ts["open_and_first_batch_ms"] / 1e3,
           "trajstore_disk_read_bytes": sum(p["disk_read_bytes"] for p in ts["phases"].values()),
           "trajstore_load_before": load(f"trajstore-{tag}")}
    if lr:
        run |= {"lerobot_slices_per_s": lr["slices_per_s"], "lerobot_frames_per_s": lr["frames_per_s"],
                "lerobot_first_batch_s": lr["first_batch_s"],
                "lerobot_load_before": load(f"lerobot-{tag}"), "ratio": ts_slices / lr["slices_per_s"],
                "lerobot": lr["lerobot"], "torch": lr["torch"], "backend": lr["backend"]}
    summary["runs"].append(run)
(work / "summary.json").write_text(json.dumps(summary, indent=1))

mib = 1 << 20
print(f"dataset: {sizes['steps']} steps x {ncam} cameras of {h}x{w}x{c}; slices of {L} steps, batches of {B}, {W} workers")
print(f"bytes on disk: raw frames {raw / mib:,.1f} MiB | LeRobot dir {sizes['lerobot_dir_bytes'] / mib:,.1f} MiB "
      f"(MP4s {sizes['lerobot_mp4_bytes'] / mib:,.1f} MiB, {sizes['lerobot_mp4_bytes'] / (sizes['steps'] * ncam):,.0f} B/frame) | "
      f"trajstore {sizes['trajstore_bytes'] / mib:,.1f} MiB ({sizes['trajstore_bytes'] / (sizes['steps'] * ncam):,.0f} B/frame)")
print("first batch: trajstore's open + first batch (one thread); LeRobot's dataset opened, workers started, first batch")
print(f"{'run':<8} {'system':<10} {'load':>5} {'slices/s':>10} {'frames/s':>11} {'first batch':>12}   trajstore/LeRobot")
for r in summary["runs"]:
    print(f"{r['run']:<8} {'trajstore':<10} {r['trajstore_load_before']:>5.1f} {r['trajstore_slices_per_s']:>10,.1f} {r['trajstore_frames_per_s']:>11,.0f} "
          f"{r['trajstore_open_and_first_batch_s']:>11.2f}s")
    if "lerobot_slices_per_s" in r:
        print(f"{'':<8} {'LeRobot':<10} {r['lerobot_load_before']:>5.1f} {r['lerobot_slices_per_s']:>10,.1f} {r['lerobot_frames_per_s']:>11,.0f} "
              f"{r['lerobot_first_batch_s']:>11.2f}s   {r['ratio']:.1f}x (target >= 5x)")
lrv = next((r for r in summary["runs"] if "lerobot" in r), None)
if lrv:
    print(f"lerobot {lrv['lerobot']}, torch {lrv['torch']}, video_backend={lrv['backend']}; "
          f"load: 1-min load average before each run; at the end: {uptime.strip()}")
EOF
