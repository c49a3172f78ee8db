"""Loader behaviour: iteration length, epochs, resumption, DataLoader, NumPy backend, dtypes,
zero-copy batches and their recycling, episode subsets, prioritized replay."""

from __future__ import annotations

import collections
import gc

import numpy as np
import pytest

import trajstore
from trajref import assert_batch_matches, batch_numpy, same_batches, slice_keys, take

torch = pytest.importorskip("torch")

KW = dict(slice_len=8, num_slices=8)
# Batches a worker of the CPU loader runs ahead in one go when its batches are small (MAX_BURST in
# src/loader/pipeline.rs).
BURST = 4


def test_max_batches_stops_and_len(demo_ds):
    loader = demo_ds.loader(**KW, max_batches=7)
    assert len(loader) == 7
    got = list(loader)
    assert [b.index for b in got] == list(range(7))
    # Iterating again continues the stream: the next 7 batches.
    again = list(loader)
    assert [b.index for b in again] == list(range(7, 14))
    assert loader.position == 14


def test_endless_loader_has_no_len(demo_ds):
    loader = demo_ds.loader(**KW)
    with pytest.raises(TypeError):
        len(loader)
    it = iter(loader)
    assert [next(it).index for _ in range(30)] == list(range(30))


def test_len_of_epoch_sampler(demo_ds, ref):
    windows = len(ref.windows(8))
    loader = demo_ds.loader(slice_len=8, num_slices=16, sampler="epoch")
    per = -(-windows // 16)
    assert loader.batches_per_epoch == per
    assert len(loader) == per
    batches = list(loader)
    assert len(batches) == per
    # Every batch is full but the last, which holds the remainder.
    assert all(b.num_slices == 16 for b in batches[:-1])
    assert batches[-1].num_slices == windows - 16 * (per - 1)
    # drop_last: only full batches.
    dl = demo_ds.loader(slice_len=8, num_slices=16, sampler="epoch", drop_last=True)
    assert len(dl) == windows // 16 == dl.batches_per_epoch
    assert all(b.num_slices == 16 for b in dl)
    # max_batches wins over the epoch.
    assert len(demo_ds.loader(slice_len=8, num_slices=16, sampler="epoch", max_batches=5)) == 5


def test_epoch_iterations_are_different_permutations(demo_ds, ref):
    loader = demo_ds.loader(slice_len=8, num_slices=16, sampler="epoch", seed=2, rank=0, world_size=1)
    e0 = slice_keys(batch_numpy(b) for b in loader)
    e1 = slice_keys(batch_numpy(b) for b in loader)
    windows = ref.windows(8)
    for keys in (e0, e1):
        assert len(keys) == len(windows)
        assert collections.Counter(keys).most_common(1)[0][1] == 1
        assert set(keys) == windows
    assert e0 != e1, "the second epoch must be shuffled differently"
    # ... and not nearly the same order: few positions hold the same window in both epochs.
    assert sum(a == b for a, b in zip(e0, e1)) < len(e0) // 100


def test_epoch_episodes_sampler_visits_each_episode_once(demo_ds, ref):
    loader = demo_ds.loader(slice_len=16, num_slices=8, sampler="epoch_episodes", seed=1)
    keys = slice_keys(batch_numpy(b) for b in loader)
    eligible = {e.id for e in ref.episodes.values() if e.length >= 16}
    ids = [e for e, _ in keys]
    assert len(ids) == len(set(ids)) and set(ids) == eligible
    assert len(loader) == -(-len(eligible) // 8)


def test_state_dict_resumes_exactly(demo_ds):
    args = dict(**KW, seed=17, workers=3)
    a = demo_ds.loader(**args)
    it = iter(a)
    first = [batch_numpy(next(it)) for _ in range(5)]
    state = a.state_dict()
    assert state["next_batch"] == 5 and state["format"] == "trajstore.loader_state"
    assert state["priorities"] == [None]
    sixth_a = batch_numpy(next(it))
    b = demo_ds.loader(**args)
    b.load_state_dict(state)
    sixth_b = batch_numpy(next(iter(b)))
    assert same_batches([sixth_a], [sixth_b])
    assert not same_batches([first[0]], [sixth_b])
    # And it goes on identically.
    it_b = iter(b)
    assert same_batches([batch_numpy(next(it)) for _ in range(3)], [batch_numpy(next(it_b)) for _ in range(3)])


def _epoch_preempted(demo_ds, args, at):
    """An uninterrupted run: the rest of the epoch after batch ``at`` and the next epoch; and the
    state saved at ``at``."""
    a = demo_ds.loader(**args)
    it = iter(a)
    for _ in range(at):
        next(it)
    state = a.state_dict()
    rest = [batch_numpy(b) for b in it]
    following = [batch_numpy(b) for b in a]
    return state, rest, following


def test_state_dict_resumes_epoch_sampler_stream(demo_ds):
    args = dict(slice_len=8, num_slices=16, sampler="epoch", seed=4)
    state, rest, following = _epoch_preempted(demo_ds, args, 10)
    assert state["next_batch"] == 10 and len(rest) == len(following) - 10
    b = demo_ds.loader(**args)
    b.load_state_dict(state)
    resumed = [batch_numpy(x) for x in b] + [batch_numpy(x) for x in b]
    resumed = resumed[: len(rest) + len(following)]
    # The stream of batches continues exactly where the first run stopped.
    assert same_batches(resumed, rest + following)


def test_state_dict_resumes_epoch_sampler_iterations(demo_ds):
    args = dict(slice_len=8, num_slices=16, sampler="epoch", seed=4)
    state, rest, following = _epoch_preempted(demo_ds, args, 10)
    b = demo_ds.loader(**args)
    b.load_state_dict(state)
    first = [batch_numpy(x) for x in b]
    assert len(first) == len(rest), f"the resumed iteration yields {len(first)} batches, the rest of the epoch is {len(rest)}"
    assert same_batches(first, rest)
    assert same_batches([batch_numpy(x) for x in b], following)


def test_torch_dataloader(demo_ds):
    from torch.utils.data import DataLoader, IterableDataset

    loader = demo_ds.loader(**KW, seed=8, max_batches=5)
    assert isinstance(loader, IterableDataset)
    direct = take(demo_ds.loader(**KW, seed=8, max_batches=5), 5)
    via = [batch_numpy(b) for b in DataLoader(loader, batch_size=None)]
    assert len(via) == 5
    assert same_batches(via, direct)


def test_numpy_backend_equals_torch(demo_ds, ref):
    t = list(demo_ds.loader(**KW, seed=12, max_batches=4))
    n = list(demo_ds.loader(**KW, seed=12, max_batches=4, backend="numpy"))
    assert len(n) == 4
    for bt, bn in zip(t, n):
        assert set(bt) == set(bn)
        for k, v in bn.items():
            assert isinstance(v, np.ndarray), k
            tv = bt[k].numpy()
            assert v.dtype == tv.dtype and v.shape == tv.shape, k
            np.testing.assert_array_equal(v, tv)
        assert_batch_matches(ref, bn, ["observation", "action", "reward", "next_observation"])
        # NumPy arrays are views of the gathered buffers (DLPack), not copies.
        assert not bn["observation"].flags.owndata


def test_flags_are_bool_and_ids_int64(demo_ds):
    b = next(iter(demo_ds.loader(**KW, max_batches=1)))
    for f in ("mask", "is_first", "is_last", "terminated", "truncated", "slice_end"):
        assert b[f].dtype == torch.bool and tuple(b[f].shape) == (8, 8)
    assert b["episode_id"].dtype == torch.int64 and b["start_step"].dtype == torch.int64
    assert b["reward"].dtype == torch.float32 and b["action"].dtype == torch.float32
    assert b.num_slices == 8


def test_held_batches_are_not_overwritten(demo_ds, ref):
    """Tensors alias the Rust buffers, which are recycled only once every tensor viewing them is
    freed: held batches (or single held tensors) keep their values while many more batches are
    produced."""
    loader = demo_ds.loader(**KW, seed=21, workers=2, prefetch=2)
    it = iter(loader)
    held = next(it)
    held_copy = batch_numpy(held)
    lone_obs = next(it)["observation"]  # the rest of that batch is freed at once
    lone_copy = lone_obs.clone()
    held_np = next(iter(demo_ds.loader(**KW, seed=22, backend="numpy", max_batches=1)))
    np_copy = batch_numpy(held_np)
    for _ in range(20):
        b = next(it)
        del b
    gc.collect()
    for _ in range(20):
        next(it)
    assert same_batches([batch_numpy(held)], [held_copy])
    assert torch.equal(lone_obs, lone_copy)
    assert same_batches([batch_numpy(held_np)], [np_copy])
    assert_batch_matches(ref, held, ["observation", "action", "reward", "next_observation"])


def test_buffers_are_recycled_only_when_released(demo_ds):
    def distinct_pointers(hold):
        kept, ptrs = [], set()
        for b in demo_ds.loader(**KW, seed=1, workers=1, prefetch=1, max_batches=40):
            ptrs.add(b["observation"].data_ptr())
            if hold:
                kept.append(b)
        return len(ptrs)

    # Held: 40 batches, 40 distinct buffers. Released at once: the same few buffers come back (one
    # worker's burst of up to 4, one queued, the caller's and the one being handed over).
    assert distinct_pointers(True) == 40
    assert distinct_pointers(False) <= BURST + 1 + 3


def test_batches_in_flight_are_bounded(demo_ds):
    """A loader keeps at most a burst of batches per worker (up to 4 for batches this small; see
    ``LoaderOptions::prefetch``), ``prefetch`` queued and the consumer's: a batch buffer is
    allocated only when none is free, so the number of distinct buffers seen while releasing every
    batch at once is the most batches that were ever alive together."""
    workers, prefetch = 4, 1
    # + the batch held by the caller and the one being handed over
    bound = workers * BURST + prefetch + 3
    seen = []
    for trial in range(3):
        ptrs = set()
        for b in demo_ds.loader(**KW, seed=trial, workers=workers, prefetch=prefetch, max_batches=300):
            ptrs.add(b["observation"].data_ptr())
        seen.append(len(ptrs))
    assert max(seen) <= bound, f"distinct batch buffers per run: {seen}, bound {bound}"


def test_episode_subset_ids(demo_ds, ref):
    subset = [3, 10, 42, 100, 150]
    for batch in demo_ds.loader(**KW, episodes=subset, seed=1, max_batches=10):
        ids = set(batch["episode_id"].tolist())
        assert ids <= set(subset)
        assert_batch_matches(ref, batch, ["observation", "reward"])
    loader = demo_ds.loader(**KW, episodes=np.array(subset), weighting="episodes", seed=1, max_batches=30)
    seen = set(slice_keys(take(loader, 30)))
    assert {e for e, _ in seen} == {e for e in subset if ref.episodes[e].length >= 8}


def test_episode_subset_sql(demo_ds, ref):
    q = "SELECT episode_id FROM episodes WHERE episode_return > 150 AND terminated"
    want = {e.id for e in ref.episodes.values() if e.ret > 150 and e.terminated}
    assert 0 < len(want) < ref_len(ref) // 4
    seen = set()
    for batch in demo_ds.loader(**KW, episodes=q, seed=2, max_batches=20):
        ids = set(batch["episode_id"].tolist())
        assert ids <= want
        seen |= ids
    assert len(seen) > 1


def ref_len(ref):
    return len(ref.episodes)


def test_prioritized_update_concentrates_sampling(demo_ds):
    # One worker: batches are planned at most `prefetch` + 2 batches ahead of the consumer (with more
    # workers, see test_batches_in_flight_are_bounded).
    loader = demo_ds.loader(**KW, sampler="prioritized", alpha=1.0, seed=5, workers=1, prefetch=2)
    it = iter(loader)
    first = next(it)
    target = int(first["episode_id"][0])
    counts_before = collections.Counter()
    for _ in range(10):
        b = next(it)
        counts_before.update(b["episode_id"].tolist())
    assert counts_before[target] < 20, "uniform priorities: the target episode is not special yet"
    # Priorities by batch (its episode_id/start_step): huge for the target episode's slices, ~0 for
    # every other slice drawn.
    loader.update_priorities(first, torch.where(first["episode_id"] == target, 1e6, 1e-6))
    for _ in range(30):
        b = next(it)
        p = torch.where(b["episode_id"] == target, torch.tensor(1e6), torch.tensor(1e-6))
        loader.update_priorities(b, p)
    # Updating by index also works (the number of a recent batch).
    loader.update_priorities(b.index, torch.where(b["episode_id"] == target, 1e6, 1e-6))
    counts = collections.Counter()
    for _ in range(20):
        counts.update(next(it)["episode_id"].tolist())
    total = sum(counts.values())
    assert counts[target] / total > 0.8, counts.most_common(3)


def test_prioritized_importance_weights(demo_ds):
    alpha, beta = 0.7, 0.5
    loader = demo_ds.loader(**KW, sampler="prioritized", alpha=alpha, beta=beta, seed=3, workers=1, prefetch=1)
    it = iter(loader)
    b = next(it)
    assert b["weight"].dtype == torch.float32 and tuple(b["weight"].shape) == (8,)
    assert torch.equal(b["weight"], torch.ones(8)), "all priorities are 1 at first"
    prio = {}
    rng = np.random.default_rng(0)
    for _ in range(40):
        b = next(it)
        p = rng.uniform(0.5, 4.0, size=8)
        loader.update_priorities(b, p)
        for e, s, x in zip(b["episode_id"].tolist(), b["start_step"].tolist(), p):
            prio[(e, s)] = x  # later updates win
    for _ in range(5):
        b = next(it)
        ps = np.array([prio.get((e, s), 1.0) for e, s in zip(b["episode_id"].tolist(), b["start_step"].tolist())])
        w = (ps ** alpha) ** -beta
        np.testing.assert_allclose(b["weight"].numpy(), w / w.max(), rtol=1e-5)


def test_update_priorities_wrong_length(demo_ds):
    loader = demo_ds.loader(**KW, sampler="prioritized", max_batches=2)
    b = next(iter(loader))
    with pytest.raises(trajstore.InvalidArgumentError):
        loader.update_priorities(b, [1.0, 2.0])
    plain = demo_ds.loader(**KW, max_batches=1)
    with pytest.raises(trajstore.InvalidArgumentError):
        plain.update_priorities(next(iter(plain)), np.ones(8))


def test_transform_runs_on_every_batch(demo_ds):
    def transform(batch):
        batch["return_to_go"] = batch["reward"].flip(-1).cumsum(-1).flip(-1)
        return batch

    for b in demo_ds.loader(**KW, seed=3, max_batches=3, transform=transform):
        assert torch.allclose(b["return_to_go"][:, 0], b["reward"].sum(-1))


def test_batch_to_and_repr(demo_ds):
    b = next(iter(demo_ds.loader(**KW, max_batches=1)))
    d = b.to(torch.float64)
    assert isinstance(d, trajstore.Batch) and d.index == b.index
    assert d["observation"].dtype == torch.float64
    assert torch.equal(d["observation"], b["observation"].double())
    r = repr(b)
    assert "observation: float32[8, 8, 17]" in r and "mask: bool[8, 8]" in r


def test_break_and_iterate_again_continues_the_stream(demo_ds):
    kw = dict(**KW, seed=10, workers=2, prefetch=2)
    whole = take(demo_ds.loader(**kw, max_batches=30), 30)
    loader = demo_ds.loader(**kw)
    got = []
    while len(got) < 30:
        for b in loader:
            got.append(batch_numpy(b))
            if len(got) % 7 == 0 or len(got) == 30:
                break
    assert same_batches(got, whole)
    assert loader.position == 30


def test_dtype_cast_on_cpu_casts_floats_only(demo_ds):
    kw = dict(slice_len=8, num_slices=8, seed=2, max_batches=2)
    for c, g in zip(demo_ds.loader(**kw), demo_ds.loader(**kw, dtype_cast=torch.float16)):
        assert g["observation"].dtype == torch.float16 and g["mask"].dtype == torch.bool
        assert torch.equal(g["observation"], c["observation"].half())
        assert g["reward"].dtype == torch.float16 and g["episode_id"].dtype == torch.int64
        assert torch.equal(g["mask"], c["mask"]) and torch.equal(g["episode_id"], c["episode_id"])


def test_weighting_windows_vs_episodes(demo_ds, ref):
    """windows: an episode is drawn in proportion to its windows; episodes: every episode alike."""
    def counts(weighting):
        c = collections.Counter()
        for b in demo_ds.loader(slice_len=8, num_slices=64, weighting=weighting, seed=3, max_batches=60):
            c.update(b["episode_id"].tolist())
        return c

    by_len = sorted(ref.episodes.values(), key=lambda e: e.length)
    q = len(by_len) // 4
    short, long_ = [e.id for e in by_len[:q]], [e.id for e in by_len[-q:]]

    def ratio(c):
        return (sum(c[i] for i in long_) / q) / max(sum(c[i] for i in short) / q, 1e-9)

    windows = sum(e.length - 7 for e in by_len[-q:]) / sum(e.length - 7 for e in by_len[:q])
    r_windows, r_episodes = ratio(counts("windows")), ratio(counts("episodes"))
    assert r_windows == pytest.approx(windows, rel=0.25)
    assert r_episodes == pytest.approx(1.0, rel=0.25)


def test_readahead_gives_the_same_batches(demo_ds):
    a = take(demo_ds.loader(**KW, seed=14, max_batches=6), 6)
    b = take(demo_ds.loader(**KW, seed=14, max_batches=6, readahead=True), 6)
    assert same_batches(a, b)


def test_explicit_columns_empty_gives_flags_only(demo_ds, ref):
    b = next(iter(demo_ds.loader(**KW, columns=[], seed=2, max_batches=1)))
    assert set(b) == {"mask", "is_first", "is_last", "terminated", "truncated", "slice_end", "episode_id", "start_step"}
    assert_batch_matches(ref, b, [])
