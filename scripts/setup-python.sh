#!/usr/bin/env bash
# Creates (once) a Python venv with pyarrow, numpy, Polars, DuckDB and h5py under ~/.cache, used by the
# interop test and the benchmark scripts. Prints the interpreter path on its last line.
set -euo pipefail
venv="${TRAJSTORE_PY_VENV:-$HOME/.cache/trajstore-py}"
if ! "$venv/bin/python" -c "import pyarrow, numpy, polars, duckdb, h5py" 2>/dev/null; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check pyarrow numpy polars duckdb h5py >&2
fi
echo "$venv/bin/python"
