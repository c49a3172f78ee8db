"""Mixing datasets in every batch (trajstore.mix): exact shares per batch, slices from the right
dataset, each dataset sampled by its own uniform sampler; clear errors for datasets that do
not match; a followed mix resumed from its state."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest

import trajstore
from growing import OBS_DIM, append, assert_fits, check_batch, lengths
from trajref import batch_numpy, same_batches

torch = pytest.importorskip("torch")

TAGS = (0.0, 1.0)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    d = tmp_path_factory.mktemp("mix")
    a, b = d / "offline.trajstore", d / "online.trajstore"
    append(a, lengths(40, 10, 80, seed=1), tag=TAGS[0], seed=1)
    append(b, lengths(25, 20, 100, seed=2), tag=TAGS[1], seed=2)
    return trajstore.open(a), trajstore.open(b)


def windows(ds, slice_len):
    lens = ds.episodes().column("length").to_numpy()
    return np.maximum(lens - slice_len + 1, 0)


def stream(loader, n):
    out = []
    for b in loader:
        out.append(batch_numpy(b))
        if len(out) == n:
            return out
    return out


def test_half_of_every_batch_from_each(two):
    a, b = two
    L, B, N = 4, 64, 400
    loader = trajstore.mix([a, b], weights=[0.5, 0.5], slice_len=L, num_slices=B, seed=3)
    assert loader.num_datasets == 2 and loader.versions == [a.version, b.version]
    counts = [np.zeros(a.num_episodes, np.int64), np.zeros(b.num_episodes, np.int64)]
    source0 = None
    for x in stream(loader, N):
        src = x["source"]
        assert src.dtype == np.int64 and src.shape == (B,)
        assert (src == np.repeat([0, 1], B // 2)).all(), src
        source0 = src if source0 is None else source0
        check_batch(x, TAGS)  # values, ids and steps of the dataset each slice says
        for s, ds in enumerate(two):
            ids = x["episode_id"][src == s]
            assert ids.min() >= ds.first_episode_id and ids.max() < ds.first_episode_id + ds.num_episodes
            np.add.at(counts[s], ids - ds.first_episode_id, 1)
    # Within each dataset, its own distribution: uniform over its windows.
    for s, ds in enumerate(two):
        assert counts[s].sum() == N * B // 2
        assert_fits(f"dataset {s} of the mix", counts[s], windows(ds, L))


def test_source_tensor_is_made_once(two):
    loader = trajstore.mix(list(two), slice_len=4, num_slices=8)
    it = iter(loader)
    x, y = next(it), next(it)
    assert x["source"] is y["source"]
    assert x["source"].dtype == torch.int64 and x["source"].tolist() == [0] * 4 + [1] * 4
    # Paths work too, and unequal weights split every batch the same way.
    loader = trajstore.mix([two[0].path, two[1].path], weights=[3, 1], slice_len=4, num_slices=64, backend="numpy")
    for x in stream(loader, 5):
        assert (x["source"] == 0).sum() == 48 and (x["source"] == 1).sum() == 16
        check_batch(x, TAGS)


def test_mix_seeds_differ_per_dataset_and_are_deterministic(two):
    kw = dict(slice_len=4, num_slices=16, seed=9)
    one = stream(trajstore.mix(list(two), **kw, workers=1), 10)
    four = stream(trajstore.mix(list(two), **kw, workers=4), 10)
    assert same_batches(one, four)
    # Part 1's stream is not part 0's seed: mixing a dataset with itself gives two streams.
    same = stream(trajstore.mix([two[0], two[0]], **kw), 3)
    for x in same:
        assert not np.array_equal(x["start_step"][:8], x["start_step"][8:])


def test_mismatched_datasets_are_clear_errors(two, tmp_path):
    c = tmp_path / "wide.trajstore"
    with trajstore.create(c, observation_shape=(OBS_DIM + 1,), action_shape=(2,)) as w:
        w.append_episode(np.zeros((20, OBS_DIM + 1), np.float32), np.zeros((20, 2), np.float32), np.zeros(20, np.float32))
    wide = trajstore.open(c)
    with pytest.raises(trajstore.SchemaError, match="observation"):
        trajstore.mix([two[0], wide], slice_len=4, num_slices=8)
    d = tmp_path / "extra.trajstore"
    with trajstore.create(d, observation_shape=(OBS_DIM,), action_shape=(2,), columns={"cost": ("float32", ())}) as w:
        w.append_episode(np.zeros((20, OBS_DIM), np.float32), np.zeros((20, 2), np.float32), np.zeros(20, np.float32), cost=np.zeros(20, np.float32))
    extra = trajstore.open(d)
    # By default the columns both have; asking for one that only one has is an error naming it.
    loader = trajstore.mix([two[0], extra], slice_len=4, num_slices=8)
    assert "cost" not in loader.columns
    with pytest.raises(trajstore.TrajstoreError, match="cost"):
        trajstore.mix([two[0], extra], slice_len=4, num_slices=8, columns=["observation", "cost"])
    for kw, match in [
        (dict(weights=[1.0]), "weights"),
        (dict(weights=[1.0, -1.0]), "weight"),
        (dict(sampler="epoch"), "endless|without replacement"),
        (dict(sampler="prioritized"), "prioritized"),
        (dict(episodes=[0, 1]), "SQL"),
        (dict(follow=[True]), "follow"),
    ]:
        with pytest.raises(trajstore.InvalidArgumentError, match=match):
            trajstore.mix(list(two), slice_len=4, num_slices=8, **kw)
    # `source` is a key of every batch of a mix: a column of that name must be left out.
    e = tmp_path / "source.trajstore"
    with trajstore.create(e, observation_shape=(OBS_DIM,), action_shape=(2,), columns={"source": ("int64", ())}) as w:
        w.append_episode(np.zeros((20, OBS_DIM), np.float32), np.zeros((20, 2), np.float32), np.zeros(20, np.float32), source=np.zeros(20))
    src = trajstore.open(e)
    assert "source" in src.loader(slice_len=4, num_slices=8).columns
    with pytest.raises(trajstore.InvalidArgumentError, match="source"):
        trajstore.mix([src, src], slice_len=4, num_slices=8)
    with pytest.raises(TypeError):
        trajstore.mix(list(two), not_an_argument=1)


def test_mix_with_a_query_per_dataset(two):
    q = "SELECT episode_id FROM episodes WHERE length >= 50"
    loader = trajstore.mix(list(two), slice_len=4, num_slices=16, episodes=q, backend="numpy")
    allowed = [set(ds.episodes_where(q).tolist()) for ds in two]
    for x in stream(loader, 20):
        for i in range(16):
            assert int(x["episode_id"][i]) in allowed[int(x["source"][i])]


def _through_torch_save(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf)


def test_mix_follow_and_resume(tmp_path):
    """Offline data fixed, online data followed while it grows: the state taken after the
    loader moved to a new online version resumes exactly there (another number of workers),
    even after more commits; a resumed loader that follows goes on to the newest version."""
    off, on = tmp_path / "off.trajstore", tmp_path / "on.trajstore"
    append(off, lengths(30, 10, 60, seed=3), tag=TAGS[0], seed=3)
    append(on, lengths(5, 10, 60, seed=4), tag=TAGS[1], seed=4)
    offline, online = trajstore.open(off), trajstore.open(on)
    kw = dict(weights=[0.5, 0.5], slice_len=4, num_slices=32, seed=5)
    loader = trajstore.mix([offline, online], follow=[False, 0.05], workers=2, **kw)
    it = iter(loader)
    for _ in range(5):
        check_batch(batch_numpy(next(it)), TAGS)
    new_ids = append(on, [40] * 5, tag=TAGS[1], seed=5)
    newest = trajstore.open(on).version
    deadline = time.time() + 20
    while loader.versions[1] != newest:
        assert time.time() < deadline, "the mix did not move to the new online version"
        check_batch(batch_numpy(next(it)), TAGS)
        time.sleep(0.01)
    assert loader.versions == [offline.version, newest]
    state = loader.state_dict()
    assert [p["follow"] for p in state["parts"]] == [False, True]
    assert [p["version"] for p in state["parts"]] == [offline.version, newest]
    rest = [batch_numpy(next(it)) for _ in range(60)]
    assert set(np.concatenate([x["episode_id"][x["source"] == 1] for x in rest]).tolist()) & set(new_ids)
    del it, loader
    # More online data after the state: a resumed loader still starts at the state's versions.
    append(on, [40] * 5, tag=TAGS[1], seed=6)
    slow = trajstore.mix([offline, online], follow=[False, {"every_batches": 10**6}], workers=4, **kw)
    slow.load_state_dict(_through_torch_save(state))
    assert slow.versions == [offline.version, newest]
    resumed = stream(slow, 60)
    assert same_batches(resumed, rest)
    # Following as before, it moves on to the newest online version.
    fast = trajstore.mix([offline, online], follow=[False, 0.05], workers=1, **kw)
    fast.load_state_dict(state)
    it = iter(fast)
    deadline = time.time() + 20
    while fast.versions[1] != newest + 1:
        assert time.time() < deadline, "the resumed mix did not follow the online dataset"
        check_batch(batch_numpy(next(it)), TAGS)
        time.sleep(0.01)
    # A state of a single dataset, or of the mix in another order, is refused.
    with pytest.raises(trajstore.InvalidArgumentError, match="state"):
        offline.loader(slice_len=4, num_slices=32, seed=5).load_state_dict(state)
    with pytest.raises(trajstore.InvalidArgumentError, match="cannot resume"):
        trajstore.mix([online, offline], **kw).load_state_dict(state)


def test_mix_takes_every_argument_of_dataset_loader():
    import inspect

    from trajstore._types import LoaderArgs

    # mix's keywords are Dataset.loader's (but `follow`, which mix takes per dataset), in the
    # same order; their defaults are written only in Dataset.loader's signature.
    params = inspect.signature(trajstore.Dataset.loader).parameters
    assert [k for k in params if k not in ("self", "follow")] == list(LoaderArgs.__annotations__)
    assert LoaderArgs.__required_keys__ == frozenset()
    assert list(inspect.signature(trajstore.mix).parameters)[-2:] == ["follow", "loader_args"]


def test_mix_takes_the_defaults_of_dataset_loader(two):
    # A mix of one dataset given no loader argument draws the batches Dataset.loader draws.
    a = trajstore.mix([two[0]], max_batches=3, workers=1)
    b = two[0].loader(max_batches=3, workers=1)
    assert a._options == b._options
    for x, y in zip(a, b):
        assert x.keys() - {"source"} == y.keys()
        for k in y:
            assert (x[k] == y[k]).all()
