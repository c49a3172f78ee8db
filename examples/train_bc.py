#!/usr/bin/env python3
"""Behaviour cloning from a D4RL-style HDF5 file with trajstore and PyTorch.

    python examples/train_bc.py                                   # synthetic data, ~10 s on CPU
    python examples/train_bc.py --input hopper_medium-v2.hdf5 --steps 20000

Steps: (1) without --input, write a small synthetic file in D4RL's hopper layout; (2) ingest
it into a trajstore dataset; (3) sample batches of (observation, action) with the loader's Rust
workers; (4) fit an MLP policy by mean-squared error; (5) evaluate on held-out episodes.
Needs only torch, numpy, h5py and trajstore. Exits 1 unless the training loss fell by 20%.
"""

import argparse
import os
import sys
import tempfile

import h5py
import numpy as np
import torch
import trajstore
from torch import nn


def write_synthetic_d4rl(path, n=50_000, seed=0):
    """D4RL's hopper layout: one row per transition; an episode ends at a row flagged in
    `terminals` (the agent fell) or `timeouts` (the time limit). The expert here is a fixed
    nonlinear function of the observation, plus a little noise, so BC can learn it."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n, 17)).astype(np.float32)
    w = rng.standard_normal((17, 6)).astype(np.float32) / np.sqrt(17)
    actions = np.tanh(2 * obs @ w) + 0.05 * rng.standard_normal((n, 6)).astype(np.float32)
    lengths = rng.integers(100, 1001, size=n // 100)  # more than enough episodes
    ends = np.cumsum(lengths)
    ends = np.append(ends[ends < n], n) - 1  # the rows that end an episode
    terminals, timeouts = np.zeros(n, bool), np.zeros(n, bool)
    full = lengths[: len(ends)] == 1000
    timeouts[ends[full]] = True  # episodes cut at 1000 steps: truncated
    terminals[ends[~full]] = True  # the others: terminated
    timeouts[n - 1] = not terminals[n - 1]  # the last one may be cut by the end of the file
    with h5py.File(path, "w") as f:
        f["observations"] = obs
        f["actions"] = actions.astype(np.float32)
        f["rewards"] = (1.0 - np.square(actions).sum(1) * 1e-3).astype(np.float32)
        f["terminals"] = terminals
        f["timeouts"] = timeouts
    return int(terminals.sum() + timeouts.sum())


class Policy(nn.Module):
    """An MLP from normalised observations to actions; keeps the normalisation with it."""

    def __init__(self, obs_dim, act_dim, mean, std, hidden=256):
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32))
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, act_dim),
        )

    def forward(self, obs):
        return self.net((obs - self.mean) / self.std)


def masked_mse(pred, target, mask):
    """Mean over real steps only: padding (mask False) contributes nothing."""
    err = (pred - target).square().mean(-1)  # [B, L]
    err = torch.where(mask, err, torch.zeros_like(err))
    return err.sum() / mask.sum().clamp(min=1)


def episode_arrays(ds, episode_id):
    """One episode as NumPy arrays (zero-copy views of the memory-mapped dataset)."""
    rb = ds.episode(episode_id)

    def column(name):
        col = rb.column(name)
        col = getattr(col, "storage", col)  # a fixed-shape tensor column: its list storage
        return col.flatten().to_numpy().reshape(rb.num_rows, -1)

    return column("observation"), column("action")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", help="a D4RL .hdf5 file (default: write a synthetic one)")
    p.add_argument("--dataset", help="the trajstore dataset directory (default: a temporary "
                   "one); reused, not ingested again, when it exists")
    p.add_argument("--steps", type=int, default=300, help="gradient steps")
    p.add_argument("--batch-size", type=int, default=256, help="slices per batch")
    p.add_argument("--slice-len", type=int, default=1, help="steps per slice")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    tmp = tempfile.TemporaryDirectory(prefix="train_bc-")  # removed when the script ends
    path = args.dataset or os.path.join(tmp.name, "bc.trajstore")

    # 1-2. The HDF5 file, ingested (its columns are recognised by their D4RL names).
    if os.path.exists(path):
        print(f"reusing the dataset at {path}")
    else:
        hdf5, expected = args.input, None
        if hdf5 is None:
            hdf5 = os.path.join(tmp.name, "synthetic_hopper.hdf5")
            expected = write_synthetic_d4rl(hdf5, seed=args.seed)
        with h5py.File(hdf5, "r") as f:
            rows = len(f["observations"])
        report = trajstore.ingest(hdf5, path)
        print(f"ingested {report['rows']} transitions in {report['episodes']} episodes "
              f"({report['seconds']:.2f} s); boundaries: {report['boundaries']}")
        if report["rows"] != rows or expected not in (None, report["episodes"]):
            sys.exit(f"unexpected ingest report: {report}")

    # 3. Open it and hold out the last 5% of episodes for evaluation.
    ds = trajstore.open(path)
    ids = np.arange(ds.first_episode_id, ds.first_episode_id + ds.num_episodes)
    n_eval = max(1, len(ids) // 20)
    train_ids, eval_ids = ids[:-n_eval], ids[-n_eval:]
    if len(train_ids) == 0:  # a single episode: train and evaluate on it
        train_ids = eval_ids
    print(f"{len(ds)} transitions, {len(train_ids)} training and {n_eval} held-out episodes")

    # Normalisation statistics from one large sample (NumPy backend: no torch needed).
    stats = ds.loader(slice_len=1, num_slices=10_000, columns=["observation"], episodes=train_ids,
                      backend="numpy", seed=args.seed, max_batches=1)
    sample = next(iter(stats))["observation"][:, 0]  # [10000, obs_dim]
    mean, std = sample.mean(0), sample.std(0) + 1e-3
    act_dim = episode_arrays(ds, eval_ids[0])[1].shape[1]

    # The training stream: `batch_size` slices of `slice_len` steps per batch, gathered ahead by
    # Rust threads (copied to the GPU on a side stream with device="cuda"). Slices longer than
    # one step may overhang an episode's ends (policy="pad"), so every step is sampled equally
    # often; batch["mask"] marks the real steps.
    loader = ds.loader(slice_len=args.slice_len, num_slices=args.batch_size,
                       columns=["observation", "action"], episodes=train_ids,
                       policy="pad" if args.slice_len > 1 else "strict",
                       device=args.device, seed=args.seed, max_batches=args.steps)

    # 4. Behaviour cloning: regress the dataset's actions from its observations.
    policy = Policy(sample.shape[1], act_dim, mean, std).to(args.device)
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
    losses = []
    for step, batch in enumerate(loader, 1):
        obs, act, mask = batch["observation"], batch["action"], batch["mask"]  # [B, L, ...]
        loss = masked_mse(policy(obs), act, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            print(f"step {step:6d}  loss {losses[-1]:.5f}")

    # 5. Held-out episodes, read whole from the dataset.
    policy.eval()
    with torch.no_grad():
        sq, n = 0.0, 0
        for eid in eval_ids:
            o, a = (torch.tensor(x, device=args.device) for x in episode_arrays(ds, eid))
            sq += (policy(o) - a).square().mean(-1).sum().item()
            n += len(o)
    print(f"held-out MSE {sq / n:.5f} over {n} transitions of {n_eval} episodes")

    first, final = losses[0], float(np.mean(losses[-max(1, len(losses) // 10):]))
    print(f"final loss {final:.5f} (first {first:.5f})")
    if not final < 0.8 * first:  # noise alone moves it a few percent
        sys.exit("the loss did not fall")


if __name__ == "__main__":
    main()
