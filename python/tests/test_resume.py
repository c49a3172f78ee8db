"""Exact resumption: a loader's state_dict, saved with torch.save and loaded into a new loader
(with another number of workers), continues the stream bit for bit, for every sampler, at the
versions the state was taken on; a state of another dataset, rank or sampler is refused."""

from __future__ import annotations

import io
import pickle
import random

import numpy as np
import pytest

import trajstore
from conftest import DEMO_ARGS
from growing import append, check_batch, lengths
from trajref import batch_numpy, make_demo, same_batches

torch = pytest.importorskip("torch")

KW = dict(slice_len=8, num_slices=64)
SAMPLERS = {
    "uniform": dict(),
    "weighted_episodes": dict(weighting="episodes", policy="pad"),
    "epoch": dict(sampler="epoch"),
    "epoch_episodes": dict(sampler="epoch_episodes", slice_len=4, num_slices=16),
    "episodes": dict(sampler="episodes", slice_len=32, num_slices=16),
    "prioritized": dict(sampler="prioritized", beta=0.4),
}


def stream(loader, n):
    """The next ``n`` batches as NumPy copies, iterating again where an iteration ends (epochs,
    max_batches)."""
    out = []
    while len(out) < n:
        got = 0
        for b in loader:
            out.append(batch_numpy(b))
            got += 1
            if len(out) == n:
                break
        assert got, "the loader yields nothing"
    return out


def through_torch_save(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf)  # weights_only: the state is plain data


def preempt(ds, args, at, workers, rng):
    """A run stopped after batch ``at`` (its last iteration ends there, so that nothing was
    drawn ahead of the priorities it set): its state, and the 100 batches it draws next."""
    a = ds.loader(**args, workers=workers, max_batches=at)
    first = stream(a, at)
    if args.get("sampler") == "prioritized":
        # Priorities of recent batches, as a training loop sets them (|TD error|): the state
        # must carry them, or the resumed stream differs.
        for k in range(max(0, at - 5), at):
            a.update_priorities(k, rng.random(args["num_slices"]) * 10 + 0.01)
    state = a.state_dict()
    assert state["next_batch"] == at
    return state, first, stream(a, 100)


@pytest.mark.parametrize("name", list(SAMPLERS))
@pytest.mark.parametrize("workers", [(1, 4), (4, 1)], ids=["1to4", "4to1"])
def test_resume_continues_exactly(demo_ds, name, workers):
    args = dict(KW, seed=11, **SAMPLERS[name])
    rng = np.random.default_rng(list(SAMPLERS).index(name))
    at = random.Random(f"{name}{workers}").randint(5, 90)
    state, first, rest = preempt(demo_ds, args, at, workers[0], rng)
    saved = through_torch_save(state)
    assert saved == state
    b = demo_ds.loader(**args, workers=workers[1])
    b.load_state_dict(saved)
    assert b.position == at
    assert b.versions == [demo_ds.version]
    resumed = stream(b, 100)
    assert len(resumed) == 100 and same_batches(resumed, rest), f"{name}: the resumed stream differs"
    assert not same_batches(resumed[:1], first[:1])
    if name == "prioritized":
        assert state["priorities"][0], "a prioritized state holds its priorities"
        # Without them the stream would be another one: such a state is refused (issue 30).
        c = demo_ds.loader(**args, workers=workers[1])
        with pytest.raises(trajstore.InvalidArgumentError, match="priorities"):
            c.load_state_dict(dict(saved, priorities=[None]))
    else:
        assert state["priorities"] == [None]


def test_state_dict_is_plain_and_pickles(demo_ds):
    loader = demo_ds.loader(**KW, sampler="prioritized", seed=2, max_batches=3)
    stream(loader, 3)
    state = loader.state_dict()
    assert state["format"] == "trajstore.loader_state"
    assert (state["rank"], state["world_size"], state["num_slices"], state["slice_len"]) == (0, 1, 64, 8)
    (part,) = state["parts"]
    assert part["version"] == demo_ds.version and part["dataset_id"]
    assert part["sampler"]["kind"] == "prioritized" and part["sampler"]["seed"] == 2
    assert isinstance(state["priorities"][0], bytes)
    again = pickle.loads(pickle.dumps(state))
    b = demo_ds.loader(**KW, sampler="prioritized", seed=2)
    b.load_state_dict(again)
    assert b.state_dict() == state


def test_old_position_dict_still_accepted(demo_ds):
    a = demo_ds.loader(**KW, seed=5)
    ref = stream(a, 8)
    b = demo_ds.loader(**KW, seed=5)
    b.load_state_dict({"position": 5})
    assert same_batches(stream(b, 3), ref[5:])


