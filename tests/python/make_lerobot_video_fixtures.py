"""Writes tests/data/lerobot_video/: small LeRobot datasets with cameras, made with PyAV the way
LeRobot's writer makes them (lerobot/datasets/dataset_writer.py and video_utils.py, 2026):

- each episode of each camera is encoded on its own (`encode_video_frames`: `av.open(path, "w")`,
  `add_stream(vcodec, fps, options)`, `pix_fmt = "yuv420p"`, RGB frames through
  `av.VideoFrame.from_image`, so swscale converts them to yuv420p), with LeRobot's default
  options: libsvtav1, `g=2`, `crf=30`, `preset=12`, `svtav1-params=fast-decode=0`; H.264 is
  libx264 with `g=2`, `crf=30` (and `threads=1`, LeRobot's `encoder_threads`; libx264's bytes may still differ from run to run, and the expected frames are decoded from the MP4s of the same run);
- v3: the episode's MP4 is appended to the camera's current `file-NNN.mp4` by
  `concatenate_video_files` (ffmpeg's concat demuxer, packets remuxed without re-encoding,
  `movflags=faststart`), or starts a new file when the current one is "full" (here: the
  `roll_after` episodes of a camera, standing for `video_files_size_in_mb`); the episode's
  `videos/<key>/from_timestamp` is the file's duration before it (`to_timestamp` of the previous
  episode of that file) and `to_timestamp` adds `get_video_duration_in_s` of the episode's own
  MP4 (`stream.duration * stream.time_base`);
- `data/chunk-000/file-000.parquet` holds every episode, one row group per episode;
  `meta/episodes/chunk-000/file-000.parquet` one row per episode; `meta/tasks.parquet`;
  `meta/info.json` with the cameras' `dtype: "video"` features;
- v2.1: one MP4 per episode and camera, `videos/chunk-000/<key>/episode_NNNNNN.mp4`.

Datasets (32x24 frames, small enough to commit the expected frames; fps 10):
- `v3_av1/`: cameras `observation.images.top` (3 episodes in one MP4) and
  `observation.images.wrist` (episodes 0-1 in file-000, episode 2 in file-001), AV1;
- `v3_h264/`: camera `observation.images.top`, 2 episodes in one MP4, H.264;
- `v21_av1/`: camera `observation.images.top`, 2 episodes, one MP4 each, AV1.

`expected/` holds, for each dataset and camera, the frame of every data row as LeRobot's PyAV
decoder gives it (`frame.to_ndarray(format="rgb24")` of the frame whose `pts * time_base` is
nearest `from_timestamp + timestamp`), `<dataset>/<key>/rgb` [rows, H, W, 3], and the decoded
yuv420p planes of the same frames (`frame.to_ndarray()`, [rows, H * 3 / 2, W]),
`<dataset>/<key>/yuv` (RGB for `v3_av1` only, to keep the fixtures small: the conversion is
the same for every dataset): raw uint8 bytes, gzipped, one file each, named and shaped by
`expected/index.json` (readable without NumPy).

Run with a Python that has PyAV (its wheel bundles libsvtav1, libdav1d and libx264), NumPy and
pyarrow: `python tests/python/make_lerobot_video_fixtures.py [OUT]`.
"""
import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

out = Path(sys.argv[1] if len(sys.argv) > 1 and __name__ == "__main__" else os.path.join(os.path.dirname(__file__), "..", "data", "lerobot_video"))
H, W, FPS = 24, 32, 10
AV1 = ("libsvtav1", {"g": "2", "crf": "30", "preset": "12", "svtav1-params": "fast-decode=0"})
H264 = ("h264", {"g": "2", "crf": "30", "threads": "1"})  # one thread: reproducible bytes


def image(cam: int, ep: int, t: int) -> np.ndarray:
    """A frame with structure an encoder must work for: gradients and a moving square."""
    y, x = np.mgrid[0:H, 0:W]
    r = (x * 8 + t * 9 + cam * 50) % 256
    g = (y * 10 + ep * 40) % 256
    b = ((x + y) * 4 + t * 5) % 256
    img = np.stack([r, g, b], -1).astype(np.uint8)
    s = (t * 2 + ep * 5) % (W - 8)
    img[4 + cam * 6 : 12 + cam * 6, s : s + 8] = (255 - 60 * cam, 30 * ep, 200)
    return img


