"""The CUDA staging ring of a loader (``device="cuda[:N]"``).

- **Host slots.** One pinned buffer per slot, allocated once by PyTorch, holding every tensor of
  a batch at a fixed offset; the native workers gather into it with the GIL released.
- **One copy per batch** of that buffer, without blocking, on a dedicated CUDA stream, into a
  ring of device buffers whose tensor views were made once (``_DeviceSlot``). The current stream
  waits on an event recorded after the copy, so the batch is ready to use in ordinary code. A
  host slot is reused only after its copy has completed.
- **A held batch is never overwritten.** Before a device buffer takes a new batch, the ring checks
  that nothing outside it refers to the old one: the views' reference counts and the storages'
  use counts. If something does, the buffer is left to its holder and a new one is allocated.
  The copy stream also waits for what the current stream had queued, so kernels still reading the
  old batch finish first.
- **Frame windows** (``frame_window=True``): a slot holds each slice's ``L + K - 1`` frames once,
  ``[B, L + K - 1, H, W]``, and the batch's ``[B, L, K, H, W]`` stacks are a view of the device
  buffer (``_stacks``): the copy carries a quarter of the stacks' bytes at ``K = 4``, L = 64.
- **Derived ``next_observation``.** Where one batch's derived ``next_observation`` would carry
  ``_TAIL_MIN_BYTES`` or more (frame stacks, large observations), the slot holds it as one row per
  slice (``Gatherer::gather_into_with_tails`` in the Rust crate): at every other step it is the
  observation one step later. It is derived on the copy stream by five kernels (``_derive``),
  bit for bit the stored batch. Below that size the copy of the full column costs less than
  issuing the kernels. With a frame window the tail is one frame per slice, the frame after its
  last valid step: the ``next_observation`` window is the observation's one row later, so the
  copy carries ``L + K - 1`` frames a slice where it would carry twice that.

The per-batch work on the training thread is a copy, two events, two waits and a few
reference-count reads. ``TRAJSTORE_STAGED_CPU=1`` runs the same rings on CPU (plain host
memory, a copy standing for the device copy), so that machines without a GPU test them."""

from __future__ import annotations

import contextlib
import math
import sys
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


#: A derived next_observation is shipped as one row per slice when that saves at least this many
#: bytes per batch: about 80 us of a 25 GB/s copy, more than issuing the five kernels of
#: ``_derive`` from Python costs (about 50 us on the CPU stand-in, BENCHMARKS.md). Frame stacks
#: clear it by far; a 17-float observation at 256 x 64 (1.1 MB) does not.
_TAIL_MIN_BYTES = 2 << 20
#: Offsets in a slot's buffer are multiples of this (any dtype's alignment, and CUDA's vector
#: loads'), as in the Rust loader's packed slots.
_ALIGN = 256
#: Device buffers in the ring: the batch being used, the one being copied, one to spare.
_DEVICE_SLOTS = 3


class _Piece(NamedTuple):
    """One tensor of a slot's buffer: where it lies and what it is."""

    name: str
    offset: int
    nbytes: int
    dtype: Any
    shape: Tuple[int, ...]
    #: Whether it is a tail (one row per slice of a derived next_observation).
    tail: bool
    #: Rows before each slice's step 0: ``K - 1`` for a frame window (held as ``[B, L + K - 1,
    #: ...frame]`` and handed out as a ``[B, L, K, ...frame]`` view of it), else 0.
    lead: int = 0


def _pieces(torch: Any, plan: _native.Plan, tails: Optional[List[bool]]) -> List[_Piece]:
    """The tensors of one slot in the order the native slot loader takes their regions:
    columns, the six flag planes, then the per-slice vectors."""
    b, l = plan.num_slices, plan.slice_len  # noqa: E741
    specs: List[Tuple[str, Any, Tuple[int, ...], bool, int]] = []
    for j, ((name, dtype, step_shape), lead) in enumerate(zip(plan.columns(), plan.leads())):
        tail = tails is not None and tails[j]
        if tail:
            # One row a slice: a step, or a frame window's one frame.
            shape: Tuple[int, ...] = (b, *step_shape[1:]) if lead else (b, *step_shape)
        elif lead:
            shape = (b, l + lead, *step_shape[1:])
        else:
            shape = (b, l, *step_shape)
        specs.append((name, _torch_dtype(torch, dtype), shape, tail, lead))
    specs.extend((n, torch.bool, (b, l), False, 0) for n in FLAGS)
    specs.extend((n, torch.int64, (b,), False, 0) for n in PER_SLICE)
    pieces: List[_Piece] = []
    at = 0
    for name, dtype, shape, tail, lead in specs:
        at = (at + _ALIGN - 1) // _ALIGN * _ALIGN
        n = math.prod(shape) * dtype.itemsize
        pieces.append(_Piece(name, at, n, dtype, shape, tail, lead))
        at += n
    return pieces


