"""The CPU path makes no CUDA call: after iterating a loader on device="cpu" (and the NumPy
backend) in a fresh interpreter, no CUDA context exists and trajstore mapped no CUDA library,
the driver included. (`import torch` of a CUDA build maps libcudart and libtorch_cuda, and on a
machine with a driver also libcuda: libcublasLt opens it as it loads, seen on an H100 with
PyTorch 2.11. That is PyTorch's, before trajstore runs; no context is created by it.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from trajref import subprocess_env

pytest.importorskip("torch")

CHILD = textwrap.dedent(
    """
    import json, re, sys

    def cuda_libs():
        libs = set()
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and "cuda" in parts[-1].lower():
                    libs.add(parts[-1])
        return libs

    import torch
    before = cuda_libs()
    import trajstore
    ds = trajstore.open(sys.argv[1])
    n = 0
    for b in ds.loader(slice_len=8, num_slices=8, device="cpu", max_batches=20, workers=2):
        assert b["observation"].device.type == "cpu"
        n += int(b["mask"].sum())
    for b in ds.loader(slice_len=8, num_slices=8, device=torch.device("cpu"), sampler="epoch", max_batches=5,
                       dtype_cast=torch.float16, transform=lambda x: x):
        n += 1
    for b in ds.loader(slice_len=8, num_slices=8, backend="numpy", max_batches=5):
        n += 1
    ds.sql("SELECT count(*) FROM transitions")
    after = cuda_libs()
    print(json.dumps({
        "n": n,
        "initialized": torch.cuda.is_initialized(),
        "new_cuda_libs": sorted(after - before),
        "driver": sorted(l for l in after - before if re.search(r"/libcuda\\.so", l)),
    }))
    """
)


def test_cpu_loader_never_touches_cuda(demo_path):
    p = subprocess.run([sys.executable, "-c", CHILD, demo_path], env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["n"] == 20 * 64 + 10
    assert out["initialized"] is False, "a CUDA context was created on the CPU path"
    assert out["driver"] == [], f"libcuda was loaded by the CPU path: {out['driver']}"
    assert out["new_cuda_libs"] == [], f"CUDA libraries loaded by the CPU path: {out['new_cuda_libs']}"