def encode(path: Path, frames: list[np.ndarray], codec: tuple[str, dict]) -> None:
    """LeRobot's `encode_video_frames` (its PNGs -> PIL -> `VideoFrame.from_image`)."""
    vcodec, options = codec
    with av.open(str(path), "w") as output:
        stream = output.add_stream(vcodec, FPS, options=options)
        stream.pix_fmt = "yuv420p"
        stream.width, stream.height = W, H
        for f in frames:
            packet = stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24"))
            if packet:
                output.mux(packet)
        packet = stream.encode()
        if packet:
            output.mux(packet)


def concatenate(inputs: list[Path], output: Path) -> None:
    """LeRobot's `concatenate_video_files`."""
    with tempfile.NamedTemporaryFile(mode="w", suffix=".ffconcat", delete=False) as f:
        f.write("ffconcat version 1.0\n")
        for p in inputs:
            f.write(f"file '{p.resolve()}'\n")
        listing = f.name
    src = av.open(listing, mode="r", format="concat", options={"safe": "0"})
    with tempfile.NamedTemporaryFile(suffix=".mp4", delete=False) as f:
        tmp = f.name
    dst = av.open(tmp, mode="w", options={"movflags": "faststart"})
    streams = {}
    for s in src.streams:
        if s.type in ("video", "audio", "subtitle"):
            streams[s.index] = dst.add_stream_from_template(template=s, opaque=True)
            streams[s.index].time_base = s.time_base
    for packet in src.demux():
        if packet.stream.index not in streams or packet.dts is None:
            continue
        packet.stream = streams[packet.stream.index]
        dst.mux(packet)
    src.close()
    dst.close()
    shutil.move(tmp, output)
    os.unlink(listing)