def test_state_of_another_dataset_refused(demo_ds, tmp_path):
    # The same data written twice: two datasets, with two ids.
    twin = trajstore.open(make_demo(tmp_path / "twin.trajstore", *DEMO_ARGS))
    assert twin.num_transitions == demo_ds.num_transitions
    a = demo_ds.loader(**KW, seed=1)
    stream(a, 3)
    state = a.state_dict()
    b = twin.loader(**KW, seed=1)
    with pytest.raises(trajstore.InvalidArgumentError, match="another dataset"):
        b.load_state_dict(state)
    # Refused before anything changed: the loader goes on from where it was.
    assert b.position == 0
    assert len(stream(b, 2)) == 2


def test_state_of_another_rank_refused(demo_ds):
    r0 = demo_ds.loader(**KW, seed=1, rank=0, world_size=2)
    stream(r0, 2)
    state = r0.state_dict()
    r1 = demo_ds.loader(**KW, seed=1, rank=1, world_size=2)
    with pytest.raises(trajstore.InvalidArgumentError, match="rank 0 of 2"):
        r1.load_state_dict(state)
    single = demo_ds.loader(**KW, seed=1)
    with pytest.raises(trajstore.InvalidArgumentError, match="rank"):
        single.load_state_dict(state)
    # The same rank resumes.
    again = demo_ds.loader(**KW, seed=1, rank=0, world_size=2)
    again.load_state_dict(state)
    assert again.position == 2


@pytest.mark.parametrize(
    "other", [dict(seed=2), dict(sampler="epoch"), dict(policy="pad"), dict(num_slices=32)]
)
def test_state_of_other_options_refused(demo_ds, other):
    a = demo_ds.loader(**KW, seed=1)
    stream(a, 2)
    state = a.state_dict()
    b = demo_ds.loader(**{**KW, "seed": 1, **other})
    with pytest.raises(trajstore.InvalidArgumentError, match="state"):
        b.load_state_dict(state)


def test_damaged_state_refused(demo_ds):
    a = demo_ds.loader(**KW)
    state = a.state_dict()
    for bad in (dict(state, format="other"), dict(state, state_version=99), {"format": "trajstore.loader_state"}):
        with pytest.raises(trajstore.InvalidArgumentError, match="state"):
            demo_ds.loader(**KW).load_state_dict(bad)
    with pytest.raises(trajstore.InvalidArgumentError):
        demo_ds.loader(**KW).load_state_dict({"nothing": 1})


def test_resume_at_the_state_version_after_new_commits(tmp_path):
    """A collector committed after the state was taken: the resumed loader (a dataset opened at
    its newest version) samples the version of the state, so the stream is the same."""
    path = tmp_path / "grow.trajstore"
    append(path, lengths(30, 10, 60, seed=1), seed=1)
    ds = trajstore.open(path)
    kw = dict(slice_len=4, num_slices=32, seed=3, episodes="SELECT episode_id FROM episodes WHERE length > 20")
    a = ds.loader(**kw, max_batches=7)
    stream(a, 7)
    state = a.state_dict()
    rest = stream(a, 50)
    append(path, lengths(10, 30, 60, seed=2), seed=2)
    newer = trajstore.open(path)
    assert newer.version > ds.version
    b = newer.loader(**kw, workers=3)
    b.load_state_dict(through_torch_save(state))
    assert b.versions == [ds.version]
    resumed = stream(b, 50)
    assert same_batches(resumed, rest)
    for x in resumed:
        check_batch(x)
    # Without the state, the newest version and its new episodes are sampled.
    assert newer.loader(**kw).versions == [newer.version]


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_a_resumed_iteration_yields_only_its_remaining_batches(demo_ds, name):
    """max_batches=60, a state after 23 batches: the resumed loader's iteration yields the 37
    left (the uninterrupted run's), as torchdata's StatefulDataLoader does; the next iteration
    is whole again."""
    args = dict(KW, seed=5, **SAMPLERS[name])
    whole = [batch_numpy(b) for b in demo_ds.loader(**args, max_batches=60)]
    n = len(whole)  # an epoch sampler's iteration may end at its epoch's end
    k = min(23, n - 1)
    a = demo_ds.loader(**args, max_batches=60)
    for i, _ in enumerate(a):
        if i + 1 == k:
            state = a.state_dict()
            break
    assert state["iteration_end"] == n
    b = demo_ds.loader(**args, max_batches=60)
    b.load_state_dict(through_torch_save(state))
    assert len(b) == n - k
    rest = [batch_numpy(x) for x in b]
    assert len(rest) == n - k and same_batches(rest, whole[k:])
    assert "iteration_end" not in b.state_dict()
    if name in ("uniform", "weighted_episodes", "prioritized"):
        assert len(b) == 60  # endless samplers: a whole max_batches iteration again
    assert len(list(b)) == len(b) > 0
