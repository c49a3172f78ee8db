"""The loader's arguments checked and normalised (before any batch is sampled): the rank, the
device, the follow periods, and the options the native ``Plan`` takes. Every bad argument
raises :class:`~trajstore.InvalidArgumentError` here or in the ``Plan``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Sequence, Tuple, Union

from . import _native
from ._types import BACKENDS, SAMPLERS, Backend, Follow, LoaderArgs, PartOptions, PlanOptions, Transform
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

    from ._dataset import Snapshot

#: A mix: (datasets, weights, follow per dataset).
Mix = Tuple[List["Snapshot"], List[float], List[Follow]]

# The longest follow period (the Rust loader's `MAX_FOLLOW_PERIOD`, as the CLI's --follow).
MAX_FOLLOW_SECONDS = 86_400


def _torch() -> Any:
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


def _follow_options(follow: Follow, what: str = "follow") -> Tuple[Optional[float], Optional[int]]:
    """The native part options of ``follow`` (``follow_every`` seconds, ``follow_every_batches``;
    None where not given): None/False (fixed), True (look every second), seconds, or
    ``{"every": seconds, "every_batches": n}``."""
    if follow is None or follow is False:
        return None, None
    if follow is True:
        return 1.0, None
    if isinstance(follow, (int, float)) and not isinstance(follow, bool):
        if not 0 < follow <= MAX_FOLLOW_SECONDS:
            raise InvalidArgumentError(
                f"{what}={follow!r}: a period in seconds, more than 0 and at most {MAX_FOLLOW_SECONDS} (a day)"
            )
        return float(follow), None
    if isinstance(follow, Mapping):
        given: Mapping[str, Any] = follow
        unknown = sorted(set(given) - {"every", "every_batches"})
        every, batches = given.get("every"), given.get("every_batches")
        if unknown or (every is None and batches is None):
            raise InvalidArgumentError(
                f"{what}={dict(given)!r}: give 'every' (seconds) and/or 'every_batches' (batches)"
            )
        seconds: Optional[float] = None
        if every is not None:
            if isinstance(every, bool) or not isinstance(every, (int, float)) or not 0 < every <= MAX_FOLLOW_SECONDS:
                raise InvalidArgumentError(
                    f"{what}: every={every!r}, a period in seconds, more than 0 and at most "
                    f"{MAX_FOLLOW_SECONDS} (a day)"
                )
            seconds = float(every)
        if batches is not None:
            if isinstance(batches, bool) or not isinstance(batches, int) or not 1 <= batches <= 2**63:
                raise InvalidArgumentError(f"{what}: every_batches={batches!r}, an int >= 1")
        return seconds, batches
    raise InvalidArgumentError(
        f"{what}={follow!r}: use True (every second), a number of seconds, or "
        "{'every': seconds, 'every_batches': n}"
    )


def _part(weight: float, follow: Follow, what: str = "follow") -> PartOptions:
    every, batches = _follow_options(follow, what)
    return {"weight": float(weight), "follow_every": every, "follow_every_batches": batches}


def _parse_device(device: Any) -> torch.device:
    """A ``torch.device`` for ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a device, an
    int), checked against this machine. ``cpu`` makes no CUDA call."""
    torch = _torch()
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise InvalidArgumentError(f"device {device!r}: use 'cpu', 'cuda' or 'cuda:N' ({e})") from None
    if d.type == "cpu":
        return d  # type: ignore[no-any-return]
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
    return torch.device("cuda", index)  # type: ignore[no-any-return]


@dataclass
class Settings:
    """A loader's arguments, checked: what the Python loader keeps, and what the native ``Plan``
    takes (``parts``, ``native``)."""

    parts: List[Tuple[_native.Snapshot, PartOptions]]
    native: PlanOptions
    backend: Backend
    rank: int
    world: int
    transform: Optional[Transform]
    pin: bool
    device: Optional[torch.device]
    cast: Optional[torch.dtype]
    beta: Optional[float]
    per_iteration: Optional[int]
    cuda: bool
    staged_on_cpu: bool
    staging: int


def settle(datasets: Sequence[Snapshot], args: LoaderArgs, follow: Follow, mix: Optional[Mix]) -> Settings:
    """Checks and normalises the arguments of a loader over ``datasets`` (one, or those of
    ``mix``). ``args`` holds every argument of :meth:`Snapshot.loader` but ``follow``."""
    if mix is None:
        parts = [_part(1.0, follow)]
    else:
        _, weights, follows = mix
        parts = [_part(w, f, f"follow[{i}]") for i, (w, f) in enumerate(zip(weights, follows))]
    backend = args["backend"]
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"backend {backend!r}: use 'torch' or 'numpy'")
    sampler = args["sampler"]
    if sampler not in SAMPLERS:
        raise InvalidArgumentError(f"sampler {sampler!r}: use one of {', '.join(SAMPLERS)}")
    rank, world = _resolve_rank(args["rank"], args["world_size"])
    device = args["device"]
    transform = args["transform"]
    if transform is not None and not callable(transform):
        raise InvalidArgumentError("transform must be callable (a function of the batch)")
    pin = bool(args["pin_memory"])
    cast = args["dtype_cast"]
    beta = args["beta"]
    if beta is not None and sampler != "prioritized":
        raise InvalidArgumentError("beta (importance weights) needs sampler='prioritized'")
    staging = args["staging_slots"]
    parsed: Optional[torch.device]
    if backend == "numpy":
        if device not in ("cpu", None) or pin or cast is not None:
            raise InvalidArgumentError(
                "backend='numpy' hands out host arrays: device='cpu', no pin_memory, no dtype_cast"
            )
        parsed = None
        cast = None
    else:
        parsed = _parse_device(device)
        torch = _torch()
        if cast is not None and not (isinstance(cast, torch.dtype) and cast.is_floating_point):
            raise InvalidArgumentError(f"dtype_cast {cast!r}: a floating torch.dtype (torch.bfloat16, ...)")
        if pin and parsed.type == "cpu" and not torch.cuda.is_available():
            raise InvalidArgumentError("pin_memory=True needs CUDA (pinned memory is a CUDA feature)")
    episodes = args["episodes"]
    workers = args["workers"]
    if workers is None:
        # Each worker's gather is itself parallel (rayon, one thread per core): on two cores a
        # second worker only oversubscribes them (BENCHMARKS.md).
        workers = 1 if (os.cpu_count() or 1) <= 2 else 2
    episodes_sql: Optional[str] = None
    episode_ids: Optional[List[int]] = None
    if isinstance(episodes, str):
        episodes_sql = episodes
    elif episodes is not None and mix is not None:
        raise InvalidArgumentError(
            "episodes= in a mix: give a SQL query (each dataset answers it), not episode ids"
        )
    elif episodes is not None:
        ids: Any = episodes
        if hasattr(ids, "tolist"):  # NumPy array or tensor
            ids = ids.tolist()
        episode_ids = [int(i) for i in ids]
    columns = args["columns"]
    if columns is not None:
        if isinstance(columns, str):
            raise InvalidArgumentError("columns must be a list of names, not a string")
        names = list(columns)
    else:
        # Of a mix: the columns every dataset has, in the first one's order.
        names = [c for c in datasets[0].sample_columns if all(c in d.sample_columns for d in datasets[1:])]
    native: PlanOptions = {
        "slice_len": args["slice_len"],
        "num_slices": args["num_slices"],
        "columns": names,
        "workers": workers,
        "prefetch": args["prefetch"],
        "rank": rank,
        "world_size": world,
        "readahead": args["readahead"],
        "sampler": sampler,
        "policy": args["policy"],
        "weighting": args["weighting"],
        "seed": args["seed"],
        "alpha": args["alpha"],
        "drop_last": args["drop_last"],
        "episode_ids": episode_ids,
        "frame_stack": args["frame_stack"],
        "frame_pad": args["frame_pad"],
        "frame_channels_last": args["frame_channels_last"],
        "frame_window": args["frame_window"],
        "frame_cache": args["frame_cache"],
        "episodes_sql": episodes_sql,
    }
    if args["frame_channels_last"] and args["frame_stack"] is None:
        raise InvalidArgumentError(
            "frame_channels_last=True stacks frames along the last axis: give frame_stack=K too"
        )
    if args["frame_window"] and args["frame_stack"] is None:
        raise InvalidArgumentError(
            "frame_window=True gathers the frames of each slice's stacks once: give frame_stack=K too"
        )
    per_iteration = args["max_batches"]
    if per_iteration is not None and per_iteration < 1:
        raise InvalidArgumentError(f"max_batches={per_iteration}: at least 1")
    cuda = parsed is not None and parsed.type == "cuda"
    # Test hook: the staged path (slots, release order, closing) on CPU, with plain host
    # slots and a clone standing for the device copy, so that machines without a GPU test it.
    staged_on_cpu = not cuda and parsed is not None and os.environ.get("TRAJSTORE_STAGED_CPU") == "1"
    cuda = cuda or staged_on_cpu
    slots = staging if staging is not None else workers + native["prefetch"] + 2
    if cuda and slots < 2:
        raise InvalidArgumentError(f"staging_slots={staging}: at least 2")
    return Settings(
        parts=[(d._n, p) for d, p in zip(datasets, parts)],
        native=native,
        backend=backend,
        rank=rank,
        world=world,
        transform=transform,
        pin=pin and not cuda,
        device=parsed,
        cast=cast,
        beta=beta,
        per_iteration=per_iteration,
        cuda=cuda,
        staged_on_cpu=staged_on_cpu,
        staging=slots,
    )