def duration(path: Path) -> float:
    """LeRobot's `get_video_duration_in_s`."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return float(s.duration * s.time_base) if s.duration is not None else float(c.duration / av.time_base)


def decode_all(path: Path) -> list[tuple[float, np.ndarray, np.ndarray]]:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return [(float(f.pts * s.time_base), f.to_ndarray(format="rgb24"), f.to_ndarray())
                for f in c.decode(s)]


def closest(frames, ts: float):
    i = int(np.argmin([abs(t - ts) for t, _, _ in frames]))
    assert abs(frames[i][0] - ts) <= 1e-4, (ts, frames[i][0])
    return frames[i]


def features(cameras: list[str], codec: str) -> dict:
    f = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
    }
    for k in cameras:
        f[k] = {"dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"],
                "info": {"video.height": H, "video.width": W, "video.codec": codec,
                         "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": FPS,
                         "video.channels": 3, "has_audio": False}}
    for k, t in [("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                 ("index", "int64"), ("task_index", "int64"), ("next.reward", "float32"),
                 ("next.done", "bool")]:
        f[k] = {"dtype": t, "shape": [1], "names": None}
    return f


def data_table(ep: int, n: int, start: int) -> pa.Table:
    idx = list(range(start, start + n))
    return pa.table({
        "observation.state": pa.array([[i * 10.0 + j for j in range(3)] for i in idx], pa.list_(pa.float32())),
        "action": pa.array([[-i - 0.5 * j for j in range(2)] for i in idx], pa.list_(pa.float32())),
        "timestamp": pa.array([t / FPS for t in range(n)], pa.float32()),
        "frame_index": pa.array(list(range(n)), pa.int64()),
        "episode_index": pa.array([ep] * n, pa.int64()),
        "index": pa.array(idx, pa.int64()),
        "task_index": pa.array([0] * n, pa.int64()),
        "next.reward": pa.array([0.25 * i for i in idx], pa.float32()),
        "next.done": pa.array([t == n - 1 for t in range(n)]),
    })


def write_dataset(name: str, version: str, cameras: list[str], lengths: list[int],
                  codec: tuple[str, dict], roll_after: dict[str, int], expected: dict | None,
                  with_rgb: bool = True) -> None:
    root = out / name
    if root.exists():
        shutil.rmtree(root)
    (root / "meta").mkdir(parents=True)
    tmp = Path(tempfile.mkdtemp())
    episodes = []
    starts = np.cumsum([0] + lengths[:-1]).tolist()
    for ep, n in enumerate(lengths):
        episodes.append({"episode_index": ep, "tasks": ["reach"], "length": n,
                         "dataset_from_index": starts[ep], "dataset_to_index": starts[ep] + n,
                         "data/chunk_index": 0, "data/file_index": 0})
    rows_of_cam: dict[str, list] = {k: [] for k in cameras}
    for c, key in enumerate(cameras):
        file_index, in_file, offset = 0, 0, 0.0
        for ep, n in enumerate(lengths):
            ep_path = tmp / f"{c}-{ep}.mp4"
            encode(ep_path, [image(c, ep, t) for t in range(n)], codec)
            dur = duration(ep_path)
            if version == "v2.1":
                dst = root / "videos" / "chunk-000" / key / f"episode_{ep:06d}.mp4"
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(ep_path, dst)
                if expected is not None:
                    frames = decode_all(dst)
                    rows_of_cam[key] += [closest(frames, t / FPS) for t in range(n)]
                continue
            if in_file == roll_after.get(key, 1 << 30):
                file_index, in_file, offset = file_index + 1, 0, 0.0
            dst = root / "videos" / key / "chunk-000" / f"file-{file_index:03d}.mp4"
            dst.parent.mkdir(parents=True, exist_ok=True)
            if in_file == 0:
                shutil.move(ep_path, dst)
            else:
                concatenate([dst, ep_path], dst)
            episodes[ep].update({f"videos/{key}/chunk_index": 0, f"videos/{key}/file_index": file_index,
                                 f"videos/{key}/from_timestamp": offset,
                                 f"videos/{key}/to_timestamp": offset + dur})
            offset += dur
            in_file += 1
        if version != "v2.1" and expected is not None:
            for ep, n in enumerate(lengths):
                e = episodes[ep]
                frames = decode_all(root / "videos" / key / "chunk-000" / f"file-{e[f'videos/{key}/file_index']:03d}.mp4")
                rows_of_cam[key] += [closest(frames, e[f"videos/{key}/from_timestamp"] + np.float32(t / FPS))
                                     for t in range(n)]
    shutil.rmtree(tmp)
    for key, rows in rows_of_cam.items():
        if expected is None:
            break
        if with_rgb:
            expected[f"{name}/{key}/rgb"] = np.stack([r[1] for r in rows])
        expected[f"{name}/{key}/yuv"] = np.stack([r[2] for r in rows])
    info = {"codebase_version": version, "robot_type": "synthetic", "total_episodes": len(lengths),
            "total_frames": sum(lengths), "total_tasks": 1, "chunks_size": 1000, "fps": FPS,
            "splits": {"train": f"0:{len(lengths)}"}, "features": features(cameras, "av1" if codec is AV1 else "h264")}
    if version == "v2.1":
        (root / "data" / "chunk-000").mkdir(parents=True)
        for ep, n in enumerate(lengths):
            pq.write_table(data_table(ep, n, starts[ep]), root / "data" / "chunk-000" / f"episode_{ep:06d}.parquet")
        info.update({"total_videos": len(lengths) * len(cameras), "total_chunks": 1,
                     "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
                     "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"})
        with open(root / "meta" / "episodes.jsonl", "w") as f:
            for e in episodes:
                f.write(json.dumps({"episode_index": e["episode_index"], "tasks": e["tasks"], "length": e["length"]}) + "\n")
        with open(root / "meta" / "tasks.jsonl", "w") as f:
            f.write(json.dumps({"task_index": 0, "task": "reach"}) + "\n")
    else:
        (root / "data" / "chunk-000").mkdir(parents=True)
        tables = [data_table(ep, n, starts[ep]) for ep, n in enumerate(lengths)]
        with pq.ParquetWriter(root / "data" / "chunk-000" / "file-000.parquet", tables[0].schema) as w:
            for t in tables:
                w.write_table(t)
        (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(episodes), root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
        pq.write_table(pa.table({"task": ["reach"], "task_index": pa.array([0], pa.int64())}), root / "meta" / "tasks.parquet")
        info.update({"data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
                     "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
                     "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"})
    with open(root / "meta" / "info.json", "w") as f:
        json.dump(info, f, indent=2)


def main() -> None:
    expected: dict = {}
    top, wrist = "observation.images.top", "observation.images.wrist"
    write_dataset("v3_av1", "v3.0", [top, wrist], [8, 6, 10], AV1, {wrist: 2}, expected)
    write_dataset("v3_h264", "v3.0", [top], [7, 9], H264, {}, expected, with_rgb=False)
    write_dataset("v21_av1", "v2.1", [top], [5, 7], AV1, {}, expected, with_rgb=False)
    write_expected(expected)


def write_expected(expected: dict) -> None:
    exp = out / "expected"
    if exp.exists():
        shutil.rmtree(exp)
    exp.mkdir()
    index = {}
    for k, v in expected.items():
        name = k.replace("/", "__") + ".u8.gz"
        with open(exp / name, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
            f.write(np.ascontiguousarray(v).tobytes())
        index[k] = {"file": name, "shape": list(v.shape)}
    with open(exp / "index.json", "w") as f:
        json.dump(index, f, indent=1, sort_keys=True)
    print("av", av.__version__, "->", out.resolve(), {k: v.shape for k, v in expected.items()})


if __name__ == "__main__":
    main()
