#!/usr/bin/env python3
"""The GPU check: every CUDA feature of trajstore checked and measured in one run, on a machine
with PyTorch but no Rust toolchain. Built and carried by scripts/gpu-check.sh (`build` here,
`gpu-bundle/run.sh OUT` there); this file is the bundle's runner.

    python3 gpu_check.py OUT [--transitions N] [--quick]

Writes OUT/results.json (every check and figure), OUT/summary.txt (what it printed) and
OUT/log.txt (the output of everything it ran), and exits 1 if any check failed. Without a CUDA
device the CUDA checks are reported `skip` and the rest (the CPU half) still runs.

Checks (pass / fail / skip):
- the Rust CUDA tests (tests/torch.rs, with TRAJSTORE_REQUIRE_CUDA=1 so that none can pass by
  skipping) and the Python package's CUDA tests (python/tests/test_cuda.py, none skipped);
- batches on cuda equal the CPU batches of the same seed and plan, every column, exactly; with
  dtype_cast bf16 / f16 equal to the CPU values cast (within the format's rounding of f32);
- a --device cpu run (Rust CLI, Rust test binary, Python) creates no CUDA context: its pid never
  appears in `nvidia-smi --query-compute-apps` and libcuda is never mapped into it (the detector
  is first shown to see a CUDA process);
- staging buffers are page-locked, as the transform sees them, and batches a transform made are
  pinned again (Python is_pinned; Rust in tests/torch.rs);
- no staging slot is overwritten while its copy is in flight: a checksum of every batch computed
  on the GPU equals the CPU plan's, over thousands of batches, several workers, two slots each;
- GPU-resident mode refuses what does not fit (budget, or the device's free memory) with a
  short error, and the process carries on.

Figures, each beside an anchor measured in the same run on the same data:
- host-to-device GB/s of the loaders (Rust, Python) against back-to-back
  `torch.empty(n, pin_memory=True).to("cuda", non_blocking=True)` copies of a batch's bytes;
- batches/s of 256x64 slices to cuda (Rust, Python) against TorchRL's
  ReplayBuffer(LazyMemmapStorage, SliceSampler, pin_memory=True, prefetch=k) moved to the GPU;
- GPU-resident sampling + gather in transitions/s against TorchRL's
  LazyTensorStorage(device="cuda") + SliceSampler;
- an MLP training step fed by the loader: the fraction of the step time spent waiting for data;
- pixel frames (issue 32): 4-stacks of 84x84 frames written out and as frame windows, the CPU
  gather alone (every core), 32 x (4-stack) in memory (every core) beside TorchRL's single-frame
  storage + SliceSampler (also without a GPU), and batches/s to cuda (Rust, Python) beside a
  pinned copy of what a batch's copy carries; the windows checked against the stacks (also on
  the CPU stand-in);
- a profile of one batch's costs (issue 35): the gather alone into host memory (also without a
  GPU), one packed pinned copy of the batch's bytes against the Python loader's per-tensor copies
  (with and without an event and record_stream), and the consumer thread's time per next().

Also checked on a GPU: a stream (a quarter of the dataset cached, from a file:// store) gives the
same batches on cuda as on cpu.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
COLUMNS = ["observation", "action", "reward", "next_observation"]
B, L = 256, 64  # the batch: 256 slices of 64 steps


class Run:
    def __init__(self, out: str) -> None:
        self.out = out
        os.makedirs(out, exist_ok=True)
        self.checks: list = []
        self.figures: dict = {}
        self.info: dict = {}
        self.log = open(os.path.join(out, "log.txt"), "w")
        self.summary = open(os.path.join(out, "summary.txt"), "w")

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.summary.write(line + "\n")
        self.summary.flush()
        self.log.write(line + "\n")
        self.log.flush()

    def check(self, name: str, ok, detail: str = "", skip: str = "") -> None:
        status = "skip" if skip else ("pass" if ok else "fail")
        self.checks.append({"check": name, "status": status, "detail": skip or detail})
        self.say(f"{status.upper():4}  {name}" + (f"  [{skip or detail}]" if (skip or detail) else ""))

    def figure(self, key: str, **fields) -> None:
        self.figures[key] = fields
        parts = ", ".join(f"{k}={_fmt(v)}" for k, v in fields.items())
        self.say(f"FIG   {key}: {parts}")

    def sh(self, cmd, env=None, timeout=600, check=True) -> subprocess.CompletedProcess:
        self.log.write(f"\n$ {' '.join(map(str, cmd))}\n")
        self.log.flush()
        try:
            p = subprocess.run(list(map(str, cmd)), env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:  # what it printed before its time ran out, then the error
            for part in (e.stdout, e.stderr):
                self.log.write(part.decode(errors="replace") if isinstance(part, bytes) else part or "")
            self.log.flush()
            raise
        self.log.write(p.stdout + p.stderr)
        self.log.flush()
        if check and p.returncode != 0:
            raise RuntimeError(f"{os.path.basename(str(cmd[0]))} exited {p.returncode}: {_tail(p.stderr or p.stdout)}")
        return p

    def section(self, name: str, fn, *args) -> None:
        """Runs one part; an exception is a failed check of that part, and the rest goes on."""
        self.say(f"\n== {name}")
        t = time.perf_counter()
        try:
            fn(self, *args)
        except Exception as e:  # noqa: BLE001 - reported, not swallowed
            self.log.write(traceback.format_exc())
            self.check(f"{name}: ran to the end", False, f"{type(e).__name__}: {_tail(str(e))}")
        self.info.setdefault("section_s", {})[name] = round(time.perf_counter() - t, 1)
        self.write()  # what has run so far, should a time limit stop the rest

    def write(self) -> dict:
        counts = {s: sum(c["status"] == s for c in self.checks) for s in ("pass", "fail", "skip")}
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump({"info": self.info, "counts": counts, "checks": self.checks, "figures": self.figures}, f,
                      indent=1)
        return counts

    def finish(self) -> int:
        failed = [c for c in self.checks if c["status"] == "fail"]
        counts = self.write()
        self.say(f"\n{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped; "
                 f"results in {os.path.join(self.out, 'results.json')}")
        return 1 if failed else 0


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return v


def _tail(s: str, n: int = 400) -> str:
    s = s.strip()
    return s if len(s) <= n else "..." + s[-n:]


# --- environment ---------------------------------------------------------------------------------
def env_for(run: Run) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(HERE, "python") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TRAJSTORE_BIN"] = os.path.join(HERE, "trajstore")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def gpu_processes() -> set | None:
    """Pids of the GPU's compute processes, or None when nvidia-smi cannot tell."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    return {int(x) for x in re.findall(r"\d+", p.stdout)}


