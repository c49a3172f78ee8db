#!/usr/bin/env bash
# Pixel observations on real Atari frames (issue 32): bytes per frame, decode rate, and batches/s
# of frame stacks against the raw-frame layout on the same disk and against TorchRL, same run.
#
#   scripts/bench_frames.sh WORKDIR GAME.npz [GAME.npz ...]
#
# Each GAME.npz is written by ../shared/peers/atari_frames.py (ale-py + gymnasium's
# AtariPreprocessing: 84x84 grayscale, frame skip 4, sticky actions). TILE copies
# (default 2) of its episodes are ingested, as new episodes, into:
#   WORKDIR/GAME-zstd-dict  frames compressed with a dictionary trained on the first frames
#   WORKDIR/GAME-none       the raw-frame layout (7,056 B per frame, stored once)
# then, per game:
#   - bytes per frame of each layout (`info --json`), against the source .npz and raw stacks;
#   - frames decoded per second on one core (RAYON_NUM_THREADS=1, 256 x 64 single frames);
#   - batches/s of 32 x (4-stack) and 256 x 64 x (4-stack), warm and cold (page cache dropped
#     before the run: needs root), for both layouts, with `trajstore bench` (its `loader`
#     figure: workers sampling and decoding ahead);
#   - 256 x 64 x (4-stack) as frame windows (--frame-window: each slice's 67 frames once, the
#     stacks a view; TorchRL's unfold view is its peer), warm and cold;
#   - channels-last stacks ([H, W, K], --channels-last) of 32 x (4-stack), warm;
#   - TorchRL (PEER_PYTHON with torchrl): LazyMemmapStorage + SliceSampler on the same frames,
#     warm and cold, and CompressedListStorage (scripts/peer_torchrl_frames.py);
#   - Lance (LANCE_PYTHON with pylance and zstandard): the same compressed frames (the zstd-dict
#     dataset's dictionary) in a Lance binary column, `take` + decode, warm and cold
#     (scripts/peer_lance_frames.py);
#   - with MEM_LIMIT (e.g. 64M; needs root and the cgroup v1 memory controller): 32 x (4-stack)
#     read through a memory cgroup of that size, smaller than the compressed dataset, so that
#     every system reads from disk all along (a dataset larger than RAM): trajstore zstd-dict
#     (with --io-floor: the disk's random-read floor, same run), trajstore raw frames, TorchRL's
#     memmap and Lance.
# Results: WORKDIR/results.jsonl (one JSON object per line), and a summary on stdout.
set -euo pipefail
work="${1:?usage: bench_frames.sh WORKDIR GAME.npz [GAME.npz ...]}"
shift
bin="${BIN:-target/release/trajstore}"
py="${PEER_PYTHON:-$HOME/.cache/trajstore-torch/bin/python}"
lance_py="${LANCE_PYTHON:-$HOME/.cache/lance-venv/bin/python}"
cgroup=""
if [ -n "${MEM_LIMIT:-}" ]; then
    cgroup=/sys/fs/cgroup/memory/trajstore-bench-frames
    mkdir -p "$cgroup"
    echo "$MEM_LIMIT" > "$cgroup/memory.limit_in_bytes"
fi
# Runs a command inside the memory cgroup.
limited() { ( echo "$BASHPID" > "$cgroup/cgroup.procs"; exec "$@" ); }
tile="${TILE:-2}"
iters="${ITERS:-200}"
mkdir -p "$work"
out="$work/results.jsonl"
: > "$out"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop the page cache: cold figures are warm)" >&2; }
emit() { echo "$1" >> "$out"; echo "$1"; }

