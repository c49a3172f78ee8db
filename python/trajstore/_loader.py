"""The loader: batches of slices gathered by Rust worker threads, handed to PyTorch or NumPy.

CPU (``device="cpu"``): each batch's columns are gathered by a worker into the batch's own
buffers; the tensors (or arrays) handed out view those buffers through DLPack (no copy), and the
buffers go back to the workers when the last tensor viewing them is freed. No CUDA call is made.

CUDA (``device="cuda[:N]"``): a ring of pinned staging buffers is allocated once by PyTorch; the
workers gather straight into them (GIL released), each batch is copied to the device without
blocking on a dedicated CUDA stream, and a staging slot is reused only after an event recorded
after its copy has completed. The current stream waits on that event, so the batch is ready to
use in ordinary code.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
from typing import Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _native
from .errors import InvalidArgumentError

FLAGS = ("mask", "is_first", "is_last", "terminated", "truncated", "slice_end")
PER_SLICE = ("episode_id", "start_step")
SAMPLERS = ("uniform", "epoch", "epoch_episodes", "episodes", "prioritized")

# The arguments of Dataset.loader and trajstore.mix, with their defaults.
LOADER_DEFAULTS: Dict[str, Any] = dict(
    slice_len=64,
    num_slices=256,
    columns=None,
    policy="strict",
    weighting="windows",
    episodes=None,
    sampler="uniform",
    seed=0,
    alpha=0.6,
    beta=None,
    drop_last=False,
    workers=None,
    prefetch=4,
    device="cpu",
    dtype_cast=None,
    rank=0,
    world_size=None,
    max_batches=None,
    backend="torch",
    transform=None,
    pin_memory=False,
    staging_slots=None,
    readahead="auto",
    follow=None,
)


class Batch(dict):
    """One batch: a dict of ``[B, L, ...]`` tensors (or NumPy arrays), one per requested column,
    plus ``mask`` (real steps; padding is False), ``is_first``, ``is_last``, ``terminated``,
    ``truncated``, ``slice_end`` (``[B, L]`` bool), ``episode_id`` and ``start_step``
    (``[B]`` int64), ``weight`` (``[B]`` float32 importance weights) when a prioritized
    loader was given ``beta``, and ``source`` (``[B]`` int64: which dataset of a
    :func:`trajstore.mix` each slice came from; the same tensor in every batch).

    ``index`` is the batch's number in the stream (what :meth:`Loader.update_priorities` and
    resuming take)."""

    index: int

    def __init__(self, index: int, items: Any) -> None:
        super().__init__(items)
        self.index = index

    @property
    def num_slices(self) -> int:
        return int(self["episode_id"].shape[0])

    def to(self, *args: Any, **kwargs: Any) -> "Batch":
        """Every tensor ``.to(*args, **kwargs)`` (torch backend)."""
        return Batch(self.index, {k: v.to(*args, **kwargs) for k, v in self.items()})

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {_describe(v)}" for k, v in self.items())
        return f"Batch(index={self.index}, {cols})"


def _describe(v: Any) -> str:
    dtype = str(getattr(v, "dtype", "?")).replace("torch.", "")
    return f"{dtype}{list(v.shape)}"


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised without torch only
        raise InvalidArgumentError(
            "backend='torch' needs PyTorch (pip install torch); or pass backend='numpy'"
        ) from e
    return torch


def _resolve_rank(rank: Union[int, str], world_size: Optional[int]) -> Tuple[int, int]:
    if rank == "auto":
        r, w = 0, 1
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                r, w = dist.get_rank(), dist.get_world_size()
            else:
                r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        except ImportError:
            r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        if world_size is not None and world_size != w:
            raise InvalidArgumentError(
                f"rank='auto' found world size {w}, but world_size={world_size} was given"
            )
        return r, w
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise InvalidArgumentError(f"rank must be an int or 'auto', got {rank!r}")
    w = 1 if world_size is None else world_size
    if w < 1 or not 0 <= rank < w:
        raise InvalidArgumentError(f"rank {rank} is not in 0..world_size {w}")
    return rank, w


# The longest follow period (the Rust loader's `MAX_FOLLOW_PERIOD`, as the CLI's --follow).
MAX_FOLLOW_SECONDS = 86_400


def _follow_options(follow: Any, what: str = "follow") -> Dict[str, Any]:
    """The native part options of ``follow``: None/False (fixed), True (look every second),
    seconds, or ``{"every": seconds, "every_batches": n}``."""
    if follow is None or follow is False:
        return {}
    if follow is True:
        return {"follow_every": 1.0}
    if isinstance(follow, (int, float)) and not isinstance(follow, bool):
        if not 0 < follow <= MAX_FOLLOW_SECONDS:
            raise InvalidArgumentError(
                f"{what}={follow!r}: a period in seconds, more than 0 and at most {MAX_FOLLOW_SECONDS} (a day)"
            )
        return {"follow_every": float(follow)}
    if isinstance(follow, Mapping):
        unknown = sorted(set(follow) - {"every", "every_batches"})
        every, batches = follow.get("every"), follow.get("every_batches")
        if unknown or (every is None and batches is None):
            raise InvalidArgumentError(
                f"{what}={dict(follow)!r}: give 'every' (seconds) and/or 'every_batches' (batches)"
            )
        out: Dict[str, Any] = {}
        if every is not None:
            if isinstance(every, bool) or not isinstance(every, (int, float)) or not 0 < every <= MAX_FOLLOW_SECONDS:
                raise InvalidArgumentError(
                    f"{what}: every={every!r}, a period in seconds, more than 0 and at most "
                    f"{MAX_FOLLOW_SECONDS} (a day)"
                )
            out["follow_every"] = float(every)
        if batches is not None:
            if isinstance(batches, bool) or not isinstance(batches, int) or not 1 <= batches <= 2**63:
                raise InvalidArgumentError(f"{what}: every_batches={batches!r}, an int >= 1")
            out["follow_every_batches"] = batches
        return out
    raise InvalidArgumentError(
        f"{what}={follow!r}: use True (every second), a number of seconds, or "
        "{'every': seconds, 'every_batches': n}"
    )


def _parse_device(device: Any):
    """A ``torch.device`` for ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a device, an
    int), checked against this machine. ``cpu`` makes no CUDA call."""
    torch = _torch()
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise InvalidArgumentError(f"device {device!r}: use 'cpu', 'cuda' or 'cuda:N' ({e})") from None
    if d.type == "cpu":
        return d
    if d.type != "cuda":
        raise InvalidArgumentError(f"device {device!r}: only 'cpu' and 'cuda' devices are supported")
    if not torch.cuda.is_available():
        raise InvalidArgumentError(
            f"device {device!r}: PyTorch sees no CUDA device (no GPU or driver, or a CPU-only "
            "PyTorch); use device='cpu'"
        )
    index = 0 if d.index is None else d.index
    if index >= torch.cuda.device_count():
        raise InvalidArgumentError(
            f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device("cuda", index)


class Loader:
    """An iterable of :class:`Batch` es sampled from a :class:`~trajstore.Dataset`, or from
    several mixed in fixed proportions per batch.

    Made by :meth:`Dataset.loader` and :func:`trajstore.mix`. Arguments:

    - ``slice_len``, ``num_slices``: each batch holds ``num_slices`` slices of ``slice_len``
      consecutive steps of one episode each.
    - ``columns``: which columns to gather (default: every stored column plus
      ``next_observation``).
    - ``policy``: ``"strict"`` (slices lie inside episodes), ``"pad"`` (slices may start before
      or run past an episode, masked), ``"span:L:R"``.
    - ``weighting``: ``"windows"`` (every window equally likely), ``"episodes"`` (every episode
      equally likely).
    - ``episodes``: restrict sampling to these episode ids, or to those a SQL query returns
      (``"SELECT episode_id FROM episodes WHERE episode_return > 3000"``).
    - ``sampler``: ``"uniform"`` (with replacement, endless), ``"epoch"`` (every window once
      per epoch), ``"epoch_episodes"`` (one window of every episode per epoch), ``"episodes"``
      (whole episodes, padded or cut to ``slice_len``), ``"prioritized"`` (proportional to
      priorities set with :meth:`update_priorities`; ``alpha``, and ``beta`` for importance
      weights in ``batch["weight"]``).
    - ``seed``: same seed, same batches, whatever ``workers``. (A prioritized sampler's batches
      also depend on the priorities set when each was drawn: workers draw ``prefetch`` batches
      ahead. ``state_dict`` holds the priorities, so a resumed run draws what the interrupted
      one would have drawn next from the same priorities.)
    - ``workers``, ``prefetch``: Rust threads gathering (default 2, 1 on a machine of two cores
      or fewer: each gather is itself parallel), and batches queued ahead.
    - ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``.
    - ``dtype_cast``: cast floating columns (e.g. ``torch.bfloat16``), on the device.
    - ``rank``, ``world_size``: data-parallel shard (ranks draw disjoint batches); ``"auto"``
      reads ``torch.distributed`` (or ``RANK``/``WORLD_SIZE``).
    - ``max_batches``: batches per iteration (default: one epoch of an epoch sampler, else
      endless).
    - ``backend``: ``"torch"`` or ``"numpy"`` (CPU only; PyTorch not needed).
    - ``transform``: a function of the host batch (run before the copy to the device) returning
      the batch (or None after changing it in place). Tensors it makes are pinned again before
      a CUDA copy. On CUDA it sees views of the staging buffers, valid only during the call.
    - ``pin_memory``: on CPU, hand out pinned tensors (for code doing its own transfers).
    - ``staging_slots``: pinned staging buffers on CUDA (default ``workers + prefetch + 2``).
    - ``readahead``: how pages of a dataset that is not in memory are read. ``"auto"``
      (default): once batches take major page faults, each worker asks the kernel for all the
      pages of its next batch at once (many reads in flight) and stops when they are found in
      memory; nothing is done for data already in memory. ``"always"``/``True``, ``"never"``/
      ``False`` force it.
    - ``follow``: sample a dataset that a collector keeps committing to: ``True`` (look for a
      newer version every second), a number of seconds, or ``{"every": seconds,
      "every_batches": n}`` (whichever comes first). A newer version is mapped in the
      background (only its new segments) and used from the next batch not yet drawn: every
      batch comes from one version, and versions only move forward (:attr:`versions`). Endless
      samplers only (``uniform``, ``episodes``); no ``episodes=`` subset.

    ``state_dict()`` is where the stream is (the next batch's number, the versions it is drawn
    from, the dataset ids, rank and sampler options, a prioritized sampler's priorities): a plain
    dict for ``torch.save``. ``load_state_dict(state)`` on a loader made with the same arguments
    (any ``workers``) continues exactly there, at the versions the state was taken on (a followed
    dataset: its newest if that one is gone); a state of another dataset, rank or sampler is
    refused with :class:`~trajstore.InvalidArgumentError`.

    Iterating yields one epoch of an epoch sampler, ``max_batches`` batches, or (uniform and
    prioritized samplers without ``max_batches``) batches forever; iterating again continues
    the stream where it stopped. ``len(loader)`` is the number of batches of one iteration where
    finite. Works as a ``torch.utils.data.IterableDataset``: ``DataLoader(loader,
    batch_size=None)`` (keep ``num_workers=0``: the loader has its own workers).
    """

    def __init__(self, dataset: Any, **kw: Any) -> None:
        # trajstore.mix: (datasets, weights, follow per dataset).
        mix: Optional[Tuple[List[Any], List[float], List[Any]]] = kw.pop("_mix", None)
        follow = kw.pop("follow", None)
        if mix is None:
            datasets, parts = [dataset], [_follow_options(follow)]
        else:
            datasets, weights, follows = mix
            parts = [
                dict(weight=float(w), **_follow_options(f, f"follow[{i}]"))
                for i, (w, f) in enumerate(zip(weights, follows))
            ]
        self._dataset = datasets[0]
        self._datasets = datasets
        self._mix = mix is not None
        self._parts = [(d._n, p) for d, p in zip(datasets, parts)]
        backend = kw.pop("backend")
        if backend not in ("torch", "numpy"):
            raise InvalidArgumentError(f"backend {backend!r}: use 'torch' or 'numpy'")
        self._backend = backend
        sampler = kw["sampler"]
        if sampler not in SAMPLERS:
            raise InvalidArgumentError(f"sampler {sampler!r}: use one of {', '.join(SAMPLERS)}")
        self._rank, self._world = _resolve_rank(kw.pop("rank"), kw.pop("world_size"))
        device = kw.pop("device")
        self._transform: Optional[Callable[[Batch], Optional[Batch]]] = kw.pop("transform")
        if self._transform is not None and not callable(self._transform):
            raise InvalidArgumentError("transform must be callable (a function of the batch)")
        self._pin = bool(kw.pop("pin_memory"))
        cast = kw.pop("dtype_cast")
        self._beta: Optional[float] = kw.pop("beta")
        if self._beta is not None and sampler != "prioritized":
            raise InvalidArgumentError("beta (importance weights) needs sampler='prioritized'")
        staging = kw.pop("staging_slots")
        if backend == "numpy":
            if device not in ("cpu", None) or self._pin or cast is not None:
                raise InvalidArgumentError(
                    "backend='numpy' hands out host arrays: device='cpu', no pin_memory, no dtype_cast"
                )
            self._device = None
            self._cast = None
        else:
            self._device = _parse_device(device)
            torch = _torch()
            if cast is not None and not (isinstance(cast, torch.dtype) and cast.is_floating_point):
                raise InvalidArgumentError(f"dtype_cast {cast!r}: a floating torch.dtype (torch.bfloat16, ...)")
            self._cast = cast
            if self._pin and self._device.type == "cpu" and not torch.cuda.is_available():
                raise InvalidArgumentError("pin_memory=True needs CUDA (pinned memory is a CUDA feature)")
        episodes = kw.pop("episodes")
        if kw["workers"] is None:
            # Each worker's gather is itself parallel (rayon, one thread per core): on two cores a
            # second worker only oversubscribes them (BENCHMARKS.md).
            kw["workers"] = 1 if (os.cpu_count() or 1) <= 2 else 2
        options: Dict[str, Any] = dict(kw)
        if isinstance(episodes, str):
            options["episodes_sql"] = episodes
        elif episodes is not None and self._mix:
            raise InvalidArgumentError(
                "episodes= in a mix: give a SQL query (each dataset answers it), not episode ids"
            )
        elif episodes is not None:
            if hasattr(episodes, "tolist"):  # NumPy array or tensor
                episodes = episodes.tolist()
            options["episode_ids"] = [int(i) for i in episodes]
        if options.get("columns") is not None:
            if isinstance(options["columns"], str):
                raise InvalidArgumentError("columns must be a list of names, not a string")
            options["columns"] = list(options["columns"])
        else:
            # Of a mix: the columns every dataset has, in the first one's order.
            options["columns"] = [
                c for c in datasets[0].sample_columns if all(c in d.sample_columns for d in datasets[1:])
            ]
        options["rank"], options["world_size"] = self._rank, self._world
        self._per_iteration: Optional[int] = options.pop("max_batches")
        if self._per_iteration is not None and self._per_iteration < 1:
            raise InvalidArgumentError(f"max_batches={self._per_iteration}: at least 1")
        self._options = options
        self._cuda = self._device is not None and self._device.type == "cuda"
        # Test hook: the staged path (slots, release order, closing) on CPU, with plain host
        # slots and a clone standing for the device copy, so that machines without a GPU test it.
        self._staged_on_cpu = (
            not self._cuda and self._device is not None and os.environ.get("TRAJSTORE_STAGED_CPU") == "1"
        )
        self._cuda = self._cuda or self._staged_on_cpu
        self._pin = self._pin and not self._cuda
        self._staging = staging if staging is not None else options["workers"] + options["prefetch"] + 2
        if self._cuda and self._staging < 2:
            raise InvalidArgumentError(f"staging_slots={staging}: at least 2")
        self._position = 0
        # The end of the iteration in progress (None: endless, or none started), and the end of
        # the iteration a loaded state was taken in.
        self._iter_end: Optional[int] = None
        self._resume_end: Optional[int] = None
        self._pid = os.getpid()
        self._recent: Deque[Tuple[int, Any, Any]] = collections.deque(maxlen=256)
        # Samplers and gatherers: every bad argument fails here.
        self._plan = _native.Plan(self._parts, options)
        self._names = [c[0] for c in self._plan.columns()]
        keys = FLAGS + PER_SLICE + ("weight",) + (("source",) if self._mix else ())
        reserved = sorted(set(self._names) & set(keys))
        if reserved:
            raise InvalidArgumentError(
                f"column(s) {', '.join(reserved)}: every batch has these keys already (the flags "
                f"{', '.join(FLAGS)}, and {', '.join(keys[len(FLAGS):])}); leave them out of columns="
            )
        self._source_host: Any = None
        self._source_dev: Any = None
        self._inflight: Deque[Tuple[int, Any]] = collections.deque()
        self._stream_native: Any = None
        self._active: Any = None
        # The first stream starts now, so that its workers gather while the caller sets up.
        self._native: Any = self._start(0)

    # --- the stream -------------------------------------------------------------------------
    def _epoch_len(self) -> Optional[int]:
        """This rank's batches per epoch of an epoch sampler (ranks take equal shares)."""
        per = self._plan.batches_per_epoch
        return None if per is None else max(1, -(-per // self._world))

    def _count(self, start: int = 0) -> Optional[int]:
        """Batches of an iteration starting at batch ``start``: ``max_batches``, else to the end
        of the epoch ``start`` is in, else endless."""
        # Resumed inside an iteration: the rest of it (as torchdata's StatefulDataLoader).
        if self._resume_end is not None and start < self._resume_end:
            return self._resume_end - start
        if self._per_iteration is not None:
            return self._per_iteration
        c = self._epoch_len()
        return None if c is None else c - start % c

    def _start(self, start: int) -> Any:
        count = self._count(start)
        if self._cuda:
            return self._cuda_native(start, count)
        return _native.BatchLoader(self._plan, start, count)

    def __len__(self) -> int:
        n = self._count(self._position)
        if n is None:
            raise TypeError("an endless loader has no len(); pass max_batches= or an epoch sampler")
        return n

    @property
    def position(self) -> int:
        """The number of the next batch of the stream."""
        return self._position

    @property
    def columns(self) -> List[str]:
        """The gathered columns, in batch order (flags and per-slice ids follow)."""
        return list(self._names)

    @property
    def batches_per_epoch(self) -> Optional[int]:
        """Batches in one epoch of an epoch sampler (all ranks together), else None."""
        return self._plan.batches_per_epoch

    @property
    def versions(self) -> List[int]:
        """The versions the next batch is drawn from, one per dataset (they move forward while
        the loader follows a dataset)."""
        return list(self._plan.versions(self._position))

    @property
    def num_datasets(self) -> int:
        """The number of datasets sampled (several for a :func:`trajstore.mix`)."""
        return len(self._datasets)

    def follow_stats(self) -> Dict[str, Any]:
        """What following new versions has done: ``refreshes`` (new versions taken),
        ``failures`` (looks that failed and were retried), ``last_error``."""
        return dict(self._plan.follow_stats())

    def state_dict(self) -> Dict[str, Any]:
        """Where the stream is, as a plain dict (``torch.save``-able): ``next_batch``, ``rank``,
        ``world_size``, one entry per dataset in ``parts`` (its id, the version and fingerprint
        the next batch is drawn from, its sampler's options), and ``priorities`` (per dataset,
        the bytes of a prioritized sampler's priorities, else None). Pass it to
        :meth:`load_state_dict` of a loader made with the same arguments, in this process or
        another, to continue exactly there (after a preemption)."""
        header, priorities = self._plan.state(self._position)
        state: Dict[str, Any] = json.loads(header)
        if self._iter_end is not None and self._position < self._iter_end:
            # Taken inside an iteration: a loader resumed from it yields the rest of it.
            state["iteration_end"] = self._iter_end
        state["priorities"] = [None if p is None else bytes(p) for p in priorities]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues the stream where ``state`` (from :meth:`state_dict`) was taken: the next
        batch is the one the loader that saved it would have yielded next, drawn from the same
        versions (the loader is reopened at them) with the same priorities, whatever ``workers``.
        Raises :class:`~trajstore.InvalidArgumentError` for a state of another dataset, rank,
        world size, sampler options or mix. (``{"position": n}`` moves to batch ``n`` of this
        loader's versions.)"""
        if not isinstance(state, Mapping):
            raise InvalidArgumentError(f"state must be a dict from state_dict(), not {type(state).__name__}")
        if "format" not in state:
            if "position" not in state:
                raise InvalidArgumentError("not a loader state: no 'format' (and no 'position')")
            pos = state["position"]
            if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos <= _native.MAX_BATCH_NUMBER:
                raise InvalidArgumentError(
                    f"position {pos!r}: a batch number, an int in 0..={_native.MAX_BATCH_NUMBER}"
                )
            self._close()
            self._recent.clear()
            self._position = pos
            self._iter_end = self._resume_end = None
            return
        header = {k: v for k, v in state.items() if k != "priorities"}
        priorities = state.get("priorities")
        if priorities is not None:
            priorities = [None if p is None else bytes(p) for p in priorities]
        try:
            text = json.dumps(header)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"not a loader state: {e}") from None
        # The new plan first: a refused state leaves this loader as it was.
        plan = _native.Plan(self._parts, self._options, text, priorities)
        self._close()
        self._recent.clear()
        self._plan = plan
        self._position = int(header["next_batch"])
        end = header.get("iteration_end")
        self._iter_end = self._resume_end = None if end is None else int(end)

    def _check_process(self) -> None:
        """Refuses use in a process forked from the one that made this loader (a DataLoader
        with ``num_workers > 0``): the native workers live only in the parent, and waiting for
        them would hang."""
        if os.getpid() != self._pid:
            raise InvalidArgumentError(
                f"this loader was created in process {self._pid} and is used in process "
                f"{os.getpid()}, forked from it (a torch DataLoader with num_workers > 0, or "
                "os.fork): its worker threads do not exist here. A trajstore loader has its own "
                "workers: use DataLoader(loader, batch_size=None, num_workers=0), or create the "
                "loader in the child process"
            )

    def __getstate__(self) -> Any:
        # A DataLoader whose workers are spawned (not forked) pickles the dataset: say why that
        # cannot work rather than fail on an unpicklable native object.
        raise InvalidArgumentError(
            "a trajstore loader cannot be pickled (it owns running worker threads and memory "
            "maps): use DataLoader(loader, batch_size=None, num_workers=0), or create the loader "
            "in each process from its dataset path"
        )

    def __iter__(self) -> Iterator[Batch]:
        self._check_process()
        count = self._count(self._position)
        self._iter_end = None if count is None else self._position + count
        native = self._native
        if native is None or native.position() != self._position:
            self._close()
            native = self._native = self._start(self._position)
        # One iteration per native stream: the next `iter()` starts another where this one
        # stopped (after closing this one, so that no two write the same staging slots).
        self._active, self._native = native, None
        try:
            if self._cuda:
                yield from self._iter_cuda(native)
            else:
                yield from self._iter_host(native)
        finally:
            self._drain()

    def _close(self) -> None:
        """Stops every native stream of this loader (joins their workers). In a forked child
        only lets go of them: their workers are the parent's."""
        if os.getpid() != getattr(self, "_pid", os.getpid()):
            self._active = self._native = None
            self._inflight.clear()
            return
        self._drain()
        for attr in ("_active", "_native"):
            native = getattr(self, attr, None)
            if native is not None:
                native.close()
                setattr(self, attr, None)

    def __del__(self) -> None:
        try:
            self._close()
        except Exception:
            pass

    # --- CPU --------------------------------------------------------------------------------
    def _wrap(self, buffers: List[Any]) -> List[Any]:
        if self._backend == "numpy":
            import numpy as np

            return [np.from_dlpack(b) for b in buffers]
        # The capsule, not the object: torch.from_dlpack(obj) spends ~1 us per tensor in Python
        # (device query, keyword fallbacks) before it reaches the same C++ import (BENCHMARKS.md).
        from torch.utils.dlpack import from_dlpack

        return [from_dlpack(b.__dlpack__()) for b in buffers]

    def _finish_host(self, batch: Batch) -> Batch:
        if self._transform is not None:
            out = self._transform(batch)
            if out is not None:
                batch = out if isinstance(out, Batch) else Batch(batch.index, out)
        if self._cast is not None:
            for k, v in batch.items():
                if v.is_floating_point():
                    batch[k] = v.to(self._cast)
        if self._pin:
            for k, v in batch.items():
                if not v.is_pinned():
                    batch[k] = v.pin_memory()
        return batch

    def _iter_host(self, native: Any) -> Iterator[Batch]:
        names = self._names + list(FLAGS) + list(PER_SLICE)
        while True:
            got = native.next()
            if got is None:
                return
            k, _, buffers = got
            batch = Batch(k, zip(names, self._wrap(buffers)))
            if self._mix:
                batch["source"] = self._sources()
            self._weights(batch)
            batch = self._finish_host(batch)
            self._position = k + 1
            yield batch

    def _sources(self) -> Any:
        """The ``source`` of every batch of a mix (made once: the parts' slices have fixed
        places in every batch), on the host."""
        if self._source_host is None:
            sources = self._plan.slice_sources()
            if self._backend == "numpy":
                import numpy as np

                self._source_host = np.asarray(sources, dtype=np.int64)
            else:
                t = _torch().tensor(sources, dtype=_torch().int64)
                pin = self._pin or (self._cuda and not self._staged_on_cpu)
                self._source_host = t.pin_memory() if pin else t
        return self._source_host

    # --- priorities -------------------------------------------------------------------------
    def _ids(self, batch: Any) -> Tuple[List[int], List[int]]:
        ids, starts = batch["episode_id"], batch["start_step"]
        return [int(i) for i in ids.tolist()], [int(s) for s in starts.tolist()]

    def _weights(self, batch: Batch) -> None:
        if self._options["sampler"] != "prioritized":
            return
        ids, starts = self._ids(batch)
        self._recent.append((batch.index, ids, starts))
        if self._beta is not None:
            w = self._plan.importance_weights(ids, starts, float(self._beta))
            if self._backend == "numpy":
                import numpy as np

                batch["weight"] = np.asarray(w, dtype=np.float32)
            else:
                batch["weight"] = _torch().tensor(w, dtype=_torch().float32)

    def update_priorities(self, batch: Union[int, Batch], priorities: Any) -> None:
        """Sets the priorities (e.g. ``|TD error| + eps``) of the slices of ``batch`` (a batch
        this loader yielded, or its ``index``), one per slice (prioritized sampler). Later
        batches are drawn in proportion to ``priority ** alpha``."""
        if self._options["sampler"] != "prioritized":
            raise InvalidArgumentError("update_priorities needs sampler='prioritized'")
        if isinstance(batch, dict):
            ids, starts = self._ids(batch)
        else:
            found = [r for r in reversed(self._recent) if r[0] == int(batch)]
            if not found:
                raise InvalidArgumentError(
                    f"batch {batch} is not among the last {self._recent.maxlen} batches; pass the batch itself"
                )
            _, ids, starts = found[0]
        p = priorities
        if hasattr(p, "detach"):  # a tensor, maybe on the GPU
            p = p.detach().double().cpu().reshape(-1).tolist()
        elif hasattr(p, "tolist"):
            p = p.reshape(-1).tolist()
        p = [float(x) for x in p]
        if len(p) != len(ids):
            raise InvalidArgumentError(f"{len(p)} priorities for a batch of {len(ids)} slices")
        self._plan.update_priorities(ids, starts, p)

    # --- CUDA -------------------------------------------------------------------------------
    def _cuda_native(self, start: int, count: Optional[int]) -> Any:
        torch = _torch()
        b, l = self._plan.num_slices, self._plan.slice_len
        pin = not self._staged_on_cpu
        if not getattr(self, "_slots", None):
            # Allocated once per loader, by PyTorch, so that they are page-locked memory its
            # copies recognise as pinned.
            self._slots: List[Dict[str, Any]] = []
            # Under the target device, so that pinning creates no CUDA context on another GPU.
            ctx = torch.cuda.device(self._device) if pin else contextlib.nullcontext()
            with ctx:
                self._alloc_slots(torch, b, l, pin)
            if pin:
                self._copy_stream = torch.cuda.Stream(device=self._device)
        regions = [[(t.data_ptr(), t.numel() * t.element_size()) for t in slot.values()] for slot in self._slots]
        return _native.SlotLoader(self._plan, start, count, regions, self._slots)

    def _alloc_slots(self, torch: Any, b: int, l: int, pin: bool) -> None:
        for _ in range(self._staging):
            slot: Dict[str, Any] = {}
            for name, dtype, shape in self._plan.columns():
                slot[name] = torch.empty((b, l, *shape), dtype=_torch_dtype(torch, dtype), pin_memory=pin)
            for name in FLAGS:
                slot[name] = torch.empty((b, l), dtype=torch.bool, pin_memory=pin)
            for name in PER_SLICE:
                slot[name] = torch.empty((b,), dtype=torch.int64, pin_memory=pin)
            self._slots.append(slot)

    def _release_done(self, native: Any, upto: int) -> None:
        """Releases the slots whose copies finished, and (waiting for them) those of every batch
        up to ``upto``."""
        while self._inflight:
            k, event = self._inflight[0]
            if k > upto and not event.query():
                break
            event.synchronize()
            self._inflight.popleft()
            native.release(k)

    def _drain(self) -> None:
        """Waits for the copies in flight and releases their slots."""
        native = self._stream_native
        while self._inflight:
            k, event = self._inflight.popleft()
            event.synchronize()
            if native is not None:
                native.release(k)

    def _iter_cuda(self, native: Any) -> Iterator[Batch]:
        torch = _torch()
        self._stream_native = native
        R = self._staging
        names = self._names + list(FLAGS) + list(PER_SLICE)
        device, cast = self._device, self._cast
        while True:
            pos = native.position()
            if pos is None:  # closed by another iteration or load_state_dict
                return
            self._release_done(native, pos - R)
            got = native.next()
            if got is None:
                return
            k, slot, nb = got
            host = Batch(k, ((n, self._slots[slot][n][:nb]) for n in names))
            if self._mix:
                host["source"] = self._sources()
            self._weights(host)
            if self._transform is not None:
                out = self._transform(host)
                if out is not None:
                    host = out if isinstance(out, Batch) else Batch(k, out)
                for n, t in list(host.items()):
                    if not self._staged_on_cpu and t.device.type == "cpu" and not t.is_pinned():
                        host[n] = t.pin_memory()
            if self._staged_on_cpu:
                out = {
                    n: (
                        t
                        if t is self._source_host
                        else t.to(cast, copy=True) if cast is not None and t.is_floating_point() else t.clone()
                    )
                    for n, t in host.items()
                }
                self._inflight.append((k, _Done()))
                self._position = k + 1
                yield Batch(k, out)
                continue
            current = torch.cuda.current_stream(device)
            with torch.cuda.stream(self._copy_stream):
                # Host-to-device copies of host memory only: the copy stream does not wait for the
                # consumer's stream, so that batch k+1's copy overlaps step k's compute. (A tensor
                # a transform put on the device is already there: `.to` returns it as is.)
                out: Dict[str, Any] = {}
                for n, t in host.items():
                    if t is self._source_host and self._source_host is not None:
                        if self._source_dev is None:  # copied once, reused by every batch
                            self._source_dev = t.to(device, non_blocking=True)
                        out[n] = self._source_dev
                        continue
                    d = t.to(device, non_blocking=True)
                    if cast is not None and d.is_floating_point():
                        d = d.to(cast)
                    out[n] = d
                event = torch.cuda.Event()
                event.record(self._copy_stream)
            current.wait_event(event)
            for t in out.values():
                t.record_stream(current)
            self._inflight.append((k, event))
            self._position = k + 1
            yield Batch(k, out)


class _Done:
    """The event of a copy that is already complete (the staged path's CPU test hook)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def _torch_dtype(torch: Any, name: str) -> Any:
    table = {
        "bool": torch.bool,
        "float16": torch.float16,
        "float32": torch.float32,
        "float64": torch.float64,
        "int8": torch.int8,
        "int16": torch.int16,
        "int32": torch.int32,
        "int64": torch.int64,
        "uint8": torch.uint8,
    }
    if name not in table:
        # uint16/32/64 have limited PyTorch support; gathered bytes stay exact in int of the width.
        table.update({"uint16": torch.int16, "uint32": torch.int32, "uint64": torch.int64})
    return table[name]


_TORCH_LOADER: Optional[type] = None


def _loader_class(backend: str) -> type:
    """``Loader``, also a ``torch.utils.data.IterableDataset`` with the torch backend."""
    global _TORCH_LOADER
    if backend != "torch":
        return Loader
    if _TORCH_LOADER is None:
        from torch.utils.data import IterableDataset

        _TORCH_LOADER = type("Loader", (Loader, IterableDataset), {"__module__": __name__, "__doc__": Loader.__doc__})
    return _TORCH_LOADER


def make_loader(dataset: Any, **kw: Any) -> Loader:
    if kw["backend"] == "torch":
        _torch()  # a clear error without PyTorch, before the IterableDataset base is imported
    return _loader_class(kw["backend"])(dataset, **kw)
