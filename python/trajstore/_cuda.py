"""The CUDA staging ring of a loader (``device="cuda[:N]"``): one pinned staging buffer per slot,
allocated once by PyTorch and holding every tensor of a batch at a fixed offset, gathered into by
the native workers (GIL released); each batch crosses to the device in one copy, without
blocking, on a dedicated CUDA stream, and a slot is reused only after an event recorded after its
copy has completed. The current stream waits on that event, so the batch is ready to use in
ordinary code. Without a transform the slot holds the compact batch (``CompactInto`` in the Rust
crate): a derived ``next_observation`` as one row per slice and the flags as per-slice spans,
expanded on the device by a few elementwise kernels (``_expand``). Each batch's device memory is
its own allocation (PyTorch's caching allocator), so a batch the caller still holds is never
overwritten.

``TRAJSTORE_STAGED_CPU=1`` runs the same ring on CPU (plain host slots, a clone standing for the
device copy), so that machines without a GPU test it."""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Deque, Dict, Iterator, List, NamedTuple, Optional, Tuple

from . import _native
from ._batch import FLAGS, PER_SLICE, Batch
from ._options import _torch
from ._types import PlanOptions, Transform

if TYPE_CHECKING:
    import torch


class _Done:
    """The event of a copy that is already complete (the staged path's CPU test hook)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class CudaRing:
    """The staging ring, a part of :class:`~trajstore.Loader` (which sets the attributes
    declared here)."""

    _plan: _native.Plan
    _names: List[str]
    _mix: bool
    _device: Optional[torch.device]
    _cast: Optional[torch.dtype]
    _transform: Optional[Transform]
    _staged_on_cpu: bool
    _staging: int
    _position: int
    _slots: List[Dict[str, Any]]
    # One pinned buffer per slot (the slot's tensors are views of it), and where each lies.
    _packed: List[Any]
    _pieces: List[_Piece]
    # Whether the slots hold the compact batch (no transform).
    _compact: bool
    _options: PlanOptions
    _copy_stream: Any
    # The batches whose copies may be in flight (their events), oldest first.
    _inflight: Deque[Tuple[int, Any]]
    # The stream whose slots `_inflight` holds.
    _stream_native: Optional[_native.SlotLoader]
    _source_host: Any
    _source_dev: Any

    def _sources(self) -> Any:
        raise NotImplementedError

    def _weights(self, batch: Batch) -> None:
        raise NotImplementedError

    def _cuda_native(self, start: int, count: Optional[int]) -> _native.SlotLoader:
        torch = _torch()
        pin = not self._staged_on_cpu
        if not getattr(self, "_slots", None):
            # Allocated once per loader, by PyTorch, so that they are page-locked memory its
            # copies recognise as pinned.
            self._compact = self._transform is None
            self._pieces = _pieces(torch, self._plan, self._compact)
            total = max(p.offset + p.nbytes for p in self._pieces)
            # Under the target device, so that pinning creates no CUDA context on another GPU.
            ctx = torch.cuda.device(self._device) if pin else contextlib.nullcontext()
            with ctx:
                self._packed = [
                    torch.empty(total, dtype=torch.uint8, pin_memory=pin) for _ in range(self._staging)
                ]
            self._slots = [_views(buf, self._pieces) for buf in self._packed]
            if pin:
                self._copy_stream = torch.cuda.Stream(device=self._device)
        regions = [[(t.data_ptr(), t.numel() * t.element_size()) for t in slot.values()] for slot in self._slots]
        return _native.SlotLoader(self._plan, start, count, regions, self._slots, self._compact)

    def _release_done(self, native: _native.SlotLoader, upto: int) -> None:
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

    def _iter_cuda(self, native: _native.SlotLoader) -> Iterator[Batch]:
        self._stream_native = native
        R = self._staging
        while True:
            pos = native.position()
            if pos is None:  # closed by another iteration or load_state_dict
                return
            self._release_done(native, pos - R)
            got = native.next()
            if got is None:
                return
            k, slot, nb = got
            if self._transform is None:
                batch = self._packed_batch(k, slot, nb)
            else:
                batch = self._transformed_batch(k, slot, nb)
            self._position = k + 1
            yield batch

    def _packed_batch(self, k: int, slot: int, nb: int) -> Batch:
        """Batch ``k`` of ``slot`` in one copy of the slot's buffer, unpacked (and expanded)
        on the device."""
        torch = _torch()
        host = self._slots[slot]
        extra: Dict[str, Any] = {}
        if self._options["sampler"] == "prioritized":
            ids = Batch(k, ((n, host[n][:nb]) for n in PER_SLICE))
            self._weights(ids)
            if "weight" in ids:
                extra["weight"] = ids["weight"]
        if self._mix:
            extra["source"] = self._sources()
        packed = self._packed[slot]
        if self._staged_on_cpu:
            dev = packed.clone()
            self._inflight.append((k, _Done()))
            out = self._unpack(torch, dev, nb)
            for n, t in extra.items():
                out[n] = t.clone() if t is not self._source_host else t
            return Batch(k, out)
        device = self._device
        current = torch.cuda.current_stream(device)
        with torch.cuda.stream(self._copy_stream):
            # One host-to-device copy of pinned memory: the copy stream does not wait for the
            # consumer's stream, so that batch k+1's copy overlaps step k's compute.
            dev = packed.to(device, non_blocking=True)
            if self._mix and self._source_dev is None:  # copied once, reused by every batch
                self._source_dev = self._source_host.to(device, non_blocking=True)
            weight = extra.get("weight")
            if weight is not None:
                weight = weight.to(device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._copy_stream)
        current.wait_event(event)
        # One allocation: recorded once for every view of it. What _expand makes is allocated on
        # the current stream, after the wait.
        dev.record_stream(current)
        out = self._unpack(torch, dev, nb)
        if weight is not None:
            weight.record_stream(current)
            out["weight"] = weight
        if self._mix:
            out["source"] = self._source_dev
        self._inflight.append((k, event))
        return Batch(k, out)

    def _unpack(self, torch: Any, dev: Any, nb: int) -> Dict[str, Any]:
        """The batch's tensors as views of its device buffer (trimmed to ``nb`` slices), expanded
        where compact, cast where asked."""
        t = {p.name: _view(dev, p)[:nb] for p in self._pieces}
        if self._compact:
            tails = [p.name for p in self._pieces if p.tail]
            t = _expand(torch, t, self._plan.slice_len, tails)
        if self._cast is not None:
            for n, x in t.items():
                if x.is_floating_point():
                    t[n] = x.to(self._cast)
        return t

    def _transformed_batch(self, k: int, slot: int, nb: int) -> Batch:
        """Batch ``k`` through the user's transform on the host, then copied tensor by tensor
        (the transform may replace any of them)."""
        torch = _torch()
        names = self._names + list(FLAGS) + list(PER_SLICE)
        device, cast = self._device, self._cast
        host = Batch(k, ((n, self._slots[slot][n][:nb]) for n in names))
        if self._mix:
            host["source"] = self._sources()
        self._weights(host)
        assert self._transform is not None
        changed = self._transform(host)
        if changed is not None:
            host = changed if isinstance(changed, Batch) else Batch(k, changed)
        for n, t in list(host.items()):
            if not self._staged_on_cpu and t.device.type == "cpu" and not t.is_pinned():
                host[n] = t.pin_memory()
        if self._staged_on_cpu:
            copies = {
                n: (
                    t
                    if t is self._source_host
                    else t.to(cast, copy=True)
                    if cast is not None and t.is_floating_point()
                    else t.clone()
                )
                for n, t in host.items()
            }
            self._inflight.append((k, _Done()))
            return Batch(k, copies)
        current = torch.cuda.current_stream(device)
        with torch.cuda.stream(self._copy_stream):
            # Host-to-device copies of host memory only (a tensor a transform put on the device
            # is already there: `.to` returns it as is).
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
        return Batch(k, out)


#: The slot key of a compact batch's ``[B, 3]`` int32 spans (first valid position, valid steps,
#: end bits), in place of the flag planes.
SPANS = "_spans"
#: The end bits of a span (``CompactInto::FIRST`` ... in the Rust crate).
_FIRST, _LAST, _TERMINATED, _TRUNCATED = 1, 2, 4, 8
#: Offsets in a slot's buffer are multiples of this (any dtype's alignment, and CUDA's vector
#: loads'), as in the Rust loader's packed slots.
_ALIGN = 256


class _Piece(NamedTuple):
    """One tensor of a slot's buffer: where it lies and what it is."""

    name: str
    offset: int
    nbytes: int
    dtype: Any
    shape: Tuple[int, ...]
    #: Whether it is a compact batch's tail (one row per slice of a derived next_observation).
    tail: bool


