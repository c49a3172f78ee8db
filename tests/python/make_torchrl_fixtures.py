"""Writes the TorchRL fixtures under tests/data/torchrl/ with real TorchRL (run once; the
directories are committed so the Rust tests need no Python). Values are formulas of the transition
number i (0-based, in the order transitions were added), which tests/ingest_torchrl.rs recomputes:

    observation[i, j]          = i * 10 + j              (float32, [3])
    action[i, j]               = -i - 0.5 * j            (float32, [2])
    next/observation[i, j]     = i * 10 + j + 1000       (float32, [3])
    next/reward[i]             = 0.25 * i                (float32, [1])
    next/terminated[i]         = (i + 1) % 97 == 0       (bool, [1])
    next/truncated[i]          = (i + 1) % 150 == 0 and not terminated
    next/done[i]               = terminated or truncated
    collector/traj_ids[i]      = number of episodes ended before i (int64)

dump/:    rb.dumps() of a TensorDictReplayBuffer over LazyMemmapStorage(1000) holding i < 700.
wrapped/: the same with LazyMemmapStorage(300), filled with i < 700 in chunks of 100, so the ring
          wrapped and holds i in 400..700, the oldest (i = 400) at physical row 100.
"""
import os
import shutil
import sys

import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "data", "torchrl")


def transitions(lo, hi):
    i = torch.arange(lo, hi)
    term = (i + 1) % 97 == 0
    trunc = ((i + 1) % 150 == 0) & ~term
    ends = torch.tensor([(k + 1) % 97 == 0 or (k + 1) % 150 == 0 for k in range(hi)])
    before = torch.cumsum(ends.long(), 0) - ends.long()
    j3 = torch.arange(3)
    return TensorDict({
        "observation": (i[:, None] * 10 + j3).float(),
        "action": (-i[:, None] - 0.5 * torch.arange(2)).float(),
        ("next", "observation"): (i[:, None] * 10 + j3 + 1000).float(),
        ("next", "reward"): (0.25 * i).float()[:, None],
        ("next", "terminated"): term[:, None],
        ("next", "truncated"): trunc[:, None],
        ("next", "done"): (term | trunc)[:, None],
        ("collector", "traj_ids"): before[lo:hi],
    }, batch_size=[hi - lo])


for name, capacity in [("dump", 1000), ("wrapped", 300)]:
    path = os.path.join(out, name)
    shutil.rmtree(path, ignore_errors=True)
    scratch = os.path.join(out, "_scratch")
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=scratch))
    for lo in range(0, 700, 100):
        rb.extend(transitions(lo, lo + 100))
    rb.dumps(path)
    del rb
    shutil.rmtree(scratch, ignore_errors=True)
    # Pickled sampler state is TorchRL's own; nothing here reads it.
    for f in ("prefetch.pkl",):
        p = os.path.join(path, f)
        if os.path.exists(p):
            os.remove(p)
import torchrl
print("torchrl", torchrl.__version__, "->", os.path.abspath(out))
