#!/usr/bin/env python3
"""A collector: appends synthetic episodes to a trajstore dataset and commits them periodically,
as an online RL actor (or a simulator farm) would, while learners sample the dataset.

    python examples/collector.py online.trajstore --commit-every 1 --episodes-per-commit 4 \\
        --episode-len 1000 --seconds 60

Creates the dataset if it is missing, with a D4RL-like schema (observation float32[17], action
float32[6], reward float32; --obs-dim/--act-dim change it), then, every --commit-every seconds,
appends --episodes-per-commit episodes of --episode-len steps and commits them (one new version
per commit, visible atomically to readers). Prints one line per commit:

    commit version 12: episodes 40..43 (44 in all) at 1718000000.123

Runs for --seconds (0: until stopped); SIGTERM or SIGINT stop it cleanly after the commit in
progress (nothing half-written is ever visible: an uncommitted episode is simply lost). Actions
come from a fixed "expert" (tanh of a random linear map of the observation, plus noise), so a
policy can learn from the data. The writer side of examples/offline_to_online.py, and of
benchmarks of loaders following a growing dataset.
"""

import argparse
import signal
import sys
import time

import numpy as np
import trajstore


def expert(obs_dim, act_dim, seed=0):
    """A fixed nonlinear policy (the same for every collector of a seed)."""
    w = np.random.default_rng(seed).standard_normal((obs_dim, act_dim)).astype(np.float32) / np.sqrt(obs_dim)
    return lambda obs: np.tanh(2 * obs @ w)


def make_episode(rng, policy, length, obs_dim):
    obs = rng.standard_normal((length, obs_dim)).astype(np.float32)
    a = policy(obs)
    act = (a + 0.05 * rng.standard_normal(a.shape)).astype(np.float32)
    rew = (1.0 - np.square(act).sum(1) * 1e-3).astype(np.float32)
    return obs, act, rew


def open_writer(path, obs_dim=17, act_dim=6):
    """The dataset's writer, creating the dataset when it does not exist."""
    return trajstore.create(path, observation_shape=(obs_dim,), action_shape=(act_dim,), append=True)


def write_dataset(path, episodes, episode_len, seed=0, obs_dim=17, act_dim=6, expert_seed=0):
    """Writes `episodes` episodes (lengths drawn around `episode_len`) in one commit: a small
    offline dataset. Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    policy = expert(obs_dim, act_dim, expert_seed)
    with open_writer(path, obs_dim, act_dim) as w:
        for _ in range(episodes):
            length = int(rng.integers(max(1, episode_len // 2), episode_len * 3 // 2 + 1))
            obs, act, rew = make_episode(rng, policy, length, obs_dim)
            # Episodes cut by the time limit are truncated; shorter ones ended in a terminal state.
            w.append_episode(obs, act, rew, terminated=length < episode_len)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", help="the dataset directory (created if missing)")
    p.add_argument("--commit-every", type=float, default=1.0, help="seconds between commits")
    p.add_argument("--episodes-per-commit", type=int, default=4)
    p.add_argument("--episode-len", type=int, default=1000, help="steps per episode")
    p.add_argument("--seconds", type=float, default=0, help="how long to run (0: until stopped)")
    p.add_argument("--obs-dim", type=int, default=17)
    p.add_argument("--act-dim", type=int, default=6)
    p.add_argument("--seed", type=int, default=1, help="seed of the episodes' randomness")
    p.add_argument("--expert-seed", type=int, default=0, help="seed of the expert policy")
    args = p.parse_args()
    if args.commit_every <= 0 or args.episodes_per_commit < 1 or args.episode_len < 1:
        sys.exit("--commit-every, --episodes-per-commit and --episode-len must be positive")

    stop = False

    def on_signal(signum, frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    rng = np.random.default_rng(args.seed)
    policy = expert(args.obs_dim, args.act_dim, args.expert_seed)
    w = open_writer(args.dataset, args.obs_dim, args.act_dim)
    print(f"collecting into {args.dataset}: {args.episodes_per_commit} episodes of {args.episode_len} steps "
          f"every {args.commit_every:g} s", flush=True)
    start = time.monotonic()
    commits = 0
    try:
        next_commit = start + args.commit_every
        while not stop and (args.seconds <= 0 or time.monotonic() - start < args.seconds):
            # Sleep in short slices so that a signal stops the collector promptly.
            while not stop and time.monotonic() < next_commit:
                time.sleep(min(0.05, max(0.0, next_commit - time.monotonic())))
            if stop:
                break
            next_commit += args.commit_every
            first = w.next_episode_id
            for _ in range(args.episodes_per_commit):
                obs, act, rew = make_episode(rng, policy, args.episode_len, args.obs_dim)
                w.append_episode(obs, act, rew, truncated=True)
            version = w.commit()
            commits += 1
            last = w.next_episode_id - 1
            print(f"commit version {version}: episodes {first}..{last} ({last + 1} in all) at {time.time():.3f}",
                  flush=True)
    finally:
        w.close()
    print(f"collector stopped after {commits} commits", flush=True)


if __name__ == "__main__":
    main()
