"""Snapshots: one committed version of a dataset, memory-mapped (Rust's ``trajstore::Snapshot``)."""

from __future__ import annotations

# pyarrow and NumPy are imported where they are used: the loader needs neither (a GPU machine
# with only PyTorch can train from a dataset).
import inspect
import os
from typing import TYPE_CHECKING, Any, Dict, List, Literal, Optional, Sequence, Tuple, Union, cast, overload

from . import _native
from ._described import Described
from ._types import (
    Backend,
    Device,
    Episodes,
    Follow,
    FramePad,
    LoaderArgs,
    Policy,
    ReadAhead,
    SamplerName,
    Transform,
    Weighting,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

    # Python >= 3.11 has `typing.Unpack`; typing_extensions (a dependency of PyTorch and of
    # mypy) gives it to the type checker on 3.9 and 3.10. Only annotations use it.
    from typing_extensions import Unpack

    from ._loader import Loader
    from ._stream import StreamedSnapshot
    from ._writer import Writer

PathLike = Union[str, "os.PathLike[str]"]


def mix(
    datasets: Sequence[Union[Snapshot, PathLike]],
    weights: Optional[Sequence[float]] = None,
    *,
    follow: Union[Follow, Sequence[Follow]] = None,
    **loader_args: Unpack[LoaderArgs],
) -> Loader:
    """A loader whose every batch mixes ``datasets`` in fixed proportions: of its
    ``num_slices`` slices, dataset ``i`` gives ``num_slices * weights[i] / sum(weights)``
    (rounded so that they add up; exactly the same counts in every batch), each dataset sampled
    by its own sampler (seed ``seed + i``) over its own episodes. ``batch["source"]`` (``[B]``
    int64, the same in every batch) says which dataset each slice came from.

    RLPD's symmetric sampling (Ball et al., 2023): half of every batch from offline data, half
    from the replay data a collector keeps committing::

        offline, online = trajstore.open("d4rl-hopper"), trajstore.open("online")
        loader = trajstore.mix([offline, online], weights=[0.5, 0.5], follow=[False, True],
                               slice_len=2, num_slices=256, device="cuda")
        for batch in loader:              # 128 offline slices, then 128 online slices
            ...

    - ``datasets``: :class:`Snapshot` objects (or paths, opened at their newest version), or
      :class:`StreamedSnapshot` objects (``trajstore.open(url, cache_limit=...)``), each
      streamed through its own cache: batches are assembled in place from each stream's
      share, on CPU or CUDA (the staging ring); the sampler is ``uniform``, nothing follows.
      The gathered columns (default: those every dataset has) must have the same type and
      per-step shape in each.
    - ``weights``: one per dataset (default: equal).
    - ``follow``: per dataset (a list), or one value for all: see :class:`Loader`.
    - every other argument of :meth:`Snapshot.loader`; the sampler must be endless
      (``uniform`` or ``episodes``), ``episodes=`` a SQL query that each dataset answers.

    ``state_dict``/``load_state_dict`` resume a mix exactly, as they do a single dataset."""
    from ._loader import make_loader
    from ._stream import StreamedSnapshot

    if isinstance(datasets, (str, bytes)) or not isinstance(datasets, Sequence):
        raise TypeError("datasets must be a list of trajstore.Snapshot (or paths)")
    streamed = [isinstance(d, StreamedSnapshot) for d in datasets]
    if any(streamed) and not all(streamed):
        raise _invalid(
            "a mix reads local (or mirrored) datasets, or streamed ones, not both: open every "
            "dataset with cache_limit to stream them all, or without it to mirror them"
        )
    ds: List[Any] = [d if isinstance(d, (Snapshot, StreamedSnapshot)) else open(d) for d in datasets]
    if not ds:
        raise _invalid("a mix needs at least one dataset")
    n = len(ds)
    if weights is None:
        ws = [1.0] * n
    else:
        given: Any = weights
        if hasattr(given, "tolist"):
            given = given.tolist()
        ws = [float(w) for w in given]
        if len(ws) != n:
            raise _invalid(f"{len(ws)} weights for {n} datasets")
    if isinstance(follow, (list, tuple)):
        if len(follow) != n:
            raise _invalid(f"{len(follow)} follow values for {n} datasets")
        follows: List[Follow] = list(follow)
    else:
        follows = [cast(Follow, follow)] * n
    unknown = sorted(set(loader_args) - set(LoaderArgs.__annotations__))
    if unknown:
        raise TypeError(f"mix() got unexpected argument(s) {', '.join(unknown)}")
    # The defaults of what is not given: those of Snapshot.loader's signature (the only place
    # they are written).
    bound = inspect.signature(Snapshot.loader).bind(ds[0], **loader_args)
    bound.apply_defaults()
    args = {k: v for k, v in bound.arguments.items() if k not in ("self", "follow")}
    return make_loader(ds[0], cast(LoaderArgs, args), mix=(ds, ws, follows))


def _invalid(msg: str) -> Exception:
    from .errors import InvalidArgumentError

    return InvalidArgumentError(msg)


def set_sql_memory_limit(limit: Union[int, str, None]) -> None:
    """Sets how much memory a SQL query of this process may use (``ds.sql``, ``episodes=``
    subsets) from the next query's session on: bytes, or a size string such as ``"8GiB"``;
    ``None`` goes back to the default (``$TRAJSTORE_SQL_MEMORY``, else half of the machine's or
    cgroup's memory). Sorts and aggregations spill to a temporary directory beyond it; other
    queries raise :class:`~trajstore.SqlError` instead of growing until the OOM killer ends
    the process."""
    _native.set_sql_memory_limit(limit)


def sql_memory_limit() -> Tuple[int, str]:
    """The SQL memory limit in bytes and where it comes from (see :func:`set_sql_memory_limit`)."""
    return _native.sql_memory_limit()


@overload
def open(
    uri: PathLike,
    version: Optional[int] = None,
    *,
    cache_dir: Optional[PathLike] = None,
    cache_limit: None = None,
    reuse: float = 4.0,
) -> Snapshot: ...


@overload
def open(
    uri: PathLike,
    version: Optional[int] = None,
    *,
    cache_dir: Optional[PathLike] = None,
    cache_limit: Union[int, str],
    reuse: float = 4.0,
    ranks_per_node: Optional[int] = None,
) -> StreamedSnapshot: ...


def open(
    uri: PathLike,
    version: Optional[int] = None,
    *,
    cache_dir: Optional[PathLike] = None,
    cache_limit: Union[int, str, None] = None,
    reuse: float = 4.0,
    ranks_per_node: Optional[int] = None,
) -> Union[Snapshot, StreamedSnapshot]:
    """Opens the dataset at ``uri``: a local directory, ``file://...``, or ``s3://bucket/prefix``
    (mirrored into ``cache_dir``, default ``$TRAJSTORE_CACHE`` or ``~/.cache/trajstore``, then
    memory-mapped). Opens the newest committed version, or ``version``.

    Raises :class:`~trajstore.DatasetNotFoundError` when there is no dataset there,
    :class:`~trajstore.PermissionDeniedError` (a ``PermissionError``) when the user may not
    enter it or a directory above it, and :class:`~trajstore.CorruptDatasetError` when its files
    are damaged.

    With ``cache_limit`` (bytes, or a size such as ``"50GiB"``), a dataset in object storage is
    **streamed** instead of mirrored: only its catalog is downloaded, and its loaders read the
    transition files through caches of at most that many bytes on the node
    (:class:`StreamedSnapshot`; ``reuse`` is how many times, on average, the uniform sampler
    draws each transition before its window rotates out). The limit is the node's:
    ``ranks_per_node`` ranks (default ``$LOCAL_WORLD_SIZE``, as torchrun sets it, else 1) keep
    ``cache_limit / ranks_per_node`` bytes each, under the same ``cache_dir``, and a rank takes
    a file that another rank of the node holds (a hard link) instead of downloading it again."""
    if cache_limit is not None:
        from ._stream import StreamedSnapshot

        if ranks_per_node is None:
            ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        return StreamedSnapshot(
            _native.open_stream(
                os.fspath(uri),
                cache_limit,
                version,
                None if cache_dir is None else os.fspath(cache_dir),
                float(reuse),
                int(ranks_per_node),
            )
        )
    native = _native.open(
        os.fspath(uri), version, None if cache_dir is None else os.fspath(cache_dir)
    )
    return Snapshot(native)


def push(path: PathLike, url: str, *, concurrency: int = 8) -> Dict[str, Any]:
    """Pushes the newest version of the local dataset at ``path`` to ``url``
    (``s3://bucket/prefix`` or ``file:///path``), as ``trajstore push`` does: segment files
    first, each checked, then the manifest, so that a reader never sees a version whose files
    are missing; files already in the store (an earlier push, or an interrupted one) are not
    uploaded again, and a store that holds a newer or unrelated version is refused. S3 settings
    come from the environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...).

    Returns the report: ``url``, ``version``, ``previous_version``, ``files_uploaded``,
    ``bytes_uploaded``, ``files_present``, ``bytes_present``, ``up_to_date`` and ``seconds``.
    Then ``trajstore.open(url, cache_limit=...)`` streams it."""
    import json

    return cast(Dict[str, Any], json.loads(_native.push(os.fspath(path), url, int(concurrency))))


class Snapshot(Described):
    """One committed version of a dataset, as Rust's ``trajstore::Snapshot`` (both made by
    ``open``). Its transitions are memory-mapped: opening costs O(episodes), nothing is read
    until used, and many processes share the page cache. ``trajstore.Dataset`` is another name
    for this class, kept for code written before the two languages' names were aligned.

    ``len(ds)`` is the number of transitions; ``ds.num_episodes`` the number of episodes."""

    _n: _native.Snapshot

    def __init__(self, native: _native.Snapshot) -> None:
        self._n = native

    # --- what it is (uri, path, version, sizes, schema, sample_columns, info: Described) ----
    @property
    def first_episode_id(self) -> int:
        """Episode ids are dense: ``first_episode_id .. first_episode_id + num_episodes``."""
        return self._n.first_episode_id

    def versions(self) -> List[int]:
        """Committed versions still on disk, oldest first."""
        return list(self._n.versions())

    def refresh(self) -> bool:
        """Moves this object to the newest committed version (a collector may have committed
        since); returns whether it changed. Loaders already made keep their version."""
        return self._n.refresh()

    def __repr__(self) -> str:
        return f"<trajstore.Snapshot\n{self._n.info(0).rstrip()}\n>"

    # --- reading ----------------------------------------------------------------------------
    def episodes(self) -> pa.Table:
        """The episode table: one row per episode (``episode_id``, ``row_start``, ``length``,
        ``episode_return``, ``terminated``, ``truncated``, ...). Zero-copy."""
        import pyarrow as pa

        return pa.table(self._n.episodes())

    def episode(self, episode_id: int) -> pa.RecordBatch:
        """The transitions of one episode, a zero-copy view of the memory map."""
        b = self._n.episode(int(episode_id)) if int(episode_id) >= 0 else None
        if b is None:
            first = self.first_episode_id
            raise IndexError(
                f"episode {episode_id} is not in this dataset (ids {first}..{first + self.num_episodes - 1})"
            )
        import pyarrow as pa

        return pa.record_batch(b)

    def sql(self, query: str, *, allow_writes: bool = False) -> pa.Table:
        """Runs SQL (DataFusion) over the tables ``transitions`` and ``episodes``; the result as a
        ``pyarrow.Table``. Read-only unless ``allow_writes`` (``COPY ... TO`` and the like).

        >>> ds.sql("SELECT count(*) AS n, avg(episode_return) FROM episodes WHERE terminated")"""
        import pyarrow as pa

        return pa.table(self._n.sql(query, allow_writes))

    # --- training ---------------------------------------------------------------------------
    def loader(
        self,
        slice_len: int = 64,
        num_slices: int = 256,
        *,
        columns: Optional[Sequence[str]] = None,
        policy: Policy = "strict",
        weighting: Weighting = "windows",
        episodes: Episodes = None,
        sampler: SamplerName = "uniform",
        seed: int = 0,
        alpha: float = 0.6,
        beta: Optional[float] = None,
        drop_last: bool = False,
        workers: Optional[int] = None,
        prefetch: int = 4,
        device: Device = "cpu",
        dtype_cast: Optional[torch.dtype] = None,
        rank: Union[int, Literal["auto"]] = 0,
        world_size: Optional[int] = None,
        max_batches: Optional[int] = None,
        backend: Backend = "torch",
        transform: Optional[Transform] = None,
        pin_memory: bool = False,
        staging_slots: Optional[int] = None,
        readahead: ReadAhead = "auto",
        frame_stack: Optional[int] = None,
        frame_pad: FramePad = "repeat",
        frame_channels_last: bool = False,
        frame_window: bool = False,
        frame_cache: Union[int, str, None] = None,
        follow: Follow = None,
    ) -> Loader:
        """Batches of ``num_slices`` slices of ``slice_len`` consecutive steps inside episodes,
        gathered ahead by ``workers`` Rust threads. See :class:`trajstore.Loader` for every
        argument; each bad one raises :class:`~trajstore.InvalidArgumentError` here, before any
        batch is sampled.

        ``follow=True`` (or a number of seconds, or ``{"every": s, "every_batches": n}``) keeps
        sampling the newest committed version while a collector writes to the dataset.

        This signature is the one place the loader's defaults are written (:func:`mix` takes
        them from it)."""
        # Every argument but `self` and `follow`, as given: the keys of `LoaderArgs`.
        given = dict(locals())
        args = {k: v for k, v in given.items() if k not in ("self", "follow")}
        from ._loader import make_loader

        return make_loader(self, cast(LoaderArgs, args), follow=follow)

    # --- writing ----------------------------------------------------------------------------
    def writer(self, *, lock_wait: float = 0.5) -> Writer:
        """The dataset's single writer, for appending episodes (waits up to ``lock_wait``
        seconds for the lock, then raises :class:`~trajstore.LockedError`)."""
        from ._writer import Writer

        return Writer(_native.Writer.open(self.path, int(lock_wait * 1000)))


Dataset = Snapshot
"""Another name for :class:`Snapshot` (the name before Rust's and Python's were aligned)."""
