#!/usr/bin/env python3
"""Offline-to-online training: every batch half offline data, half online data that a collector
in another process keeps committing (RLPD's symmetric sampling), the online half following the
dataset's new versions while training runs.

    python examples/offline_to_online.py --steps 2000 --commit-every 1

Steps: (1) write a synthetic offline dataset and start an online one (the collector's code,
examples/collector.py); (2) start the collector as a subprocess, committing
--episodes-per-commit episodes every --commit-every seconds; (3) train a behaviour-cloning MLP
on ``trajstore.mix([offline, online], weights=[0.5, 0.5], follow=[False, True])``: the loader
looks for a newer online version every --follow seconds, maps only its new segments in the
background, and draws the next batches from it; (4) stop the collector cleanly (SIGTERM: it
finishes the commit in progress).

Every --log-every steps it prints the online version the batch came from, how many distinct
online episodes were sampled so far and the newest of them, and the loss:

    step    100  online v 7  online episodes seen 23 (newest 24)  loss 0.08123

Exits 1 if the online version sampled never grew. --step-delay stands for the time an online
learner spends on other work per update (acting, evaluating).
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import torch
import trajstore
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from collector import write_dataset  # noqa: E402


def start_collector(path, args):
    """The collector in its own process; its lines are echoed with a prefix."""
    cmd = [sys.executable, os.path.join(HERE, "collector.py"), path, "--commit-every", str(args.commit_every),
           "--episodes-per-commit", str(args.episodes_per_commit), "--episode-len", str(args.episode_len),
           "--seed", str(args.seed + 1)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)

    def echo():
        for line in proc.stdout:
            print(f"[collector] {line.rstrip()}", flush=True)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    return proc, thread


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="where the two datasets go (default: a temporary directory)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=256, help="slices per batch (half from each)")
    p.add_argument("--commit-every", type=float, default=1.0, help="the collector's seconds between commits")
    p.add_argument("--episodes-per-commit", type=int, default=2)
    p.add_argument("--episode-len", type=int, default=200)
    p.add_argument("--follow", type=float, default=0.5, help="seconds between looks for a new online version")
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds of other work per step")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    if args.device == "cpu":
        # A small model: one intra-op thread (the loader's workers and the collector use the
        # other cores; more threads only wait on each other).
        torch.set_num_threads(1)
    tmp = tempfile.TemporaryDirectory(prefix="offline_to_online-")
    root = args.dir or tmp.name
    os.makedirs(root, exist_ok=True)
    offline_path, online_path = os.path.join(root, "offline.trajstore"), os.path.join(root, "online.trajstore")

    # 1. Offline data, and the online dataset's first episodes (a loader needs one to sample).
    if not os.path.exists(offline_path):
        write_dataset(offline_path, episodes=50, episode_len=args.episode_len, seed=args.seed)
    if not os.path.exists(online_path):
        write_dataset(online_path, episodes=2, episode_len=args.episode_len, seed=args.seed + 100)
    offline, online = trajstore.open(offline_path), trajstore.open(online_path)
    print(f"offline: {offline.num_episodes} episodes; online: {online.num_episodes} episodes at version "
          f"{online.version}")

    # 2. The collector.
    proc, echo = start_collector(online_path, args)
    try:
        # 3. Symmetric sampling: every batch half offline, half online; only the online half
        # follows new versions.
        loader = trajstore.mix([offline, online], weights=[0.5, 0.5], follow=[False, args.follow],
                               slice_len=1, num_slices=args.batch_size, columns=["observation", "action"],
                               device=args.device, seed=args.seed)
        obs_dim = offline.schema.field("observation").type.shape[0]
        act_dim = offline.schema.field("action").type.list_size
        policy = nn.Sequential(nn.Linear(obs_dim, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                               nn.Linear(256, act_dim)).to(args.device)
        opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
        online_part = None  # batch["source"] == 1: the online slices (the same in every batch)
        seen = set()
        first_version = None
        it = iter(loader)
        for step in range(1, args.steps + 1):
            version = loader.versions[1]  # the online version of the batch drawn next
            first_version = version if first_version is None else first_version
            batch = next(it)
            if online_part is None:
                online_part = batch["source"] == 1
            obs, act = batch["observation"][:, 0], batch["action"][:, 0]
            loss = (policy(obs) - act).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen.update(batch["episode_id"][online_part].tolist())
            if step == 1 or step % args.log_every == 0 or step == args.steps:
                print(f"step {step:6d}  online v {version}  online episodes seen {len(seen)} "
                      f"(newest {max(seen)})  loss {loss.item():.5f}", flush=True)
            if args.step_delay:
                time.sleep(args.step_delay)
        stats = loader.follow_stats()
    finally:
        # 4. Stop the collector: SIGTERM, it finishes its commit and closes its writer.
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        echo.join(timeout=5)
    print(f"collector exited with status {code}; online dataset now at version "
          f"{trajstore.open(online_path).version}")
    print(f"online versions sampled: {first_version} .. {version} ({stats['refreshes']} refreshes, "
          f"{stats['failures']} failed looks); distinct online episodes sampled: {len(seen)}")
    if code != 0:
        sys.exit("the collector failed")
    if version <= first_version:
        sys.exit("the online version sampled never grew (a longer run, or a shorter --commit-every)")


if __name__ == "__main__":
    main()
