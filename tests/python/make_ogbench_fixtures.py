"""Writes tests/data/ogbench/ with the real OGBench (1.2.1; `pip install ogbench absl-py`, no GPU or
rendering needed) and its own dataset generator:

    python tests/python/make_ogbench_fixtures.py OGBENCH_CHECKOUT [OUT_DIR]

OGBENCH_CHECKOUT is a clone of github.com/seohongpark/ogbench: its
`data_gen_scripts/generate_manipspace.py` (not part of the pip package) writes the files, exactly
as the OGBench authors made the hosted datasets and as horizon-reduction's README generates the
1B-transition ones (one `*-N.npz` shard per seed, each with its `*-N-val.npz` validation split):

- scene-sharded/scene-play-v0-{0,1,2}.npz (+ -val.npz): `scene-v0`, `--dataset_type=play`,
  10 training trajectories (and 1 validation one) of 6 rows per seed; keys observations [40]
  float32, actions [5] float32, terminals bool, qpos [25], qvel [24] float32, button_states [2]
  int64, saved with np.savez_compressed by the generator.

scene-sharded.expected.json is what `ogbench.load_dataset(path, add_info=True)` (the regular,
non-compact form every OGBench agent trains on) returns for each training shard: per array its
dtype, shape and the CRC-32 of its little-endian bytes, plus `terminals` itself (1.0 on the
last transition of each trajectory). tests/ingest/npz_dir.rs checks trajstore's ingest of the
directory against it, so CI needs neither OGBench nor MuJoCo.
"""
import json
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np

import ogbench

repo = sys.argv[1]
out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "data", "ogbench")
name = "scene-sharded"
shards = os.path.join(out, name)
os.makedirs(shards, exist_ok=True)
for f in os.listdir(shards):
    os.remove(os.path.join(shards, f))

with tempfile.TemporaryDirectory() as tmp:
    for seed in range(3):
        path = os.path.join(shards, f"scene-play-v0-{seed}.npz")
        subprocess.run(
            [
                sys.executable,
                os.path.join(repo, "data_gen_scripts", "generate_manipspace.py"),
                f"--seed={seed}",
                "--env_name=scene-v0",
                "--dataset_type=play",
                "--num_episodes=10",
                "--max_episode_steps=6",
                f"--save_path={path}",
            ],
            check=True,
            cwd=tmp,
        )

expected = {"generator": "ogbench 1.2.1 data_gen_scripts/generate_manipspace.py --env_name=scene-v0", "shards": []}
for seed in range(3):
    file = f"scene-play-v0-{seed}.npz"
    data = ogbench.load_dataset(os.path.join(shards, file), add_info=True)
    arrays = {}
    for key, a in sorted(data.items()):
        a = np.ascontiguousarray(a)
        arrays[key] = {
            "dtype": str(a.dtype),
            "shape": list(a.shape),
            "crc32": zlib.crc32(a.astype(a.dtype.newbyteorder("<")).tobytes()),
        }
    expected["shards"].append(
        {
            "file": file,
            "transitions": int(len(data["observations"])),
            "terminals": [int(t) for t in data["terminals"]],
            "first_observation": [float(x) for x in data["observations"][0]],
            "arrays": arrays,
        }
    )
with open(os.path.join(out, f"{name}.expected.json"), "w") as f:
    json.dump(expected, f, indent=1)
    f.write("\n")
print("wrote", out)
