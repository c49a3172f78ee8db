"""Errors: bad loader arguments fail when the loader is made (not mid-epoch), with
InvalidArgumentError (a ValueError); missing and damaged datasets raise TrajstoreError subclasses,
never crash the interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import trajstore
from trajref import subprocess_env

torch = pytest.importorskip("torch")

BAD_LOADER_ARGS = {
    "unknown column": dict(columns=["observation", "no_such_column"]),
    "columns as a string": dict(columns="observation"),
    "slice longer than every episode": dict(slice_len=1000),
    "unknown device": dict(device="tpu"),
    "unknown device type": dict(device="mps"),
    "unknown sampler": dict(sampler="shuffle"),
    "bad policy": dict(policy="sideways"),
    "bad span policy": dict(policy="span:x:2"),
    "bad weighting": dict(weighting="steps"),
    "zero slices": dict(num_slices=0),
    "zero slice_len": dict(slice_len=0),
    "rank out of range": dict(rank=2, world_size=2),
    "world size zero": dict(rank=0, world_size=0),
    "empty episode subset": dict(episodes=[]),
    "unknown episode id": dict(episodes=[0, 10**9]),
    "episode subset with epoch sampler": dict(sampler="epoch", episodes=[1, 2, 3]),
    "beta without prioritized": dict(beta=0.4),
    "negative alpha": dict(sampler="prioritized", alpha=-1.0),
    "integer dtype_cast": dict(dtype_cast=torch.int32),
    "zero max_batches": dict(max_batches=0),
    "unknown backend": dict(backend="jax"),
    "numpy backend with dtype_cast": dict(backend="numpy", dtype_cast=torch.float16),
    "too many workers": dict(workers=100_000),
    "transform not callable": dict(transform=42),
    "batch larger than memory": dict(num_slices=1 << 24, slice_len=1 << 16, policy="pad"),
    "drop_last with no full batch": dict(sampler="epoch", num_slices=1 << 20, drop_last=True),
}


if torch.cuda.is_available():
    BAD_LOADER_ARGS["cuda index out of range"] = dict(device=f"cuda:{torch.cuda.device_count()}")
else:
    BAD_LOADER_ARGS["cuda without a GPU"] = dict(device="cuda")
    BAD_LOADER_ARGS["cuda index without a GPU"] = dict(device="cuda:1")
    BAD_LOADER_ARGS["torch.device cuda without a GPU"] = dict(device=torch.device("cuda", 0))


@pytest.mark.parametrize("kwargs", list(BAD_LOADER_ARGS.values()), ids=list(BAD_LOADER_ARGS))
def test_bad_loader_arguments_fail_at_construction(demo_ds, kwargs):
    with pytest.raises(trajstore.InvalidArgumentError) as e:
        demo_ds.loader(**kwargs)  # made, not iterated
    assert isinstance(e.value, ValueError) and isinstance(e.value, trajstore.TrajstoreError)
    assert str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_pin_memory_without_cuda(demo_ds):
    with pytest.raises(trajstore.InvalidArgumentError):
        demo_ds.loader(pin_memory=True)


def test_error_messages_name_the_problem(demo_ds):
    with pytest.raises(trajstore.InvalidArgumentError, match="no_such_column"):
        demo_ds.loader(columns=["no_such_column"])
    with pytest.raises(trajstore.InvalidArgumentError, match="1000"):
        demo_ds.loader(slice_len=1000)
    with pytest.raises(trajstore.InvalidArgumentError, match="shuffle"):
        demo_ds.loader(sampler="shuffle")
    with pytest.raises(trajstore.InvalidArgumentError, match="sideways"):
        demo_ds.loader(policy="sideways")
    with pytest.raises(trajstore.InvalidArgumentError, match="tpu"):
        demo_ds.loader(device="tpu")


def test_bad_subset_query_is_sql_error(demo_ds):
    with pytest.raises(trajstore.SqlError):
        demo_ds.loader(episodes="SELECT nope FROM episodes")
    # A subset query must return episode ids.
    with pytest.raises(trajstore.TrajstoreError):
        demo_ds.loader(episodes="SELECT length FROM episodes")


def test_missing_dataset(tmp_path):
    missing = tmp_path / "nothing-here"
    with pytest.raises(trajstore.DatasetNotFoundError) as e:
        trajstore.open(missing)
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, trajstore.TrajstoreError)
    with pytest.raises(FileNotFoundError):
        trajstore.open(str(missing))


def test_directory_that_is_not_a_dataset(tmp_path):
    (tmp_path / "somefile.txt").write_text("hello")
    with pytest.raises(trajstore.TrajstoreError):
        trajstore.open(tmp_path)


def test_missing_version(demo_path):
    with pytest.raises(trajstore.TrajstoreError):
        trajstore.open(demo_path, version=999)


def _manifest(path):
    vdir = os.path.join(path, "_versions")
    return os.path.join(vdir, max(os.listdir(vdir), key=lambda n: int(n.split(".")[0])))


def _segment(path, index=1, episodes=False):
    with open(_manifest(path)) as f:
        seg = json.load(f)["segments"][index]
    return os.path.join(path, seg["episodes_path" if episodes else "path"])


def test_truncated_segment_is_corrupt(fresh_demo):
    path = fresh_demo()
    seg = _segment(path)
    size = os.path.getsize(seg)
    with open(seg, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(trajstore.CorruptDatasetError) as e:
        trajstore.open(path)
    assert os.path.basename(seg) in str(e.value)


def test_truncated_episode_table_is_corrupt(fresh_demo):
    path = fresh_demo()
    seg = _segment(path, 2, episodes=True)
    with open(seg, "r+b") as f:
        f.truncate(os.path.getsize(seg) - 100)
    with pytest.raises(trajstore.CorruptDatasetError):
        trajstore.open(path)


def test_garbled_manifest_is_corrupt(fresh_demo):
    path = fresh_demo()
    with open(_manifest(path), "w") as f:
        f.write('{"format": "trajstore", "version": ')
    with pytest.raises(trajstore.CorruptDatasetError) as e:
        trajstore.open(path)
    assert "manifest" in str(e.value)
    # The older version is still readable.
    older = trajstore.open(path, version=1)
    assert older.version == 1


def test_missing_segment_file(fresh_demo):
    path = fresh_demo()
    os.remove(_segment(path, 3))
    with pytest.raises(trajstore.TrajstoreError) as e:
        trajstore.open(path)
    assert isinstance(e.value, (trajstore.DatasetNotFoundError, trajstore.CorruptDatasetError))


GARBLE = {
    # offset from the end of the segment file, bytes written there
    "footer": (74, b"\xff" * 64),
    "footer length": (10, b"\xff\xff\xff\x7f"),
    "trailing magic": (6, b"XXXXXX"),
}


@pytest.mark.parametrize("what", list(GARBLE))
def test_garbled_segment_footer_is_corrupt_and_never_crashes(tmp_path, demo_path, what):
    """A damaged segment raises CorruptDatasetError in a fresh interpreter, which then exits
    normally (no signal, no abort)."""
    import shutil

    path = str(tmp_path / "garbled.trajstore")
    shutil.copytree(demo_path, path)
    seg = _segment(path, 0)
    back, data = GARBLE[what]
    with open(seg, "r+b") as f:
        f.seek(os.path.getsize(seg) - back)
        f.write(data)
    code = f"""
import trajstore
try:
    ds = trajstore.open({path!r})
    for b in ds.loader(slice_len=8, num_slices=8, max_batches=3):
        pass
    print("OPENED")
except trajstore.TrajstoreError as e:
    print("ERROR", type(e).__name__, e)
"""
    p = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ERROR CorruptDatasetError"), p.stdout + p.stderr
    assert os.path.basename(seg) in p.stdout


def test_ingest_unknown_option(tmp_path):
    with pytest.raises(trajstore.InvalidArgumentError):
        trajstore.ingest(tmp_path / "in.parquet", tmp_path / "out", no_such_option=1)


def test_ingest_missing_input(tmp_path):
    with pytest.raises(trajstore.TrajstoreError) as e:
        trajstore.ingest(tmp_path / "in.parquet", tmp_path / "out")
    assert isinstance(e.value, FileNotFoundError)


def test_every_error_class_is_exported():
    # trajstore.__all__ lists errors.__all__ by name (so that type checkers see the re-exports).
    assert set(trajstore.errors.__all__) <= set(trajstore.__all__)
    assert all(getattr(trajstore, n) is getattr(trajstore.errors, n) for n in trajstore.errors.__all__)
