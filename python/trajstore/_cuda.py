"""The CUDA staging ring of a loader (``device="cuda[:N]"``): pinned staging buffers allocated
once by PyTorch, gathered into by the native workers (GIL released), each batch copied to the
device without blocking on a dedicated CUDA stream, and a slot reused only after an event
recorded after its copy has completed. The current stream waits on that event, so the batch is
ready to use in ordinary code.

``TRAJSTORE_STAGED_CPU=1`` runs the same ring on CPU (plain host slots, a clone standing for the
device copy), so that machines without a GPU test it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Deque, Dict, Iterator, List, Optional, Tuple

from . import _native
from ._batch import FLAGS, PER_SLICE, Batch
from ._options import _torch
from ._types import Transform

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
        b, l = self._plan.num_slices, self._plan.slice_len  # noqa: E741
        pin = not self._staged_on_cpu
        if not getattr(self, "_slots", None):
            # Allocated once per loader, by PyTorch, so that they are page-locked memory its
            # copies recognise as pinned.
            self._slots = []
            # Under the target device, so that pinning creates no CUDA context on another GPU.
            ctx = torch.cuda.device(self._device) if pin else contextlib.nullcontext()
            with ctx:
                self._alloc_slots(torch, b, l, pin)
            if pin:
                self._copy_stream = torch.cuda.Stream(device=self._device)
        regions = [[(t.data_ptr(), t.numel() * t.element_size()) for t in slot.values()] for slot in self._slots]
        return _native.SlotLoader(self._plan, start, count, regions, self._slots)

    def _alloc_slots(self, torch: Any, b: int, l: int, pin: bool) -> None:  # noqa: E741
        for _ in range(self._staging):
            slot: Dict[str, Any] = {}
            for name, dtype, shape in self._plan.columns():
                slot[name] = torch.empty((b, l, *shape), dtype=_torch_dtype(torch, dtype), pin_memory=pin)
            for name in FLAGS:
                slot[name] = torch.empty((b, l), dtype=torch.bool, pin_memory=pin)
            for name in PER_SLICE:
                slot[name] = torch.empty((b,), dtype=torch.int64, pin_memory=pin)
            self._slots.append(slot)

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
                self._position = k + 1
                yield Batch(k, copies)
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
