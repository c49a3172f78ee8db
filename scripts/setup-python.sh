#!/usr/bin/env bash
# Creates (once) a Python venv under ~/.cache with pyarrow, numpy, Polars, DuckDB, h5py and zstandard (the interop
# test, the frame decoder test of schemas/FORMAT.md and the benchmark scripts) and moto's S3 server (the S3-compatible server that tests/remote/s3.rs
# starts on a local port). Prints the interpreter path on its last line.
set -euo pipefail
venv="${TRAJSTORE_PY_VENV:-$HOME/.cache/trajstore-py}"
if ! "$venv/bin/python" -c "import pyarrow, numpy, polars, duckdb, h5py, zstandard, moto.server" 2>/dev/null; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check pyarrow numpy polars duckdb h5py zstandard "moto[server]" >&2
fi
echo "$venv/bin/python"