for npz in "$@"; do
    game="$(basename "$npz" .npz)"
    for codec in zstd-dict none; do
        ds="$work/$game-$codec"
        rm -rf "$ds"
        for _ in $(seq "$tile"); do
            "$bin" ingest "$npz" "$ds" --observation-col frames --episode-col episode \
                --terminated-col terminated --truncated-col truncated --drop-cols final_frame \
                --frame-codec "$codec" --json > /dev/null
        done
        sync  # the raw layout's gigabytes written back now, not during the next game's warm runs
        info="$("$bin" info "$ds" --json)"
        emit "{\"game\":\"$game\",\"codec\":\"$codec\",\"info\":$info,\"npz_bytes\":$(stat -c %s "$npz")}"
    done
    # Decoded frames per second on one core: single frames, 256 x 64 per batch.
    emit "{\"game\":\"$game\",\"decode_one_core\":$(RAYON_NUM_THREADS=1 "$bin" bench "$work/$game-zstd-dict" \
        --columns observation --slice-len 64 --num-slices 256 --iters 20 --workers 1 --json)}"
    for shape in "1 32 $iters" "64 256 $((iters / 10))"; do
        read -r len slices n <<< "$shape"
        for codec in zstd-dict none; do
            for cache in warm cold; do
                # warm: the dataset read into the page cache first (--prefault); cold: dropped.
                if [ "$cache" = cold ]; then drop; prefault=""; else prefault="--prefault"; fi
                r="$("$bin" bench "$work/$game-$codec" $prefault --columns observation,action,reward \
                    --slice-len "$len" --num-slices "$slices" --frame-stack 4 --iters "$n" --json)"
                emit "{\"game\":\"$game\",\"codec\":\"$codec\",\"slice_len\":$len,\"num_slices\":$slices,\"cache\":\"$cache\",\"bench\":$r}"
            done
        done
    done
    # 256 x 64 as frame windows (each slice's 67 frames once, the stacks a view: TorchRL's unfold
    # view is the peer), warm and cold.
    for cache in warm cold; do
        if [ "$cache" = cold ]; then drop; prefault=""; else prefault="--prefault"; fi
        r="$("$bin" bench "$work/$game-zstd-dict" $prefault --columns observation,action,reward \
            --slice-len 64 --num-slices 256 --frame-stack 4 --frame-window --iters "$((iters / 10))" --json)"
        emit "{\"game\":\"$game\",\"codec\":\"zstd-dict\",\"slice_len\":64,\"num_slices\":256,\"cache\":\"$cache\",\"frame_window\":true,\"bench\":$r}"
    done
    r="$("$bin" bench "$work/$game-zstd-dict" --prefault --columns observation,action,reward \
        --slice-len 1 --num-slices 32 --frame-stack 4 --channels-last --iters "$iters" --json)"
    emit "{\"game\":\"$game\",\"codec\":\"zstd-dict\",\"slice_len\":1,\"num_slices\":32,\"cache\":\"warm\",\"channels_last\":true,\"bench\":$r}"
    if [ -n "$cgroup" ]; then
        for codec in zstd-dict none; do
            floor=""; [ "$codec" = zstd-dict ] && floor="--io-floor"
            drop
            r="$(limited "$bin" bench "$work/$game-$codec" $floor --columns observation,action,reward \
                --slice-len 1 --num-slices 32 --frame-stack 4 --iters "$iters" --json)"
            emit "{\"game\":\"$game\",\"codec\":\"$codec\",\"slice_len\":1,\"num_slices\":32,\"cache\":\"cold (memory cgroup $MEM_LIMIT)\",\"bench\":$r}"
        done
    fi
    # The raw layout is large (7,056 B per frame): gone before the peers write their own copies
    # (TorchRL's memmap, twice while it saves it for the cold run) unless KEEP=1.
    [ "${KEEP:-0}" = 1 ] || rm -rf "$work/$game-none"
    if "$py" -c "import torchrl" 2>/dev/null; then
        peer() { "$py" "$(dirname "$0")/peer_torchrl_frames.py" "$npz" --tile "$tile" --iters 20 --tmp "$work" "$@" 2>/dev/null \
            | grep '^{' | while read -r line; do emit "{\"game\":\"$game\",\"peer\":$line}"; done; }
        peer
        peer --cold
        [ -z "$cgroup" ] || peer --cold --cgroup "$cgroup"
    else
        echo "(no torchrl in $py: TorchRL figures skipped)" >&2
    fi
    if "$lance_py" -c "import lance, zstandard" 2>/dev/null; then
        lance_dir="$work/$game.lance"
        rm -rf "$lance_dir"
        zdict="$(ls "$work/$game-zstd-dict"/dictionaries/*.zdict | head -n 1)"
        lpeer() { "$lance_py" "$(dirname "$0")/peer_lance_frames.py" "$npz" "$zdict" --tile "$tile" \
            --dir "$lance_dir" --iters 50 "$@" | grep '^{' \
            | while read -r line; do emit "{\"game\":\"$game\",\"peer\":$line}"; done; }
        lpeer
        lpeer --cold
        [ -z "$cgroup" ] || lpeer --cold --cgroup "$cgroup"
        [ "${KEEP:-0}" = 1 ] || rm -rf "$lance_dir"
    else
        echo "(no lance/zstandard in $lance_py: Lance figures skipped)" >&2
    fi
done
