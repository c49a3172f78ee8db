"""Writing from Python: create(), append_episode (NumPy and torch), append_step/end_episode,
commit, the context manager, the lock, and argument errors. Every round trip is checked against
the committed files read with pyarrow (trajref.Reference), ds.episode(i), ds.episodes() and the
loader's batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from trajref import Reference, assert_batch_matches, batch_numpy, column_to_numpy

torch = pytest.importorskip("torch")

class CollectorFailed(Exception):
    pass


def _episode(rng, t, obs_shape=(5,), act_dim=2, obs_dtype=np.float32):
    if obs_dtype == np.uint8:
        obs = rng.integers(0, 256, (t, *obs_shape), dtype=np.uint8)
        final = rng.integers(0, 256, obs_shape, dtype=np.uint8)
    else:
        obs = rng.standard_normal((t, *obs_shape)).astype(obs_dtype)
        final = rng.standard_normal(obs_shape).astype(obs_dtype)
    if act_dim is None:
        act = rng.integers(0, 4, t).astype(np.int64)
    else:
        act = rng.standard_normal((t, act_dim)).astype(np.float32)
    rew = rng.standard_normal(t).astype(np.float32)
    return obs, act, rew, final


def _col(rb, name):
    return column_to_numpy(rb.column(rb.schema.get_field_index(name)))[0]


def _check_roundtrip(path, episodes, obs_dtype=np.float32):
    """``episodes``: list of (obs, act, rew, final, terminated) as appended, in id order."""
    ds = trajstore.open(path)
    assert ds.num_episodes == len(episodes)
    assert len(ds) == sum(len(e[0]) for e in episodes)
    ref = Reference(path)
    table = ds.episodes()
    assert table.column("episode_id").to_pylist() == list(range(len(episodes)))
    assert table.column("length").to_pylist() == [len(e[0]) for e in episodes]
    assert table.column("terminated").to_pylist() == [e[4] for e in episodes]
    assert table.column("truncated").to_pylist() == [not e[4] for e in episodes]
    finals, _ = column_to_numpy(table.column("final_observation"))
    for i, (obs, act, rew, final, term) in enumerate(episodes):
        t = len(obs)
        assert table.column("episode_return").to_pylist()[i] == pytest.approx(float(rew.astype(np.float64).sum()), rel=1e-6)
        np.testing.assert_array_equal(finals[i], final)
        rb = ds.episode(i)
        np.testing.assert_array_equal(_col(rb, "observation"), obs)
        assert _col(rb, "observation").dtype == obs_dtype
        np.testing.assert_array_equal(_col(rb, "action"), act)
        np.testing.assert_array_equal(_col(rb, "reward"), rew)
        np.testing.assert_array_equal(_col(rb, "step"), np.arange(t))
        np.testing.assert_array_equal(_col(rb, "episode_id"), np.full(t, i))
        np.testing.assert_array_equal(_col(rb, "is_first"), np.arange(t) == 0)
        np.testing.assert_array_equal(_col(rb, "is_last"), np.arange(t) == t - 1)
        np.testing.assert_array_equal(_col(rb, "terminated"), (np.arange(t) == t - 1) & term)
        np.testing.assert_array_equal(_col(rb, "truncated"), (np.arange(t) == t - 1) & (not term))
        # The files say the same.
        np.testing.assert_array_equal(ref.steps(i, "observation"), obs)
        # The whole episode as one strict slice: next_observation is o_{t+1}, and the final
        # observation at the last step.
        batch = next(iter(ds.loader(slice_len=t, num_slices=1, episodes=[i], max_batches=1)))
        b = batch_numpy(batch)
        assert int(b["episode_id"][0]) == i and int(b["start_step"][0]) == 0
        np.testing.assert_array_equal(b["observation"][0], obs)
        np.testing.assert_array_equal(b["action"][0], act)
        np.testing.assert_array_equal(b["next_observation"][0, :-1], obs[1:])
        np.testing.assert_array_equal(b["next_observation"][0, -1], final)
        assert bool(b["terminated"][0, -1]) == term and bool(b["truncated"][0, -1]) == (not term)
        assert_batch_matches(ref, batch, ["observation", "action", "reward", "next_observation"])
    return ds


def test_roundtrip_numpy_torch_and_steps(tmp_path):
    path = tmp_path / "w.trajstore"
    rng = np.random.default_rng(0)
    eps = []
    w = trajstore.create(path, observation_shape=(5,), action_shape=(2,))
    assert w.schema.names == ["observation", "action", "reward"]
    # From NumPy.
    obs, act, rew, final = _episode(rng, 7)
    assert w.append_episode(obs, act, rew, terminated=True, final_observation=final) == 0
    eps.append((obs, act, rew, final, True))
    # From torch tensors (float64 on input: converted to the dataset's float32).
    obs, act, rew, final = _episode(rng, 11)
    i = w.append_episode(
        observation=torch.from_numpy(obs).double(), action=torch.from_numpy(act), reward=torch.from_numpy(rew),
        final_observation=torch.from_numpy(final),
    )
    assert i == 1
    eps.append((obs, act, rew, final, False))
    # Step by step.
    obs, act, rew, final = _episode(rng, 6)
    for t in range(6):
        w.append_step(obs[t], torch.from_numpy(act[t]) if t % 2 else act[t], float(rew[t]))
    assert w.end_episode(truncated=True, final_observation=final) == 2
    eps.append((obs, act, rew, final, False))
    assert w.next_episode_id == 3
    version = w.commit()
    assert version >= 2
    w.close()
    assert w.closed
    ds = _check_roundtrip(path, eps)
    assert ds.version == version


def test_roundtrip_discrete_actions(tmp_path):
    path = tmp_path / "d.trajstore"
    rng = np.random.default_rng(1)
    eps = []
    with trajstore.create(path, observation_shape=(3,), action_shape=None) as w:
        assert w.schema.field("action").type == pa.int64()
        obs, act, rew, final = _episode(rng, 9, obs_shape=(3,), act_dim=None)
        w.append_episode(obs, act.astype(np.int32), rew, terminated=True, final_observation=final)
        eps.append((obs, act, rew, final, True))
        obs, act, rew, final = _episode(rng, 5, obs_shape=(3,), act_dim=None)
        w.append_episode(torch.from_numpy(obs), torch.from_numpy(act), torch.from_numpy(rew), final_observation=final)
        eps.append((obs, act, rew, final, False))
        obs, act, rew, final = _episode(rng, 4, obs_shape=(3,), act_dim=None)
        for t in range(4):
            w.append_step(obs[t], int(act[t]), rew[t])
        w.end_episode(final_observation=torch.from_numpy(final))
        eps.append((obs, act, rew, final, False))
    ds = _check_roundtrip(path, eps)
    b = next(iter(ds.loader(slice_len=4, num_slices=6, max_batches=1)))
    assert b["action"].dtype == torch.int64 and tuple(b["action"].shape) == (6, 4)


def test_roundtrip_uint8_image_observations(tmp_path):
    path = tmp_path / "img.trajstore"
    rng = np.random.default_rng(2)
    eps = []
    with trajstore.create(path, observation_shape=(3, 4, 4), action_shape=(2,), observation_dtype="uint8") as w:
        for t, term in ((6, True), (9, False)):
            obs, act, rew, final = _episode(rng, t, obs_shape=(3, 4, 4), obs_dtype=np.uint8)
            w.append_episode(torch.from_numpy(obs) if term else obs, act, rew, terminated=term, final_observation=final)
            eps.append((obs, act, rew, final, term))
    ds = _check_roundtrip(path, eps, obs_dtype=np.uint8)
    b = next(iter(ds.loader(slice_len=5, num_slices=4, max_batches=1)))
    assert b["observation"].dtype == torch.uint8 and tuple(b["observation"].shape) == (4, 5, 3, 4, 4)
    assert b["next_observation"].dtype == torch.uint8


def test_stored_next_observation(tmp_path):
    path = tmp_path / "next.trajstore"
    rng = np.random.default_rng(3)
    obs, act, rew, _ = _episode(rng, 8)
    nxt = rng.standard_normal((8, 5)).astype(np.float32)  # deliberately not obs[1:]
    with trajstore.create(path, observation_shape=(5,), action_shape=(2,), store_next_observation=True) as w:
        assert "next_observation" in w.schema.names
        with pytest.raises(trajstore.InvalidArgumentError):
            w.append_episode(obs, act, rew)  # next_observation is required
        w.append_episode(obs, act, rew, next_observation=torch.from_numpy(nxt), terminated=True)
    ds = trajstore.open(path)
    assert "next_observation" in ds.schema.names
    b = batch_numpy(next(iter(ds.loader(slice_len=8, num_slices=1, max_batches=1))))
    np.testing.assert_array_equal(b["next_observation"][0], nxt)
    np.testing.assert_array_equal(Reference(path).columns["next_observation"], nxt)


def test_extra_columns(tmp_path):
    path = tmp_path / "extra.trajstore"
    rng = np.random.default_rng(4)
    obs, act, rew, final = _episode(rng, 6)
    qpos = rng.standard_normal((6, 3))
    cost = rng.standard_normal(6).astype(np.float32)
    with trajstore.create(path, observation_shape=(5,), action_shape=(2,),
                          columns={"qpos": ("float64", (3,)), "cost": ("float32", ())}) as w:
        w.append_episode(obs, act, rew, qpos=qpos, cost=torch.from_numpy(cost), final_observation=final)
    ds = trajstore.open(path)
    rb = ds.episode(0)
    np.testing.assert_array_equal(_col(rb, "qpos"), qpos)
    np.testing.assert_array_equal(_col(rb, "cost"), cost)
    b = next(iter(ds.loader(slice_len=6, num_slices=1, columns=["qpos", "cost"], max_batches=1)))
    assert b["qpos"].dtype == torch.float64
    np.testing.assert_array_equal(b["qpos"][0].numpy(), qpos)


def test_context_manager_commits_on_clean_exit(tmp_path):
    path = tmp_path / "cm.trajstore"
    rng = np.random.default_rng(5)
    obs, act, rew, final = _episode(rng, 5)
    with trajstore.create(path, observation_shape=(5,), action_shape=(2,)) as w:
        w.append_episode(obs, act, rew, terminated=True, final_observation=final)
        # Not visible before the commit.
        assert trajstore.open(path).num_episodes == 0
    assert w.closed
    _check_roundtrip(path, [(obs, act, rew, final, True)])
    trajstore.open(path).writer().close()  # the lock was released


def test_context_manager_exception_discards_and_releases_lock(tmp_path):
    path = tmp_path / "cm.trajstore"
    rng = np.random.default_rng(6)
    kept = _episode(rng, 5)
    with pytest.raises(CollectorFailed):
        with trajstore.create(path, observation_shape=(5,), action_shape=(2,)) as w:
            w.append_episode(*kept[:3], terminated=True, final_observation=kept[3])
            w.commit()
            w.append_episode(*_episode(rng, 7)[:3])
            w.append_step(np.zeros(5), np.zeros(2), 0.0)
            raise CollectorFailed("collector failed")
    assert w.closed
    _check_roundtrip(path, [(*kept, True)])
    # A second writer can open it, and continues after the committed episode.
    w2 = trajstore.open(path).writer()
    assert w2.next_episode_id == 1
    w2.close()


def test_context_manager_exception_releases_lock(tmp_path):
    path = tmp_path / "lock.trajstore"
    with pytest.raises(ValueError):
        with trajstore.create(path, observation_shape=(5,), action_shape=(2,)) as w:
            raise ValueError("boom")
    assert w.closed
    w2 = trajstore.open(path).writer()
    assert not w2.closed and w2.next_episode_id == 0
    w2.close()


def test_second_writer_is_locked(tmp_path):
    path = tmp_path / "locked.trajstore"
    w = trajstore.create(path, observation_shape=(5,), action_shape=(2,))
    ds = trajstore.open(path)
    with pytest.raises(trajstore.LockedError) as e:
        ds.writer(lock_wait=0.1)
    assert isinstance(e.value, trajstore.TrajstoreError)
    with pytest.raises(trajstore.LockedError):
        trajstore.create(path, observation_shape=(5,), action_shape=(2,), append=True, lock_wait=0.1)
    w.close()
    w2 = ds.writer()
    with pytest.raises(trajstore.LockedError):
        ds.writer(lock_wait=0)
    w2.close()


def test_wrong_column_or_width_is_invalid_argument(tmp_path):
    path = tmp_path / "bad.trajstore"
    rng = np.random.default_rng(7)
    obs, act, rew, final = _episode(rng, 6)
    with trajstore.create(path, observation_shape=(5,), action_shape=(2,)) as w:
        bad = {
            "unknown column": dict(observation=obs, action=act, reward=rew, qpos=np.zeros((6, 3))),
            "action width": dict(observation=obs, action=np.zeros((6, 3), np.float32), reward=rew),
            "observation width": dict(observation=obs[:, :4], action=act, reward=rew),
            "reward steps": dict(observation=obs, action=act, reward=rew[:5]),
            "action steps": dict(observation=obs, action=act[:4], reward=rew),
            "not numeric": dict(observation=obs, action=act, reward=["a"] * 6),
            "final observation shape": dict(observation=obs, action=act, reward=rew, final_observation=np.zeros(4)),
        }
        for what, kwargs in bad.items():
            with pytest.raises(trajstore.InvalidArgumentError) as e:
                w.append_episode(**kwargs)
            assert isinstance(e.value, ValueError), what
        # Nothing was appended by the failed calls.
        assert w.next_episode_id == 0
        w.append_episode(obs, act, rew, final_observation=final)
    _check_roundtrip(path, [(obs, act, rew, final, False)])


def test_append_after_close_is_invalid(tmp_path):
    w = trajstore.create(tmp_path / "c.trajstore", observation_shape=(5,), action_shape=(2,))
    w.close()
    obs, act, rew, _ = _episode(np.random.default_rng(8), 3)
    with pytest.raises(trajstore.InvalidArgumentError):
        w.append_episode(obs, act, rew)


def test_end_episode_without_steps(tmp_path):
    with trajstore.create(tmp_path / "e.trajstore", observation_shape=(5,), action_shape=(2,)) as w:
        with pytest.raises(trajstore.InvalidArgumentError):
            w.end_episode()


def test_create_errors(tmp_path):
    with pytest.raises(trajstore.InvalidArgumentError):
        trajstore.create(tmp_path / "a", observation_shape=(5,), action_shape=(2, 3))
    with pytest.raises(trajstore.TrajstoreError):
        trajstore.create(tmp_path / "b", observation_shape=(5,), observation_dtype="complex128")
    trajstore.create(tmp_path / "c", observation_shape=(5,), action_shape=(2,)).close()
    # An existing dataset without append=True.
    with pytest.raises(trajstore.InvalidArgumentError, match="already"):
        trajstore.create(tmp_path / "c", observation_shape=(5,), action_shape=(2,))


def test_create_append_to_existing(tmp_path):
    path = tmp_path / "app.trajstore"
    trajstore.create(path, observation_shape=(5,), action_shape=(2,)).close()
    w = trajstore.create(path, observation_shape=(5,), action_shape=(2,), append=True)
    assert w.next_episode_id == 0
    w.close()
    # A different schema is refused.
    with pytest.raises(trajstore.SchemaError):
        trajstore.create(path, observation_shape=(6,), action_shape=(2,), append=True)


def test_writer_schema_and_repr(tmp_path):
    w = trajstore.create(tmp_path / "r.trajstore", observation_shape=(3, 4, 4), action_shape=None, observation_dtype="uint8")
    try:
        s = w.schema
        assert s.names == ["observation", "action", "reward"]
        assert s.field("action").type == pa.int64() and s.field("reward").type == pa.float32()
        obs = s.field("observation").type
        storage = obs.storage_type if isinstance(obs, pa.BaseExtensionType) else obs
        assert storage.value_type == pa.uint8() and storage.list_size == 48
        assert "next episode 0" in repr(w)
    finally:
        w.close()
    assert "closed" in repr(w)
