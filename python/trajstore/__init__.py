"""trajstore: an Apache Arrow columnar store for reinforcement-learning transitions.

Open a dataset, explore it in SQL, and sample fixed-length slices inside episodes as batches of
PyTorch tensors (or NumPy arrays), gathered by Rust worker threads without the GIL and handed
over without copies::

    import trajstore
    ds = trajstore.open("hopper.trajstore")
    for batch in ds.loader(slice_len=64, num_slices=256, device="cuda", max_batches=1000):
        obs, act = batch["observation"], batch["action"]        # [256, 64, 17], [256, 64, 6]
        mask = batch["mask"]                                     # [256, 64] bool

Mixing datasets in every batch (RLPD's symmetric sampling: half offline data, half the online
data a collector keeps committing, followed as it grows)::

    loader = trajstore.mix([offline, online], weights=[0.5, 0.5], follow=[False, True])
    batch["source"]                                              # [256] int64: 0 or 1

Training across nodes from object storage, through a bounded cache per rank (``torchrun``)::

    ds = trajstore.open("s3://bucket/atari.trajstore", cache_limit="50GiB")
    loader = ds.loader(slice_len=32, num_slices=256, rank="auto", device="cuda")

Preemptible training: ``loader.state_dict()`` (a plain dict, for ``torch.save``) and
``loader.load_state_dict(state)`` continue the stream exactly, at the same dataset versions.

Writing from collectors::

    with trajstore.create("new.trajstore", observation_shape=(17,), action_shape=(6,)) as w:
        w.append_episode(observation=obs, action=act, reward=rew, terminated=True)
        w.commit()
"""

from __future__ import annotations

from . import errors
from ._dataset import Dataset, Snapshot, mix, open, push, set_sql_memory_limit, sql_memory_limit
from ._loader import Batch, Loader
from ._native import __version__
from ._stream import StreamedSnapshot
from ._writer import Writer, create, ingest
from .errors import (
    ConflictError,
    CorruptDatasetError,
    DatasetNotFoundError,
    IncompatibleFormatError,
    InvalidArgumentError,
    InvalidDataError,
    LockedError,
    PermissionDeniedError,
    RemoteError,
    SchemaError,
    SqlError,
    StreamBrokenError,
    TrajstoreError,
    TrajstoreIOError,
)

__all__ = [
    "__version__",
    "open",
    "push",
    "mix",
    "set_sql_memory_limit",
    "sql_memory_limit",
    "create",
    "ingest",
    "Dataset",
    "Snapshot",
    "StreamedSnapshot",
    "Loader",
    "Batch",
    "Writer",
    "errors",
    # errors.__all__ (a test checks that they agree)
    "TrajstoreError",
    "DatasetNotFoundError",
    "CorruptDatasetError",
    "IncompatibleFormatError",
    "SchemaError",
    "InvalidDataError",
    "InvalidArgumentError",
    "LockedError",
    "ConflictError",
    "RemoteError",
    "StreamBrokenError",
    "TrajstoreIOError",
    "PermissionDeniedError",
    "SqlError",
]
