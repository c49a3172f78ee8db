"""Writes tests/data/hdf5/ with h5py (run once; the files are committed so the Rust tests need no
Python):

- d4rl.hdf5: D4RL's layout with the arrays and formulas of make_numpy_fixtures.py (N = 1000):
  observations gzip-compressed in chunks of 128 rows, actions with the shuffle filter and gzip,
  rewards contiguous, terminals/timeouts as h5py booleans, infos/qpos and infos/step, and a
  metadata/ group with a string and a scalar (as D4RL files have).
(Minari's layout is tested with files written by Minari itself: make_minari_fixtures.py.)
"""
import os
import sys

import h5py
import numpy as np

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "data", "hdf5")
os.makedirs(out, exist_ok=True)
n = 1000
i = np.arange(n)
terminals = (i + 1) % 97 == 0
with h5py.File(os.path.join(out, "d4rl.hdf5"), "w") as f:
    f.create_dataset("observations", data=(i[:, None] * 10 + np.arange(3)).astype(np.float32),
                     chunks=(128, 3), compression="gzip")
    f.create_dataset("actions", data=(-i[:, None] - 0.5 * np.arange(2)).astype(np.float32),
                     chunks=(200, 2), shuffle=True, compression="gzip")
    f.create_dataset("rewards", data=(0.25 * i).astype(np.float32))
    f.create_dataset("terminals", data=terminals, chunks=(300,), compression="gzip")
    f.create_dataset("timeouts", data=((i + 1) % 150 == 0) & ~terminals)
    f.create_dataset("next_observations", data=(i[:, None] * 10 + np.arange(3) + 1000).astype(np.float32))
    f.create_dataset("infos/qpos", data=(i[:, None] + 0.125 * np.arange(2)).astype(np.float64))
    f.create_dataset("infos/step", data=(i % 7).astype(np.int16))
    f.create_dataset("metadata/algorithm", data="SAC")
    f.create_dataset("metadata/iteration", data=np.int64(7))
print("h5py", h5py.__version__, "->", os.path.abspath(out))
