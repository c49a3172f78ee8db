"""Writes tests/data/minari/ with real Minari (0.5, `pip install "minari[create]" gymnasium`):
two small datasets recorded with minari.DataCollector, copied as Minari stores them
(`<name>/data/main_data.hdf5` and `metadata.json`), and for each a `<name>.expected.json` read
back through Minari's own API (dataset.iterate_episodes()), which tests/ingest_numpy.rs compares
trajstore's ingest against.

- cartpole: CartPole-v1 (obs [4] float32, discrete int64 actions, float64 rewards), episodes
  cut at 30 steps, so some end terminated and some truncated;
- pendulum: Pendulum-v1 (obs [3], action [1] float32), every episode truncated at 20 steps.
"""
import json
import os
import shutil
import sys
import tempfile

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "data", "minari")
root = tempfile.mkdtemp()
os.environ["MINARI_DATASETS_PATH"] = root

import gymnasium as gym  # noqa: E402
import minari  # noqa: E402

for name, env_id, steps, episodes in [("cartpole", "CartPole-v1", 30, 4), ("pendulum", "Pendulum-v1", 20, 3)]:
    env = minari.DataCollector(gym.make(env_id, max_episode_steps=steps))
    env.action_space.seed(7)
    for ep in range(episodes):
        env.reset(seed=ep)
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            done = term or trunc
    ds = env.create_dataset(dataset_id=f"test/{name}-v0", algorithm_name="random")
    src = os.path.join(root, "test", f"{name}-v0")
    dst = os.path.join(out, name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    expected = []
    for e in ds.iterate_episodes():
        expected.append({
            "id": int(e.id),
            "observations": e.observations.astype(float).tolist(),
            "actions": e.actions.astype(float).tolist(),
            "rewards": e.rewards.astype(float).tolist(),
            "terminations": e.terminations.astype(bool).tolist(),
            "truncations": e.truncations.astype(bool).tolist(),
        })
    with open(os.path.join(out, f"{name}.expected.json"), "w") as f:
        json.dump(expected, f)
shutil.rmtree(root)
print("minari", minari.__version__, "->", os.path.abspath(out))
