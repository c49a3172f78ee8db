#!/usr/bin/env bash
# trajstore against TorchRL's ReplayBuffer(LazyMemmapStorage) + SliceSampler on the same data,
# in the same run: the peer script writes its dataset to Parquet, trajstore ingests that file, and
# both time batches of 256 slices x 64 steps.
#   scripts/bench_vs_torchrl.sh 2000000 [WORKDIR]
# Needs the peer venv (../shared/peers/README.md): ~/.cache/trajstore-peers with torch, torchrl.
# DEVICE=cpu|cuda (with a binary built with --features torch) adds the torch loader's figures:
# batches of torch tensors on that device, the like-for-like of TorchRL's sample().
set -euo pipefail
n="${1:?usage: bench_vs_torchrl.sh N [WORKDIR]}"
work="${2:-/tmp/trajstore-vs-torchrl}"
bin="${BIN:-target/release/trajstore}"
py="${PEER_PYTHON:-$HOME/.cache/trajstore-peers/bin/python}"
peer="$(dirname "$0")/../../shared/peers/torchrl_slice_bench.py"
[ -f "$peer" ] || peer="${PEER_SCRIPT:?set PEER_SCRIPT to torchrl_slice_bench.py}"
mkdir -p "$work"
pq="$work/peer-$n.parquet"
ds="$work/peer-$n.trajstore"
echo "== TorchRL (writes $pq)" >&2
"$py" "$peer" --n "$n" --parquet "$pq" --iters 50 2>/dev/null | tee "$work/torchrl-$n.json"
rm -rf "$ds"
echo "== trajstore ingest" >&2
"$bin" ingest "$pq" "$ds" --episode-col episode --terminated-col terminated --truncated-col truncated --json
for mode in "--weighting episodes --policy pad" "--weighting windows --policy strict"; do
    echo "== trajstore bench $mode" >&2
    # shellcheck disable=SC2086
    "$bin" bench "$ds" --slice-len 64 --num-slices 256 $mode --iters 1000 ${DEVICE:+--device "$DEVICE"} --json | tee "$work/trajstore-$n-${mode// /_}.json"
done
