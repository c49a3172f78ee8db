"""An independent reference reader of trajstore datasets for the tests: it reads the committed
manifest (``_versions/<newest>.json``) and the Arrow IPC files it names with pyarrow only (never
with trajstore), and computes what a batch of slices must hold with NumPy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

FLAGS = ("mask", "is_first", "is_last", "terminated", "truncated", "slice_end")


def column_to_numpy(col: Any) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """A column (Array or ChunkedArray) as a NumPy array ``[N, *shape]`` plus its validity
    (None when there is no null). Fixed-shape tensors and fixed-size lists become dense arrays;
    nulls become zeros."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks else pa.array([], type=col.type)
    t = col.type
    shape: Tuple[int, ...] = ()
    if isinstance(t, pa.BaseExtensionType):
        if hasattr(t, "shape"):
            shape = tuple(int(d) for d in t.shape)
        col = col.storage
        t = col.type
    valid = None
    if col.null_count:
        valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_fixed_size_list(t):
        width = t.list_size
        if not shape:
            shape = (width,)
        n = len(col)
        # `.values` ignores the array's offset: flatten() honours it (and yields nothing for
        # null slots, so fill those in explicitly).
        if valid is None:
            flat = col.flatten().to_numpy(zero_copy_only=False)
        else:
            flat = np.zeros(n * width, dtype=t.value_type.to_pandas_dtype())
            vals = col.flatten().to_numpy(zero_copy_only=False)
            flat.reshape(n, width)[valid] = vals.reshape(-1, width)
        return np.asarray(flat).reshape((n,) + shape), valid
    arr = col.to_numpy(zero_copy_only=False)
    if valid is not None:
        arr = np.where(valid, arr, 0)
    return np.asarray(arr), valid


def newest_manifest(path: str) -> Dict[str, Any]:
    vdir = os.path.join(path, "_versions")
    names = sorted(n for n in os.listdir(vdir) if n.endswith(".json"))
    if not names:
        raise FileNotFoundError(f"no manifest in {vdir}")
    best = max(names, key=lambda n: int(n.split(".")[0]))
    with open(os.path.join(vdir, best)) as f:
        return json.load(f)


def read_ipc(path: str) -> pa.Table:
    with pa.memory_map(path) as src:
        return ipc.open_file(src).read_all()


@dataclass
class Episode:
    id: int
    row: int  # global row of step 0 in the concatenated transitions
    length: int
    ret: float
    terminated: bool
    truncated: bool
    final: Optional[np.ndarray]  # final observation, None when null


class Reference:
    """Every committed transition and episode of the dataset at ``path``, read with pyarrow."""

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)
        self.manifest = newest_manifest(self.path)
        seg_tables, ep_tables = [], []
        for seg in self.manifest["segments"]:
            seg_tables.append(read_ipc(os.path.join(self.path, seg["path"])))
            ep_tables.append(read_ipc(os.path.join(self.path, seg["episodes_path"])))
        self.segment_tables = seg_tables
        self.episode_tables = ep_tables
        if seg_tables:
            self.transitions = pa.concat_tables(seg_tables)
            self.episodes_table = pa.concat_tables(ep_tables)
        else:
            self.transitions = None
            self.episodes_table = None
        self.columns: Dict[str, np.ndarray] = {}
        if self.transitions is not None:
            for name in self.transitions.column_names:
                self.columns[name], _ = column_to_numpy(self.transitions.column(name))
        self.episodes: Dict[int, Episode] = {}
        offset = 0
        for _seg, st, et in zip(self.manifest["segments"], seg_tables, ep_tables):
            ids = et.column("episode_id").to_pylist()
            starts = et.column("row_start").to_pylist()
            lengths = et.column("length").to_pylist()
            rets = et.column("episode_return").to_pylist()
            term = et.column("terminated").to_pylist()
            trunc = et.column("truncated").to_pylist()
            if "final_observation" in et.column_names:
                finals, fvalid = column_to_numpy(et.column("final_observation"))
            else:
                finals, fvalid = None, None
            for k in range(et.num_rows):
                final = None
                if finals is not None and (fvalid is None or fvalid[k]):
                    final = finals[k]
                self.episodes[int(ids[k])] = Episode(
                    int(ids[k]), offset + int(starts[k]), int(lengths[k]), float(rets[k]),
                    bool(term[k]), bool(trunc[k]), final,
                )
            offset += st.num_rows
        self.num_transitions = offset

    # --- what the files hold ------------------------------------------------------------------
    @property
    def episode_ids(self) -> List[int]:
        return sorted(self.episodes)

    def steps(self, episode_id: int, name: str) -> np.ndarray:
        e = self.episodes[episode_id]
        return self.columns[name][e.row : e.row + e.length]

    def next_observation(self, episode_id: int) -> np.ndarray:
        """o_{t+1} of every step of the episode: the stored column when there is one, else the
        next step's observation and, at the last step, the final observation (zeros if null)."""
        if "next_observation" in self.columns:
            return self.steps(episode_id, "next_observation")
        obs = self.steps(episode_id, "observation")
        e = self.episodes[episode_id]
        final = e.final if e.final is not None else np.zeros_like(obs[0])
        return np.concatenate([obs[1:], final[None]], axis=0)

    def windows(self, slice_len: int) -> set:
        """Every (episode_id, start) of a strict window of ``slice_len`` steps."""
        return {
            (e.id, s)
            for e in self.episodes.values()
            for s in range(0, e.length - slice_len + 1)
        }

    # --- what a batch must hold ---------------------------------------------------------------
    def expected_slice(self, episode_id: int, start: int, slice_len: int, columns: Sequence[str]) -> Dict[str, np.ndarray]:
        e = self.episodes[episode_id]
        t = np.arange(start, start + slice_len)
        valid = (t >= 0) & (t < e.length)
        idx = np.clip(t, 0, e.length - 1)
        out: Dict[str, np.ndarray] = {}
        for name in columns:
            src = self.next_observation(episode_id) if name == "next_observation" and "next_observation" not in self.columns else self.steps(episode_id, name)
            vals = src[idx].copy()
            vals[~valid] = 0
            out[name] = vals
        last = valid & (t == e.length - 1)
        out["mask"] = valid
        out["is_first"] = valid & (t == 0)
        out["is_last"] = last
        out["terminated"] = last & e.terminated
        out["truncated"] = last & e.truncated
        end = np.zeros(slice_len, dtype=bool)
        if valid.any():
            end[np.nonzero(valid)[0][-1]] = True
        out["slice_end"] = end
        return out


