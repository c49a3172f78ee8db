"""Writes tests/data/lerobot_images: a LeRobot v3 dataset whose cameras are `image` features (PNG
bytes inside the Parquet files, Hugging Face `datasets`' `Image` storage `{bytes, path}`), made by
LeRobot's own writer (`LeRobotDataset.create(..., use_videos=False)`, `add_frame`,
`save_episode`, `finalize`), and beside it `front.u8` and `wrist.u8`: every stored image of the
two RGB cameras decoded by Pillow, in row order, as raw bytes (`[rows, H, W, 3]`). (LeRobot writes one-channel images only as 16-bit or
float depth PNGs, which trajstore's 8-bit decoders refuse with a named error.)

Run with the Python of scripts/setup-lerobot-peer.sh (lerobot needs Python 3.12):
    ~/.cache/trajstore-lerobot/bin/python tests/python/make_lerobot_image_fixtures.py [OUT]
"""

import io
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from PIL import Image

out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1] / "data" / "lerobot_images")
root = out / "v3"
if root.exists():
    shutil.rmtree(root)
H, W = 24, 32
features = {
    "observation.state": {"dtype": "float32", "shape": (2,), "names": ["x", "y"]},
    "action": {"dtype": "float32", "shape": (2,), "names": ["dx", "dy"]},
    "observation.images.front": {
        "dtype": "image",
        "shape": (H, W, 3),
        "names": ["height", "width", "channels"],
    },
    "observation.images.wrist": {
        "dtype": "image",
        "shape": (H // 2, W // 2, 3),
        "names": ["height", "width", "channels"],
    },
    "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
}
ds = LeRobotDataset.create(
    repo_id="trajstore/lerobot_images",
    fps=10,
    features=features,
    root=root,
    use_videos=False,
)
rng = np.random.default_rng(3)
yy, xx = np.mgrid[0:H, 0:W]
for ep, length in enumerate([7, 5, 9]):
    for t in range(length):
        front = np.zeros((H, W, 3), np.uint8)
        front[..., 0] = (xx * 7 + t * 11 + ep * 40) % 256
        front[..., 1] = (yy * 9 + t * 3) % 256
        front[..., 2] = rng.integers(0, 256, (H, W), dtype=np.uint8)
        wrist = np.stack(
            [((xx + yy + t * 5 + ep) * 4 % 256)[::2, ::2].astype(np.uint8)] * 3, axis=-1
        )
        wrist[..., 1] = 255 - wrist[..., 1]
        ds.add_frame(
            {
                "observation.state": np.array([t, ep], np.float32),
                "action": np.array([0.5 * t, -ep], np.float32),
                "observation.images.front": front,
                "observation.images.wrist": wrist,
                "next.reward": np.array([float(t == length - 1)], np.float32),
                "task": "push the block",
            }
        )
    ds.save_episode()
ds.finalize()
# The image writer's temporary PNGs (their bytes are in the Parquet files now).
shutil.rmtree(root / "images", ignore_errors=True)

# What the Parquet files hold, decoded by Pillow: the reference the test compares with.
expected: dict[str, list[np.ndarray]] = {"front": [], "wrist": []}
for f in sorted((root / "data").rglob("*.parquet")):
    table = pq.read_table(f)
    for key, name in [("observation.images.front", "front"), ("observation.images.wrist", "wrist")]:
        for cell in table.column(key).to_pylist():
            expected[name].append(np.asarray(Image.open(io.BytesIO(cell["bytes"]))))
for name, frames in expected.items():
    np.stack(frames).astype(np.uint8).tofile(out / f"{name}.u8")
print(root, {k: np.stack(v).shape for k, v in expected.items()})
