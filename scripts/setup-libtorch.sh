#!/usr/bin/env bash
# Sets up the libtorch that the `torch` feature builds against: a venv under ~/.cache with
# `pip install torch==2.11.0` (the version tch 0.24 is built for; the PyPI wheel carries CUDA 13
# and also runs on machines without a GPU), created once. Prints the environment to build with:
#
#     eval "$(scripts/setup-libtorch.sh)"
#     cargo test --features torch
set -euo pipefail
venv="${TRAJSTORE_TORCH_VENV:-$HOME/.cache/trajstore-torch}"
want="2.11.0"
# numpy too: without it every `import torch` (torch-sys's build script runs this python to find
# libtorch) warns that NumPy failed to initialise.
have=$("$venv/bin/python" -c "import numpy, torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)
if [ "$have" != "$want" ]; then
    echo "installing torch==$want into $venv (about 5 GB with its CUDA wheels; once)" >&2
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check "torch==$want" numpy >&2
fi
lib=$("$venv/bin/python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))" 2>/dev/null)
echo "export LIBTORCH_USE_PYTORCH=1"
echo "export VIRTUAL_ENV=\"$venv\""
echo "export PATH=\"$venv/bin:\$PATH\""
echo "export LD_LIBRARY_PATH=\"$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
