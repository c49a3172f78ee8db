#!/usr/bin/env bash
# Tests the Python package: builds the extension module (`cargo build -p trajstore-python`, dev
# profile, in the same target directory as the crate's tests, so it reuses their compiled
# dependencies), links it into python/trajstore/ (what `maturin develop` would install), and runs
# the pytest suite of python/tests with the venv of scripts/setup-python-tests.sh (PyTorch,
# pyarrow, DuckDB). Extra arguments go to pytest (e.g. `scripts/test-python.sh -k loader`).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/trajstore-target}"
py=$(scripts/setup-python-tests.sh | tail -n 1)
# An extension module: do not link libpython (the interpreter that imports it provides it).
export PYO3_PYTHON="$py" PYO3_BUILD_EXTENSION_MODULE=1
cargo build -p trajstore-python
ln -sf "$CARGO_TARGET_DIR/debug/lib_native.so" python/trajstore/_native.abi3.so
# The `trajstore` binary some tests compare with (built by `cargo test`, else here).
if [ ! -x "$CARGO_TARGET_DIR/debug/trajstore" ]; then
    cargo build --bin trajstore
fi
export TRAJSTORE_BIN="$CARGO_TARGET_DIR/debug/trajstore"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
# pytest's exit status is this script's: a failing (or erroring) test fails CI.
exec "$py" -m pytest -q -ra python/tests "$@"
