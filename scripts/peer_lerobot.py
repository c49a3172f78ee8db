"""LeRobot's side of scripts/bench_lerobot.sh: a LeRobot v3 dataset written by LeRobot's own
writer, and LeRobot's own reader (`LeRobotDataset` + a torch `DataLoader`) timed on it.

Runs in the venv of scripts/setup-lerobot-peer.sh (Python 3.12, `lerobot[dataset]`):

    py=$(scripts/setup-lerobot-peer.sh | tail -n1)
    $py scripts/peer_lerobot.py make /tmp/lr --episodes 20 --frames 150 --height 96 --width 128
    $py scripts/peer_lerobot.py bench /tmp/lr --slice-len 16 --batch 256 --workers 2 --batches 8

`make DIR`: `LeRobotDataset.create(...)`, then per step `add_frame(...)` and per episode
`save_episode()`, then `finalize()` (lerobot 0.6: without it the parquet footers are not
written). So the files are what LeRobot writes: each camera's episodes encoded with its
default encoder (libsvtav1, g=2, crf=30, preset 12, yuv420p, through PyAV) and concatenated into
`videos/<camera>/chunk-000/file-000.mp4`, `data/` and `meta/` in v3.0. The frames: a smoothed
random texture that pans, a moving block and Gaussian sensor noise (so AV1 has real work), per
camera; `observation.state` a random walk, `action` the next state's change, `next.reward` and
`next.done` (what `trajstore ingest` reads without options). Prints one JSON line.

`bench DIR`: `LeRobotDataset(repo_id, root=DIR, delta_timestamps={key: [k / fps for k in
range(L)]} for every camera and for observation.state, action and next.reward,
video_backend="pyav", return_uint8=True)`, so that each item is a slice of L steps with L frames
per camera (LeRobot clamps a window that runs past its episode's end to the last step and flags
the rest `*_is_pad`); `DataLoader(ds, batch_size=B, shuffle=True, num_workers=W)`. It times
`--batches` batches after `--warmup` batches (the warm-up includes starting the workers) and
prints one JSON line: slices/s (LeRobot's samples/s: one item is one slice), steps/s and
decoded frames/s (slices x L x cameras), plus the time to the first batch (dataset opened,
workers started, first batch decoded).

`return_uint8=True` keeps the frames uint8 (as trajstore returns them); LeRobot's default
returns float32 in [0, 1], 4x the bytes through the DataLoader's shared memory (`--float`).
torchcodec, LeRobot's default decoder where it loads, needs FFmpeg's shared libraries, which
this machine lacks; `pyav` is LeRobot's decoder everywhere else (`--backend` to change it).
"""

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO_ID = "local/trajstore-peer"
TASK = "push the block"


