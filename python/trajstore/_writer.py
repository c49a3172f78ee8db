"""Writing: datasets from collectors (whole episodes or step by step) and from files."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _native
from ._types import FrameCodec
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

PathLike = Union[str, "os.PathLike[str]"]

BOUNDARY = ("observation", "action", "reward", "next_observation")


def create(
    path: PathLike,
    observation_shape: Sequence[int],
    action_shape: Optional[Sequence[int]] = None,
    *,
    observation_dtype: str = "float32",
    store_next_observation: bool = False,
    columns: Optional[Mapping[str, Tuple[str, Sequence[int]]]] = None,
    append: bool = False,
    segment_bytes: Optional[int] = None,
    lock_wait: float = 0.5,
    frame_codec: Optional[FrameCodec] = None,
    frame_level: Optional[int] = None,
) -> Writer:
    """Creates a dataset at ``path`` and returns its (single) writer.

    - ``observation_shape``: e.g. ``(17,)`` or ``(3, 84, 84)`` with ``observation_dtype="uint8"``.
    - ``action_shape``: ``(6,)`` for continuous ``float32`` actions; ``None`` for a discrete
      action (one ``int64`` per step).
    - ``store_next_observation``: store o_{t+1} per step (default: derived from the next step
      and each episode's final observation, half the bytes).
    - ``columns``: extra per-step columns, ``{"qpos": ("float64", (15,)), "cost": ("float32", ())}``.
    - ``append``: if ``path`` already holds a dataset, append to it (its schema must match)
      instead of failing.
    - ``frame_codec``: store ``uint8`` image observations (``[H, W]`` or ``[H, W, C]``) as a
      frame column, one compressed frame per step: ``"zstd-dict"`` (zstd with a dictionary
      trained on the first episodes; about 60-85x smaller on Atari frames), ``"zstd"`` or
      ``"none"``. Append raw frames; loaders stack them with ``frame_stack=K``. Give each
      episode's ``final_observation`` (its last next frame) where the environment has one.
    - ``frame_level``: the frame column's zstd level, 1 to 22 (default 5; higher compresses
      slower into fewer bytes, and decodes as fast or faster). Ignored by readers.

    Use it as a context manager: leaving the block normally commits what was appended; an
    exception discards everything since the last :meth:`Writer.commit` and releases the lock::

        with trajstore.create("new.trajstore", observation_shape=(17,), action_shape=(6,)) as w:
            w.append_episode(observation=obs, action=act, reward=rew, terminated=True)
    """
    cols = None
    if columns:
        cols = [(name, str(dtype), [int(d) for d in shape]) for name, (dtype, shape) in columns.items()]
    native = _native.create(
        os.fspath(path),
        [int(d) for d in observation_shape],
        None if action_shape is None else [int(d) for d in action_shape],
        observation_dtype=str(observation_dtype),
        store_next_observation=store_next_observation,
        columns=cols,
        append=append,
        segment_bytes=segment_bytes,
        lock_wait_ms=int(lock_wait * 1000),
        frame_codec=frame_codec,
        frame_level=frame_level,
    )
    return Writer(native)


def ingest(input: PathLike, dataset: PathLike, **options: Any) -> Dict[str, Any]:
    """Ingests a file (or directory) into the dataset at ``dataset`` (created, or appended to
    when it exists with the same schema), as ``trajstore ingest`` does: Parquet, NumPy
    (``.npz`` or a directory of ``.npy``), D4RL/Minari HDF5, Arrow IPC, LeRobot (Parquet
    directory) and TorchRL (``rb.dumps`` directory). Options (as the CLI's flags):
    ``format``, ``episode_col``, ``terminated_col``, ``truncated_col``, ``observation_col``,
    ``observation_cols``, ``action_col``, ``action_cols``, ``reward_col``, ``no_reward``,
    ``next_observation_col``, ``drop_cols``, ``batch_rows``, ``segment_bytes``.

    Pixel observations: uint8 images (two or more spatial axes) become a frame column,
    compressed one frame per step (``frame_codec``: ``"zstd-dict"``, the default, ``"zstd"``
    or ``"none"``; ``frame_level``: zstd's level for a dataset the ingest creates, 1 to 22,
    default 5; ``keep_tensor=True`` keeps them as a tensor column); ``unstack=K`` stores
    stacked observations (``[H, W, K]`` or ``[K, H, W]``, as Atari wrappers make them) as
    single frames after checking that consecutive stacks overlap. ``format="dqn"`` (recognised
    without it) reads dopamine's DQN Replay layout, with ``stack_size`` (default 4) and
    ``checkpoints`` (a list of checkpoint numbers; default all).

    A TFDS/RLDS directory (``dataset_info.json``, ``features.json``, ``*.tfrecord-*``; recognised,
    or ``format="rlds"``) takes ``splits`` (a list of split names), ``observation_col`` (the step
    feature that becomes the observation), ``drop_cols``, ``frame_codec``, ``frame_level`` and
    ``keep_tensor``.

    A directory of ``.npz`` shards is one dataset (name order); ``convention``: ``"rows"``,
    ``"ogbench"`` (recognised from OGBench's keys) or ``"episode-files"`` (one episode per file,
    ``T + 1`` observations; recognised), as the CLI's ``--convention``.

    Returns the report: rows, episodes, version, seconds, column mapping, boundaries. Nothing is
    committed when it fails."""
    report: Dict[str, Any] = json.loads(_native.ingest(os.fspath(input), os.fspath(dataset), options))
    return report


def _step_shape(field: pa.Field, width: int) -> Tuple[int, ...]:
    """The shape of one step of ``field``: its ``arrow.fixed_shape_tensor`` shape, else
    ``(width,)`` for a fixed-size list, else ``()``."""
    import pyarrow as pa

    t = field.type
    shape = getattr(t, "shape", None)  # pa.FixedShapeTensorType
    if shape is not None:
        return tuple(int(d) for d in shape)
    meta = field.metadata or {}
    if meta.get(b"ARROW:extension:name") == b"arrow.fixed_shape_tensor":
        return tuple(int(d) for d in json.loads(meta[b"ARROW:extension:metadata"])["shape"])
    return (width,) if pa.types.is_fixed_size_list(t) else ()


def _squeeze(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _numpy(x: Any) -> np.ndarray:
    import numpy as np

    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x)


class Writer:
    """The single writer of a dataset: holds its lock (a second writer gets
    :class:`~trajstore.LockedError`) until :meth:`close`. Appended episodes become durable and
    visible to readers, atomically, at :meth:`commit`; a crash before it loses only what was
    appended since the last commit."""

    def __init__(self, native: _native.Writer) -> None:
        import pyarrow as pa

        self._n = native
        self._schema: pa.Schema = pa.schema(native.payload_schema())
        self._steps: List[Dict[str, np.ndarray]] = []

    @property
    def schema(self) -> pa.Schema:
        """The columns of one step (observation, action, reward, [next_observation], extras)."""
        return self._schema

    @property
    def next_episode_id(self) -> int:
        return self._n.next_episode_id()

    @property
    def closed(self) -> bool:
        return self._n.closed

    def _column(self, field: pa.Field, value: Any, steps: Optional[int]) -> pa.Array:
        import numpy as np
        import pyarrow as pa

        t = field.type
        if isinstance(t, pa.BaseExtensionType):  # observations: arrow.fixed_shape_tensor
            t = t.storage_type
        if pa.types.is_fixed_size_list(t):
            elem, width = t.value_type, t.list_size
        else:
            elem, width = t, 1
        arr = _numpy(value)
        if arr.dtype == object:
            raise InvalidArgumentError(f"column `{field.name}`: expected a numeric array")
        try:
            arr = np.ascontiguousarray(arr, dtype=elem.to_pandas_dtype())
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"column `{field.name}`: cannot convert to {elem}: {e}") from None
        n = arr.shape[0] if arr.ndim > 0 else 1
        if steps is not None and n != steps:
            raise InvalidArgumentError(
                f"column `{field.name}` has {n} steps, `observation` has {steps}"
            )
        # Shapes, not counts: a [T, 84, 84, 3] image into a (3, 84, 84) column has the right
        # number of values and would be stored scrambled.
        want = _step_shape(field, width)
        got = tuple(arr.shape[1:]) if arr.ndim > 0 else ()
        # Size-1 axes added or dropped never reorder values: (84, 84, 1) into (84, 84) is fine.
        if _squeeze(got) != _squeeze(want):
            raise InvalidArgumentError(
                f"column `{field.name}`: each step is shaped {got}, the dataset's is {want} "
                f"(array of shape {tuple(arr.shape)}; steps come first). Transpose or reshape it "
                f"to the dataset's layout (e.g. channel-first vs channel-last images)"
            )
        flat = pa.array(arr.reshape(-1))
        if pa.types.is_fixed_size_list(t):
            return pa.FixedSizeListArray.from_arrays(flat, width)
        return flat

    def append_episode(
        self,
        observation: Any,
        action: Any,
        reward: Any,
        *,
        terminated: bool = False,
        truncated: Optional[bool] = None,
        next_observation: Any = None,
        final_observation: Any = None,
        **columns: Any,
    ) -> int:
        """Appends one episode of ``T`` steps (NumPy arrays, torch tensors or lists; converted
        to the dataset's types): ``observation [T, *obs_shape]``, ``action [T, act_dim]`` (or
        ``[T]`` integers), ``reward [T]``, the extra columns by name, and how it ended:
        ``terminated`` (a terminal state), else ``truncated`` (default: not terminated).
        ``final_observation`` (o_T) is kept when ``next_observation`` is derived;
        ``next_observation [T, ...]`` is required when the dataset stores it.

        Not durable before :meth:`commit`. Returns the episode's id."""
        values = dict(columns, observation=observation, action=action, reward=reward)
        if next_observation is not None:
            values["next_observation"] = next_observation
        steps = _numpy(observation).shape[0] if _numpy(observation).ndim > 0 else None
        arrays = []
        for field in self._schema:
            if field.name not in values:
                raise InvalidArgumentError(f"the episode has no `{field.name}` column")
            arrays.append(self._column(field, values.pop(field.name), steps))
        if values:
            raise InvalidArgumentError(
                f"the dataset has no column(s) {', '.join(sorted(values))} (its columns: "
                f"{', '.join(self._schema.names)})"
            )
        import pyarrow as pa

        # Plain storage types; the Rust side puts the columns in the dataset's schema (with its
        # field metadata, the tensor extension's among them).
        batch = pa.RecordBatch.from_arrays(arrays, names=self._schema.names)
        final = None
        if final_observation is not None:
            obs_field = self._schema.field("observation")
            final = pa.RecordBatch.from_arrays(
                [self._column(obs_field, _numpy(final_observation)[None, ...], 1)], names=["observation"]
            )
        if truncated is None:
            truncated = not terminated
        return self._n.append_episode(batch, bool(terminated), bool(truncated), final)

    def append_step(
        self, observation: Any, action: Any, reward: float, *, next_observation: Any = None, **columns: Any
    ) -> None:
        """Adds one step to the episode in progress (for collectors that produce steps); the
        episode is appended by :meth:`end_episode`. A process that dies mid-episode loses that
        episode only."""
        import numpy as np

        step = dict(columns, observation=_numpy(observation), action=_numpy(action), reward=np.float32(reward))
        if next_observation is not None:
            step["next_observation"] = _numpy(next_observation)
        self._steps.append(step)

    def end_episode(
        self, *, terminated: bool = False, truncated: Optional[bool] = None, final_observation: Any = None
    ) -> int:
        """Appends the episode built with :meth:`append_step`; returns its id."""
        if not self._steps:
            raise InvalidArgumentError("end_episode: no step was appended since the last episode")
        import numpy as np

        steps, self._steps = self._steps, []
        cols = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
        return self.append_episode(
            terminated=terminated, truncated=truncated, final_observation=final_observation, **cols
        )

    def set_property(self, key: str, value: str) -> None:
        """A dataset property (``env_id``, ``policy``, ...), saved with the next commit."""
        self._n.set_property(str(key), str(value))

    def commit(self) -> int:
        """Makes the appended episodes durable and visible as a new version, atomically.
        Returns the version."""
        return self._n.commit()

    def close(self) -> None:
        """Releases the lock; episodes appended since the last commit are discarded."""
        self._steps = []
        self._n.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None and not self.closed:
                self.commit()
        finally:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"next episode {self.next_episode_id}"
        return f"<trajstore.Writer {state}; columns {', '.join(self._schema.names)}>"
