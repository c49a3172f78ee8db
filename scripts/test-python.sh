#!/usr/bin/env bash
# Tests the Python package: builds the extension module (`cargo build -p trajstore-python`, dev
# profile, in the same target directory as the crate's tests, so it reuses their compiled
# dependencies), links it into python/trajstore/ (what `maturin develop` would install), and runs
# the pytest suite of python/tests with the venv of scripts/setup-python-tests.sh (PyTorch,
# pyarrow, DuckDB). Extra arguments go to pytest (e.g. `scripts/test-python.sh -k loader`).
set -euo pipefail
cd "$(dirname "$0")/.."
# One target directory for every stage of scripts/test.sh (the repository's `target/` unless
# CARGO_TARGET_DIR says otherwise).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
py=$(scripts/setup-python-tests.sh | tail -n 1)
# An extension module: do not link libpython (the interpreter that imports it provides it).
export PYO3_PYTHON="$py" PYO3_BUILD_EXTENSION_MODULE=1
# The extension and the `trajstore` binary some tests compare with, in one build that selects
# what `cargo test --features fault-injection` selects (the crate with its features, and its
# tests, whose dev-dependencies take part in feature resolution): every shared dependency then
# has the features of scripts/test.sh's first stage, so nothing it compiled is compiled again.
# (`cargo build -p trajstore-python` alone resolved other features and rebuilt arrow, parquet
# and DataFusion.)
cargo build -p trajstore -p trajstore-python --features trajstore/fault-injection --lib --bins --tests
ln -sf "$CARGO_TARGET_DIR/debug/lib_native.so" python/trajstore/_native.abi3.so
export TRAJSTORE_BIN="$CARGO_TARGET_DIR/debug/trajstore"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
# pytest's exit status is this script's: a failing (or erroring) test fails CI.
exec "$py" -m pytest -q -ra python/tests "$@"