def maps_cuda_driver(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(re.search(r"/libcuda\.so", line) for line in f)
    except OSError:
        return False


def watch(cmd, env):
    """Runs cmd while sampling nvidia-smi's compute processes and the process's maps; returns
    (completed process, pid, seen in nvidia-smi, libcuda mapped, samples)."""
    p = subprocess.Popen(list(map(str, cmd)), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = mapped = False
    samples = 0
    out: dict = {}

    def drain():
        out["stdout"], out["stderr"] = p.communicate()

    t = threading.Thread(target=drain)
    t.start()
    while t.is_alive():
        procs = gpu_processes()
        if procs is not None:
            samples += 1
            seen |= p.pid in procs
        mapped |= maps_cuda_driver(p.pid)
        time.sleep(0.1)
    t.join()
    cp = subprocess.CompletedProcess(cmd, p.returncode, out.get("stdout", ""), out.get("stderr", ""))
    return cp, p.pid, seen, mapped, samples


def cpu_facts() -> dict:
    """What the CPU figures depend on, from `lscpu`: the model, whether the CPUs are hyperthreads
    of fewer cores (16 CPUs of 8 cores decode at well under 16 times one), sockets, NUMA nodes,
    the last-level cache. Empty where `lscpu` is missing."""
    if not _has("lscpu"):
        return {}
    p = subprocess.run(["lscpu"], capture_output=True, text=True)
    wanted = {"Model name": "model", "Thread(s) per core": "threads_per_core", "Core(s) per socket":
              "cores_per_socket", "Socket(s)": "sockets", "NUMA node(s)": "numa_nodes", "L3 cache": "l3",
              "CPU max MHz": "max_mhz", "Hypervisor vendor": "hypervisor"}
    facts = {}
    for line in p.stdout.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in wanted:
            facts[wanted[key.strip()]] = value.strip()
    return facts


def section_env(run: Run, a) -> None:
    import torch

    run.info.update(python=sys.version.split()[0], torch=torch.__version__, host=platform.node(),
                    cpus=os.cpu_count(), cuda=torch.cuda.is_available(), transitions=a.transitions)
    p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current",
                        "--format=csv,noheader"], capture_output=True, text=True) if _has("nvidia-smi") else None
    run.info["nvidia_smi"] = p.stdout.strip() if p and p.returncode == 0 else None
    run.info["cpu"] = cpu_facts()
    if torch.cuda.is_available():
        run.info["gpu"] = torch.cuda.get_device_name(0)
        run.info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    run.say(f"python {run.info['python']}, torch {run.info['torch']}, {run.info['cpus']} cpus "
            f"({run.info['cpu']}), "
            f"gpu: {run.info.get('gpu', 'none')} ({run.info['nvidia_smi']})")


def _has(prog: str) -> bool:
    return any(os.access(os.path.join(d, prog), os.X_OK) for d in os.environ.get("PATH", "").split(":"))


# --- Rust ----------------------------------------------------------------------------------------
def section_rust_tests(run: Run, a) -> None:
    import torch

    env = env_for(run)
    cuda = torch.cuda.is_available()
    if cuda:
        env["TRAJSTORE_REQUIRE_CUDA"] = "1"
    results, rcs = {}, []
    for binary in ("test-torch", "test-torch_oom"):
        # A bounded wait: a kernel that never returns must not spend a short device lease.
        p = run.sh([os.path.join(HERE, binary), "--test-threads", "1"], env=env, check=False, timeout=300)
        results.update(re.findall(r"^test (\S+) \.\.\. (ok|FAILED|ignored)", p.stdout, re.M))
        rcs.append(p.returncode)
    if not results:
        run.check("Rust torch tests ran", False, _tail(p.stderr or p.stdout))
        return
    cuda_tests = sorted(t for t in results if t.startswith("cuda") or "pinned" in t)
    other = sorted(t for t in results if t not in cuda_tests)
    for t in cuda_tests:
        if not cuda:
            run.check(f"Rust {t}", True, skip="no CUDA device")
        else:
            run.check(f"Rust {t}", results[t] == "ok", results[t])
    bad = [t for t in other if results[t] != "ok"]
    run.check(f"Rust torch tests on the CPU ({len(other)})", not bad, f"failed: {bad}" if bad else "")


def section_cpu_run(run: Run, a, ds: str) -> None:
    """A --device cpu run never creates a CUDA context (Rust CLI, Rust test binary, Python)."""
    import torch

    env = env_for(run)
    cuda = torch.cuda.is_available()
    smi = gpu_processes() is not None
    detector = False
    if cuda and smi:
        # The detector first: a CUDA run of the same CLI must be seen by it.
        cp, pid, seen, mapped, _ = watch([os.path.join(HERE, "trajstore"), "bench", ds, "--iters", "300", "--device", "cuda",
                                          "--json"], env)
        detector = seen and mapped
        run.check("detector: a --device cuda run shows in nvidia-smi and maps libcuda", detector,
                  f"seen={seen} mapped={mapped} rc={cp.returncode}")
    runs = {
        "Rust CLI bench --device cpu": [os.path.join(HERE, "trajstore"), "bench", ds, "--iters", "300", "--device", "cpu", "--json"],
        "Rust test binary (CPU loader, streaming and resident)": [os.path.join(HERE, "test-torch_cpu_only")],
        "Python loader device='cpu'": [sys.executable, "-c", CPU_PY, ds],
    }
    for name, cmd in runs.items():
        cp, pid, seen, mapped, samples = watch(cmd, env)
        detail = f"rc={cp.returncode}, nvidia-smi samples={samples}, in nvidia-smi={seen}, libcuda mapped={mapped}"
        run.log.write(f"\n$ {' '.join(map(str, cmd))}\n{cp.stdout}{cp.stderr}")
        ok = cp.returncode == 0 and not seen and not mapped
        if name.startswith("Python"):
            # The interpreter's own `import torch` may map the driver (PyTorch's libcublasLt opens
            # it as it loads): what counts is no context and nothing new mapped by trajstore.
            ok = cp.returncode == 0 and not seen and "initialized=False" in cp.stdout and "new=[]" in cp.stdout
            mapped = mapped and "mapped by import torch=True" not in cp.stdout
            detail += "; " + cp.stdout.strip().splitlines()[-1] if cp.stdout.strip() else ""
        if mapped:
            detail += "; " + who_loads_libcuda(run, cmd, env)
        if cuda and smi and not detector:
            ok = False
            detail += "; the detector did not see a CUDA process, so this proves nothing"
        run.check(f"--device cpu creates no CUDA context: {name}", ok, detail)


def who_loads_libcuda(run: Run, cmd, env) -> str:
    """The dynamic loader's account of who loaded the CUDA driver (LD_DEBUG=files)."""
    p = subprocess.run(list(map(str, cmd)), env={**env, "LD_DEBUG": "files"}, capture_output=True, text=True,
                       timeout=600)
    lines = (p.stderr + p.stdout).splitlines()
    hits = [i for i, line in enumerate(lines) if re.search(r"file=\S*libcuda\.so", line)]
    run.log.write("\n".join(lines[max(0, hits[0] - 30): hits[0] + 5]) + "\n" if hits else "libcuda: no LD_DEBUG line\n")
    return "; ".join(lines[i].strip() for i in hits[:2]) or "LD_DEBUG saw no libcuda"


CPU_PY = r"""
import re, sys, torch
def driver():
    maps = open("/proc/self/maps").read()
    return sorted({l.split()[-1] for l in maps.splitlines() if re.search(r"/libcuda\.so", l)})
by_torch = driver()  # import torch (a CUDA build) may map it: PyTorch's libcublasLt opens it
stages = [("import", driver())]
import trajstore
ds = trajstore.open(sys.argv[1])
stages.append(("open", driver()))
loader = ds.loader(slice_len=64, num_slices=256, device="cpu", workers=2, max_batches=400)
stages.append(("loader", driver()))
n = 0
for b in loader:
    n += b["observation"].shape[0] > 0
    if n == 1:
        stages.append(("first batch", driver()))
first = next((s for s, d in stages if d), "none")
new = sorted(set(driver()) - set(by_torch))
print(f"batches={n} initialized={torch.cuda.is_initialized()} mapped by import torch={by_torch != []} "
      f"first stage with libcuda={first} new={new}")
"""


