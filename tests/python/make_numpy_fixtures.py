"""Writes the NumPy fixtures under tests/data/numpy/ with real NumPy (run once; the files are
committed so the Rust tests need no Python). Every value is a formula of the row index, which
tests/ingest_numpy.rs recomputes:

    observations[i, j]      = i * 10 + j                 (float32, [N, 3])
    actions[i, j]           = -i - 0.5 * j               (float32, [N, 2])
    rewards[i]              = 0.25 * i                   (float32)
    terminals[i]            = (i + 1) % 97 == 0          (bool)
    timeouts[i]             = (i + 1) % 150 == 0 and not terminals[i]   (bool)
    next_observations[i, j] = observations[i, j] + 1000  (float32, [N, 3])
    infos/qpos[i, j]        = i + 0.125 * j              (float64, [N, 2])
    infos/step[i]           = i % 7                      (int16)

d4rl.npz (np.savez), d4rl_compressed.npz (np.savez_compressed) and d4rl_dir/ (one .npy per
array, `infos/` flattened to `infos_`) hold these N = 1000 rows; discrete.npz has integer actions
(actions[i] = i % 5, int64) and Gymnasium flag names (terminated, truncated).
"""
import os
import sys

import numpy as np

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "data", "numpy")
os.makedirs(out, exist_ok=True)
n = 1000
i = np.arange(n)
terminals = (i + 1) % 97 == 0
arrays = {
    "observations": (i[:, None] * 10 + np.arange(3)[None, :]).astype(np.float32),
    "actions": (-i[:, None] - 0.5 * np.arange(2)[None, :]).astype(np.float32),
    "rewards": (0.25 * i).astype(np.float32),
    "terminals": terminals,
    "timeouts": ((i + 1) % 150 == 0) & ~terminals,
    "next_observations": (i[:, None] * 10 + np.arange(3)[None, :] + 1000).astype(np.float32),
    "infos/qpos": (i[:, None] + 0.125 * np.arange(2)[None, :]).astype(np.float64),
    "infos/step": (i % 7).astype(np.int16),
}
np.savez(os.path.join(out, "d4rl.npz"), **arrays)
np.savez_compressed(os.path.join(out, "d4rl_compressed.npz"), **arrays)
d = os.path.join(out, "d4rl_dir")
os.makedirs(d, exist_ok=True)
for k, v in arrays.items():
    np.save(os.path.join(d, k.replace("/", "_") + ".npy"), v)
np.savez(
    os.path.join(out, "discrete.npz"),
    observations=arrays["observations"],
    actions=(i % 5).astype(np.int64),
    rewards=arrays["rewards"],
    terminated=arrays["terminals"],
    truncated=arrays["timeouts"],
)
print("numpy", np.__version__, "->", os.path.abspath(out))