def _tails(torch: Any, plan: _native.Plan) -> Optional[List[bool]]:
    """The columns shipped as one row per slice: derived next_observations saving
    ``_TAIL_MIN_BYTES`` or more per batch."""
    b, l = plan.num_slices, plan.slice_len  # noqa: E741
    out = []
    for (_, dtype, shape), can, lead in zip(plan.columns(), plan.tail_columns(), plan.leads()):
        # A row: a step, or a frame window's frame; a slice holds L + lead rows.
        row = math.prod(shape) // (lead + 1) * _torch_dtype(torch, dtype).itemsize
        out.append(can and b * (l + lead - 1) * row >= _TAIL_MIN_BYTES)
    return out if any(out) else None


def _view(buf: Any, p: _Piece) -> Any:
    return buf[p.offset : p.offset + p.nbytes].view(p.dtype).view(p.shape)


def _stacks(t: Any, lead: int) -> Any:
    """A column as handed out: ``t`` itself, or for a frame window (``t`` ``[B, L + K - 1,
    ...frame]``, ``lead = K - 1``) the ``[B, L, K, ...frame]`` view whose step ``j`` is rows
    ``j .. j + K`` of its slice, sharing ``t``'s memory (the stacks are never written out)."""
    if not lead:
        return t
    n = t.dim()
    return t.unfold(1, lead + 1, 1).permute(0, 1, n, *range(2, n))


class _DeviceSlot:
    """One buffer of the device ring: a batch's packed bytes, the tensors handed out (views of
    it, made once, and each tail's derived next_observation), and what their reference counts
    are when nothing outside the ring holds them."""

    def __init__(self, torch: Any, pieces: List[_Piece], device: Any, l: int) -> None:  # noqa: E741
        total = max(p.offset + p.nbytes for p in pieces)
        self.buf = torch.empty(total, dtype=torch.uint8, device=device)
        self.views = {p.name: _view(self.buf, p) for p in pieces}
        #: Each tail's next_observation, [B, L, ...] (a frame window's [B, L + K - 1,
        #: ...frame]), derived into on every batch.
        self.full = {
            p.name: torch.empty((p.shape[0], l + p.lead, *p.shape[1:]), dtype=p.dtype, device=device)
            for p in pieces
            if p.tail
        }
        leads = {p.name: p.lead for p in pieces}
        self.out: Dict[str, Any] = {n: _stacks(self.full.get(n, v), leads[n]) for n, v in self.views.items()}
        self.derivations = _derivations(torch, self.views, self.full, leads)
        self._refs = self._ref_counts()
        self._uses = self._use_counts(torch)

    def _ref_counts(self) -> List[int]:
        return [sys.getrefcount(t) for t in self.out.values()]

    def _use_counts(self, torch: Any) -> Optional[List[int]]:
        count = getattr(torch._C, "_storage_Use_Count", None)
        if count is None:
            return None
        return [count(t.untyped_storage()._cdata) for t in (self.buf, *self.full.values())]

    def held(self, torch: Any) -> bool:
        """Whether something outside the ring refers to this buffer's tensors (a batch the caller
        kept, a view of one); True where PyTorch cannot tell."""
        uses = self._use_counts(torch)
        return uses is None or uses != self._uses or self._ref_counts() != self._refs


class _Derivation(NamedTuple):
    """The views ``_derive`` works on for one tail, made once per device buffer."""

    #: The full next_observation as stored (``[B, R, ...]``, ``R = L`` or ``L + K - 1``), its
    #: first R-1 rows and its last.
    out: Any
    head: Any
    last: Any
    #: The observation's last R-1 rows.
    later: Any
    #: The mask and slice_end planes: broadcast over a step's dimensions (``lead == 0``), or
    #: ``[B, L]`` as they are (a window).
    mask: Any
    end: Any
    #: The tail as ``[B, 1, ...]``.
    tail: Any
    #: Rows before each slice's step 0 (``K - 1`` for a frame window), with ``[1, R]`` row
    #: numbers and the shape a per-row condition broadcasts from.
    lead: int
    rows: Any
    cond: Tuple[int, ...]


