"""The Python package's CUDA path on a GPU machine, with nothing but PyTorch installed (no pytest,
no pyarrow): what `gpu-bundle/run.sh` runs there (scripts/gpu-bundle.sh).

    python3 cuda_check.py DATASET [--batches 500] [--out results.json]

Checks, and exits non-zero if one fails:
- batches on ``cuda`` equal the CPU batches of the same seed, also under a non-default stream;
- ``dtype_cast=torch.bfloat16`` casts the floating columns only;
- ``pin_memory=True`` on CPU hands out pinned tensors, also after a transform that makes new ones;
- the staging ring is reused safely (values still right after many more batches than slots).
Measures: batches/s to ``cuda`` and the host-to-device GB/s this implies, against
``tensor.pin_memory().to("cuda", non_blocking=True)`` of the same bytes, in the same process.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import trajstore

COLUMNS = ["observation", "action", "reward", "next_observation"]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("--batches", type=int, default=500)
    p.add_argument("--out", default="")
    a = p.parse_args()
    assert torch.cuda.is_available(), "no CUDA device"
    ds = trajstore.open(a.dataset)
    results: dict = {"gpu": torch.cuda.get_device_name(0), "transitions": len(ds)}
    failures = []

    def check(name: str, ok: bool) -> None:
        results[name] = bool(ok)
        if not ok:
            failures.append(name)
        print(f"{'ok  ' if ok else 'FAIL'} {name}", flush=True)

    kw = dict(slice_len=64, num_slices=256, columns=COLUMNS, seed=7, max_batches=40)
    cpu = [dict(b) for b in ds.loader(device="cpu", **kw)]
    gpu = [{k: v.cpu() for k, v in b.items()} for b in ds.loader(device="cuda", staging_slots=3, **kw)]
    check("cuda batches equal cpu batches (40 batches through 3 staging slots)", all(map(same, cpu, gpu)))

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        side = [{k: v.cpu() for k, v in b.items()} for b in ds.loader(device="cuda", **kw)]
    check("equal under a non-default current stream", all(map(same, cpu, side)))

    b = next(iter(ds.loader(device="cuda", dtype_cast=torch.bfloat16, **kw)))
    check(
        "bf16 cast: floats bf16, flags bool, ids int64",
        b["observation"].dtype == torch.bfloat16
        and b["mask"].dtype == torch.bool
        and b["episode_id"].dtype == torch.int64
        and b["observation"].is_cuda,
    )

    def transform(batch):
        batch["observation"] = batch["observation"] * 2.0  # a new, pageable tensor
        batch["extra"] = torch.ones(3)
        return batch

    pinned = next(iter(ds.loader(device="cpu", pin_memory=True, transform=transform, **kw)))
    check("pin_memory holds after a transform", all(t.is_pinned() for t in pinned.values()))

    # Throughput to the device, and the H2D baseline of the same bytes.
    n = a.batches
    loader = ds.loader(slice_len=64, num_slices=256, columns=COLUMNS, device="cuda", max_batches=n + 20)
    it = iter(loader)
    for _ in range(20):
        next(it)
    torch.cuda.synchronize()
    t = time.perf_counter()
    nbytes = 0
    for batch in it:
        nbytes = sum(v.numel() * v.element_size() for v in batch.values())
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    results["cuda_batches_per_s"] = n / dt
    results["batch_bytes"] = nbytes
    results["loader_h2d_gb_per_s"] = n * nbytes / dt / 1e9
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    for _ in range(20):
        host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    results["baseline_h2d_gb_per_s"] = n * nbytes / (time.perf_counter() - t) / 1e9
    results["loader_vs_baseline"] = results["loader_h2d_gb_per_s"] / results["baseline_h2d_gb_per_s"]
    print(json.dumps(results), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
