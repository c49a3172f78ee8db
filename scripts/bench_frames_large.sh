#!/usr/bin/env bash
# Pixel observations from a dataset larger than RAM (issue 32): real Atari frames, tiled (each
# copy new episodes) until the compressed dataset is larger than this machine's memory, read cold
# against the raw-frame layout (also larger than memory) on the same disk, the disk's own
# random-read floor (same run), and TorchRL's memmap of the raw frames.
#
#   scripts/bench_frames_large.sh WORKDIR GAME.npz
#
# GAME.npz is written by ../shared/peers/atari_frames.py (ale-py + gymnasium's
# AtariPreprocessing); save it uncompressed (its default, np.savez), as every copy is read again.
# Needs root (the page cache is dropped before each cold run). Steps:
#   1. WORKDIR/GAME-zstd-dict: one copy ingested, its size on disk measured, then enough copies
#      for SIZE_FACTOR (default 1.05) x MemTotal ingested in one more `ingest` (a directory of
#      links to GAME.npz, read as shards: every copy is new episodes); `info --json`;
#   2. WORKDIR/GAME-none: the raw layout (7,056 B per frame), sized the same way;
#   3. cold (`sync; drop_caches`) `trajstore bench` of both: 32 x (4-stack) with --io-floor, and
#      256 x 64 x (4-stack) (ITERS/2 batches: fewer would time mostly the loader filling its first
#      462 MB buffers), and 256 x 64 again as frame windows (--frame-window: 67 frames per slice,
#      the stacks a view, as TorchRL's unfold view); peak RSS of each run (with /usr/bin/time);
#   4. the raw layout removed (KEEP=1 keeps it), then TorchRL's LazyMemmapStorage + SliceSampler
#      on as many copies as the raw layout, written once and mapped afresh, cold
#      (scripts/peer_torchrl_frames.py --cold).
# PHASES (default "ingest bench torchrl") runs only some of steps 1-2, 3 and 4 (e.g. the ingest
# while the machine is busy, the cold runs once it is quiet).
# Results: WORKDIR/large.jsonl (one JSON object per line, appended), and the lines on stdout.
set -euo pipefail
work="${1:?usage: bench_frames_large.sh WORKDIR GAME.npz}"
npz="$(realpath "${2:?usage: bench_frames_large.sh WORKDIR GAME.npz}")"
bin="${BIN:-target/release/trajstore}"
py="${PEER_PYTHON:-$HOME/.cache/trajstore-torch/bin/python}"
factor="${SIZE_FACTOR:-1.05}"
iters="${ITERS:-200}"
game="$(basename "$npz" .npz)"
mem=$(awk '/MemTotal/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
mkdir -p "$work"
out="$work/large.jsonl"
phases="${PHASES:-ingest bench torchrl}"
has() { case " $phases " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
emit() { echo "$1" >> "$out"; echo "$1"; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
ingest() {  # INPUT DATASET CODEC
    # Episodes from the flags (each copy's last row is truncated): the copies repeat the source's
    # episode ids, which an --episode-col ingest refuses (an id must not reappear).
    "$bin" ingest "$1" "$2" --observation-col frames --terminated-col terminated \
        --truncated-col truncated --drop-cols final_frame,episode --frame-codec "$3" --json
}
# Copies needed for factor x MemTotal, given the bytes of one copy.
copies() { awk -v m="$mem" -v f="$factor" -v b="$1" 'BEGIN { c = int(m * f / b) + 1; print (c < 1 ? 1 : c) }'; }
# Adds N-1 more copies of the npz to DATASET (one ingest of a directory of links).
more() {  # DATASET CODEC N
    local links="$work/$game-links"
    rm -rf "$links"; mkdir -p "$links"
    for i in $(seq 2 "$3"); do ln -s "$npz" "$links/$(printf 'copy_%05d.npz' "$i")"; done
    [ "$3" -lt 2 ] || ingest "$links" "$1" "$2"
    rm -rf "$links"
}
# Cold bench of DATASET with ARGS..., with the process's peak RSS.
cold_bench() {
    local ds="$1"; shift
    drop
    local t0 r rss=null
    t0=$(date +%s%N)
    if [ -x /usr/bin/time ]; then
        r="$(/usr/bin/time -f '%M' -o "$work/rss.txt" "$bin" bench "$ds" "$@" --json)"
        rss=$(( $(tail -n 1 "$work/rss.txt") * 1024 ))
    else
        r="$("$bin" bench "$ds" "$@" --json)"
    fi
    echo "{\"bench\":$r,\"peak_rss_bytes\":$rss,\"wall_ms\":$(( ($(date +%s%N) - t0) / 1000000 ))}"
}

for codec in zstd-dict none; do
    has ingest || break
    ds="$work/$game-$codec"
    rm -rf "$ds"
    t0=$(date +%s)
    ingest "$npz" "$ds" "$codec" > /dev/null
    sync
    one=$(du -sb "$ds" | cut -f1)
    n=$(copies "$one")
    more "$ds" "$codec" "$n" > /dev/null
    sync
    emit "{\"game\":\"$game\",\"codec\":\"$codec\",\"copies\":$n,\"mem_total_bytes\":$mem,\"dataset_bytes\":$(du -sb "$ds" | cut -f1),\"ingest_s\":$(( $(date +%s) - t0 )),\"info\":$("$bin" info "$ds" --json | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)))')}"
done
for codec in zstd-dict none; do
    has bench || break
    ds="$work/$game-$codec"
    emit "{\"game\":\"$game\",\"codec\":\"$codec\",\"slice_len\":1,\"num_slices\":32,\"cache\":\"cold, larger than RAM\",\"run\":$(cold_bench "$ds" \
        --io-floor --columns observation,action,reward --slice-len 1 --num-slices 32 --frame-stack 4 --iters "$iters")}"
    emit "{\"game\":\"$game\",\"codec\":\"$codec\",\"slice_len\":64,\"num_slices\":256,\"cache\":\"cold, larger than RAM\",\"run\":$(cold_bench "$ds" \
        --columns observation,action,reward --slice-len 64 --num-slices 256 --frame-stack 4 --iters $((iters / 2)))}"
    # The same as frame windows (each slice's 67 frames once; TorchRL's unfold view is the peer).
    if [ "$codec" = zstd-dict ]; then emit "{\"game\":\"$game\",\"codec\":\"$codec\",\"slice_len\":64,\"num_slices\":256,\"frame_window\":true,\"cache\":\"cold, larger than RAM\",\"run\":$(cold_bench "$ds" \
        --columns observation,action,reward --slice-len 64 --num-slices 256 --frame-stack 4 --frame-window --iters $((iters / 2)))}"; fi
done
has torchrl || exit 0
raw_copies=$(python3 -c "import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print([r['copies'] for r in rows if r.get('codec') == 'none' and 'copies' in r][-1])" "$out")
[ "${KEEP:-0}" = 1 ] || rm -rf "$work/$game-none"
if "$py" -c "import torchrl" 2>/dev/null; then
    "$py" "$(dirname "$0")/peer_torchrl_frames.py" "$npz" --tile "$raw_copies" --iters 20 --tmp "$work" --cold 2>/dev/null \
        | grep '^{' | while read -r line; do emit "{\"game\":\"$game\",\"cache\":\"cold, larger than RAM\",\"peer\":$line}"; done
else
    echo "(no torchrl in $py: TorchRL figures skipped)" >&2
fi
