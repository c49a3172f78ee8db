#!/usr/bin/env bash
# The Python loader against TorchRL and the Rust loader, in one process (scripts/bench_python.py):
# builds the extension in release mode in its own target dir, copies it with the pure-Python
# package into a private directory (python/trajstore/_native.abi3.so, the tests' debug symlink, is
# left alone), and runs the benchmark for each N given (default 2M and 20M).
#   scripts/bench_python.sh [N ...]          e.g. scripts/bench_python.sh 2000000 20000000
# Environment: PY (a python with torch, torchrl, tensordict, pyarrow; default the trajstore-torch
# venv), PKG (package dir, default /tmp/bench-pkg), OUT (where the outputs go, default
# /tmp/bench-python-out), ARGS (extra arguments for bench_python.py, e.g. "--breakdown").
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PY:-$HOME/.cache/trajstore-torch/bin/python}"
pkg="${PKG:-/tmp/bench-pkg}"
out="${OUT:-/tmp/bench-python-out}"
target="${CARGO_TARGET_DIR_BENCH:-$HOME/.cache/trajstore-bench-target}"
"$py" -c "import torch, torchrl, tensordict, pyarrow" 2>/dev/null ||
    "${py%/python}/pip" install torchrl tensordict "torch==2.11.0"
CARGO_TARGET_DIR="$target" PYO3_PYTHON="$py" PYO3_BUILD_EXTENSION_MODULE=1 \
    cargo build --release -p trajstore-python
rm -rf "$pkg" && mkdir -p "$pkg/trajstore" "$out"
cp python/trajstore/*.py python/trajstore/py.typed "$pkg/trajstore/"
cp "$target/release/lib_native.so" "$pkg/trajstore/_native.abi3.so"
[ $# -gt 0 ] || set -- 2000000 20000000
for n in "$@"; do
    # shellcheck disable=SC2086
    PYTHONPATH="$pkg" "$py" scripts/bench_python.py --n "$n" ${ARGS:-} \
        2> >(tee "$out/bench-python-$n.log" >&2) | tee "$out/bench-python-$n.txt"
done
