#!/usr/bin/env bash
# The test command of the README: sets up Python (pyarrow for the interop test, moto for the S3
# server of tests/remote/s3.rs), runs every test with the default features, then the Python
# package's pytest suite (scripts/test-python.sh: PyTorch from pip, the extension built in the
# same target directory), then sets up libtorch (the same pip torch==2.11.0) and runs the Rust
# tests again with the `torch` feature. Every stage builds into one target directory and the
# dependencies are compiled once: the Python stage selects what the first stage selected, and
# Cargo.toml turns on in every build the dependency features that the torch stage would change,
# so the later stages compile only trajstore itself, the extension and tch. Extra arguments go
# to both `cargo test` runs (the second also tests the `video` feature where libdav1d installs;
# e.g. `scripts/test.sh --test crash`, or one module:
# `scripts/test.sh --test integration loader::`); TRAJSTORE_SKIP_PYTHON=1 skips the pytest suite
# and TRAJSTORE_SKIP_TORCH=1 the torch run.
set -euo pipefail
cd "$(dirname "$0")/.."
# One target directory for every stage (the Python stage and the torch stage reuse what the
# first compiled: Cargo.toml unifies the features they would otherwise change).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
if py=$(scripts/setup-python.sh 2>/dev/null | tail -n 1) && [ -x "$py" ]; then
    export TRAJSTORE_PYTHON="$py"
elif [ "${CI:-}" = "true" ]; then
    echo "could not set up Python with pyarrow and moto (needed by the interop and S3 tests under CI)" >&2
    exit 1
else
    echo "note: no Python venv with pyarrow and moto; the interop and S3 tests will be skipped" >&2
fi
echo "== cargo test (default features)" >&2
cargo test --features fault-injection "$@"
if [ "${TRAJSTORE_SKIP_PYTHON:-}" = "1" ]; then
    echo "note: TRAJSTORE_SKIP_PYTHON=1: the Python package was not tested" >&2
else
    echo "== the Python package (scripts/test-python.sh)" >&2
    scripts/test-python.sh
fi
if [ "${TRAJSTORE_SKIP_TORCH:-}" = "1" ]; then
    echo "note: TRAJSTORE_SKIP_TORCH=1: the torch feature was not tested" >&2
    exit 0
fi
if torch_env=$(scripts/setup-libtorch.sh); then
    eval "$torch_env"
elif [ "${CI:-}" = "true" ]; then
    echo "could not install torch==2.11.0 (needed by the torch feature's tests under CI)" >&2
    exit 1
else
    echo "note: no libtorch (pip torch==2.11.0 failed); the torch feature was not tested" >&2
    exit 0
fi
# The torch stage also runs the `video` feature's tests (LeRobot camera videos) where libdav1d
# can be installed (scripts/setup-video.sh; under CI=true it must be): one more feature in a
# build that compiles the crate anyway, rather than a build of its own.
features=torch,fault-injection
if scripts/setup-video.sh >/dev/null 2>&1; then
    features="$features,video"
elif [ "${CI:-}" = "true" ]; then
    echo "could not install libdav1d (scripts/setup-video.sh; needed by the video feature's tests under CI)" >&2
    exit 1
else
    echo "note: no libdav1d (scripts/setup-video.sh failed); the video feature was not tested" >&2
fi
echo "== cargo test --features $features" >&2
cargo test --features "$features" "$@"
