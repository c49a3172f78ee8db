"""The loader: batches of slices gathered by Rust worker threads, handed to PyTorch or NumPy.

CPU (``device="cpu"``): each batch's columns are gathered by a worker into the batch's own
buffers; the tensors (or arrays) handed out view those buffers through DLPack (no copy), and the
buffers go back to the workers when the last tensor viewing them is freed. No CUDA call is made.

CUDA (``device="cuda[:N]"``): the staging ring of ``_cuda.py``. The arguments are checked in
``_options.py``, their types defined in ``_types.py``.
"""

from __future__ import annotations

import collections
import json
import os
from typing import TYPE_CHECKING, Any, Deque, Dict, Iterator, List, Mapping, Optional, Tuple, Type, Union

from . import _native
from ._batch import FLAGS, PER_SLICE, Batch
from ._cuda import CudaRing
from ._options import Mix, _torch, settle
from ._types import Backend, Follow, LoaderArgs
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ._dataset import Snapshot
    from ._stream import StreamedSnapshot

#: The format of a streaming loader's state (``state_dict`` of a loader of a stream).
STREAM_STATE = "trajstore.stream-loader-state/1"

__all__ = ["FLAGS", "PER_SLICE", "Batch", "Loader", "make_loader"]


class Loader(CudaRing):
    """An iterable of :class:`Batch` es sampled from a :class:`~trajstore.Snapshot`, or from
    several mixed in fixed proportions per batch.

    Made by :meth:`Snapshot.loader` and :func:`trajstore.mix`. Arguments:

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
      also depend on the priorities set when each was drawn: workers draw up to ``2 * workers +
      prefetch`` batches ahead. ``state_dict`` holds the priorities, so a resumed run draws what
      the interrupted one would have drawn next from the same priorities.)
    - ``workers``, ``prefetch``: Rust threads gathering (default 2, 1 on a machine of two cores
      or fewer: each gather is itself parallel), and batches queued ahead. On the CPU, with
      batches small enough, each worker may run up to 3 more batches ahead (64 MiB in all at
      most; not with ``"prioritized"``), so that it is woken once every few batches.
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
    - ``frame_stack``: for pixel observations stored as frames (one compressed frame per step,
      see ``trajstore ingest --frame-codec``), each step's observation is its last K frames,
      ``[B, L, K, H, W]`` (uint8), decoded and stacked by the Rust workers from frames stored
      once; ``next_observation`` is the stack one frame later (the episode's stored final frame
      after its last step, zeros where the source stored none). Default: one frame per step,
      ``[B, L, H, W]``.
    - ``frame_pad``: what a stack holds before an episode's first frame: ``"repeat"`` (that
      frame, as gymnasium's ``FrameStackObservation``; default) or ``"zeros"`` (as dopamine).
    - ``frame_channels_last``: stacks along the last axis, ``[B, L, H, W, K]`` (as dopamine and
      Stable-Baselines3 give them; ``[B, L, H, W, K*C]`` for color frames, each frame's
      channels together, oldest first) instead of ``[B, L, K, H, W]``.
    - ``frame_window``: with ``frame_stack=K``, each slice's ``L + K - 1`` frames are gathered
      once and the ``[B, L, K, H, W]`` stacks are a strided view of them (step ``j``'s stack is
      frames ``j .. j + K`` of its slice, so consecutive steps' stacks share memory, as TorchRL's
      ``unfold`` view): a quarter of the bytes to gather and to copy at ``K = 4``. The view is
      read-only in spirit (writing one stack writes its neighbours); ``.contiguous()`` writes
      the stacks out. A padded step's stack may hold its neighbours' frames: use the mask. With
      ``device="cuda"`` the staging slots hold the ``L + K - 1`` frames, one copy carries them,
      and the view is made of the device buffer. Not with ``frame_channels_last`` (``permute``
      the view).
    - ``frame_cache``: keep up to this many bytes of decoded frames in memory (an int, or a
      size such as ``"2GiB"``): the frame columns' frames (all of them where they fit, else the
      first ones) are decoded once, in parallel, when the loader is made, and copied afterwards
      instead of decoded (about twice the batches per second on Atari frames). It costs the
      memory of raw frames, as TorchRL's in-memory storages do; loaders of one snapshot share
      it. A frame that does not decode raises here. Not with ``follow`` or a streamed dataset.
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

    def __init__(
        self,
        dataset: Union[Snapshot, StreamedSnapshot],
        args: LoaderArgs,
        *,
        follow: Follow = None,
        mix: Optional[Mix] = None,
    ) -> None:
        from ._stream import StreamedSnapshot

        # A dataset streamed from object storage through a bounded cache (see _stream.py).
        self._stream: Optional[StreamedSnapshot] = dataset if isinstance(dataset, StreamedSnapshot) else None
        # trajstore.mix: (datasets, weights, follow per dataset).
        datasets: List[Any] = [dataset] if mix is None else list(mix[0])
        self._mix_weights: List[float] = [1.0] if mix is None else [float(w) for w in mix[1]]
        self._dataset = datasets[0]
        self._datasets = datasets
        self._mix = mix is not None
        s = settle(datasets, args, follow, mix)
        self._parts = s.parts
        self._backend: Backend = s.backend
        self._rank, self._world = s.rank, s.world
        self._transform = s.transform
        self._pin = s.pin
        self._beta = s.beta
        self._device = s.device
        self._cast = s.cast
        self._per_iteration = s.per_iteration
        # The options of the native plan (`sampler`, `workers`, `prefetch`, ...).
        self._options = s.native
        self._cuda = s.cuda
        self._staged_on_cpu = s.staged_on_cpu
        self._staging = s.staging
        self._position = 0
        # The end of the iteration in progress (None: endless, or none started), and the end of
        # the iteration a loaded state was taken in.
        self._iter_end: Optional[int] = None
        self._resume_end: Optional[int] = None
        self._pid = os.getpid()
        self._recent: Deque[Tuple[int, List[int], List[int]]] = collections.deque(maxlen=256)
        # Samplers and gatherers: every bad argument fails here.
        follows = [follow] if mix is None else list(mix[2])
        self._stream_follow = self._stream is not None and any(f not in (None, False) for f in follows)
        # Several ranks following a stream agree on every round's version through
        # torch.distributed (rank 0 looks, a broadcast tells the others): see _agree_on_version.
        self._follow_by_ranks = self._stream_follow and self._world > 1
        if self._follow_by_ranks:
            _distributed_for_follow(self._world)
        self._follow_refreshes = 0
        if self._stream is not None:
            streams = [(d._n, w) for d, w in zip(datasets, self._mix_weights)]
            self._plan = _native.Plan.streamed(streams, self._options, self._stream_follow, self._follow_by_ranks)
        else:
            self._plan = _native.Plan(self._parts, self._options)
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
        self._stream_native: Optional[_native.SlotLoader] = None
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

    def _start(self, start: int, rest: bool = False) -> Any:
        """A native stream from batch ``start``: of an iteration's batches, or with ``rest``,
        of what is left of the iteration in progress."""
        count = self._count(start)
        if rest:
            count = None if self._iter_end is None else self._iter_end - start
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
        another, to continue exactly there (after a preemption).

        A streaming loader's state is ``format``, ``url``, ``version``, ``rank``,
        ``world_size``, the sampler's options and ``next_batch``: its batches are a pure
        function of them. A following stream's also has ``version_base``, the batch where the
        version it reads now began (``version`` is that version)."""
        state: Dict[str, Any]
        if self._stream is not None:
            state = self._stream_identity()
            state["next_batch"] = self._position
            if self._iter_end is not None and self._position < self._iter_end:
                state["iteration_end"] = self._iter_end
            return state
        header, priorities = self._plan.state(self._position)
        state = json.loads(header)
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
        if self._stream is not None or state.get("format") == STREAM_STATE:
            self._load_stream_state(state)
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

    def _stream_identity(self) -> Dict[str, Any]:
        """What a streaming loader's batches depend on, but the batch number."""
        assert self._stream is not None
        o = self._options
        keys = ("sampler", "policy", "weighting", "seed", "slice_len", "num_slices", "columns")
        out: Dict[str, Any] = {
            "format": STREAM_STATE,
            "url": self._stream.uri,
            "version": self._stream.version,
            "follow": self._stream_follow,
            "rank": self._rank,
            "world_size": self._world,
            "reuse": self._stream.reuse,
        }
        out.update({k: o[k] for k in keys})  # type: ignore[literal-required]
        out["frame_stack"] = o["frame_stack"]
        if self._mix:
            # A mix of streams: every stream's URL, version, weight and reuse.
            out["mix"] = [[d.uri, d.version, w, d.reuse] for d, w in zip(self._datasets, self._mix_weights)]
        cursor = self._plan.stream_cursor()
        if self._stream_follow and cursor is not None:
            # Following: the version read now, and the batch where it began.
            out["version"], out["version_base"] = cursor
        return out

    def _load_stream_state(self, state: Mapping[str, Any]) -> None:
        if self._stream is None:
            raise InvalidArgumentError(
                "a streaming loader's state: load it into a loader of the same stream "
                "(trajstore.open(url, cache_limit=...).loader(...))"
            )
        if state.get("format") != STREAM_STATE:
            raise InvalidArgumentError(
                "a state of a loader of local datasets: a streaming loader takes the state of a "
                "streaming loader"
            )
        mine = self._stream_identity()
        for k, v in mine.items():
            if self._stream_follow and k in ("version", "version_base"):
                continue
            theirs = state.get(k)
            if isinstance(v, tuple):
                v = list(v)
            if isinstance(theirs, tuple):
                theirs = list(theirs)
            if theirs != v:
                hint = (
                    f": open the stream at that version, trajstore.open(url, version={theirs}, cache_limit=...)"
                    if k == "version"
                    else ""
                )
                raise InvalidArgumentError(f"the state's {k} is {theirs!r}, this loader's {v!r}{hint}")
        pos = state.get("next_batch")
        if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos <= _native.MAX_BATCH_NUMBER:
            raise InvalidArgumentError(f"a damaged state: next_batch {pos!r}")
        end = state.get("iteration_end")
        self._close()
        if self._stream_follow:
            version, base = state.get("version"), state.get("version_base", 0)
            if not isinstance(version, int) or not isinstance(base, int) or not 0 <= base <= pos:
                raise InvalidArgumentError(f"a damaged state: version {version!r}, version_base {base!r}")
            self._plan.set_stream_cursor(version, base)
        self._position = pos
        self._iter_end = self._resume_end = None if end is None else int(end)

    def stream_stats(self) -> Dict[str, Any]:
        """What a streaming loader downloaded and holds (``{}`` for local datasets): this
        rank's ``cache_dir`` (``cache_dirs``: one per stream of a mix, whose figures are the
        streams' together) and its size on disk now (``cache_bytes``, every file, downloads in
        progress included), ``cache_limit`` (the rank's share of the node's
        ``node_cache_limit``), and from the running native loader (this iteration's, or the last
        one's): ``files_downloaded``, ``bytes_downloaded``, ``bytes_resumed`` (partial downloads
        continued, not fetched again), ``files_shared`` (taken from another rank of the node,
        not downloaded), ``files_evicted``, ``peak_cache_bytes``, ``windows_opened`` and
        ``wait_seconds`` (workers waiting for downloads)."""
        if self._stream is None:
            return {}
        native: Dict[str, Any] = {}
        for n in (self._active, self._native):
            text = None if n is None else n.stream_stats()
            if text is not None:
                native = json.loads(text)
                break
        streams = self._datasets if self._mix else [self._stream]
        roots = [os.path.join(d.path, "_stream", f"rank-{self._rank}") for d in streams]
        used = 0
        for root in roots:
            for d, _, files in os.walk(root):
                for f in files:
                    try:
                        used += os.path.getsize(os.path.join(d, f))
                    except OSError:
                        pass
        return {
            **native,
            "cache_dir": roots[0],
            "cache_dirs": roots,
            "cache_bytes": used,
            "cache_limit": sum(d.rank_cache_limit for d in streams),
            "node_cache_limit": sum(d.cache_limit for d in streams),
        }

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

    def _agree_on_version(self) -> None:
        """Ranks following a stream together, at a round boundary (or the start of an
        iteration after the first batch): rank 0 reads the store's newest version and a
        ``torch.distributed`` broadcast gives it to every rank; each moves to it from this batch
        when it is newer than the version it reads."""
        import torch.distributed as dist

        assert self._stream is not None
        newest: Optional[int] = None
        if self._rank == 0:
            try:
                newest = self._stream._n.newest_version()
            except Exception:
                newest = None  # the store unreachable: keep the version, look again next round
        box: List[Optional[int]] = [newest]
        dist.broadcast_object_list(box, src=0)
        cursor = self._plan.stream_cursor()
        if box[0] is not None and cursor is not None and box[0] > cursor[0]:
            self._plan.set_stream_cursor(int(box[0]), self._position)
            self._follow_refreshes += 1

    def __iter__(self) -> Iterator[Batch]:
        self._check_process()
        if self._follow_by_ranks and self._position > 0 and self._native is None:
            # Every rank starts its iteration at the same batch (an epoch's end, a restart).
            self._agree_on_version()
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
                if not self._round_boundary():
                    return
                # A round boundary of a stream the ranks follow together: every rank is here at
                # the same batch; they agree on the next round's version, then go on.
                native.close()
                self._agree_on_version()
                native = self._active = self._start(self._position, rest=True)
                continue
            k, _, buffers = got
            batch = Batch(k, zip(names, self._wrap(buffers)))
            if self._mix:
                batch["source"] = self._sources()
            self._weights(batch)
            batch = self._finish_host(batch)
            self._position = k + 1
            yield batch

    def _round_boundary(self) -> bool:
        """Whether a native loader that ended stopped at a round boundary of a stream the ranks
        follow together (the iteration goes on with the version they agree on), not at the
        iteration's end."""
        ended = self._iter_end is not None and self._position >= self._iter_end
        return self._follow_by_ranks and not ended and self._options["sampler"] != "epoch"

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



