"""Computes the golden dataset's expected values with pyarrow (an independent reader), once, when
the golden dataset is made: python golden_expected.py tests/data/golden-v1.trajstore > expected.json"""
import json, os, sys

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

root = sys.argv[1]
out = {"versions": {}}
for name in sorted(os.listdir(os.path.join(root, "_versions"))):
    m = json.load(open(os.path.join(root, "_versions", name)))
    lengths, returns, terminated, obs_sums, act_sums, first_obs = [], [], [], [], [], []
    for seg in m["segments"]:
        t = ipc.open_file(pa.memory_map(os.path.join(root, seg["path"]))).read_all()
        e = ipc.open_file(pa.memory_map(os.path.join(root, seg["episodes_path"]))).read_all()
        obs = t.column("observation").combine_chunks().storage.flatten().to_numpy().reshape(t.num_rows, -1)
        act = t.column("action").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1)
        rew = t.column("reward").to_numpy()
        for start, length, term in zip(e.column("row_start").to_pylist(), e.column("length").to_pylist(),
                                       e.column("terminated").to_pylist()):
            lengths.append(length)
            returns.append(float(np.sum(rew[start:start + length].astype(np.float64))))
            terminated.append(term)
            obs_sums.append(float(obs[start:start + length].astype(np.float64).sum()))
            act_sums.append(float(act[start:start + length].astype(np.float64).sum()))
            first_obs.append([float(x) for x in obs[start]])
    out["versions"][str(m["version"])] = {
        "transitions": m["transitions"], "episodes": m["episodes"], "lengths": lengths,
        "returns": returns, "terminated": terminated, "obs_sums": obs_sums, "act_sums": act_sums,
        "first_obs": first_obs,
    }
json.dump(out, sys.stdout)
