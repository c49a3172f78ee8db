#!/usr/bin/env python3
"""Preemptible training: checkpoints that hold the loader's state, so that a run killed at any
moment (a preempted spot instance, a cluster's time limit) continues bit for bit where its last
checkpoint was.

    python examples/preemptible_training.py --steps 2000 --save-every 100
    python examples/preemptible_training.py --steps 2000 --kill-at 750   # dies after step 750
    python examples/preemptible_training.py --steps 2000                 # resumes from step 700

Behaviour cloning of a small MLP on a synthetic dataset (written once, by the collector's code
in examples/collector.py). Every --save-every steps the script saves, atomically (a temporary
file, then os.replace: a kill during the save leaves the previous checkpoint intact), one
checkpoint with everything the rest of the run depends on:

- the model's and the optimizer's state,
- ``loader.state_dict()``: the number of the next batch, the dataset version, id and
  fingerprint, the sampler's options (a prioritized sampler's priorities too); a plain dict,
- the step, and PyTorch's random number generator (the training adds noise with it).

With deterministic PyTorch (one thread, deterministic algorithms), the run prints exactly the
same ``step S loss L`` lines (L in full precision) whether it was killed and resumed or not:
the loader resumes the same batches whatever its number of workers, on the version of the
dataset the checkpoint was taken on, even if a collector committed more episodes since.
--kill-at K simulates a preemption: SIGKILL right after step K, without a last checkpoint.
"""

import argparse
import os
import signal
import sys

import torch
import trajstore
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collector import write_dataset  # noqa: E402


def save_atomically(obj, path):
    """torch.save to a temporary file, flushed to disk, then renamed over `path`."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="runs/preemptible/data.trajstore",
                   help="the dataset (written once, synthetic, if missing)")
    p.add_argument("--checkpoint", default="runs/preemptible/checkpoint.pt",
                   help="the checkpoint (resumed from when it exists)")
    p.add_argument("--steps", type=int, default=500, help="gradient steps of the whole run")
    p.add_argument("--save-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--kill-at", type=int, help="SIGKILL this process right after this step")
    p.add_argument("--batch-size", type=int, default=64, help="slices per batch")
    p.add_argument("--slice-len", type=int, default=4, help="steps per slice")
    p.add_argument("--workers", type=int, help="loader threads (any number gives the same batches)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    # Deterministic PyTorch: the same batches then give the same losses, bit for bit.
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    if not os.path.exists(args.dataset):
        os.makedirs(os.path.dirname(os.path.abspath(args.dataset)), exist_ok=True)
        write_dataset(args.dataset, episodes=60, episode_len=200, seed=args.seed)
        print(f"wrote a synthetic dataset at {args.dataset}")
    ds = trajstore.open(args.dataset)
    obs_dim, act_dim = ds.schema.field("observation").type.shape[0], ds.schema.field("action").type.list_size

    policy = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                           nn.Linear(128, act_dim))
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
    loader = ds.loader(slice_len=args.slice_len, num_slices=args.batch_size, columns=["observation", "action"],
                       seed=args.seed, workers=args.workers)

    step = 0
    if os.path.exists(args.checkpoint):
        # weights_only (the default) suffices: the loader's state is plain data.
        ckpt = torch.load(args.checkpoint)
        policy.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])  # at the checkpoint's dataset version
        torch.set_rng_state(ckpt["torch_rng"])
        step = ckpt["step"]
        print(f"resuming from step {step} (dataset version {loader.versions[0]}, batch {loader.position})")

    it = iter(loader)
    while step < args.steps:
        batch = next(it)
        step += 1
        obs, act, mask = batch["observation"], batch["action"], batch["mask"]
        obs = obs + 0.01 * torch.randn_like(obs)  # augmentation: uses the checkpointed RNG
        err = (policy(obs) - act).square().mean(-1)
        loss = torch.where(mask, err, torch.zeros_like(err)).sum() / mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}", flush=True)
        if step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a preemption: no last checkpoint
        if step % args.save_every == 0 or step == args.steps:
            save_atomically({
                "model": policy.state_dict(),
                "optimizer": opt.state_dict(),
                "loader": loader.state_dict(),  # next batch: `step`
                "torch_rng": torch.get_rng_state(),
                "step": step,
            }, args.checkpoint)
    print(f"done: {step} steps")


if __name__ == "__main__":
    main()
