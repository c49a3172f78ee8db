"""Writes tests/data/lerobot/: a small dataset in the LeRobot v2.1 layout (meta/info.json,
meta/episodes.jsonl, meta/tasks.jsonl, data/chunk-000/episode_NNNNNN.parquet; one file per
episode, as LeRobotDataset writes them), with pyarrow and the column types LeRobot uses
(`observation.state` and `action` as list<float32>, `next.reward` float32, `next.done` bool,
int64 indices). No videos: image features are stored as video files outside the Parquet data.
A `meta/episodes/chunk-000/file-000.parquet` (LeRobot v3's per-episode metadata, different
columns) checks that only `data/` is read.

Values are the formulas of make_numpy_fixtures.py for the global frame index i (`index`), over
700 frames; episodes end where terminals or timeouts would, so tests/common recomputes them.
"""
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "data", "lerobot")
n = 700
ends = [i for i in range(n) if (i + 1) % 97 == 0 or (i + 1) % 150 == 0]
if ends[-1] != n - 1:
    ends.append(n - 1)
os.makedirs(os.path.join(out, "data", "chunk-000"), exist_ok=True)
os.makedirs(os.path.join(out, "meta", "episodes", "chunk-000"), exist_ok=True)
start = 0
episodes = []
for k, end in enumerate(ends):
    idx = list(range(start, end + 1))
    t = pa.table({
        "observation.state": pa.array([[i * 10.0 + j for j in range(3)] for i in idx], pa.list_(pa.float32())),
        "action": pa.array([[-i - 0.5 * j for j in range(2)] for i in idx], pa.list_(pa.float32())),
        "episode_index": pa.array([k] * len(idx), pa.int64()),
        "frame_index": pa.array([i - start for i in idx], pa.int64()),
        "timestamp": pa.array([(i - start) / 10 for i in idx], pa.float32()),
        "next.reward": pa.array([0.25 * i for i in idx], pa.float32()),
        "next.done": pa.array([i == end for i in idx]),
        "index": pa.array(idx, pa.int64()),
        "task_index": pa.array([0] * len(idx), pa.int64()),
    })
    pq.write_table(t, os.path.join(out, "data", "chunk-000", f"episode_{k:06d}.parquet"))
    episodes.append({"episode_index": k, "tasks": ["reach"], "length": len(idx)})
    start = end + 1
pq.write_table(pa.table({"episode_index": [e["episode_index"] for e in episodes],
                         "length": [e["length"] for e in episodes]}),
               os.path.join(out, "meta", "episodes", "chunk-000", "file-000.parquet"))
features = {
    "observation.state": {"dtype": "float32", "shape": [3], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "next.reward": {"dtype": "float32", "shape": [1], "names": None},
    "next.done": {"dtype": "bool", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
info = {"codebase_version": "v2.1", "robot_type": "synthetic", "total_episodes": len(episodes),
        "total_frames": n, "total_tasks": 1, "total_videos": 0, "total_chunks": 1,
        "chunks_size": 1000, "fps": 10, "splits": {"train": f"0:{len(episodes)}"},
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": None, "features": features}
with open(os.path.join(out, "meta", "info.json"), "w") as f:
    json.dump(info, f, indent=2)
with open(os.path.join(out, "meta", "episodes.jsonl"), "w") as f:
    for e in episodes:
        f.write(json.dumps(e) + "\n")
with open(os.path.join(out, "meta", "tasks.jsonl"), "w") as f:
    f.write(json.dumps({"task_index": 0, "task": "reach"}) + "\n")
print("pyarrow", pa.__version__, "->", os.path.abspath(out), len(episodes), "episodes")
