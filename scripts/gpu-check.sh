#!/usr/bin/env bash
# The GPU check, in two halves (README, "Check a GPU setup"):
#
#     scripts/gpu-check.sh build [DIR]      # here, with Rust: the bundle into DIR (gpu-bundle/)
#     gpu-bundle/run.sh OUT [--quick]       # there, with PyTorch 2.11 and no Rust: every check
#                                           # and figure into OUT/results.json and summary.txt
#     scripts/gpu-check.sh all OUT [...]    # both on one machine (a workstation with a GPU)
#
# The bundle (under the 64 MiB a device call carries; `build` fails above it): the loader-only
# CLI (no DataFusion) and the test binaries of tests/torch.rs and tests/torch_cpu_only.rs,
# release-built, stripped and xz-compressed; the Python package (its .py files and the release
# extension, likewise) with its CUDA tests; wheels of what a bare PyTorch machine lacks for the
# TorchRL anchors (torchrl, tensordict and their small dependencies, for CPython 3.12, cached in
# ~/.cache/trajstore-gpu-wheels; skipped with a note if they cannot be fetched); with
# GPU_CHECK_ATARI, real Atari frames (see atari() below); the runner scripts/gpu_check.py and
# run.sh. `run.sh` exits 1 if any check fails; without a CUDA device the CUDA checks are reported
# skipped and the CPU half still runs (what CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((64 * 1024 * 1024))

