#!/usr/bin/env python3
"""Data-parallel training from a dataset in object storage, streamed through a bounded cache on
each node: the script to copy for a cluster.

    # once: push a dataset (any S3-compatible store; AWS_ENDPOINT_URL for MinIO, Ceph, R2, ...)
    trajstore push hopper.trajstore s3://my-bucket/d4rl/hopper
    # on each node (2 GPUs here; gloo on CPU-only machines)
    torchrun --nproc_per_node 2 examples/train_s3_torchrun.py s3://my-bucket/d4rl/hopper \\
        --cache-limit 20GiB --steps 10000 --checkpoint-dir runs/hopper

Behaviour cloning of an MLP (``observation`` → ``action``) under DistributedDataParallel. Each
rank opens the dataset with ``trajstore.open(url, cache_limit=...)``: only the catalog is
downloaded up front; the loader (``rank="auto"``: torch.distributed's rank and world size)
downloads its rank's share of the transition files window by window into a cache; the node's
ranks (torchrun's ``LOCAL_WORLD_SIZE``) share ``--cache-limit``, so the node never holds more
than that, and a file one rank holds is hard-linked by another rather than downloaded again.
The ranks' shares are disjoint and together cover the dataset (a node downloads it about once
per round, not once per rank). Every rank
yields the same number of batches, so the gradient all-reduce never waits on a rank that ran
out.

Every ``--save-every`` steps each rank writes, atomically, a checkpoint with the model, the
optimizer and its loader's ``state_dict()`` (the next batch's number; batches are a pure
function of it, the seed, the rank and the world size). Run the same command again after a
preemption and every rank continues from the last checkpoint, drawing exactly the batches it
would have drawn, and reusing the files its cache kept (partial downloads resume).
"""

import argparse
import math
import os

import torch
import torch.distributed as dist
import trajstore
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def save_atomically(obj, path):
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="the dataset, s3://bucket/prefix (or file:///path)")
    p.add_argument("--cache-limit", default="20GiB", help="bytes of transition files the node keeps on disk (its ranks share them)")
    p.add_argument("--cache-dir", default=None, help="where the caches live (default $TRAJSTORE_CACHE or ~/.cache/trajstore)")
    p.add_argument("--steps", type=int, default=1000, help="gradient steps")
    p.add_argument("--batch-size", type=int, default=256, help="slices per batch and rank")
    p.add_argument("--save-every", type=int, default=200, help="steps between checkpoints")
    p.add_argument("--checkpoint-dir", default="runs/s3", help="one checkpoint per rank")
    p.add_argument("--log-every", type=int, default=100, help="steps between log lines (rank 0)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)

    ds = trajstore.open(args.url, cache_limit=args.cache_limit, cache_dir=args.cache_dir)
    loader = ds.loader(
        slice_len=1,
        num_slices=args.batch_size,
        columns=["observation", "action"],
        seed=args.seed,
        rank="auto",
        device=device,
    )
    def width(name):
        t = ds.schema.field(name).type  # a fixed-shape tensor, or a fixed-size list
        return math.prod(t.shape) if hasattr(t, "shape") else t.list_size

    obs_dim, act_dim = width("observation"), width("action")
    model = nn.Sequential(nn.Linear(obs_dim, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, act_dim))
    model = DistributedDataParallel(model.to(device), device_ids=[local_rank] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)

    os.makedirs(args.checkpoint_dir, exist_ok=True)
    ckpt = os.path.join(args.checkpoint_dir, f"rank{rank}-of-{world}.pt")
    step = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
        if rank == 0:
            print(f"resumed at step {step}", flush=True)

    batches = iter(loader)
    while step < args.steps:
        batch = next(batches)
        obs, act = batch["observation"][:, 0], batch["action"][:, 0]
        loss = nn.functional.mse_loss(model(obs), act)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if rank == 0 and step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.5f}", flush=True)
        if step % args.save_every == 0 or step == args.steps:
            save_atomically(
                {"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                 "loader": loader.state_dict(), "step": step},
                ckpt,
            )
    s = loader.stream_stats()
    print(
        f"rank {rank}: {step} steps; downloaded {s['bytes_downloaded'] / 2**20:.1f} MiB "
        f"({s['files_downloaded']} files, {s['bytes_resumed'] / 2**20:.1f} MiB resumed), cache peak "
        f"{s['peak_cache_bytes'] / 2**20:.1f} of {s['cache_limit'] / 2**20:.1f} MiB, "
        f"{s['wait_seconds']:.2f} s waiting for downloads",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
