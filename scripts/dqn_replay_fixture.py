"""Writes a small DQN Replay directory in dopamine's `OutOfGraphReplayBuffer.save` layout, with
NumPy and gzip only (no dopamine, no TensorFlow), for the ingest tests of `trajstore`.

The buffer is filled the way dopamine's `add` fills it: before every episode's first step,
`stack_size - 1` all-zero transitions (frame, action 0, reward 0, terminal 0); then the steps;
the step that ends an episode has terminal 1. Entry `g` (in add order) goes to index
`g % capacity` and `add_count` counts every entry ever added. Each checkpoint `N` is one gzipped
`np.save` per array, named like dopamine names them:

    $store$_observation_ckpt.N.gz   uint8  [capacity, H, W]
    $store$_action_ckpt.N.gz        int32  [capacity]
    $store$_reward_ckpt.N.gz        float32[capacity]
    $store$_terminal_ckpt.N.gz      uint8  [capacity]
    add_count_ckpt.N.gz             int64  0-d
    invalid_range_ckpt.N.gz         int64  [stack_size + update_horizon]
    episode_end_indices_ckpt.N.gz   a pickled set (newer dopamine writes it; readers may ignore it)

Checkpoints are saved at the add counts given by --saves (default: X, X + capacity,
X + 1.5 * capacity with X = 0.6 * capacity: the first one never wrapped, the second one holds
exactly the entries after the first, the third overlaps the second by half).

`expected.json` lists the episodes an ingest must produce: every episode added up to the last
save, the one still running then truncated, each with its length, return, flags and the CRC-32
of its frames (concatenated, row-major).

Usage: python dqn_replay_fixture.py OUT_DIR [--capacity 600] [--stack 4] [--shape 12 10]
"""
import argparse
import gzip
import json
import os
import pickle
import zlib

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--capacity", type=int, default=600)
p.add_argument("--stack", type=int, default=4)
p.add_argument("--horizon", type=int, default=1)
p.add_argument("--shape", type=int, nargs="+", default=[12, 10])
p.add_argument("--saves", type=int, nargs="*")
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()

C, K = a.capacity, a.stack
saves = a.saves or [int(0.6 * C), int(0.6 * C) + C, int(0.6 * C) + C + C // 2]
rng = np.random.default_rng(a.seed)
store = {
    "observation": np.zeros((C, *a.shape), np.uint8),
    "action": np.zeros(C, np.int32),
    "reward": np.zeros(C, np.float32),
    "terminal": np.zeros(C, np.uint8),
}
add_count = 0
episode_ends = set()


def put(frame, action, reward, terminal):
    global add_count
    i = add_count % C
    store["observation"][i] = frame
    store["action"][i] = action
    store["reward"][i] = reward
    store["terminal"][i] = terminal
    if terminal:
        episode_ends.add(i)
    else:
        episode_ends.discard(i)
    add_count += 1


def save(n):
    os.makedirs(a.out, exist_ok=True)
    cursor = add_count % C
    invalid = np.array([(cursor - a.horizon + i) % C for i in range(K + a.horizon)])
    arrays = {f"$store$_{k}": v for k, v in store.items()}
    arrays["add_count"] = np.array(add_count)
    arrays["invalid_range"] = invalid
    for name, arr in arrays.items():
        with gzip.open(os.path.join(a.out, f"{name}_ckpt.{n}.gz"), "wb") as f:
            np.save(f, arr, allow_pickle=False)
    with gzip.open(os.path.join(a.out, f"episode_end_indices_ckpt.{n}.gz"), "wb") as f:
        pickle.dump(set(episode_ends), f)


episodes = []  # (frames, actions, rewards, terminated)
current = None
save_at = list(saves)
n_saved = 0
while save_at:
    if current is None:
        current = ([], [], [])
        length = int(rng.integers(5, 60))
        for _ in range(K - 1):
            put(np.zeros(a.shape, np.uint8), 0, 0.0, 0)
            if save_at and add_count == save_at[0]:
                save(n_saved); n_saved += 1; save_at.pop(0)
        if not save_at:
            break
    t = len(current[0])
    frame = rng.integers(0, 256, size=a.shape, dtype=np.uint8)
    frame.flat[0] = 1 + t % 250  # never all zero
    action = int(rng.integers(0, 6))
    reward = float(rng.choice([-1.0, 0.0, 0.0, 1.0]))
    terminal = int(t + 1 == length)
    put(frame, action, reward, terminal)
    current[0].append(frame); current[1].append(action); current[2].append(reward)
    if terminal:
        episodes.append((*current, True))
        current = None
    if save_at and add_count == save_at[0]:
        save(n_saved); n_saved += 1; save_at.pop(0)
if current is not None and current[0]:
    episodes.append((*current, False))

expected = [
    {
        "length": len(f),
        "return": float(np.sum(np.array(r, np.float32), dtype=np.float64)),
        "terminated": term,
        "truncated": not term,
        "crc32": zlib.crc32(np.stack(f).tobytes()),
        "actions": [int(x) for x in act],
    }
    for f, act, r, term in episodes
]
with open(os.path.join(a.out, "expected.json"), "w") as f:
    json.dump({"capacity": C, "stack_size": K, "shape": a.shape, "saves": saves,
               "episodes": expected}, f)
print(f"{len(expected)} episodes, {add_count} entries, checkpoints at {saves} -> {a.out}")