def section_rust_figures(run: Run, a, ds: str, anchor) -> None:
    import torch

    if not torch.cuda.is_available():
        run.check("Rust figures on cuda", True, skip="no CUDA device")
        return
    bin_ = os.path.join(HERE, "trajstore")
    cols = ",".join(COLUMNS)
    iters = "300" if a.quick else "2000"
    for workers in (4, 8):
        p = run.sh([bin_, "bench", ds, "--device", "cuda", "--device-only", "--num-slices", B, "--slice-len", L,
                    "--columns", cols, "--workers", workers, "--iters", iters, "--json"], env=env_for(run))
        t = json.loads(p.stdout)["torch"]
        nbytes = t["gb_per_s"] * 1e9 / t["batches_per_s"]
        # The anchor is a pinned copy of what one batch's copy carries (the compact batch:
        # next_observation one row per slice, flags as spans), not of the full batch it becomes.
        sent = int(t.get("transfer_bytes_per_batch") or nbytes)
        copy_bps = anchor(sent) * 1e9 / sent
        run.figure(f"rust_cuda_{workers}w", batches_per_s=t["batches_per_s"], h2d_gb_per_s=t["gb_per_s"],
                   pinned_copy_batches_per_s=copy_bps, over_pinned_copy=t["batches_per_s"] / copy_bps,
                   full_batch_pinned_copy_gb_per_s=anchor(int(nbytes)),
                   synced_pinned_copy_gb_per_s=t.get("pinned_copy_gb_per_s"), batch_mb=nbytes / 1e6,
                   transfer_mb=sent / 1e6, expand=t.get("compact_expand"),
                   ring_replaced=(t.get("device_ring") or {}).get("replaced"),
                   **{f"worker_{k}_us": v for k, v in (t.get("worker_us_per_batch") or {}).items() if k != "batches"})
    # Beside it, 4 workers: the compact batch expanded by libtorch operations (~40 small kernels
    # a batch, --ops-expand), the full batch shipped as it is (--full-batch), and a new device
    # allocation and views a batch on the default stream instead of the device ring
    # (--no-device-ring).
    for variant in ("--ops-expand", "--full-batch", "--no-device-ring"):
        p = run.sh([bin_, "bench", ds, "--device", "cuda", "--device-only", "--num-slices", B, "--slice-len", L,
                    "--columns", cols, "--workers", 4, "--iters", iters, variant, "--json"], env=env_for(run))
        t = json.loads(p.stdout)["torch"]
        sent = int(t.get("transfer_bytes_per_batch") or 0)
        run.figure(f"rust_cuda_4w_{variant[2:].replace('-', '_')}", batches_per_s=t["batches_per_s"],
                   transfer_mb=sent / 1e6, expand=t.get("compact_expand"),
                   **{f"worker_{k}_us": v for k, v in (t.get("worker_us_per_batch") or {}).items() if k != "batches"},
                   pinned_copy_batches_per_s=anchor(sent) * 1e9 / sent if sent else None)
    # Resident: the fused kernel (one NVRTC-compiled kernel a batch) and, beside it in the same
    # run, the same batches by libtorch operations (--resident-unfused) and by the fused kernel
    # reading each batch's parameters in the workers' pinned buffer instead of a copy issued
    # before it (--resident-mapped-params). 8 workers plan the batches: with the default 2,
    # planning 16384 slices a batch bounded the H200 runs (2.9e9 against 3.8e9 transitions/s
    # with 4 or 8).
    variants = {"fused": [], "unfused": ["--resident-unfused"], "mapped": ["--resident-mapped-params"]}
    for slices in (B, 4096, 16384):
        it = str(max(300, int(iters) * B // slices))
        rates, failed = {}, {}
        for name, flag in variants.items():
            # The in-place parameters are new (sixteenth session, never run on a GPU before): a
            # failure is reported beside the other figures instead of ending the section.
            p = run.sh([bin_, "bench", ds, "--device", "cuda", "--device-only", "--resident", "--resident-budget",
                        "60GiB", *flag, "--num-slices", slices, "--slice-len", L, "--columns", cols, "--iters", it,
                        "--workers", 8, "--json"], env=env_for(run), check=name != "mapped")
            if p.returncode != 0:
                failed[name] = _tail((p.stderr or "").strip(), 300)
                continue
            rates[name] = json.loads(p.stdout)["torch"]
        t, u, m = rates["fused"], rates["unfused"], rates.get("mapped")
        mapped = ({"mapped_transitions_per_s": m["transitions_per_s"], "mapped_gather": m.get("resident_gather"),
                   "mapped_over_fused": m["transitions_per_s"] / t["transitions_per_s"]}
                  if m else {"mapped_error": failed.get("mapped")})
        run.figure(f"rust_resident_{slices}x{L}", workers=8, transitions_per_s=t["transitions_per_s"],
                   batches_per_s=t["batches_per_s"], setup_s=t["setup_s"], gather=t.get("resident_gather"),
                   # The kernel alone, launched back to back (eighteenth session): whether the
                   # kernel or the rest of a batch (the consumer, the parameters' copy) bounds it.
                   kernel_us_per_batch=t.get("resident_kernel_us_per_batch"),
                   loader_us_per_batch=1e6 / t["batches_per_s"],
                   # Per batch (nineteenth session): a worker planning the parameters, the
                   # consumer waiting for them and issuing the batch (copy, launch, views).
                   **_resident_times(t), **{f"mapped_{k}": v for k, v in _resident_times(m or {}).items()},
                   unfused_transitions_per_s=u["transitions_per_s"],
                   over_unfused=t["transitions_per_s"] / u["transitions_per_s"], **mapped)
    # The fixed cost of a resident batch (4 slices x 4 steps: no bandwidth to speak of), which
    # bounds small batches: 1e9 transitions/s at 256 x 64 leaves 16 us a batch.
    fixed = {}
    for name, flag in variants.items():
        p = run.sh([bin_, "bench", ds, "--device", "cuda", "--device-only", "--resident", "--resident-budget", "60GiB",
                    *flag, "--num-slices", 4, "--slice-len", 4, "--columns", cols, "--iters",
                    "2000" if a.quick else "20000", "--json"], env=env_for(run), check=name != "mapped")
        if p.returncode == 0:
            ft = json.loads(p.stdout)["torch"]
            fixed[name] = 1e6 / ft["batches_per_s"]
            if name == "fused":
                fixed["kernel"] = ft.get("resident_kernel_us_per_batch")
            if name in ("fused", "mapped"):
                fixed.update({f"{name}_{k}": v for k, v in _resident_times(ft).items()})
    run.figure("rust_resident_fixed_cost", fused_us_per_batch=fixed.pop("fused"), unfused_us_per_batch=fixed.pop("unfused"),
               mapped_us_per_batch=fixed.pop("mapped", None), fused_kernel_alone_us=fixed.pop("kernel", None), **fixed)
    # Refused, not crashed: a budget smaller than the columns.
    p = run.sh([bin_, "bench", ds, "--device", "cuda", "--device-only", "--resident", "--resident-budget", "1MiB",
                "--iters", "5"],
               env=env_for(run), check=False)
    err = (p.stderr or "").strip()
    run.check("resident mode beyond its budget is a clear error (CLI)",
              p.returncode not in (0,) and p.returncode > 0 and "budget" in err and len(err.splitlines()) <= 4,
              f"rc={p.returncode}: {_tail(err, 200)}")


def _resident_times(t: dict) -> dict:
    """A resident bench's µs per batch: a worker planning the parameters, the consumer waiting
    for them and issuing the batch (empty where the bench has none)."""
    w = t.get("worker_us_per_batch") or {}
    return {k: w.get(f) for k, f in (("planning_us", "gather"), ("consumer_wait_us", "consumer_wait"),
                                     ("consumer_issue_us", "consumer_issue")) if w.get(f) is not None}


# --- Python --------------------------------------------------------------------------------------
def section_python_tests(run: Run, a) -> None:
    import torch

    xml = os.path.join(tempfile.mkdtemp(), "junit.xml")
    tests = [os.path.join(HERE, "python", "tests", f) for f in ("test_cuda.py", "test_cpu_no_cuda.py")]
    p = run.sh([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}", *tests],
               env=env_for(run), check=False)
    root = ET.parse(xml).getroot()
    cases = list(root.iter("testcase"))
    failed = [c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None]
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    cuda = torch.cuda.is_available()
    n = len(cases)
    if cuda:
        run.check(f"Python CUDA tests ({n}, none skipped)", p.returncode == 0 and not failed and not skipped and n > 0,
                  f"failed={failed} skipped={skipped}" if failed or skipped else "")
    else:
        run.check(f"Python tests on the CPU ({n - len(skipped)} ran)", not failed and p.returncode == 0,
                  f"failed={failed}" if failed else "")
        run.check(f"Python CUDA tests ({len(skipped)})", True, skip="no CUDA device")


def checksum(torch, batch) -> "torch.Tensor":
    """An exact, order-sensitive checksum of every tensor of a batch, where the batch is."""
    total = None
    for k in sorted(batch.keys()):
        t = batch[k].contiguous()
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        b = t.view(torch.uint8).reshape(-1).to(torch.int64)
        w = torch.arange(b.numel(), device=b.device, dtype=torch.int64) % 251 + 1
        s = (b * w).sum()
        total = s if total is None else total * 1_000_003 + s
    return total


def stream_check(run: Run, a, ds_path: str, kw: dict, devices: tuple = ("cpu", "cuda")) -> None:
    """A stream (issue 34): a `file://` store of a demo dataset in 4 MiB segments (so that a
    quarter of it holds the three windows a stream keeps: two being read, one downloading), read
    through a cache of a quarter of it onto each of `devices`, from fresh caches with the same
    seed: the same batches."""
    import torch
    import trajstore

    work = os.path.dirname(ds_path)
    src = os.path.join(work, "stream-src.trajstore")
    run.sh([os.path.join(HERE, "trajstore"), "demo", src, "--transitions", 1_000_000 if a.quick else 2_000_000,
            "--segment-size", "4MiB", "--json"], env=env_for(run))
    store = "file://" + os.path.join(work, "store")
    trajstore.push(src, store)  # (the bundle's CLI is loader-only: no `push`)
    limit = trajstore.open(store, cache_limit="1TiB", cache_dir=os.path.join(work, "probe")).transition_bytes // 4
    streamed = []
    for i, dev in enumerate(devices):
        sds = trajstore.open(store, cache_limit=limit, cache_dir=os.path.join(work, f"cache-{i}"))
        t0 = time.perf_counter()
        streamed.append([{k: v.cpu() for k, v in b.items()} for b in sds.loader(device=dev, **{**kw, "max_batches": 200})])
        run.figure(f"python_stream_{dev}_{i}_batches_per_s", value=len(streamed[i]) / (time.perf_counter() - t0),
                   note="128 x 32, a quarter of the dataset cached, from a file:// store, cold cache")
    same = len(streamed[0]) == len(streamed[1]) == 200 and all(
        g.keys() == c.keys() and all(torch.equal(g[k], c[k]) for k in c) for g, c in zip(streamed[1], streamed[0]))
    run.check(f"Python: a stream's {devices[1]} batches equal its {devices[0]} batches (quarter cache, 200 batches)",
              same, "")


def section_python_checks(run: Run, a, ds_path: str) -> None:
    import torch
    import trajstore

    if not torch.cuda.is_available():
        run.check("Python CUDA checks", True, skip="no CUDA device")
        return
    ds = trajstore.open(ds_path)
    cols = ds.sample_columns
    kw = dict(slice_len=32, num_slices=128, columns=cols, seed=3, max_batches=60)
    cpu = [dict(b) for b in ds.loader(device="cpu", workers=2, **kw)]
    gpu = []
    for b in ds.loader(device="cuda", workers=3, staging_slots=2, **kw):
        gpu.append({k: v.cpu() for k, v in b.items()})
        devices = {v.device.type for v in b.values()}
    same = len(gpu) == len(cpu) and all(
        g.keys() == c.keys() and all(torch.equal(g[k], c[k]) for k in c) for g, c in zip(gpu, cpu))
    run.check(f"Python: cuda batches equal the CPU batches, every column ({len(cols)} + flags, {len(cpu)} batches)",
              same and devices == {"cuda"}, f"devices={devices}")
    for dt, rel in ((torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)):
        exact = within = True
        for c, b in zip(cpu[:10], ds.loader(device="cuda", dtype_cast=dt, **{**kw, "max_batches": 10})):
            for k, v in b.items():
                if c[k].is_floating_point():
                    if v.dtype != dt:
                        exact = within = False
                        continue
                    g = v.cpu()
                    exact &= torch.equal(g, c[k].to(dt))
                    # Half a unit in the last place, relative; absolute below the format's
                    # smallest normal (f16 subnormals are spaced 2^-24 apart).
                    atol = 2.0**-25 if dt == torch.float16 else 0.0
                    within &= bool(((g.float() - c[k]).abs() <= c[k].abs() * rel + atol).all())
                else:
                    exact &= torch.equal(v.cpu(), c[k])
                    within &= torch.equal(v.cpu(), c[k])
        run.check(f"Python: dtype_cast={str(dt).split('.')[-1]} is the CPU values cast (within {rel:.2g} relative)",
                  within, f"bit-equal to the CPU cast: {exact}")

    # Pinned staging, as the transform sees it, and repinned after it.
    seen = []

    def transform(batch):
        seen.append(all(v.is_pinned() for v in batch.values()))
        batch["observation"] = batch["observation"] * 2.0  # a new, pageable tensor
        batch["return"] = batch["reward"].sum(-1)
        return batch

    got = list(ds.loader(device="cuda", transform=transform, **{**kw, "max_batches": 8}))
    ok_vals = all(torch.equal(g["observation"].cpu(), c["observation"] * 2.0) for g, c in zip(got, cpu))
    run.check("Python: staging buffers are pinned when the transform runs (cuda)", seen and all(seen) and ok_vals,
              f"{sum(seen)}/{len(seen)} pinned, values after transform right: {ok_vals}")
    pinned = list(ds.loader(device="cpu", pin_memory=True, transform=transform, **{**kw, "max_batches": 8}))
    run.check("Python: pin_memory=True batches stay pinned after a transform that makes new tensors",
              all(v.is_pinned() for b in pinned for v in b.values()), "")

    stream_check(run, a, ds_path, kw)

    # The staging ring under pressure: every batch's checksum on the GPU against the CPU plan.
    n = 600 if a.quick else 3000
    skw = dict(slice_len=L, num_slices=B, columns=COLUMNS, seed=17, max_batches=n)
    want = [checksum(torch, b).item() for b in ds.loader(device="cpu", workers=4, **skw)]
    load = torch.ones(2048, 2048, device="cuda")
    acc = load
    sums = []
    t0 = time.perf_counter()
    for b in ds.loader(device="cuda", workers=4, staging_slots=2, **skw):
        acc = acc @ load / 2048.0  # keep the device busy so that copies queue up behind it
        sums.append(checksum(torch, b))
    got = torch.stack(sums).cpu().tolist()
    dt = time.perf_counter() - t0
    torn = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    run.check(f"Python: no staging slot overwritten in flight ({n} batches, 4 workers x 2 slots, GPU checksums)",
              len(got) == len(want) == n and not torn, f"{len(torn)} differ; first {torn[:5]}; {n / dt:.0f} batches/s")

    # Batches kept on the device (never copied out) while the device ring goes round, the GPU
    # busy; with next_observation crossing as one row per slice and derived on the device.
    import trajstore._cuda as ring

    saved = ring._TAIL_MIN_BYTES
    ring._TAIL_MIN_BYTES = 0
    try:
        held, views = [], []
        hkw = dict(slice_len=L, num_slices=B, columns=COLUMNS, seed=23, max_batches=40, policy="span:3:5")
        for i, b in enumerate(ds.loader(device="cuda", workers=4, staging_slots=2, **hkw)):
            acc = acc @ load / 2048.0
            if i % 2:
                held.append(b)
            else:
                views.append(b["next_observation"][:, 1:])
        cpu_h = list(ds.loader(device="cpu", workers=2, **hkw))
    finally:
        ring._TAIL_MIN_BYTES = saved
    ok_held = all(all(torch.equal(g[k].cpu(), c[k]) for k in c) for g, c in zip(held, cpu_h[1::2]))
    ok_views = all(torch.equal(v.cpu(), c["next_observation"][:, 1:]) for v, c in zip(views, cpu_h[0::2]))
    run.check("Python: held batches and views are never overwritten; next_observation derived on the device "
              "(40 batches, span policy, 2 slots)", len(held) == 20 and ok_held and ok_views,
              f"held equal: {ok_held}, views equal: {ok_views}")


def pinned_anchor(torch):
    """GB/s of back-to-back pinned host-to-device copies of nbytes (the issue's anchor)."""
    cache: dict = {}

    def measure(nbytes: int) -> float:
        if nbytes in cache:
            return cache[nbytes]
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        host.fill_(1)
        for _ in range(10):
            host.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        reps = max(50, int(4e9 / max(nbytes, 1)))
        reps = min(reps, 2000)
        t0 = time.perf_counter()
        for _ in range(reps):
            host.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        cache[nbytes] = nbytes * reps / (time.perf_counter() - t0) / 1e9
        return cache[nbytes]

    return measure


def section_python_figures(run: Run, a, ds_path: str, anchor) -> None:
    import torch
    import trajstore

    if not torch.cuda.is_available():
        run.check("Python figures on cuda", True, skip="no CUDA device")
        return
    ds = trajstore.open(ds_path)
    n = 300 if a.quick else 2000
    for workers in (4, 8):
        loader = ds.loader(slice_len=L, num_slices=B, columns=COLUMNS, device="cuda", workers=workers, prefetch=4,
                           max_batches=n + 50)
        it = iter(loader)
        for _ in range(50):
            b = next(it)
        nbytes = sum(v.numel() * v.element_size() for v in b.values())
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        k = 0
        for b in it:
            k += 1
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        gbps = k * nbytes / dt / 1e9
        # One copy per batch of the slot's packed buffer (the compact batch): the anchor.
        sent = int(loader._packed[0].numel())
        copy_bps = anchor(sent) * 1e9 / sent
        run.figure(f"python_cuda_{workers}w", batches_per_s=k / dt, h2d_gb_per_s=gbps,
                   pinned_copy_batches_per_s=copy_bps, over_pinned_copy=k / dt / copy_bps,
                   full_batch_pinned_copy_gb_per_s=anchor(nbytes), batch_mb=nbytes / 1e6, transfer_mb=sent / 1e6)


def section_frames(run: Run, a, work: str, anchor) -> None:
    """Pixel frames (issues 32 and 35): a `demo --frames` dataset (84x84 uint8 frames, zstd with
    a trained dictionary), loaded as written-out 4-stacks and as frame windows (`frame_window`:
    each slice's L + K - 1 frames gathered once and copied once, the [B, L, K, 84, 84] stacks an
    `unfold` view made where the batch lies).

    - Checked (the CPU half too, through the staged ring's CPU stand-in, TRAJSTORE_STAGED_CPU=1):
      the window batches of the CUDA ring equal the written-out stacks of the same seed at every
      valid step, are views with one frame between steps, and their copy carries each slice's
      L + K - 1 observation frames once.
    - Figures: the CPU gather alone at 256 x 64 x (4-stack), every core (decoding bound), both
      layouts; the loader at 32 x (4-stack) in memory on every core beside TorchRL's
      single-frame storage + SliceSampler on the same episodes (where torchrl imports); on a GPU, batches/s of both layouts to cuda from Rust (`bench --device cuda`) and
      Python, each beside a pinned copy of what one batch's copy carries; and the window with its
      stored frames decoded on the GPU (`--device-decode`)."""
    import torch
    import trajstore

    bin_ = os.path.join(HERE, "trajstore")
    ds_path = os.path.join(work, "frames.trajstore")
    run.sh([bin_, "demo", ds_path, "--frames", "--discrete", "--act-dim", "4", "--transitions",
            100_000 if a.quick else 1_000_000, "--json"], env=env_for(run))
    cuda = torch.cuda.is_available()
    ds = trajstore.open(ds_path)
    k, l, b = 4, 16, 32
    cols = ["observation", "next_observation", "action"]
    kw = dict(slice_len=l, num_slices=b, columns=cols, frame_stack=k, seed=5, max_batches=20, policy="pad")
    ref = [{n: t.clone() for n, t in batch.items()} for batch in ds.loader(device="cpu", **kw)]
    where = dict(device="cuda") if cuda else dict(staging_slots=2)
    old = os.environ.get("TRAJSTORE_STAGED_CPU")
    if not cuda:
        os.environ["TRAJSTORE_STAGED_CPU"] = "1"
    try:
        ring = {}
        for window in (False, True):
            loader = ds.loader(frame_window=window, **where, **kw)
            got = []
            for batch in loader:
                got.append({n: t.cpu() for n, t in batch.items()})
                strides = tuple(batch["observation"].stride())
            obs = next(p for p in loader._pieces if p.name == "observation")
            nxt = next(p for p in loader._pieces if p.name == "next_observation")
            ring[window] = (got, int(loader._packed[0].numel()), strides, obs.nbytes, nxt.nbytes if nxt.tail else None)
    finally:
        if old is None:
            os.environ.pop("TRAJSTORE_STAGED_CPU", None)
    frame = 84 * 84
    (stacks, sent_stacks, _, obs_stacks, _), (windows, sent_window, strides, obs_window, next_window) = ring[False], ring[True]
    same = len(windows) == len(ref) == len(stacks) == 20
    for w, s, r in zip(windows, stacks, ref):
        m = r["mask"].bool()
        same &= all(torch.equal(s[n], r[n]) for n in r)
        same &= all(torch.equal(w[n], r[n]) for n in r if n not in ("observation", "next_observation"))
        same &= all(torch.equal(w[n][m], r[n][m]) for n in ("observation", "next_observation"))
    on = "cuda" if cuda else "the CPU stand-in"
    run.check(f"Python: frame windows through the staging ring ({on}) equal the written-out stacks at every valid "
              "step, as views", same and strides == ((l + k - 1) * frame, frame, frame, 84, 1),
              f"strides={strides}")
    # The observation crosses as L + K - 1 frames a slice, not L * K; next_observation as one
    # frame a slice (the frame after its last valid step; its window is derived on the device
    # from the observation's), where written-out stacks ship one stack a slice.
    run.check("Python: a frame window's copy carries each slice's L + K - 1 observation frames once, and one "
              "frame of next_observation",
              obs_window * l * k == obs_stacks * (l + k - 1) and next_window == b * frame and sent_window < sent_stacks,
              f"observation {obs_window / 1e6:.2f} MB against {obs_stacks / 1e6:.2f} MB; next_observation "
              f"{next_window} B; the whole copy {sent_window / 1e6:.2f} MB against {sent_stacks / 1e6:.2f} MB")
    # The CPU gather alone, every core: what the loaders to cuda can at most deliver.
    iters = "20" if a.quick else "100"
    shape = ["--num-slices", B, "--slice-len", L, "--columns", "observation,action,reward", "--frame-stack", "4"]
    workers = str(os.cpu_count() or 2)
    for window in (False, True):
        name = "window" if window else "stacks"
        flag = ["--frame-window"] if window else []
        j = json.loads(run.sh([bin_, "bench", ds_path, *shape, *flag, "--workers", workers, "--iters", iters,
                               "--json"], env=env_for(run)).stdout)
        run.figure(f"frames_gather_only_{name}", batches_per_s=j["loader_batches_per_s"], workers=workers,
                   batch_mb=j["batch_bytes"] / 1e6, frames_per_s=j["loader_batches_per_s"] * B * (L + (3 if window else 0)))
        if not window:
            frames_32x4(run, a, bin_, ds, ds_path, workers)
        if not cuda:
            continue
        j = json.loads(run.sh([bin_, "bench", ds_path, "--device", "cuda", "--device-only", *shape, *flag, "--workers",
                               workers, "--iters", iters, "--json"], env=env_for(run)).stdout)["torch"]
        sent = int(j.get("transfer_bytes_per_batch") or 0)
        copy_bps = anchor(sent) * 1e9 / sent if sent else None
        run.figure(f"frames_rust_cuda_{name}", batches_per_s=j["batches_per_s"], transfer_mb=sent / 1e6,
                   pinned_copy_batches_per_s=copy_bps, expand=j.get("compact_expand"))
        if window:
            # Issue 35 part 5: the stored frames cross (tens of bytes each) and the GPU decodes
            # them (frame_decode.cu, one thread a frame), against the workers' decode above.
            d = json.loads(run.sh([bin_, "bench", ds_path, "--device", "cuda", "--device-only", *shape, *flag,
                                   "--device-decode", "--workers", workers, "--iters", iters, "--json"],
                                  env=env_for(run), timeout=180).stdout)["torch"]
            t = json.loads(run.sh([bin_, "bench", ds_path, "--device", "cuda", "--device-only", *shape, *flag,
                                   "--device-decode", "--device-decode-per-thread", "--workers", workers, "--iters",
                                   iters, "--json"], env=env_for(run), timeout=180).stdout)["torch"]
            dsent = int(d.get("transfer_bytes_per_batch") or 0)
            run.figure("frames_rust_cuda_window_device_decode", batches_per_s=d["batches_per_s"],
                       kernel=d.get("device_decode_kernel"), per_thread_batches_per_s=t["batches_per_s"],
                       transfer_mb=dsent / 1e6, over_workers_decode=d["batches_per_s"] / j["batches_per_s"],
                       fewer_bytes=sent / dsent if dsent else None,
                       pinned_copy_batches_per_s=anchor(dsent) * 1e9 / dsent if dsent else None)
        loader = ds.loader(slice_len=L, num_slices=B, columns=["observation", "action", "reward"], frame_stack=4,
                           frame_window=window, device="cuda", workers=int(workers), max_batches=int(iters) + 10)
        it = iter(loader)
        for _ in range(10):
            next(it)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = sum(1 for _ in it)
        torch.cuda.synchronize()
        rate = n / (time.perf_counter() - t0)
        sent = int(loader._packed[0].numel())
        run.figure(f"frames_python_cuda_{name}", batches_per_s=rate, transfer_mb=sent / 1e6,
                   pinned_copy_batches_per_s=anchor(sent) * 1e9 / sent)


def frames_32x4(run: Run, a, bin_: str, ds, ds_path: str, workers: str) -> None:
    """Issue 32's in-memory target: 32 x (4-stack) on every core against TorchRL's single-frame
    storage + SliceSampler on the same episodes, in the same run."""
    j = json.loads(run.sh([bin_, "bench", ds_path, "--prefault", "--num-slices", "32", "--slice-len", "1",
                           "--columns", "observation,action,reward", "--frame-stack", "4", "--workers",
                           workers, "--iters", "3000" if a.quick else "30000", "--json"], env=env_for(run)).stdout)
    ours = j["loader_batches_per_s"]
    theirs = _torchrl_frame_stacks(ds, 32, 4, 200)
    run.figure("frames_32x4_loader", batches_per_s=ours, workers=workers,
               torchrl_batches_per_s=theirs, over_torchrl=ours / theirs if theirs else None)


def section_atari(run: Run, a) -> None:
    """Issue 32's targets on real Atari frames, where the bundle carries them."""
    _atari(run, a, os.path.join(HERE, "trajstore"), str(os.cpu_count() or 2))


def _atari(run: Run, a, bin_: str, workers: str) -> None:
    """Issue 32's targets on real Atari frames, where the bundle carries them (`GPU_CHECK_ATARI`
    at build: the first whole episodes of ale-py recordings, ingested with the default codec):
    every frame decodes (`verify`), bytes per frame against raw, decoded frames/s on one core, and
    32 x (4-stack) in memory on every core beside TorchRL's single-frame storage + SliceSampler
    over the same episodes, in the same run."""
    import torch
    import trajstore

    cuda = torch.cuda.is_available()
    root = os.path.join(HERE, "atari")
    games = sorted(os.listdir(root)) if os.path.isdir(root) else []
    if not games:
        run.check("real Atari frames", True, skip="the bundle carries none (GPU_CHECK_ATARI at build)")
        return
    for game in games:
        path = os.path.join(root, game)
        v = run.sh([bin_, "verify", path], env=env_for(run), check=False)
        run.check(f"{game}: every real frame decodes to its shape (verify)", v.returncode == 0,
                  (v.stdout + v.stderr).strip()[-300:])
        info = json.loads(run.sh([bin_, "info", path, "--json"], env=env_for(run)).stdout)
        frames = next((f for f in info.get("frames", []) if f["column"] == "observation"), {})
        one = json.loads(run.sh([bin_, "bench", path, "--prefault", "--columns", "observation", "--slice-len", "64",
                                 "--num-slices", "256", "--iters", "20", "--workers", "1", "--json"],
                                env={**env_for(run), "RAYON_NUM_THREADS": "1"}).stdout)
        run.figure(f"atari_{game}_frames", transitions=info.get("transitions"), episodes=info.get("episodes"),
                   bytes_per_frame=frames.get("bytes_per_frame"), ratio_to_raw=frames.get("ratio"),
                   decoded_frames_per_s_one_core=one["loader_batches_per_s"] * 256 * 64)
        # From one worker to every core, and one fewer (the consumer, woken once a batch, takes a
        # core): how the loader scales says whether decoding or the hand-over bounds it, beside
        # the one-thread sample + gather of the same run (its median, and its mean over the whole
        # loop, warm-up half included, which a loader's mean rate compares with).
        stacks = ["--num-slices", "32", "--slice-len", "1", "--columns", "observation,action,reward",
                  "--frame-stack", "4"]
        iters = "3000" if a.quick else "30000"
        rates, one_thread_us, one_thread_mean_us, spread = {}, [], [], {}
        n = int(workers)
        for w in sorted({1, 2, 4, 8, n, max(1, n - 1)} & set(range(1, n + 1))):
            j = json.loads(run.sh([bin_, "bench", path, "--prefault", *stacks, "--workers", w, "--iters", iters,
                                   "--json"], env=env_for(run)).stdout)
            rates[w] = j["loader_batches_per_s"]
            one_thread_us.append(j["sample_median_us"])
            loop = j["phases"]["single_thread"]
            one_thread_mean_us.append(loop["secs"] * 1e6 / loop["batches"])
            # Each worker takes the next batch free: the fewest and most one made say how
            # unevenly the cores ran (hyperthread siblings, the consumer's core).
            per = j.get("loader_batches_per_worker") or [0]
            spread[w] = [min(per), max(per)]
        # Every core but the consumer's, with a deeper queue: whether the window bounds it.
        m = max(1, n - 1)
        deep = json.loads(run.sh([bin_, "bench", path, "--prefault", *stacks, "--workers", m, "--prefetch", "64",
                                  "--iters", iters, "--json"], env=env_for(run)).stdout)
        best = max(rates, key=lambda w: rates[w])
        ours = rates[best]
        # The decoded frames in memory (--frame-cache: copied, not decoded; raw frames' memory,
        # as TorchRL's storage holds them), at the best worker count.
        cached = json.loads(run.sh([bin_, "bench", path, "--prefault", *stacks, "--workers", best, "--frame-cache",
                                    "8GiB", "--iters", iters, "--json"], env=env_for(run)).stdout)
        theirs = _torchrl_frame_stacks(trajstore.open(path), 32, 4, 200)
        one_us = sorted(one_thread_us)[len(one_thread_us) // 2]
        mean_us = sorted(one_thread_mean_us)[len(one_thread_mean_us) // 2]
        run.figure(f"atari_{game}_32x4_loader", batches_per_s=ours, workers=best,
                   by_workers={str(w): round(r) for w, r in rates.items()},
                   one_thread_sample_gather_us=one_us, one_thread_mean_us=mean_us,
                   over_one_thread_mean={str(w): round(r * mean_us / 1e6, 2) for w, r in rates.items()},
                   batches_per_worker_min_max={str(w): v for w, v in spread.items()},
                   prefetch_64={"workers": m, "batches_per_s": deep["loader_batches_per_s"]},
                   frame_cache={"workers": best, "batches_per_s": cached["loader_batches_per_s"],
                                "one_thread_sample_gather_us": cached["sample_median_us"],
                                "fill_seconds": cached["frame_cache"]["fill_seconds"],
                                "bytes": cached["frame_cache"]["bytes"],
                                "over_torchrl": cached["loader_batches_per_s"] / theirs if theirs else None},
                   torchrl_batches_per_s=theirs, over_torchrl=ours / theirs if theirs else None)
        if cuda:
            # The same 4-stacks as a frame window of one step (`[32, 1, 4, 84, 84]`, a view) to
            # the GPU: decoded by the workers, then shipped compressed and decoded on the device.
            to_gpu = {}
            for name, flag in (("workers_decode", []), ("device_decode", ["--device-decode"])):
                t = json.loads(run.sh([bin_, "bench", path, "--prefault", "--device", "cuda", "--device-only", *stacks,
                                       "--frame-window", *flag, "--workers", str(best), "--iters", iters, "--json"],
                                      env=env_for(run), timeout=180).stdout)["torch"]
                to_gpu[name] = t["batches_per_s"]
            run.figure(f"atari_{game}_32x4_to_cuda", workers=best, **{f"{k}_batches_per_s": v for k, v in to_gpu.items()},
                       torchrl_batches_per_s=theirs,
                       over_torchrl={k: v / theirs for k, v in to_gpu.items()} if theirs else None)


def _torchrl_frame_stacks(ds, slices: int, k: int, iters: int) -> float | None:
    """TorchRL's batches/s of `slices` K-stacks from single 84x84 frames in memory
    (`LazyTensorStorage` + `SliceSampler`: a K-stack ending at step t is the K-step slice ending at
    t, as `scripts/peer_torchrl_frames.py` samples them), over `ds`'s episode lengths; None
    without torchrl. Its storage copies raw frames, so their content does not change its speed:
    they are zeros."""
    import numpy as np
    import torch

    try:
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        from torchrl.data.replay_buffers.samplers import SliceSampler
    except ImportError:
        return None
    lengths = np.asarray(ds.episodes().column("length").to_numpy(), dtype=np.int64)
    n = int(lengths.sum())
    episode = torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths))
    rb = ReplayBuffer(storage=LazyTensorStorage(n), batch_size=slices * k,
                      sampler=SliceSampler(slice_len=k, traj_key="episode", strict_length=True, cache_values=True))
    rb.extend(TensorDict({"obs": torch.zeros((n, 84, 84), dtype=torch.uint8), "episode": episode}, batch_size=[n]))
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        rb.sample()
        times.append(time.perf_counter() - t)
    times.sort()
    return 1 / times[len(times) // 2]


def section_profile(run: Run, a, ds_path: str, anchor) -> None:
    """Where a batch's time goes (issue 35, part 6), each cost on its own at the batch's exact
    size: the gather alone into host memory (the Rust CLI's CPU loader, every worker count the
    CUDA figures use; runs without a GPU too); then, on a GPU, one packed pinned copy of the
    batch's bytes, the same bytes as the Python loader's separate per-tensor copies, those plus a
    recorded event, and the time the Python loader's consumer thread spends per batch."""
    import torch
    import trajstore

    bin_ = os.path.join(HERE, "trajstore")
    iters = "200" if a.quick else "1000"
    for workers in (4, 8):
        p = run.sh([bin_, "bench", ds_path, "--num-slices", B, "--slice-len", L,
                    "--columns", ",".join(COLUMNS), "--workers", workers, "--iters", iters, "--json"],
                   env=env_for(run))
        j = json.loads(p.stdout)
        rate = j["loader_batches_per_s"]
        run.figure(f"gather_only_{workers}w", batches_per_s=rate, gb_per_s=rate * j["batch_bytes"] / 1e9,
                   batch_mb=j["batch_bytes"] / 1e6)
    if not torch.cuda.is_available():
        run.check("profile on cuda", True, skip="no CUDA device")
        return
    ds = trajstore.open(ds_path)
    host = next(iter(ds.loader(slice_len=L, num_slices=B, columns=COLUMNS, device="cpu", pin_memory=True,
                               max_batches=1)))
    tensors = [v for v in host.values()]
    nbytes = sum(v.numel() * v.element_size() for v in tensors)
    packed = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    stream = torch.cuda.Stream()
    reps = 200 if a.quick else 1000

    def per_batch_us(fn) -> float:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps * 1e6

    def one_copy() -> None:
        with torch.cuda.stream(stream):
            packed.to("cuda", non_blocking=True)

    def per_tensor() -> None:
        with torch.cuda.stream(stream):
            for v in tensors:
                v.to("cuda", non_blocking=True)

    def per_tensor_event() -> None:
        with torch.cuda.stream(stream):
            out = [v.to("cuda", non_blocking=True) for v in tensors]
            ev = torch.cuda.Event()
            ev.record(stream)
        torch.cuda.current_stream().wait_event(ev)
        for o in out:
            o.record_stream(torch.cuda.current_stream())

    run.figure("profile_copy_us_per_batch", one_packed_copy=per_batch_us(one_copy),
               per_tensor_copies=per_batch_us(per_tensor), per_tensor_copies_event_record_stream=per_batch_us(
                   per_tensor_event), tensors=len(tensors), batch_mb=nbytes / 1e6,
               pinned_copy_gb_per_s=anchor(nbytes))
    # The consumer thread's own time per batch: next() on a loader that is never starved (few
    # batches, long waits between them for the workers to fill the ring).
    loader = ds.loader(slice_len=L, num_slices=B, columns=COLUMNS, device="cuda", workers=4, prefetch=4,
                       max_batches=60)
    it = iter(loader)
    spent = []
    for _ in range(60):
        time.sleep(0.02)
        t0 = time.perf_counter()
        next(it)
        spent.append(time.perf_counter() - t0)
    spent.sort()
    run.figure("profile_python_next_us", median=spent[len(spent) // 2] * 1e6, p90=spent[int(len(spent) * 0.9)] * 1e6)


def section_training(run: Run, a, ds_path: str) -> None:
    """An MLP (behaviour cloning on observation -> action) fed by the loader: how much of each
    step the loop waits for the next batch."""
    import torch
    import trajstore

    if not torch.cuda.is_available():
        run.check("training step fed by the loader", True, skip="no CUDA device")
        return
    ds = trajstore.open(ds_path)
    steps = 200 if a.quick else 1000
    for hidden, layers in ((256, 2), (1024, 3)):
        torch.manual_seed(0)
        mods, d = [], 17
        for _ in range(layers):
            mods += [torch.nn.Linear(d, hidden), torch.nn.ReLU()]
            d = hidden
        net = torch.nn.Sequential(*mods, torch.nn.Linear(d, 6)).cuda()
        opt = torch.optim.Adam(net.parameters(), lr=1e-4)

        def step(b):
            obs = b["observation"].reshape(-1, 17)
            act = b["action"].reshape(-1, 6)
            m = b["mask"].reshape(-1, 1)
            loss = (((net(obs) - act) ** 2) * m).sum() / m.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

        # The GPU-only time of a step, on one batch held on the device.
        held = next(iter(ds.loader(slice_len=L, num_slices=B, columns=COLUMNS, device="cuda", max_batches=1)))
        for _ in range(20):
            step(held)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(100):
            step(held)
        torch.cuda.synchronize()
        compute = (time.perf_counter() - t0) / 100
        wait = 0.0
        it = iter(ds.loader(slice_len=L, num_slices=B, columns=COLUMNS, device="cuda", workers=8, prefetch=4,
                            max_batches=steps + 20))
        for _ in range(20):
            step(next(it))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            w = time.perf_counter()
            b = next(it)
            wait += time.perf_counter() - w
            loss = step(b)
        torch.cuda.synchronize()
        total = time.perf_counter() - t0
        run.figure(f"training_mlp_{hidden}x{layers}", step_ms=1e3 * total / steps, gpu_only_step_ms=1e3 * compute,
                   wait_fraction=wait / total, gpu_idle_fraction=max(0.0, 1 - compute * steps / total),
                   loss=float(loss.detach()))


# --- TorchRL -------------------------------------------------------------------------------------
def section_torchrl(run: Run, a, ds_path: str, figures: dict) -> None:
    import numpy as np
    import torch

    if not torch.cuda.is_available():
        run.check("TorchRL anchors", True, skip="no CUDA device")
        return
    try:
        from tensordict import TensorDict
        from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
        from torchrl.data.replay_buffers.samplers import SliceSampler
    except ImportError as e:
        run.check("TorchRL anchors", True, skip=f"torchrl not importable: {e}")
        return
    sys.path.insert(0, os.path.join(HERE, "python", "tests"))
    from trajref import Reference

    t0 = time.perf_counter()
    ref = Reference(ds_path)
    n = ref.num_transitions
    done = np.zeros(n, dtype=bool)
    for e in ref.episodes.values():
        done[e.row + e.length - 1] = True
    data = {
        "observation": torch.from_numpy(np.ascontiguousarray(ref.columns["observation"])),
        "action": torch.from_numpy(np.ascontiguousarray(ref.columns["action"])),
        "reward": torch.from_numpy(np.ascontiguousarray(ref.columns["reward"])),
        "done": torch.from_numpy(done),
    }
    del ref
    run.info["torchrl_load_s"] = round(time.perf_counter() - t0, 1)
    iters = 30 if a.quick else 200

    def fill(storage):
        chunk = 1 << 21
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            storage.extend(TensorDict({k: v[s:e] for k, v in data.items()}, batch_size=[e - s]))

    # Streaming: memmap storage, pinned, prefetching, each batch moved to the GPU.
    scratch = tempfile.mkdtemp(prefix="torchrl-memmap-")
    prefetch = 4
    rb = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=scratch),
                      sampler=SliceSampler(num_slices=B, end_key="done", cache_values=True, strict_length=False),
                      batch_size=B * L, pin_memory=True, prefetch=prefetch)
    t0 = time.perf_counter()
    fill(rb)
    ingest = time.perf_counter() - t0
    host = rb.sample()
    pinned = all(v.is_pinned() for v in host.values(include_nested=True, leaves_only=True))
    for _ in range(10):
        rb.sample().to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        b = rb.sample().to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    bps = iters / dt
    ours = {k: figures[k]["batches_per_s"] for k in figures if k.startswith(("rust_cuda", "python_cuda"))}
    run.figure(f"torchrl_memmap_cuda_prefetch{prefetch}", batches_per_s=bps, ingest_s=ingest,
               sample_pinned=pinned, on_cuda=bool(b["observation"].is_cuda), **{f"{k}_over_torchrl": v / bps for k, v in ours.items()})
    del rb
    # GPU-resident: tensor storage on the device.
    for slices in (B, 4096, 16384):
        rb = ReplayBuffer(storage=LazyTensorStorage(n, device="cuda"),
                          sampler=SliceSampler(num_slices=slices, end_key="done", cache_values=True, strict_length=False),
                          batch_size=slices * L)
        fill(rb)
        for _ in range(5):
            rb.sample()
        torch.cuda.synchronize()
        reps = max(10, iters // (slices // B))
        t0 = time.perf_counter()
        for _ in range(reps):
            b = rb.sample()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        tps = reps * slices * L / dt
        key = f"rust_resident_{slices}x{L}"
        ours = figures.get(key, {}).get("transitions_per_s")
        run.figure(f"torchrl_cuda_storage_{slices}x{L}", transitions_per_s=tps,
                   **({f"{key}_over_torchrl": ours / tps} if ours else {}))
        del rb, b
        torch.cuda.empty_cache()


# --- main ----------------------------------------------------------------------------------------
# Every section, in the order a full run takes them.
SECTIONS = ("rust-tests", "python-tests", "cpu", "python-checks", "profile", "frames", "atari", "figures", "training",
            "torchrl")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="folder for results.json, summary.txt and log.txt")
    p.add_argument("--transitions", type=int, default=10_000_000, help="size of the D4RL-shaped dataset it builds")
    p.add_argument("--quick", action="store_true", help="fewer batches (a CPU machine, or a smoke run)")
    p.add_argument("--skip", default="", help="comma-separated sections to skip: " + ", ".join(SECTIONS))
    p.add_argument("--only", default="",
                   help="comma-separated sections to run, in this order (a short device lease: the most wanted "
                        "first; results.json is rewritten after each section)")
    a = p.parse_args()
    sys.path.insert(0, os.path.join(HERE, "python"))  # the bundle's package, for the in-process checks
    only = [s for s in a.only.split(",") if s]
    skip = set(filter(None, a.skip.split(",")))
    unknown = sorted((set(only) | skip) - set(SECTIONS))
    if unknown:
        p.error(f"unknown sections {unknown}; they are: {', '.join(SECTIONS)}")
    run = Run(a.out)
    run.section("environment", section_env, a)
    work = tempfile.mkdtemp(prefix="trajstore-gpu-check-")
    ds = os.path.join(work, "d4rl.trajstore")
    t0 = time.perf_counter()
    run.sh([os.path.join(HERE, "trajstore"), "demo", ds, "--transitions", a.transitions, "--mean-episode-len", "1000",
            "--json"], env=env_for(run))
    run.info["demo_s"] = round(time.perf_counter() - t0, 1)
    import torch

    anchor = pinned_anchor(torch) if torch.cuda.is_available() else None
    parts = {
        "rust-tests": [("Rust tests", section_rust_tests, (a,))],
        "python-tests": [("Python tests", section_python_tests, (a,))],
        "cpu": [("CPU runs leave the GPU alone", section_cpu_run, (a, ds))],
        "python-checks": [("Python CUDA checks", section_python_checks, (a, ds))],
        "profile": [("profile", section_profile, (a, ds, anchor))],
        "frames": [("pixel frames", section_frames, (a, work, anchor))],
        "atari": [("real Atari frames", section_atari, (a,))],
        "figures": [("Rust figures", section_rust_figures, (a, ds, anchor)),
                    ("Python figures", section_python_figures, (a, ds, anchor))],
        "training": [("training step", section_training, (a, ds))],
        "torchrl": [("TorchRL anchors", section_torchrl, (a, ds, run.figures))],
    }
    for key in only or SECTIONS:
        if key in skip:
            continue
        for name, fn, args in parts[key]:
            run.section(name, fn, *args)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