def _pieces(torch: Any, plan: _native.Plan, compact: bool) -> List[_Piece]:
    """The tensors of one slot in the order the native slot loader takes their regions:
    columns, then the flag planes (or the spans), then the per-slice vectors."""
    b, l = plan.num_slices, plan.slice_len  # noqa: E741
    tails = plan.tail_columns() if compact else [False] * len(plan.columns())
    specs: List[Tuple[str, Any, Tuple[int, ...], bool]] = []
    for (name, dtype, step_shape), tail in zip(plan.columns(), tails):
        lead = (b,) if tail else (b, l)
        specs.append((name, _torch_dtype(torch, dtype), (*lead, *step_shape), tail))
    if compact:
        specs.append((SPANS, torch.int32, (b, 3), False))
    else:
        specs.extend((n, torch.bool, (b, l), False) for n in FLAGS)
    specs.extend((n, torch.int64, (b,), False) for n in PER_SLICE)
    pieces: List[_Piece] = []
    at = 0
    for name, dtype, shape, tail in specs:
        at = (at + _ALIGN - 1) // _ALIGN * _ALIGN
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        pieces.append(_Piece(name, at, n, dtype, shape, tail))
        at += n
    return pieces


def _view(buf: Any, p: _Piece) -> Any:
    return buf[p.offset : p.offset + p.nbytes].view(p.dtype).view(p.shape)


