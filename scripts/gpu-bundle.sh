#!/usr/bin/env bash
# Builds what a GPU machine without Rust needs to check the `torch` feature and the Python
# package, into gpu-bundle/ (ignored by git; under the device tool's 64 MiB carry limit): the
# loader-only CLI (no DataFusion) and the torch test binaries, release-built and stripped; the
# Python package (its .py files and the release extension, stripped and gzipped: ~33 MB) with
# python/tests/cuda_check.py; and run.sh, which finds that machine's PyTorch 2.11 libraries and
# runs the CUDA tests, the Python package's CUDA checks and the benchmarks there:
#
#     scripts/gpu-bundle.sh                      # here
#     gpu-bundle/run.sh [DATASET_TRANSITIONS]    # there (with carry: ["gpu-bundle"])
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup-libtorch.sh)"
flags=(--release --no-default-features --features cli,torch)
cargo build "${flags[@]}" --bin trajstore
tests=$(cargo test "${flags[@]}" --test torch --test torch_cpu_only --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])')
target="${CARGO_TARGET_DIR:-target}"
rm -rf gpu-bundle && mkdir -p gpu-bundle/python/trajstore
strip -o gpu-bundle/trajstore "$target/release/trajstore"
while read -r name exe; do strip -o "gpu-bundle/test-$name" "$exe"; done <<< "$tests"
# The Python package as a wheel would install it (the interpreter only names the ABI: abi3).
PYO3_PYTHON="$VIRTUAL_ENV/bin/python" PYO3_BUILD_EXTENSION_MODULE=1 cargo build --release -p trajstore-python
cp python/trajstore/*.py python/trajstore/py.typed gpu-bundle/python/trajstore/
strip -o gpu-bundle/python/trajstore/_native.abi3.so "$target/release/lib_native.so"
gzip -9 gpu-bundle/python/trajstore/_native.abi3.so
cp python/tests/cuda_check.py gpu-bundle/python/
cat > gpu-bundle/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs on a GPU machine with PyTorch 2.11 (no Rust needed). Results go to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")"
lib=$(python3 -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
out="${OUT:-/tmp/gpu-out}"; mkdir -p "$out"
n="${1:-20000000}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
./test-torch --test-threads 1 2>&1 | tee "$out/test-torch.txt"
# A CPU run next to nvidia-smi: the process must not appear among the GPU's processes.
./test-torch_cpu_only 2>&1 | tee "$out/test-cpu-only.txt" &
pid=$!
for _ in 1 2 3 4 5; do nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader >> "$out/cpu-run-gpu-procs.txt"; sleep 0.2; done
wait $pid
./trajstore demo /tmp/gpu-demo.trajstore --transitions "$n" --json > "$out/demo.json"
# The Python package's CUDA path (needs only PyTorch there).
gunzip -kf python/trajstore/_native.abi3.so.gz
PYTHONPATH="$PWD/python" python3 python/cuda_check.py /tmp/gpu-demo.trajstore --out "$out/python-cuda.json" 2>&1 | tee "$out/python-cuda.txt"
for args in "--device cuda" "--device cuda --resident" "--device cuda --resident --cast bf16" \
            "--device cuda --resident --num-slices 4096" "--device cpu"; do
    # shellcheck disable=SC2086
    ./trajstore bench /tmp/gpu-demo.trajstore --iters 500 $args --json | tee -a "$out/bench.jsonl"
done
RUN
chmod +x gpu-bundle/run.sh
du -sh gpu-bundle
