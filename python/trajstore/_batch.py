"""A batch: the dict a loader yields, and the keys every batch has."""

from __future__ import annotations

from typing import Any, Dict

#: The ``[B, L]`` bool planes of every batch.
FLAGS = ("mask", "is_first", "is_last", "terminated", "truncated", "slice_end")
#: The ``[B]`` int64 per-slice keys of every batch.
PER_SLICE = ("episode_id", "start_step")


class Batch(Dict[str, Any]):
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

    def to(self, *args: Any, **kwargs: Any) -> Batch:
        """Every tensor ``.to(*args, **kwargs)`` (torch backend)."""
        return Batch(self.index, {k: v.to(*args, **kwargs) for k, v in self.items()})

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {_describe(v)}" for k, v in self.items())
        return f"Batch(index={self.index}, {cols})"


def _describe(v: Any) -> str:
    dtype = str(getattr(v, "dtype", "?")).replace("torch.", "")
    return f"{dtype}{list(v.shape)}"