def to_numpy(x: Any) -> np.ndarray:
    """A torch tensor (any device) or array as a NumPy copy."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.numpy().copy()
    return np.array(x, copy=True)


def batch_numpy(batch: Any) -> Dict[str, np.ndarray]:
    return {k: to_numpy(v) for k, v in batch.items()}


def assert_batch_matches(ref: Reference, batch: Any, columns: Iterable[str], *, exact: bool = True) -> int:
    """Checks every slice of ``batch`` against the reference; returns the number of masked-out
    (padding) steps seen."""
    b = batch_numpy(batch)
    columns = list(columns)
    ids, starts = b["episode_id"], b["start_step"]
    assert ids.dtype == np.int64 and starts.dtype == np.int64
    n, l = b["mask"].shape
    assert ids.shape == (n,) and starts.shape == (n,)
    padded = 0
    for i in range(n):
        want = ref.expected_slice(int(ids[i]), int(starts[i]), l, columns)
        for name in columns:
            got = b[name][i]
            assert got.shape == want[name].shape, (name, got.shape, want[name].shape)
            if exact:
                np.testing.assert_array_equal(got, want[name], err_msg=f"{name} of slice {i} (episode {ids[i]}, start {starts[i]})")
            else:
                np.testing.assert_allclose(got, want[name], rtol=1e-2, atol=1e-2, err_msg=name)
        for name in FLAGS:
            assert b[name].dtype == np.bool_, name
            np.testing.assert_array_equal(b[name][i], want[name], err_msg=f"{name} of slice {i} (episode {ids[i]}, start {starts[i]})")
        padded += int((~want["mask"]).sum())
    return padded


def take(loader: Any, n: int) -> List[Dict[str, np.ndarray]]:
    """The next ``n`` batches of ``loader`` as NumPy copies (fewer if it ends)."""
    out = []
    for batch in loader:
        out.append(batch_numpy(batch))
        if len(out) == n:
            break
    return out


def same_batches(a: List[Dict[str, np.ndarray]], b: List[Dict[str, np.ndarray]]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.keys() != y.keys():
            return False
        for k in x:
            if x[k].shape != y[k].shape or not np.array_equal(x[k], y[k]):
                return False
    return True


def slice_keys(batches: Iterable[Dict[str, np.ndarray]]) -> List[Tuple[int, int]]:
    return [
        (int(e), int(s))
        for b in batches
        for e, s in zip(b["episode_id"].tolist(), b["start_step"].tolist())
    ]


# --- the CLI and child processes ---------------------------------------------------------------
def _bin() -> str:
    b = os.environ.get("TRAJSTORE_BIN") or shutil.which("trajstore")
    if not b or not os.access(b, os.X_OK):
        pytest.skip("the trajstore CLI is needed (run the suite with scripts/test-python.sh, which sets TRAJSTORE_BIN)")
    return b


def run_cli(*args: str) -> subprocess.CompletedProcess:
    p = subprocess.run([_bin(), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"trajstore {' '.join(map(str, args))} failed:\n{p.stdout}\n{p.stderr}"
    return p


def make_demo(path, *args: str) -> str:
    run_cli("demo", str(path), *args)
    return str(path)


def subprocess_env() -> dict:
    """The environment of a child Python that imports this trajstore (same PYTHONPATH)."""
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__import__("trajstore").__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


# --- known package bugs -------------------------------------------------------------------------
# Every append_episode fails before reaching the native writer (details in the report): the
# observation column of Writer.schema is an `arrow.fixed_shape_tensor` extension type, which
# Writer._column does not unwrap (`pa.types.is_fixed_size_list` is False for it), so it calls
# `to_pandas_dtype()` on the extension type: NotImplementedError.