def frames_texture(h: int, w: int, seed: int) -> np.ndarray:
    """A smoothed random texture twice the frame's width (it pans across the frame)."""
    rng = np.random.default_rng(seed)
    cell = max(2, min(h, w) // 24)
    tex = rng.integers(0, 256, (h // cell + 1, 2 * w // cell + 1, 3)).astype(np.float32)
    tex = tex.repeat(cell, 0).repeat(cell, 1)[:h, : 2 * w]
    half = max(1, cell // 2)
    for _ in range(2):  # a box filter, twice: edges and gradients
        tex = (tex + np.roll(tex, half, 0) + np.roll(tex, half, 1) + np.roll(tex, half, (0, 1))) / 4
    return tex


def make(args: argparse.Namespace) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = Path(args.dir)
    if root.exists():
        sys.exit(f"error: {root} exists (make writes a new dataset; remove it first)")
    h, w = args.height, args.width
    cams = [f"observation.images.{name}" for name in ("top", "wrist", "left", "right")[: args.cameras]]
    features = {
        "observation.state": {"dtype": "float32", "shape": (args.state_dim,), "names": None},
        "action": {"dtype": "float32", "shape": (args.action_dim,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
    }
    kind = "image" if args.images else "video"
    for cam in cams:
        features[cam] = {"dtype": kind, "shape": (h, w, 3), "names": ["height", "width", "channels"]}
    t0 = time.perf_counter()
    ds = LeRobotDataset.create(REPO_ID, fps=args.fps, features=features, root=root, use_videos=not args.images,
                               video_backend=args.backend)
    textures = [frames_texture(h, w, args.seed + c) for c in range(len(cams))]
    size = max(4, min(h, w) // 4)
    for ep in range(args.episodes):
        rng = np.random.default_rng((args.seed, ep))
        state = np.cumsum(rng.normal(0, 0.05, (args.frames + 1, args.state_dim)), 0).astype(np.float32)
        noise = np.random.default_rng((args.seed, ep, 1))
        for t in range(args.frames):
            frame = {
                "observation.state": state[t],
                "action": (state[t + 1] - state[t])[: args.action_dim].copy(),
                "next.reward": np.array([-float(np.linalg.norm(state[t + 1]))], np.float32),
                "next.done": np.array([t == args.frames - 1]),
                "task": TASK,
            }
            for c, cam in enumerate(cams):
                x0 = (t * max(1, w // 100) + ep * 17 + c * 31) % w
                img = textures[c][:, x0 : x0 + w].copy()
                y = (h // 4 + c * size // 2 + t) % (h - size)
                x = (t * max(1, w // 60) + ep * 11) % (w - size)
                img[y : y + size, x : x + size] = (230, (40 + 10 * ep) % 256, 60)
                if args.noise > 0:
                    img += noise.normal(0, args.noise, img.shape).astype(np.float32)
                frame[cam] = np.clip(img, 0, 255).astype(np.uint8)
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    mp4s = sorted(root.glob("videos/**/*.mp4"))
    print(json.dumps({
        "dir": str(root), "episodes": args.episodes, "frames_per_episode": args.frames,
        "cameras": cams, "shape": [h, w, 3], "fps": args.fps, "write_s": round(time.perf_counter() - t0, 2),
        "mp4_files": len(mp4s), "mp4_bytes": sum(p.stat().st_size for p in mp4s),
        "lerobot": version(),
    }))


def version() -> str:
    from importlib.metadata import version as v

    return v("lerobot")


def bench(args: argparse.Namespace) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    import torch

    t_open = time.perf_counter()
    info = json.loads((Path(args.dir) / "meta" / "info.json").read_text())
    fps = info["fps"]
    cams = [k for k, f in info["features"].items() if f["dtype"] in ("video", "image")]
    keys = cams + [k for k in ("observation.state", "action", "next.reward") if k in info["features"]]
    deltas = [k / fps for k in range(args.slice_len)]
    ds = LeRobotDataset(REPO_ID, root=args.dir, delta_timestamps={k: deltas for k in keys},
                        video_backend=args.backend, return_uint8=not args.float)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                         drop_last=True, persistent_workers=args.workers > 0)
    it = iter(loader)

    def take() -> dict:
        nonlocal it
        try:
            return next(it)
        except StopIteration:  # an epoch ran out: start another (the workers persist)
            it = iter(loader)
            return next(it)

    first = take()
    first_s = time.perf_counter() - t_open
    shape = list(first[cams[0]].shape)
    dtype = str(first[cams[0]].dtype)
    for _ in range(args.warmup - 1):
        take()
    t0 = time.perf_counter()
    n = 0
    for _ in range(args.batches):
        n += len(take()["index"])
    dt = time.perf_counter() - t0
    slices = n / dt
    print(json.dumps({
        "system": "lerobot", "lerobot": version(), "torch": torch.__version__, "backend": args.backend,
        "dataset_frames": len(ds), "episodes": ds.num_episodes, "cameras": len(cams),
        "batch": args.batch, "slice_len": args.slice_len, "workers": args.workers,
        "camera_batch_shape": shape, "camera_dtype": dtype,
        "first_batch_s": round(first_s, 3), "warmup_batches": args.warmup,
        "batches": args.batches, "seconds": round(dt, 3),
        "slices_per_s": round(slices, 2), "steps_per_s": round(slices * args.slice_len, 1),
        "frames_per_s": round(slices * args.slice_len * len(cams), 1),
        "batches_per_s": round(args.batches / dt, 4),
    }))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="write a LeRobot v3 dataset with LeRobot's writer")
    m.add_argument("dir")
    m.add_argument("--episodes", type=int, default=20)
    m.add_argument("--frames", type=int, default=150, help="steps per episode")
    m.add_argument("--height", type=int, default=96)
    m.add_argument("--width", type=int, default=128)
    m.add_argument("--cameras", type=int, default=2, choices=[1, 2, 3, 4])
    m.add_argument("--fps", type=int, default=30)
    m.add_argument("--state-dim", type=int, default=14)
    m.add_argument("--action-dim", type=int, default=14)
    m.add_argument("--noise", type=float, default=2.0, help="sensor noise (standard deviation, 0-255 scale)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--backend", default="pyav")
    m.add_argument("--images", action="store_true",
                   help="cameras as `image` features (PNG bytes in the Parquet files) instead of AV1 videos")
    b = sub.add_parser("bench", help="time LeRobotDataset + DataLoader on slices of a dataset")
    b.add_argument("dir")
    b.add_argument("--slice-len", type=int, default=16, help="steps per item (delta_timestamps)")
    b.add_argument("--batch", type=int, default=256)
    b.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    b.add_argument("--batches", type=int, default=8, help="timed batches")
    b.add_argument("--warmup", type=int, default=2, help="batches before timing (at least 1)")
    b.add_argument("--backend", default="pyav", help="LeRobot's video_backend")
    b.add_argument("--float", action="store_true", help="float32 frames in [0, 1] (LeRobot's default)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local dataset: never ask the Hub
    if args.cmd == "make":
        make(args)
    else:
        args.warmup = max(1, args.warmup)
        bench(args)


if __name__ == "__main__":
    main()
