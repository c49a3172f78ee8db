"""Streaming a dataset from object storage through a bounded local cache: ``trajstore.open(url,
cache_limit="50GiB")`` (Rust's ``trajstore::remote::Stream`` and ``StreamLoader``)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, cast

from . import _native
from ._described import Described
from ._types import LoaderArgs

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._loader import Loader


class StreamedSnapshot(Described):
    """One committed version of a dataset in object storage, opened for streaming by
    :func:`trajstore.open` with ``cache_limit``: only its catalog (manifest and episode tables,
    O(episodes)) is downloaded. A loader reads the transition files through a cache of at most
    ``rank_cache_limit`` bytes on disk (``cache_limit`` shared by the node's ``ranks_per_node``
    ranks, under ``cache_dir``, downloads in progress included; a file another rank of the node
    holds is hard-linked, not downloaded again), evicting the least recently used file no batch
    in flight needs, and downloading the next window's files while the current one is sampled.
    A node needs disk for the cache, not for the dataset.

    ``len(ds)``, ``num_episodes``, ``schema``, ``sample_columns`` and ``info()`` answer from
    the catalog alone; ``episodes_where(query)`` from the catalog and ranged reads. For SQL at
    large, or for samplers a stream cannot run (``prioritized``, ``episodes``,
    ``epoch_episodes``), open without ``cache_limit`` (the whole version is mirrored)."""

    _n: _native.Stream

    def __init__(self, native: _native.Stream) -> None:
        self._n = native

    @property
    def transition_bytes(self) -> int:
        """Bytes of the version's transition files: what mirroring it would download."""
        return self._n.transition_bytes

    @property
    def cache_limit(self) -> int:
        """The node's cache limit, in bytes: all its ranks' caches together."""
        return self._n.cache_limit

    @property
    def ranks_per_node(self) -> int:
        """Ranks of this node that share :attr:`cache_limit`."""
        return self._n.ranks_per_node

    @property
    def rank_cache_limit(self) -> int:
        """One rank's share of :attr:`cache_limit`, in bytes."""
        return self._n.rank_cache_limit

    @property
    def reuse(self) -> float:
        """How many times, on average, the uniform sampler draws each transition per round."""
        return self._n.reuse

    def __repr__(self) -> str:
        return f"<trajstore.StreamedSnapshot {self.uri} v{self.version}, cache {self.cache_limit} B>"

    def loader(self, **loader_args: Unpack[LoaderArgs]) -> Loader:
        """Batches sampled through the cache, with the keyword arguments and the batch layout of
        :meth:`trajstore.Snapshot.loader` (its defaults: ``slice_len=64, num_slices=256``; CPU, or
        CUDA through the same pinned staging ring as a local dataset's; ``frame_stack``;
        ``rank="auto"`` takes ``torch.distributed``'s rank and world size, or ``RANK`` and
        ``WORLD_SIZE``). Samplers, as the batches are drawn:

        - ``"uniform"`` (default; endless): batches are numbered per rank and grouped into
          rounds; each round the version's files are shuffled and dealt to the ranks (disjoint
          shares that together cover the version: N ranks download the dataset once per round
          in total), and a rank cuts its share into windows of at most a third of the cache.
          Every batch draws its slices uniformly (or as ``weighting`` says) inside one window,
          so the slices of a batch are correlated within a window, as in Mosaic Streaming's
          shuffle blocks; over a round every slice of a rank's share has the same expected
          number of draws, and over ranks and rounds every slice of the version is equally
          likely.
        - ``"epoch"``: an iteration is an epoch; each window's slices are visited once in a
          shuffled order, and every rank stops at the shortest rank's epoch, so that every rank
          yields the same number of batches (collective operations never wait on a rank that
          has stopped).

        Everything is a pure function of ``seed``, the rank, the world size and the batch
        number, whatever ``workers``: ``state_dict()`` is the next batch's number (and what it
        depends on), and ``load_state_dict`` continues exactly there after a restart, reusing
        the files the cache kept and resuming partial downloads.

        ``follow=True``: at the end of every round (every epoch, for ``"epoch"``) the loader
        reads the store's newest manifest and, when a version was committed since, continues
        with it: its batches are numbered on from that batch, drawn by the new version's
        schedule (the files it shares with the old one stay cached), and ``state_dict()``
        records the version and the batch it began at (``version_base``), so that a restart
        continues exactly. With several ranks the ranks must agree on every round's version:
        they do it through ``torch.distributed`` (initialize it first, as torchrun scripts do):
        at each round boundary, which every rank reaches at the same batch, rank 0 reads the
        newest version and a broadcast gives it to the others.

        ``episodes=`` (ids, or a SQL query answered as :meth:`episodes_where` answers it) and
        ``weighting="episodes"`` work with ``"uniform"``: rounds deal and windows are given
        batches by each segment's share of the draws (its slices, or episodes, in the subset),
        so a segment holding no episode of the subset is never downloaded, and each window
        draws only the subset's slices. Not available on a stream: the ``prioritized``,
        ``epoch_episodes`` and ``episodes`` samplers."""
        from ._dataset import Snapshot
        from ._loader import make_loader

        bound = inspect.signature(Snapshot.loader).bind(cast(Snapshot, self), **loader_args)
        bound.apply_defaults()
        args = {k: v for k, v in bound.arguments.items() if k not in ("self", "follow")}
        return make_loader(self, cast(LoaderArgs, args), follow=bound.arguments.get("follow"))
