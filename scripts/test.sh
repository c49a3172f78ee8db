#!/usr/bin/env bash
# The test command of the README: sets up Python for the interop test, then runs every test.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh --test crash`).
set -euo pipefail
cd "$(dirname "$0")/.."
if py=$(scripts/setup-python.sh 2>/dev/null | tail -n 1) && [ -x "$py" ]; then
    export TRAJSTORE_PYTHON="$py"
elif [ "${CI:-}" = "true" ]; then
    echo "could not set up Python with pyarrow (needed by the interop test under CI)" >&2
    exit 1
else
    echo "note: no pyarrow venv; the interop test will be skipped" >&2
fi
cargo test "$@"
