#!/usr/bin/env bash
# Lints and type-checks the Python package: `ruff check` on the package and its tests,
# `mypy --strict` on the package (its `_native.pyi` stub included), and `mypy.stubtest`, which
# imports the built extension and checks that the stub matches it. The configuration is in
# python/pyproject.toml ([tool.ruff], [tool.mypy]). Uses the venv of
# scripts/setup-python-tests.sh, into which it installs ruff and mypy (once), and builds and
# links the extension module as scripts/test-python.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
py=$(scripts/setup-python-tests.sh | tail -n 1)
if ! "$py" -c "import mypy, ruff" 2>/dev/null; then
    echo "installing ruff and mypy into $(dirname "$(dirname "$py")") (once)" >&2
    "$py" -m pip install --quiet --disable-pip-version-check ruff mypy >&2
fi
# An extension module: do not link libpython (the interpreter that imports it provides it).
export PYO3_PYTHON="$py" PYO3_BUILD_EXTENSION_MODULE=1
# The build of scripts/test-python.sh (same selection and features: nothing is compiled twice).
cargo build -p trajstore -p trajstore-python --features trajstore/fault-injection --lib --bins --tests
ln -sf "$CARGO_TARGET_DIR/debug/lib_native.so" python/trajstore/_native.abi3.so
echo "ruff check python/trajstore python/tests"
"$py" -m ruff check python/trajstore python/tests
cd python
echo "mypy --strict trajstore"
"$py" -m mypy --strict trajstore
echo "python -m mypy.stubtest trajstore._native"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$py" -m mypy.stubtest trajstore._native --mypy-config-file pyproject.toml
