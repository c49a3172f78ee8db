#!/usr/bin/env bash
# The venv of the Python package's tests and benchmarks: the torch venv of
# scripts/setup-libtorch.sh (PyTorch 2.11.0, NumPy), plus pyarrow, DuckDB, h5py, pytest and
# zstandard (the frame decoder of schemas/FORMAT.md section 3.1),
# installed once. Prints the interpreter path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup-libtorch.sh)"
py="$VIRTUAL_ENV/bin/python"
if ! "$py" -c "import pyarrow, duckdb, h5py, pytest, zstandard" 2>/dev/null; then
    echo "installing pyarrow, duckdb, h5py, pytest and zstandard into $VIRTUAL_ENV (once)" >&2
    "$py" -m pip install --quiet --disable-pip-version-check pyarrow duckdb h5py pytest zstandard >&2
fi
echo "$py"
