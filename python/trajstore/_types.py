"""The types of the loader's arguments, defined once: ``Literal`` aliases for the enum-like
arguments, :class:`LoaderArgs` (the keywords :func:`trajstore.mix` passes on to the loader), and
the dicts the Python package hands to the native ``Plan``.

The defaults live in one place only: the signature of :meth:`trajstore.Snapshot.loader`."""

from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypedDict,
    Union,
    get_args,
)

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ._batch import Batch

# --- enum-like arguments (their runtime checks derive from these with `get_args`) ------------

#: ``sampler=``: with replacement and endless; every window once per epoch; one window of every
#: episode per epoch; whole episodes; in proportion to priorities.
SamplerName = Literal["uniform", "epoch", "epoch_episodes", "episodes", "prioritized"]
#: ``policy=``: slices inside episodes, or padded past their ends; also ``"span:L:R"`` (a string).
Policy = Union[Literal["strict", "pad"], str]
#: ``weighting=``: every window equally likely, or every episode.
Weighting = Literal["windows", "episodes"]
#: ``backend=``: PyTorch tensors, or NumPy arrays (CPU only).
Backend = Literal["torch", "numpy"]
#: ``readahead=``: ``True`` is ``"always"``, ``False`` ``"never"``.
ReadAhead = Union[Literal["auto", "always", "never"], bool]
#: ``frame_pad=``: what a frame stack holds before an episode's first frame.
FramePad = Literal["repeat", "zeros"]

#: ``frame_codec=``: how a frame column compresses each frame (``trajstore ingest --frame-codec``).
FrameCodec = Literal["zstd-dict", "zstd", "none"]

SAMPLERS: Tuple[SamplerName, ...] = get_args(SamplerName)
BACKENDS: Tuple[Backend, ...] = get_args(Backend)


class FollowEvery(TypedDict, total=False):
    """``follow={"every": seconds, "every_batches": n}`` (whichever comes first)."""

    every: float
    every_batches: int


#: ``follow=``: None/False (a fixed version), True (look every second), seconds, or a dict.
Follow = Union[None, bool, float, FollowEvery]
#: ``episodes=``: episode ids, or a SQL query returning an ``episode_id`` column.
Episodes = Union[None, str, Sequence[int], "np.ndarray[Any, Any]"]
#: ``device=``: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, a ``torch.device`` or a CUDA device index.
Device = Union[str, int, "torch.device"]
#: ``transform=``: a function of the host batch returning the batch (or None after changing it
#: in place).
Transform = Callable[["Batch"], Optional[Mapping[str, Any]]]


class LoaderArgs(TypedDict, total=False):
    """The keyword arguments of :meth:`trajstore.Snapshot.loader` but ``follow``, which
    :func:`trajstore.mix` takes per dataset. No defaults here: what is not given takes the
    default of :meth:`~trajstore.Snapshot.loader`'s signature. Documented in
    :class:`trajstore.Loader`."""

    slice_len: int
    num_slices: int
    columns: Optional[Sequence[str]]
    policy: Policy
    weighting: Weighting
    episodes: Episodes
    sampler: SamplerName
    seed: int
    alpha: float
    beta: Optional[float]
    drop_last: bool
    workers: Optional[int]
    prefetch: int
    device: Device
    dtype_cast: Optional[torch.dtype]
    rank: Union[int, Literal["auto"]]
    world_size: Optional[int]
    max_batches: Optional[int]
    backend: Backend
    transform: Optional[Transform]
    pin_memory: bool
    staging_slots: Optional[int]
    readahead: ReadAhead
    frame_stack: Optional[int]
    frame_pad: FramePad
    frame_channels_last: bool
    frame_window: bool
    frame_cache: Union[int, str, None]


# --- what the native Plan takes (python/src/plan.rs: every key given, no defaults there) -------


class PlanOptions(TypedDict):
    """The options of every part of a native ``Plan`` (``LoaderArgs`` in plan.rs)."""

    slice_len: int
    num_slices: int
    columns: List[str]
    workers: int
    prefetch: int
    rank: int
    world_size: int
    readahead: ReadAhead
    sampler: SamplerName
    policy: Policy
    weighting: Weighting
    seed: int
    alpha: float
    drop_last: bool
    episode_ids: Optional[List[int]]
    episodes_sql: Optional[str]
    frame_stack: Optional[int]
    frame_pad: FramePad
    frame_channels_last: bool
    frame_window: bool
    frame_cache: Union[int, str, None]


class PartOptions(TypedDict):
    """One dataset's options in a native ``Plan`` (``PartArgs`` in plan.rs; it may also
    override the sampler options of :class:`PlanOptions`, and ``seed``, which is otherwise the
    loader's ``seed + i``)."""

    weight: float
    follow_every: Optional[float]
    follow_every_batches: Optional[int]


#: A loader state from ``state_dict`` (a plain dict).
State = Dict[str, Any]
