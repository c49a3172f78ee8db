"""What a dataset version says about itself, from its catalog: shared by :class:`Snapshot`
(memory-mapped) and :class:`StreamedSnapshot` (streamed through a cache), whose native objects
answer the same calls."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


class Described:
    """The version's identity, sizes, schema and summary (``len(ds)`` is its transitions)."""

    # `_native.Snapshot` or `_native.Stream` (the subclass says which).
    _n: Any

    @property
    def uri(self) -> str:
        """What it was opened from."""
        return str(self._n.uri)

    @property
    def path(self) -> str:
        """The local directory: the dataset mapped, or the mirror of a dataset in object storage
        (a stream's catalog, and its ranks' caches under ``_stream/``)."""
        return str(os.fspath(self._n.path))

    @property
    def version(self) -> int:
        """The committed version this object reads."""
        return int(self._n.version)

    @property
    def num_transitions(self) -> int:
        return int(self._n.num_transitions)

    @property
    def num_episodes(self) -> int:
        return int(self._n.num_episodes)

    def __len__(self) -> int:
        return int(self._n.num_transitions)

    @property
    def schema(self) -> pa.Schema:
        """The transitions' schema (observation, action, reward, boundary columns, ...)."""
        import pyarrow as pa

        return pa.schema(self._n)

    def episodes_where(self, query: str) -> np.ndarray:
        """The sorted, distinct episode ids returned by ``query`` (which must return an
        ``episode_id`` column), as an ``int64`` array: a subset for ``loader``'s ``episodes=``.
        On a stream, ``episodes`` is answered from the catalog and ``transitions`` with ranged
        reads of the columns the query uses (nothing is mirrored)."""
        import numpy as np

        return np.from_dlpack(self._n.episodes_where(query))

    @property
    def sample_columns(self) -> List[str]:
        """The columns a loader can gather (``next_observation`` included, derived from the
        episode when the dataset does not store it)."""
        return list(self._n.sample_columns())

    def info(self, bins: int = 12) -> str:
        """What ``trajstore info`` prints: counts, sizes, schema, and episode length and return
        summaries with histograms of ``bins`` bins (0: none)."""
        return str(self._n.info(bins))

    def info_dict(self) -> Dict[str, Any]:
        """What ``trajstore info --json`` prints, as a dict."""
        info: Dict[str, Any] = json.loads(self._n.info_json())
        return info