def _views(buf: Any, pieces: List[_Piece]) -> Dict[str, Any]:
    return {p.name: _view(buf, p) for p in pieces}


def _expand(torch: Any, t: Dict[str, Any], l: int, tails: List[str]) -> Dict[str, Any]:  # noqa: E741
    """The full batch of a compact one, where it lies: the flag planes from the spans, and each
    tail column's ``next_observation``, which is the tail at a slice's last valid step, the
    observation one step later at its other valid steps and zero where padded (the expansion
    ``CompactInto`` documents in the Rust crate)."""
    spans = t.pop(SPANS)
    off, n, bits = spans[:, 0:1], spans[:, 1:2], spans[:, 2:3]
    rel = torch.arange(l, dtype=torch.int32, device=spans.device) - off
    mask = (rel >= 0) & (rel < n)
    slice_end = (rel == n - 1) & mask
    flags = {
        "mask": mask,
        "is_first": (rel == 0) & mask & ((bits & _FIRST) != 0),
        "is_last": slice_end & ((bits & _LAST) != 0),
        "terminated": slice_end & ((bits & _TERMINATED) != 0),
        "truncated": slice_end & ((bits & _TRUNCATED) != 0),
        "slice_end": slice_end,
    }
    out: Dict[str, Any] = {}
    for name, x in t.items():
        if name not in tails:
            out[name] = x
            continue
        # A tail: [B, ...] against the observation's [B, L, ...].
        obs = t["observation"]
        cond = (x.shape[0], l) + (1,) * (obs.dim() - 2)
        nxt = torch.zeros_like(obs)
        nxt[:, :-1] = obs[:, 1:]
        nxt.masked_fill_(~mask.view(cond), 0)
        out[name] = torch.where(slice_end.view(cond), x.unsqueeze(1), nxt)
    cols = {n: v for n, v in out.items() if n not in PER_SLICE}
    return {**cols, **flags, **{n: out[n] for n in PER_SLICE}}


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
