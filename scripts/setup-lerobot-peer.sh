#!/usr/bin/env bash
# Creates (once) the Python 3.12 venv that scripts/peer_lerobot.py and scripts/bench_lerobot.sh
# run LeRobot in: `lerobot[dataset]` (LeRobotDataset, its v3 writer, PyAV) from PyPI, with its
# torch (the PyPI wheel, CUDA 13; it also runs on machines without a GPU). Prints the
# interpreter path on its last line, like scripts/setup-python.sh:
#
#     py=$(scripts/setup-lerobot-peer.sh | tail -n1)
#
# Environment:
#   TRAJSTORE_LEROBOT_VENV    the venv (default ~/.cache/trajstore-lerobot)
#   TRAJSTORE_PY312           a Python >= 3.12 (default: python3.12 on PATH, else pyenv's 3.12.1)
#   TRAJSTORE_LEROBOT_VERSION the lerobot release (default 0.6.1, the one BENCHMARKS.md measured)
#   TRAJSTORE_TORCH_VENV      the venv of scripts/setup-libtorch.sh (default ~/.cache/trajstore-torch)
#
# What it leaves out of lerobot[dataset]'s dependencies, to save disk (the full set is ~5 GB):
# - torchcodec: it needs FFmpeg's shared libraries, which this machine lacks; the benchmark
#   decodes with LeRobot's `video_backend="pyav"` (PyAV's wheel bundles FFmpeg and libdav1d);
# - triton (~650 MB): only torch.compile uses it;
# - the nvidia-* CUDA libraries (~2.7 GB): when the torch venv of scripts/setup-libtorch.sh
#   holds the very same versions (it installs the same torch), they are linked from there
#   (they are plain shared libraries, the same for every Python); otherwise they are installed.
# The venv is then whatever pip resolved for `lerobot[dataset]==VERSION`, pinned, less those.
set -euo pipefail
venv="${TRAJSTORE_LEROBOT_VENV:-$HOME/.cache/trajstore-lerobot}"
version="${TRAJSTORE_LEROBOT_VERSION:-0.6.1}"
torch_venv="${TRAJSTORE_TORCH_VENV:-$HOME/.cache/trajstore-torch}"
py="${TRAJSTORE_PY312:-}"
if [ -z "$py" ]; then
    # The first that runs (a pyenv shim on PATH may exist and fail).
    for c in python3.12 python3.13 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3; do
        if "$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then py="$c"; break; fi
    done
fi
check='import lerobot, av, pandas, datasets, torch; from lerobot.datasets.lerobot_dataset import LeRobotDataset'
if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    [ -n "$py" ] && "$py" -c 'import sys; assert sys.version_info >= (3, 12)' \
        || { echo "error: lerobot needs Python >= 3.12 (none found); set TRAJSTORE_PY312" >&2; exit 1; }
    free_kb=$(df -Pk "$(dirname "$venv")" 2>/dev/null | awk 'NR == 2 {print $4}' || echo 0)
    echo "installing lerobot[dataset]==$version into $venv (free: $((free_kb / 1048576)) GiB)" >&2
    "$py" -m venv "$venv" >&2
    pip=("$venv/bin/pip" --disable-pip-version-check --no-cache-dir)
    "${pip[@]}" install --quiet --upgrade pip >&2
    report=$(mktemp)
    "${pip[@]}" install --quiet --dry-run --ignore-installed --report "$report" "lerobot[dataset]==$version" >&2
    # The pinned list, less what is left out (above); the linked CUDA libraries' dist-info
    # directories make pip see them as installed.
    mapfile -t pkgs < <("$venv/bin/python" - "$report" "$torch_venv" "$venv" <<'EOF'
import glob, json, os, sys
report, torch_venv, venv = sys.argv[1:]
site = glob.glob(os.path.join(venv, "lib", "python3.*", "site-packages"))[0]
theirs = glob.glob(os.path.join(torch_venv, "lib", "python3.*", "site-packages"))
pins = [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.load(open(report))["install"]]
cuda = [(n, v) for n, v in pins if n.lower().startswith("nvidia")]
def dist_info(d, n, v):
    return os.path.join(d, n.replace("-", "_") + "-" + v + ".dist-info")
link = bool(theirs) and bool(cuda) and os.path.isdir(os.path.join(theirs[0], "nvidia")) and all(
    os.path.isdir(dist_info(theirs[0], n.lower(), v)) or os.path.isdir(dist_info(theirs[0], n, v)) for n, v in cuda)
if link:
    os.symlink(os.path.join(theirs[0], "nvidia"), os.path.join(site, "nvidia"))
    for n, v in cuda:
        src = next(p for p in (dist_info(theirs[0], n.lower(), v), dist_info(theirs[0], n, v)) if os.path.isdir(p))
        os.symlink(src, os.path.join(site, os.path.basename(src)))
    print(f"linked {len(cuda)} CUDA packages from {theirs[0]}", file=sys.stderr)
skip = {"torchcodec", "triton"}
for n, v in pins:
    if n.lower() in skip or (link and (n, v) in cuda):
        continue
    print(f"{n}=={v}")
EOF
)
    rm -f "$report"
    "${pip[@]}" install --quiet --no-deps "${pkgs[@]}" >&2
    "$venv/bin/python" -c "$check" >&2
fi
echo "$venv/bin/python"
