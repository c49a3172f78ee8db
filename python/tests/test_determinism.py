"""Determinism and sharding: the stream of batches is a function of the seed (and the rank), not
of the number of workers; ranks draw disjoint parts of the one global stream."""

from __future__ import annotations

import collections

import pytest

from trajref import same_batches, slice_keys, take

KW = dict(slice_len=8, num_slices=12)


def test_same_seed_same_batches(demo_ds):
    a = take(demo_ds.loader(**KW, seed=42, max_batches=8), 8)
    b = take(demo_ds.loader(**KW, seed=42, max_batches=8), 8)
    assert len(a) == 8
    assert same_batches(a, b)


def test_different_seed_different_batches(demo_ds):
    a = take(demo_ds.loader(**KW, seed=1, max_batches=8), 8)
    b = take(demo_ds.loader(**KW, seed=2, max_batches=8), 8)
    assert not same_batches(a, b)
    # Not just one slice: the slice choices differ almost everywhere.
    ka, kb = slice_keys(a), slice_keys(b)
    assert sum(x != y for x, y in zip(ka, kb)) > len(ka) // 2


@pytest.mark.parametrize("sampler", ["uniform", "epoch", "prioritized", "episodes"])
def test_workers_do_not_change_the_stream(demo_ds, sampler):
    one = take(demo_ds.loader(**KW, sampler=sampler, seed=9, workers=1, prefetch=1, max_batches=16), 16)
    four = take(demo_ds.loader(**KW, sampler=sampler, seed=9, workers=4, prefetch=8, max_batches=16), 16)
    assert len(one) == 16
    assert same_batches(one, four)


def test_same_seed_same_batches_numpy_backend(demo_ds):
    a = take(demo_ds.loader(**KW, seed=5, max_batches=4, backend="numpy"), 4)
    b = take(demo_ds.loader(**KW, seed=5, max_batches=4, workers=3), 4)
    assert same_batches(a, b)


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_ranks_draw_interleaved_global_batches(demo_ds, sampler):
    """Batch k of rank r is batch k * world + r of the world_size=1 stream: disjoint ranks that
    together draw the whole stream."""
    world, n = 2, 6
    full = take(demo_ds.loader(**KW, sampler=sampler, seed=3, max_batches=world * n), world * n)
    for r in range(world):
        mine = take(demo_ds.loader(**KW, sampler=sampler, seed=3, rank=r, world_size=world, max_batches=n), n)
        assert len(mine) == n
        assert same_batches(mine, full[r::world]), f"rank {r}"
    r0 = take(demo_ds.loader(**KW, sampler=sampler, seed=3, rank=0, world_size=world, max_batches=n), n)
    r1 = take(demo_ds.loader(**KW, sampler=sampler, seed=3, rank=1, world_size=world, max_batches=n), n)
    assert not any(same_batches([x], [y]) for x in r0 for y in r1)


def test_rank_auto_reads_environment(demo_ds, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    full = take(demo_ds.loader(**KW, seed=4, max_batches=6), 6)
    mine = take(demo_ds.loader(**KW, seed=4, rank="auto", max_batches=2), 2)
    assert same_batches(mine, [full[1], full[4]])


def _num_slices_with_epoch_parity(ref, slice_len, parity, candidates=range(8, 17)):
    windows = len(ref.windows(slice_len))
    for ns in candidates:
        per = -(-windows // ns)
        if per % 2 == parity:
            return ns, per, windows
    raise AssertionError("no batch size gives that parity")


def _epoch_ranks(demo_ds, ns, world=2):
    keys = []
    for r in range(world):
        loader = demo_ds.loader(slice_len=8, num_slices=ns, sampler="epoch", seed=6, rank=r, world_size=world)
        keys.append(slice_keys(take(loader, 10**9)))
    return keys


def test_epoch_ranks_disjoint_and_complete_even_epoch(demo_ds, ref):
    ns, per, windows = _num_slices_with_epoch_parity(ref, 8, 0)
    all_windows = ref.windows(8)
    loader = demo_ds.loader(slice_len=8, num_slices=ns, sampler="epoch", seed=6, rank=0, world_size=2)
    assert loader.batches_per_epoch == per
    assert len(loader) == per // 2
    k0, k1 = _epoch_ranks(demo_ds, ns)
    # Each rank sees each of its windows once; the ranks are disjoint and together cover every
    # strict window of the dataset (computed from the episode files) exactly once.
    assert len(k0) == len(set(k0)) and len(k1) == len(set(k1))
    assert not set(k0) & set(k1)
    assert set(k0) | set(k1) == all_windows
    assert len(k0) + len(k1) == windows


def test_epoch_ranks_odd_epoch_pad_inside_the_epoch(demo_ds, ref):
    """With an odd number of batches per epoch, both ranks take the same number of batches (data-
    parallel steps stay in lockstep), every window is covered, no rank sees a window twice, and the
    only windows both ranks see are those of the one padding batch (a batch of the same epoch, as
    DistributedSampler pads) - never the next epoch's."""
    ns, per, windows = _num_slices_with_epoch_parity(ref, 8, 1)
    k0, k1 = _epoch_ranks(demo_ds, ns)
    lens = [
        len(demo_ds.loader(slice_len=8, num_slices=ns, sampler="epoch", seed=6, rank=r, world_size=2))
        for r in (0, 1)
    ]
    assert lens == [(per + 1) // 2] * 2, lens
    assert len(k0) == len(set(k0)) and len(k1) == len(set(k1)), "a rank draws a window twice"
    assert set(k0) | set(k1) == ref.windows(8)
    assert len(set(k0) & set(k1)) <= ns, f"{len(set(k0) & set(k1))} windows drawn by both ranks"


def test_epoch_covers_every_window_once(demo_ds, ref):
    loader = demo_ds.loader(slice_len=8, num_slices=16, sampler="epoch", seed=1)
    keys = slice_keys(take(loader, 10**9))
    counts = collections.Counter(keys)
    assert set(counts) == ref.windows(8)
    assert max(counts.values()) == 1
