"""Batches hold exactly the data of the segment files: every slice of a batch is compared with a
NumPy reference built from the dataset's Arrow files read by pyarrow (trajref.Reference)."""

from __future__ import annotations

import numpy as np
import pytest

from trajref import assert_batch_matches, batch_numpy, take

COLUMNS = ["observation", "action", "reward", "next_observation"]


def test_reference_reads_the_whole_dataset(demo_ds, ref):
    # The reference itself: every transition, dense episode ids, episode rows contiguous.
    assert ref.num_transitions == len(demo_ds) == 20000
    assert len(ref.manifest["segments"]) >= 3, "the demo fixture should span several segments"
    assert ref.episode_ids == list(range(demo_ds.num_episodes))
    for e in ref.episodes.values():
        steps = ref.steps(e.id, "step")
        np.testing.assert_array_equal(steps, np.arange(e.length))
        assert (ref.steps(e.id, "episode_id") == e.id).all()


def test_strict_batches_equal_reference(demo_ds, ref):
    loader = demo_ds.loader(slice_len=16, num_slices=16, policy="strict", seed=7, max_batches=12)
    assert loader.columns == COLUMNS
    n = 0
    seen_last = 0
    for batch in loader:
        assert set(batch) == set(COLUMNS) | {
            "mask", "is_first", "is_last", "terminated", "truncated", "slice_end", "episode_id", "start_step"
        }
        assert tuple(batch["observation"].shape) == (16, 16, 17)
        assert tuple(batch["action"].shape) == (16, 16, 6)
        assert tuple(batch["reward"].shape) == (16, 16)
        assert bool(batch["mask"].all()), "strict slices lie inside their episodes"
        padded = assert_batch_matches(ref, batch, COLUMNS)
        assert padded == 0
        b = batch_numpy(batch)
        # Strict windows: start >= 0 and start + L <= episode length.
        for e, s in zip(b["episode_id"], b["start_step"]):
            assert 0 <= s <= ref.episodes[int(e)].length - 16
        # slice_end: exactly the last step of every slice.
        assert b["slice_end"][:, -1].all() and b["slice_end"].sum() == 16
        seen_last += int(b["is_last"].sum())
        n += 1
    assert n == 12
    assert seen_last > 0, "some slices should reach an episode's last step (next_observation = final observation)"


def test_next_observation_at_episode_end_is_final_observation(demo_ds, ref):
    """At an episode's last step, next_observation is the episode table's final observation; elsewhere
    the next step's observation."""
    checked = 0
    for batch in demo_ds.loader(slice_len=8, num_slices=16, policy="pad", seed=11, max_batches=20):
        b = batch_numpy(batch)
        for i, j in zip(*np.nonzero(b["is_last"])):
            e = ref.episodes[int(b["episode_id"][i])]
            assert e.final is not None
            np.testing.assert_array_equal(b["next_observation"][i, j], e.final)
            assert b["terminated"][i, j] == e.terminated and b["truncated"][i, j] == e.truncated
            checked += 1
        inner = b["mask"][:, :-1] & b["mask"][:, 1:]
        np.testing.assert_array_equal(b["next_observation"][:, :-1][inner], b["observation"][:, 1:][inner])
    assert checked > 10


@pytest.mark.parametrize("policy", ["pad", "span:4:4"])
def test_padded_batches_equal_reference(demo_ds, ref, policy):
    padded = 0
    negative_starts = 0
    for batch in demo_ds.loader(slice_len=16, num_slices=16, policy=policy, seed=3, max_batches=15):
        padded += assert_batch_matches(ref, batch, COLUMNS)
        b = batch_numpy(batch)
        m = ~b["mask"]
        # Masked positions: zeros everywhere, no flag set.
        for name in COLUMNS:
            assert not b[name][m].any(), f"{name} is not zero at masked steps"
        for name in ("is_first", "is_last", "terminated", "truncated", "slice_end"):
            assert not b[name][m].any(), name
        negative_starts += int((b["start_step"] < 0).sum())
        if policy == "pad":
            assert (b["start_step"] >= 0).all()
    assert padded > 0, "the test needs slices that run past an episode's end"
    if policy.startswith("span"):
        assert negative_starts > 0, "span:4:4 should start some slices before step 0"


def test_epoch_sampler_batches_equal_reference(demo_ds, ref):
    for batch in demo_ds.loader(slice_len=12, num_slices=8, sampler="epoch", seed=5, max_batches=10):
        assert_batch_matches(ref, batch, COLUMNS)


@pytest.mark.parametrize("sampler", ["episodes", "epoch_episodes", "prioritized"])
def test_other_samplers_equal_reference(demo_ds, ref, sampler):
    loader = demo_ds.loader(slice_len=32, num_slices=8, sampler=sampler, seed=2, max_batches=6,
                            policy="pad" if sampler == "episodes" else "strict")
    batches = list(loader)
    assert len(batches) == 6
    for batch in batches:
        assert_batch_matches(ref, batch, COLUMNS)
        if sampler == "episodes":
            b = batch_numpy(batch)
            assert (b["start_step"] == 0).all() and b["is_first"][:, 0].all()


def test_column_subset_and_order(demo_ds, ref):
    cols = ["reward", "action"]
    loader = demo_ds.loader(slice_len=10, num_slices=8, columns=cols, seed=1, max_batches=3)
    assert loader.columns == cols
    for batch in loader:
        assert "observation" not in batch and "next_observation" not in batch
        assert list(batch)[:2] == cols
        assert_batch_matches(ref, batch, cols)


def test_discrete_actions_equal_reference(discrete_ds, discrete_ref):
    import torch

    assert discrete_ref.columns["action"].dtype == np.int64
    for batch in discrete_ds.loader(slice_len=8, num_slices=12, seed=4, max_batches=5, policy="pad"):
        assert batch["action"].dtype == torch.int64
        assert tuple(batch["action"].shape) == (12, 8)
        assert batch["observation"].dtype == torch.float32
        for f in ("mask", "is_first", "is_last", "terminated", "truncated", "slice_end"):
            assert batch[f].dtype == torch.bool
        assert batch["episode_id"].dtype == torch.int64 and batch["start_step"].dtype == torch.int64
        assert_batch_matches(discrete_ref, batch, COLUMNS)
        a = batch["action"][batch["mask"]]
        assert int(a.min()) >= 0 and int(a.max()) < 5


def test_batches_cross_check_with_dataset_episode(demo_ds, ref):
    """The zero-copy ds.episode(id) agrees with the loader (a cross-check of the reference)."""
    from trajref import column_to_numpy

    batch = next(iter(demo_ds.loader(slice_len=16, num_slices=8, seed=9, max_batches=1)))
    b = batch_numpy(batch)
    for i in range(8):
        eid, s = int(b["episode_id"][i]), int(b["start_step"][i])
        rb = demo_ds.episode(eid)
        obs, _ = column_to_numpy(rb.column(rb.schema.get_field_index("observation")))
        act, _ = column_to_numpy(rb.column(rb.schema.get_field_index("action")))
        np.testing.assert_array_equal(b["observation"][i], obs[s : s + 16])
        np.testing.assert_array_equal(b["action"][i], act[s : s + 16])
        np.testing.assert_array_equal(obs, ref.steps(eid, "observation"))


def test_multi_batch_stream_is_not_constant(demo_ds):
    # Guards the value tests against a loader that repeats one batch.
    bs = take(demo_ds.loader(slice_len=8, num_slices=8, seed=0, max_batches=4), 4)
    keys = {tuple(b["episode_id"].tolist()) + tuple(b["start_step"].tolist()) for b in bs}
    assert len(keys) == 4
