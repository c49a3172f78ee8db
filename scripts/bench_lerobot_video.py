"""How to keep a LeRobot dataset's camera frames, with figures: the encoded MP4s (AV1 as LeRobot
writes them, decoded when a batch is sampled) against trajstore's frame columns (decoded once at
ingest, each frame stored with zstd and the column's dictionary).

Writes a LeRobot v3 dataset with PyAV exactly as tests/python/make_lerobot_video_fixtures.py
does (libsvtav1, g=2, crf=30, preset=12, yuv420p), but at camera size (default 480x640, two
cameras, 10 episodes of 150 frames) with textured frames (a fixed smoothed-noise texture that
pans, a moving object, sensor noise), then measures:

- bytes on disk: the MP4s; the frame columns after `trajstore ingest` (`trajstore info --json`);
- ingest: wall time of `trajstore ingest DIR DS` (frames/s);
- decoded frames/s of a batch of 256 random one-frame slices, the way each store is read: from
  the MP4s, LeRobot's `decode_video_frames_pyav` path (seek to the key frame at or before the
  frame, decode forward; libdav1d, the decoder trajstore's ingest uses); from the frame columns,
  zstd with the column's dictionary (the `zstandard` module, one decoder, as a gather worker).

Run: `python scripts/bench_lerobot_video.py --bin target/release/trajstore [--height 480
--width 640 --episodes 20 --frames 150] [--keep DIR]` with a Python that has PyAV, NumPy,
pyarrow and zstandard (`pip install av numpy pyarrow zstandard`), and a trajstore built with
`--features video`.
"""
import argparse
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import zstandard

here = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location(
    "fixtures", here.parent / "tests" / "python" / "make_lerobot_video_fixtures.py")
fx = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fx)

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--height", type=int, default=480)
ap.add_argument("--width", type=int, default=640)
ap.add_argument("--episodes", type=int, default=10)
ap.add_argument("--frames", type=int, default=150)
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--noise", type=float, default=2.0, help="sensor noise (standard deviation, 0-255 scale)")
ap.add_argument("--keep")
args = ap.parse_args()

H, W = args.height, args.width
rng = np.random.default_rng(0)
texture = rng.integers(0, 256, (H // 8 + 1, 2 * W // 8 + 1, 3)).astype(np.float32)
texture = texture.repeat(8, 0).repeat(8, 1)[: H, : 2 * W]
# Smooth the blocky noise (a box filter twice): a texture with edges and gradients.
for _ in range(2):
    texture = (texture + np.roll(texture, 4, 0) + np.roll(texture, 4, 1) + np.roll(texture, 4, (0, 1))) / 4


def image(cam: int, ep: int, t: int) -> np.ndarray:
    x0 = (t * 3 + ep * 17 + cam * 101) % W
    img = texture[:, x0 : x0 + W].copy()
    s = (t * 5 + ep * 11) % (W - 64)
    img[100 + cam * 40 : 164 + cam * 40, s : s + 64] = (230, 40 + 10 * ep % 200, 60)
    if args.noise > 0:
        img += np.random.default_rng(ep * 100000 + t * 10 + cam).normal(0, args.noise, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


fx.H, fx.W, fx.image = H, W, image
work = Path(args.keep or tempfile.mkdtemp(prefix="lerobot-bench-"))
fx.out = work
cams = ["observation.images.top", "observation.images.wrist"]
t0 = time.perf_counter()
fx.write_dataset("v3", "v3.0", cams, [args.frames] * args.episodes, fx.AV1, {}, None)
print(f"wrote the dataset in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
root = work / "v3"
mp4s = sorted(root.glob("videos/**/*.mp4"))
mp4_bytes = sum(p.stat().st_size for p in mp4s)
frames = 2 * args.episodes * args.frames

ds = work / "ds.trajstore"
shutil.rmtree(ds, ignore_errors=True)
t0 = time.perf_counter()
subprocess.run([args.bin, "ingest", str(root), str(ds)], check=True, stdout=subprocess.DEVNULL)
ingest_s = time.perf_counter() - t0
info = json.loads(subprocess.run([args.bin, "info", str(ds), "--json"], check=True,
                                 capture_output=True, text=True).stdout)
stored = {f["column"]: f["stored_bytes"] + f["dictionary_bytes"] for f in info["frames"]}

# A batch of one-frame slices from the MP4s, LeRobot's way (top camera).
top = [p for p in mp4s if "images.top" in str(p)]
rnd = random.Random(1)
with av.open(str(top[0])) as c:
    s = c.streams.video[0]
    n_frames = s.frames
    tb = s.time_base
picks = [rnd.randrange(n_frames) for _ in range(args.batch)]
t0 = time.perf_counter()
decoded = 0
with av.open(str(top[0])) as c:
    s = c.streams.video[0]
    for k in picks:
        ts = k / fx.FPS
        c.seek(round(ts / tb) - 1, backward=True, any_frame=False, stream=s)
        for f in c.decode(s):
            decoded += 1
            f.to_ndarray(format="rgb24")
            if float(f.pts * tb) >= ts - 1e-4:
                break
video_s = time.perf_counter() - t0

# The same batch from the stored frame column.
manifest = json.loads(sorted((ds / "_versions").glob("*.json"))[-1].read_text())
col = next(c for c in manifest["columns"] if c["name"] == "observation.images.top")
frame_spec = col["frame"]
d = frame_spec.get("dictionary")
dctx = zstandard.ZstdDecompressor(
    dict_data=zstandard.ZstdCompressionDict((ds / d["path"]).read_bytes()) if d else None)
blobs = []
for seg in manifest["segments"]:
    t = ipc.open_file(pa.memory_map(str(ds / seg["path"]))).read_all()
    blobs += t.column("observation.images.top").to_pylist()
n = int(np.prod(frame_spec["shape"]))
picks = [rnd.randrange(len(blobs)) for _ in range(args.batch)]
t0 = time.perf_counter()
for k in picks:
    np.frombuffer(dctx.decompress(blobs[k], max_output_size=n), np.uint8)
zstd_s = time.perf_counter() - t0

raw = frames * H * W * 3
print(json.dumps({
    "frames": frames, "shape": [H, W, 3], "noise": args.noise, "raw_bytes": raw,
    "mp4_bytes": mp4_bytes, "mp4_bytes_per_frame": mp4_bytes / frames,
    "frame_column_bytes": sum(stored.values()), "frame_column_bytes_per_frame": sum(stored.values()) / frames,
    "ingest_s": ingest_s, "ingest_frames_per_s": frames / ingest_s,
    "batch": args.batch,
    "video_batch_s": video_s, "video_frames_per_s": args.batch / video_s, "video_frames_decoded": decoded,
    "zstd_batch_s": zstd_s, "zstd_frames_per_s": args.batch / zstd_s,
}, indent=1))
if not args.keep:
    shutil.rmtree(work)