build() {
    local dir="${1:-gpu-bundle}"
    eval "$(scripts/setup-libtorch.sh)"
    # GPU_CHECK_PROFILE=dev (what CI builds, after scripts/test.sh): the binaries scripts/test.sh
    # built, its torch stage's features and profile (nothing is compiled again; a release build
    # of the whole graph takes a fresh 2-core machine about 20 minutes), not compressed and not
    # held to the 64 MiB a device call carries: a bundle for a device is the release one, the
    # loader-only CLI.
    local profile="${GPU_CHECK_PROFILE:-release}" out=release flags
    case "$profile" in
        release) flags=(--release --no-default-features --features cli,torch) ;;
        dev)
            out=debug
            # scripts/test.sh's torch stage: `video` where libdav1d installs.
            flags=(--features torch,fault-injection)
            scripts/setup-video.sh >/dev/null 2>&1 && flags=(--features torch,fault-injection,video)
            ;;
        *) echo "GPU_CHECK_PROFILE=$profile: release or dev" >&2; exit 2 ;;
    esac
    # The Python package as a wheel would install it (the interpreter only names the ABI: abi3).
    # The dev build is scripts/test-python.sh's, selection and features alike (nothing new); it
    # comes first because it also links target/debug/trajstore, without the torch feature.
    if [ "$profile" = release ]; then
        PYO3_PYTHON="$VIRTUAL_ENV/bin/python" PYO3_BUILD_EXTENSION_MODULE=1 cargo build --release -p trajstore-python
    else
        PYO3_PYTHON="$(scripts/setup-python-tests.sh | tail -n 1)" PYO3_BUILD_EXTENSION_MODULE=1 \
            cargo build -p trajstore -p trajstore-python --features trajstore/fault-injection --lib --bins --tests
    fi
    # With --tests in a dev build: the dev-dependencies take part in feature resolution when
    # tests are built, and a binary built without them would compile the graph again.
    local tests_too=()
    [ "$profile" = dev ] && tests_too=(--tests)
    cargo build "${flags[@]}" --bin trajstore "${tests_too[@]}"
    local tests
    tests=$(cargo test "${flags[@]}" --test torch --test torch_cpu_only --test torch_oom --no-run --message-format=json |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])')
    local target="${CARGO_TARGET_DIR:-target}"
    rm -rf "$dir" && mkdir -p "$dir/python/trajstore" "$dir/python/tests" "$dir/wheels"
    strip -o "$dir/trajstore" "$target/$out/trajstore"
    while read -r name exe; do strip -o "$dir/test-$name" "$exe"; done <<< "$tests"
    cp python/trajstore/*.py python/trajstore/py.typed "$dir/python/trajstore/"
    strip -o "$dir/python/trajstore/_native.abi3.so" "$target/$out/lib_native.so"
    # xz: the binaries are 130 MB stripped, ~25 MB compressed; run.sh unpacks them.
    if [ "$profile" = release ]; then
        xz -9 -T0 "$dir/trajstore" "$dir"/test-* "$dir/python/trajstore/_native.abi3.so"
    fi
    cp python/tests/{conftest.py,trajref.py,growing.py,test_cuda.py,test_cpu_no_cuda.py} "$dir/python/tests/"
    cp scripts/gpu_check.py "$dir/"
    wheels "$dir/wheels"
    atari "$dir/atari" "$target/$out/trajstore"
    cat > "$dir/run.sh" <<'RUN'
#!/usr/bin/env bash
# The GPU check's second half (scripts/gpu-check.sh): run.sh OUT [--quick] [--transitions N].
# Needs python3 with PyTorch 2.11 (PYTHON= picks another interpreter); no Rust, no network.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py="${PYTHON:-python3}"
lib=$("$py" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))") ||
    { echo "run.sh: $py cannot import torch (PyTorch 2.11 is needed)" >&2; exit 2; }
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Unpack into a fresh folder (the bundle stays as carried): the xz-compressed binaries through
# Python's lzma (no xz program needed), the rest copied.
work=$(mktemp -d /tmp/trajstore-gpu-check.XXXXXX)
"$py" - "$here" "$work" <<'PY' || exit 2
import lzma, os, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
for root, _, files in os.walk(src):
    out = os.path.join(dst, os.path.relpath(root, src))
    os.makedirs(out, exist_ok=True)
    for f in files:
        if f.endswith(".xz"):
            with lzma.open(os.path.join(root, f)) as i, open(os.path.join(out, f[:-3]), "wb") as o:
                shutil.copyfileobj(i, o, 1 << 22)
            os.chmod(os.path.join(out, f[:-3]), 0o755)
        else:
            shutil.copy2(os.path.join(root, f), os.path.join(out, f))
PY
here="$work"
# The TorchRL anchors run only with a GPU: install their wheels (CPython 3.12) only there.
if ! "$py" -c "import torchrl" 2>/dev/null && ls "$here"/wheels/*.whl >/dev/null 2>&1 &&
    "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    site=$(mktemp -d /tmp/trajstore-gpu-site.XXXXXX)
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$here"/wheels/*.whl &&
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$py" "$here/gpu_check.py" "$@"
rc=$?
rm -rf "$work" "${site:-}"
exit $rc
RUN
    chmod +x "$dir/run.sh" "$dir/gpu_check.py"
    local size
    size=$(du -sb "$dir" | cut -f1)
    if [ "$profile" != release ]; then
        echo "bundle ($profile): $dir, $((size / 1024 / 1024)) MiB (a device takes a release bundle)" >&2
        return 0
    fi
    echo "bundle: $dir, $((size / 1024 / 1024)) MiB ($size bytes; limit 64 MiB)" >&2
    if [ "$size" -ge "$limit" ]; then
        echo "the bundle is over 64 MiB: a device call cannot carry it" >&2
        exit 1
    fi
}

# Real Atari frames for issue 32's figures, when GPU_CHECK_ATARI names them: space-separated
# GAME.npz[:STEPS] files written by an ale-py recorder (flat `frames` [N, 84, 84] uint8, `action`,
# `reward`, `terminated`, `truncated`, `episode`, as `scripts/bench_frames.sh` reads). The whole
# episodes within each file's first STEPS steps (default 100,000) are ingested, frames compressed
# as a dataset stores them by default (zstd level 5 with a trained dictionary), into DIR/GAME: a
# few MiB each (Pong ~83 B a frame), so that the device measures decoding on real frames.
atari() {
    local dest="$1" cli="$2"
    [ -n "${GPU_CHECK_ATARI:-}" ] || return 0
    mkdir -p "$dest"
    local tmp
    tmp=$(mktemp -d /tmp/trajstore-gpu-atari.XXXXXX)
    for spec in $GPU_CHECK_ATARI; do
        local npz="${spec%%:*}" steps=100000
        [ "$spec" != "$npz" ] && steps="${spec##*:}"
        local game
        game=$(basename "$npz" .npz)
        # The first whole episodes, read from the .npz members (stored, not deflated) without
        # loading the rest of a many-GiB file.
        "$VIRTUAL_ENV/bin/python" - "$npz" "$steps" "$tmp/$game.npz" <<'PY'
import sys, zipfile
import numpy as np

src, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
z = zipfile.ZipFile(src)

def head(name: str, rows: int) -> np.ndarray:
    with z.open(name + ".npy") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        assert not fortran, f"{name}: Fortran order"
        rows = min(rows, shape[0])
        width = int(np.prod(shape[1:], dtype=np.int64))
        data = f.read(rows * width * dtype.itemsize)
        return np.frombuffer(data, dtype).reshape((rows, *shape[1:]))

episode = head("episode", steps)
ends = np.flatnonzero(np.diff(episode)) + 1
if len(episode) == steps and ends.size:
    steps = int(ends[-1])          # drop the episode cut by the limit
cols = {n: head(n, steps) for n in ("frames", "action", "reward", "terminated", "truncated", "episode")}
np.savez(out, **cols)
print(f"{src}: {steps} steps, {len(np.unique(cols['episode']))} episodes", file=sys.stderr)
PY
        "$cli" ingest "$tmp/$game.npz" "$dest/$game" --observation-col frames --episode-col episode \
            --terminated-col terminated --truncated-col truncated --json > /dev/null
        rm -f "$tmp/$game.npz"
    done
    rm -rf "$tmp"
}

# Wheels (CPython 3.12, manylinux x86-64) of the TorchRL anchor's packages a bare PyTorch machine
# lacks; their versions are the ones the benchmarks here use.
wheels() {
    local dest="$1" cache="$HOME/.cache/trajstore-gpu-wheels"
    local pkgs=(torchrl==0.14.1 tensordict==0.14.3 pyvers==0.2.3 hoptorch==0.1.4 orjson==3.13.0
                importlib_metadata==10.2.0)
    mkdir -p "$cache"
    for p in "${pkgs[@]}"; do
        local name="${p%%==*}" ver="${p##*==}"
        if ! ls "$cache/${name}-${ver}-"*.whl >/dev/null 2>&1; then
            python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
                --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
                --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$cache" "$p" >&2 ||
                { echo "note: could not fetch $p; the TorchRL anchors will be skipped there" >&2; return 0; }
        fi
    done
    for p in "${pkgs[@]}"; do cp "$cache/${p%%==*}-${p##*==}-"*.whl "$dest/"; done
}

case "${1:-}" in
    build) shift; build "$@" ;;
    run) shift; dir=gpu-bundle; exec "$dir/run.sh" "$@" ;;
    all) shift; build gpu-bundle; PYTHON=$(scripts/setup-python-tests.sh | tail -n 1) exec gpu-bundle/run.sh "$@" ;;
    *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
