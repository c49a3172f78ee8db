"""The staged path of the CUDA loader (workers gather into a ring of caller-owned slots; a slot
is handed back only after its batch was copied out) exercised on CPU through the
TRAJSTORE_STAGED_CPU=1 test hook: plain host slots, and a clone standing for the device copy. The
GPU-specific parts (pinned memory, the copy stream, events) are in test_cuda.py and
cuda_check.py; the ring, its release order and closing a stream before another reuses the slots
are tested here, on every machine."""

from __future__ import annotations

import numpy as np
import pytest

from trajref import assert_batch_matches, same_batches, take

torch = pytest.importorskip("torch")

COLUMNS = ["observation", "action", "reward", "next_observation"]


@pytest.fixture
def staged(monkeypatch):
    monkeypatch.setenv("TRAJSTORE_STAGED_CPU", "1")


@pytest.mark.parametrize(
    "workers,slots,policy,tails",
    [(1, 2, "pad", False), (2, 3, "strict", True), (4, 7, "pad", True), (2, 3, "span:5:7", True)],
)
def test_staged_batches_equal_plain_batches(demo_ds, ref, monkeypatch, workers, slots, policy, tails):
    """One copy per batch of the slot's buffer into the device ring; with ``tails`` (any
    next_observation large enough, here every one) next_observation crosses as one row per slice
    and is derived by torch: the same batches as the host loader."""
    import trajstore._cuda

    if tails:
        monkeypatch.setattr(trajstore._cuda, "_TAIL_MIN_BYTES", 0)
    kw = dict(slice_len=16, num_slices=16, policy=policy, seed=21, max_batches=30, columns=COLUMNS)
    plain = take(demo_ds.loader(**kw), 30)
    monkeypatch.setenv("TRAJSTORE_STAGED_CPU", "1")
    loader = demo_ds.loader(**kw, workers=workers, staging_slots=slots)
    assert loader._staged_on_cpu
    assert loader._plan.tail_columns() == [c == "next_observation" for c in COLUMNS]
    got = take(loader, 30)
    # One buffer per slot, every tensor a view of it.
    assert all(
        t.untyped_storage().data_ptr() == buf.data_ptr()
        for buf, slot in zip(loader._packed, loader._slots)
        for t in slot.values()
    )
    shape = (16,) if tails else (16, 16)
    assert tuple(loader._slots[0]["next_observation"].shape) == (*shape, 17)
    # Batches copied (not held) reuse the device ring's buffers.
    assert len(loader._ring) == trajstore._cuda._DEVICE_SLOTS
    assert same_batches(got, plain)
    for b in got[:3]:
        assert_batch_matches(ref, b, COLUMNS)


def test_staged_epoch_with_a_short_last_batch(discrete_ds, staged, monkeypatch):
    kw = dict(slice_len=8, num_slices=48, sampler="epoch", seed=2)
    staged_batches = take(discrete_ds.loader(**kw, staging_slots=2), 10**9)
    monkeypatch.delenv("TRAJSTORE_STAGED_CPU")
    plain = take(discrete_ds.loader(**kw), 10**9)
    assert len(staged_batches) == len(plain) > 1
    assert same_batches(staged_batches, plain)
    # The last batch of the epoch is short: its tensors are trimmed views of the slot.
    assert staged_batches[-1]["episode_id"].shape[0] <= 48


def test_staged_break_and_iterate_again_continues_without_overwriting(demo_ds, staged, monkeypatch):
    kw = dict(slice_len=8, num_slices=8, seed=5, max_batches=12)
    loader = demo_ds.loader(**kw, staging_slots=3, workers=2)
    first = []
    for i, b in enumerate(loader):
        first.append({k: v.numpy().copy() for k, v in b.items()})
        if i == 4:
            break
    assert loader.position == 5
    rest = take(loader, 10**9)  # the next iteration: 12 more batches from batch 5
    monkeypatch.delenv("TRAJSTORE_STAGED_CPU")
    plain = take(demo_ds.loader(**dict(kw, max_batches=17)), 17)
    assert same_batches(first, plain[:5])
    assert same_batches(rest, plain[5:17])


def test_staged_dtype_cast_and_transform(demo_ds, staged):
    def transform(batch):
        batch["reward"] = batch["reward"] * 0 + 1
        return batch

    b = next(iter(demo_ds.loader(slice_len=8, num_slices=4, dtype_cast=torch.bfloat16, transform=transform)))
    assert b["observation"].dtype == torch.bfloat16
    assert b["episode_id"].dtype == torch.int64 and b["mask"].dtype == torch.bool
    assert torch.all(b["reward"] == 1)


def test_staged_mix_equals_plain_mix(tmp_path, monkeypatch):
    """A mix through the staged path: the same batches, and one `source` tensor for all."""
    import trajstore
    from growing import append, check_batch, lengths
    from trajref import batch_numpy

    a, b = tmp_path / "a.trajstore", tmp_path / "b.trajstore"
    append(a, lengths(20, 10, 50, seed=1), tag=0.0, seed=1)
    append(b, lengths(20, 10, 50, seed=2), tag=1.0, seed=2)
    kw = dict(slice_len=4, num_slices=16, weights=[3, 1], seed=4, max_batches=12)
    plain = take(trajstore.mix([a, b], **kw), 12)
    monkeypatch.setenv("TRAJSTORE_STAGED_CPU", "1")
    loader = trajstore.mix([a, b], **kw, staging_slots=3, workers=2)
    assert loader._staged_on_cpu
    got = list(loader)
    assert got[0]["source"] is got[-1]["source"] and got[0]["source"].tolist() == [0] * 12 + [1] * 4
    got = [batch_numpy(x) for x in got]
    assert same_batches(got, plain)
    for x in got:
        check_batch(x, (0.0, 1.0))


def test_held_batches_are_never_overwritten(demo_ds, monkeypatch):
    """Batches kept (not copied) while the rings go round many times still hold their data: a
    device buffer something refers to (a batch, a view of one) is left to it and replaced."""
    import trajstore._cuda

    monkeypatch.setattr(trajstore._cuda, "_TAIL_MIN_BYTES", 0)
    kw = dict(slice_len=8, num_slices=16, policy="pad", seed=3, max_batches=40, columns=COLUMNS)
    plain = take(demo_ds.loader(**kw), 40)
    monkeypatch.setenv("TRAJSTORE_STAGED_CPU", "1")
    loader = demo_ds.loader(**kw, workers=3, staging_slots=2)
    held, views = [], []
    for i, b in enumerate(loader):
        if i % 2:
            held.append(b)  # the batch itself
        else:
            views.append(b["observation"][:, 1:])  # only a view of one of its tensors
    assert len(held) == 20
    got = [{k: v.numpy() for k, v in b.items()} for b in held]
    assert same_batches(got, plain[1::2])
    for v, want in zip(views, plain[0::2]):
        np.testing.assert_array_equal(v.numpy(), want["observation"][:, 1:])
    slot_memory = {buf.data_ptr() for buf in loader._packed}
    assert all(t.untyped_storage().data_ptr() not in slot_memory for b in held for t in b.values())
    # Nothing held: the ring's buffers are used again and again.
    loader = demo_ds.loader(**kw, workers=3, staging_slots=2)
    seen = {id(b["observation"]) for b in loader}
    assert len(seen) == trajstore._cuda._DEVICE_SLOTS