_TORCH_LOADER: Optional[Type[Loader]] = None


def _distributed_for_follow(world: int) -> None:
    """Checks that several ranks following a stream can agree: torch.distributed is initialized
    with their world size."""
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None  # type: ignore[assignment]
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError(
            f"follow=True with {world} ranks: the ranks must agree on every round's version, "
            "which they do through torch.distributed; call torch.distributed.init_process_group "
            "first (torchrun), or follow with one rank"
        )
    if dist.get_world_size() != world:
        raise InvalidArgumentError(
            f"follow=True with world_size={world}, but torch.distributed has {dist.get_world_size()} ranks"
        )


def _loader_class(backend: str) -> Type[Loader]:
    """``Loader``, also a ``torch.utils.data.IterableDataset`` with the torch backend."""
    global _TORCH_LOADER
    if backend != "torch":
        return Loader
    if _TORCH_LOADER is None:
        from torch.utils.data import IterableDataset

        _TORCH_LOADER = type("Loader", (Loader, IterableDataset), {"__module__": __name__, "__doc__": Loader.__doc__})
    return _TORCH_LOADER


def make_loader(
    dataset: Union[Snapshot, StreamedSnapshot], args: LoaderArgs, *, follow: Follow = None, mix: Optional[Mix] = None
) -> Loader:
    """A loader over ``dataset`` (or the datasets of ``mix``): ``args`` holds every argument of
    :meth:`Snapshot.loader` but ``follow``, its defaults filled in."""
    if args["backend"] == "torch":
        _torch()  # a clear error without PyTorch, before the IterableDataset base is imported
    return _loader_class(args["backend"])(dataset, args, follow=follow, mix=mix)
