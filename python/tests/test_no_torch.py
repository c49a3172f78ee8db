"""Without PyTorch (NumPy/pyarrow users): the package imports, the NumPy backend samples, SQL works,
and asking for torch tensors is a clear InvalidArgumentError, not an ImportError deep inside."""

from __future__ import annotations

import subprocess
import sys

from trajref import subprocess_env

SCRIPT = r"""
import sys
sys.modules["torch"] = None  # `import torch` now raises ImportError, as if it were not installed
import trajstore
ds = trajstore.open(sys.argv[1])
b = next(iter(ds.loader(slice_len=8, num_slices=4, backend="numpy", max_batches=1)))
assert type(b["observation"]).__name__ == "ndarray" and b["observation"].shape[:2] == (4, 8)
assert b["mask"].dtype == bool and b["episode_id"].dtype.name == "int64"
assert ds.sql("SELECT count(*) AS n FROM transitions").column("n")[0].as_py() == len(ds)
try:
    ds.loader(slice_len=8, num_slices=4)
except trajstore.InvalidArgumentError as e:
    assert "PyTorch" in str(e), e
else:
    raise AssertionError("backend='torch' without PyTorch did not fail")
print("ok")
"""


def test_without_pytorch(demo_path):
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, demo_path], env=subprocess_env(), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