def _derivations(torch: Any, views: Dict[str, Any], full: Dict[str, Any], leads: Dict[str, int]) -> List[_Derivation]:
    """Per tail, the views ``_derive`` works on, made once per device buffer."""
    if not full:
        return []
    obs, mask, end = views["observation"], views["mask"], views["slice_end"]
    out = []
    for name, dst in full.items():
        lead = leads[name]
        cond = (*dst.shape[:2], *(1,) * (dst.dim() - 2))
        rows = torch.arange(dst.shape[1], device=dst.device).view(1, -1)
        planes = (mask, end) if lead else (mask.view(cond), end.view(cond))
        tail = views[name].unsqueeze(1)
        out.append(_Derivation(dst, dst[:, :-1], dst[:, -1], obs[:, 1:], *planes, tail, lead, rows, cond))
    return out


def _derive(torch: Any, derivations: List[_Derivation]) -> None:
    """Each tail's next_observation: the tail at a slice's last valid step, the observation one
    step later at the other valid steps, zero where padded (five kernels). For a frame window,
    row ``r`` of a slice whose valid steps are ``off .. off + n - 1`` is the tail at ``r == off +
    n - 1 + lead``, the observation's row ``r + 1`` where ``off <= r < off + n - 1 + lead``,
    zero elsewhere (a few more kernels on ``[B, R]``)."""
    for d in derivations:
        d.head.copy_(d.later)
        d.last.zero_()
        if not d.lead:
            d.out.masked_fill_(d.mask.logical_not(), 0)
            torch.where(d.end, d.tail, d.out, out=d.out)
            continue
        n = d.mask.sum(1, keepdim=True)
        first = d.mask.to(torch.int32).argmax(1, keepdim=True)
        stop = first + n - 1 + d.lead
        some = n > 0
        keep = (d.rows >= first) & (d.rows < stop) & some
        d.out.masked_fill_(keep.logical_not().view(d.cond), 0)
        torch.where(((d.rows == stop) & some).view(d.cond), d.tail, d.out, out=d.out)


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
    _options: PlanOptions
    # The host slots (name -> view of the slot's pinned buffer), their buffers, and where each
    # tensor lies in them.
    _slots: List[Dict[str, Any]]
    _packed: List[Any]
    _pieces: List[_Piece]
    # The device ring and the next buffer of it to use.
    _ring: List[_DeviceSlot]
    _ring_next: int
    _copy_stream: Any
    # The batches whose copies may be in flight (their events), oldest first.
    _inflight: Deque[Tuple[int, Any]]
    # The stream whose slots `_inflight` holds.
    _stream_native: Optional[_native.SlotLoader]
    _source_host: Any
    _source_dev: Any
    # The native loader of the iteration in progress.
    _active: Any

    def _sources(self) -> Any:
        raise NotImplementedError

    def _round_boundary(self) -> bool:
        raise NotImplementedError

    def _agree_on_version(self) -> None:
        raise NotImplementedError

    def _start(self, start: int, rest: bool = False) -> Any:
        raise NotImplementedError

    def _weights(self, batch: Batch) -> None:
        raise NotImplementedError

    def _cuda_native(self, start: int, count: Optional[int]) -> _native.SlotLoader:
        torch = _torch()
        pin = not self._staged_on_cpu
        if not getattr(self, "_slots", None):
            # Without a transform (which sees the host batch whole) derived next_observations
            # may be shipped as one row per slice.
            tails = _tails(torch, self._plan) if self._transform is None else None
            self._pieces = _pieces(torch, self._plan, tails)
            total = max(p.offset + p.nbytes for p in self._pieces)
            # Allocated once per loader, by PyTorch, so that they are page-locked memory its
            # copies recognise as pinned; under the target device, so that pinning creates no
            # CUDA context on another GPU.
            ctx = torch.cuda.device(self._device) if pin else contextlib.nullcontext()
            with ctx:
                self._packed = [torch.empty(total, dtype=torch.uint8, pin_memory=pin) for _ in range(self._staging)]
            self._slots = [{p.name: _view(buf, p) for p in self._pieces} for buf in self._packed]
            self._ring, self._ring_next = [], 0
            if pin:
                self._copy_stream = torch.cuda.Stream(device=self._device)
        tails = [p.tail for p in self._pieces[: len(self._names)]]
        regions = [[(t.data_ptr(), t.numel() * t.element_size()) for t in slot.values()] for slot in self._slots]
        return _native.SlotLoader(
            self._plan, start, count, regions, self._slots, tails if any(tails) else None
        )

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
                if not self._round_boundary():
                    return
                # A round boundary of a stream the ranks follow together: the slots go back,
                # the ranks agree on the next round's version, and a new native loader writes
                # the same slots.
                self._drain()
                native.close()
                self._agree_on_version()
                native = self._stream_native = self._active = self._start(self._position, rest=True)
                continue
            k, slot, nb = got
            if self._transform is None:
                batch = self._ring_batch(k, slot, nb)
            else:
                batch = self._transformed_batch(k, slot, nb)
            self._position = k + 1
            yield batch

    def _device_slot(self, torch: Any) -> _DeviceSlot:
        """The next buffer of the device ring, or a new one where the caller still holds it."""
        i = self._ring_next
        self._ring_next = (i + 1) % _DEVICE_SLOTS
        if i == len(self._ring):
            self._ring.append(_DeviceSlot(torch, self._pieces, self._target(), self._plan.slice_len))
        elif self._ring[i].held(torch):
            self._ring[i] = _DeviceSlot(torch, self._pieces, self._target(), self._plan.slice_len)
        return self._ring[i]

    def _target(self) -> Any:
        return "cpu" if self._staged_on_cpu else self._device

    def _ring_batch(self, k: int, slot: int, nb: int) -> Batch:
        """Batch ``k`` of host slot ``slot``, in one copy into the next device buffer."""
        torch = _torch()
        host = self._slots[slot]
        weight = None
        if self._options["sampler"] == "prioritized":
            ids = Batch(k, ((n, host[n][:nb]) for n in PER_SLICE))
            self._weights(ids)
            weight = ids.get("weight")
        if self._mix:
            self._sources()
        d = self._device_slot(torch)
        if self._staged_on_cpu:
            d.buf.copy_(self._packed[slot])
            _derive(torch, d.derivations)
            event: Any = _Done()
            if weight is not None:
                weight = weight.clone()
            source = self._source_host
        else:
            current = torch.cuda.current_stream(self._device)
            # What the current stream has queued so far, the last use of this buffer included,
            # finishes before the copy overwrites it.
            free = torch.cuda.Event()
            free.record(current)
            with torch.cuda.stream(self._copy_stream):
                self._copy_stream.wait_event(free)
                # One host-to-device copy of pinned memory; the copy stream does not wait for
                # what the current stream queues later, so that it overlaps that compute.
                d.buf.copy_(self._packed[slot], non_blocking=True)
                _derive(torch, d.derivations)
                if self._mix and self._source_dev is None:  # copied once, reused by every batch
                    self._source_dev = self._source_host.to(self._device, non_blocking=True)
                if weight is not None:
                    weight = weight.to(self._device, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._copy_stream)
            current.wait_event(event)
            if weight is not None:
                weight.record_stream(current)
            source = self._source_dev
        self._inflight.append((k, event))
        out = d.out if nb == self._plan.num_slices else {n: t[:nb] for n, t in d.out.items()}
        batch = Batch(k, out)
        if self._cast is not None:
            for n, t in out.items():
                if t.is_floating_point():
                    batch[n] = t.to(self._cast)
        if weight is not None:
            batch["weight"] = weight
        if self._mix:
            batch["source"] = source
        return batch

    def _transformed_batch(self, k: int, slot: int, nb: int) -> Batch:
        """Batch ``k`` through the user's transform on the host, then copied tensor by tensor
        (the transform may replace any of them)."""
        torch = _torch()
        device, cast = self._device, self._cast
        # The pieces are the columns, the flag planes and the per-slice vectors, in batch order.
        host = Batch(k, ((p.name, _stacks(self._slots[slot][p.name], p.lead)[:nb]) for p in self._pieces))
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
