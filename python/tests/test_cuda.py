"""The CUDA path (pinned staging ring, copies on a side stream): the same batches as on the CPU.
Skipped on machines without a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

import trajstore
from trajref import assert_batch_matches, batch_numpy, same_batches, take

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

COLUMNS = ["observation", "action", "reward", "next_observation"]


def _cpu(batch):
    return {k: v.cpu() for k, v in batch.items()}


@pytest.mark.parametrize("policy", ["strict", "pad"])
def test_cuda_batches_equal_cpu_batches(demo_ds, ref, policy):
    kw = dict(slice_len=16, num_slices=16, policy=policy, seed=13, max_batches=24)
    cpu = take(demo_ds.loader(**kw), 24)
    gpu = []
    for b in demo_ds.loader(**kw, device="cuda"):
        for k, v in b.items():
            assert v.device.type == "cuda", k
        gpu.append(batch_numpy(b))
    assert len(gpu) == 24
    assert same_batches(gpu, cpu)
    for b in gpu[:4]:
        assert_batch_matches(ref, b, COLUMNS)


def test_cuda_epoch_with_partial_last_batch(discrete_ds, discrete_ref):
    kw = dict(slice_len=8, num_slices=48, sampler="epoch", seed=1)
    cpu = take(discrete_ds.loader(**kw), 10**9)
    loader = discrete_ds.loader(**kw, device="cuda", staging_slots=3)
    gpu = take(loader, 10**9)
    assert len(gpu) == len(cpu) == len(loader)
    assert gpu[-1]["episode_id"].shape[0] <= 48
    assert same_batches(gpu, cpu)
    assert gpu[-1]["action"].dtype == np.int64


def test_dtype_cast_bfloat16_casts_floats_only(demo_ds):
    kw = dict(slice_len=8, num_slices=8, seed=2, max_batches=5)
    cpu = list(demo_ds.loader(**kw))
    gpu = list(demo_ds.loader(**kw, device="cuda", dtype_cast=torch.bfloat16))
    for c, g in zip(cpu, gpu):
        for k, v in g.items():
            if c[k].is_floating_point():
                assert v.dtype == torch.bfloat16, k
                assert torch.equal(v.cpu(), c[k].to(torch.bfloat16)), k
            else:
                assert v.dtype == c[k].dtype, k
                assert torch.equal(v.cpu(), c[k]), k
    assert gpu[0]["mask"].dtype == torch.bool and gpu[0]["episode_id"].dtype == torch.int64


def test_pin_memory_on_cpu(demo_ds):
    kw = dict(slice_len=8, num_slices=8, seed=4, max_batches=4)
    plain = take(demo_ds.loader(**kw), 4)
    pinned = []
    for b in demo_ds.loader(**kw, pin_memory=True):
        for k, v in b.items():
            assert v.device.type == "cpu" and v.is_pinned(), k
        pinned.append(batch_numpy(b))
    assert same_batches(pinned, plain)


def test_pin_memory_after_transform_that_makes_new_tensors(demo_ds):
    """TorchRL issue #2404: tensors a transform creates lose pinning; here they are pinned again."""

    def transform(batch):
        out = dict(batch)
        out["observation"] = batch["observation"] * 2.0          # a new tensor
        out["return"] = batch["reward"].sum(-1)                  # a new key
        return out                                               # a plain dict

    kw = dict(slice_len=8, num_slices=8, seed=5, max_batches=4)
    plain = list(demo_ds.loader(**kw))
    got = list(demo_ds.loader(**kw, pin_memory=True, transform=transform))
    assert len(got) == 4
    for p, g in zip(plain, got):
        assert isinstance(g, trajstore.Batch)
        for k, v in g.items():
            assert v.is_pinned(), k
        assert torch.equal(g["observation"], p["observation"] * 2.0)
        assert torch.equal(g["return"], p["reward"].sum(-1))


def test_cuda_transform_runs_on_host_and_values_arrive(demo_ds):
    seen = []

    def transform(batch):
        seen.append(batch["observation"].device.type)
        batch["obs_sq"] = batch["observation"] ** 2
        return None  # changed in place

    kw = dict(slice_len=8, num_slices=8, seed=6, max_batches=4)
    plain = list(demo_ds.loader(**kw))
    got = list(demo_ds.loader(**kw, device="cuda", transform=transform))
    assert seen == ["cpu"] * 4
    for p, g in zip(plain, got):
        assert g["obs_sq"].device.type == "cuda"
        assert torch.equal(g["obs_sq"].cpu(), p["observation"] ** 2)


def test_cuda_under_non_default_stream(demo_ds):
    kw = dict(slice_len=16, num_slices=16, seed=7, max_batches=12)
    cpu = list(demo_ds.loader(**kw))
    stream = torch.cuda.Stream()
    sums = []
    with torch.cuda.stream(stream):
        assert torch.cuda.current_stream() == stream
        for b in demo_ds.loader(**kw, device="cuda"):
            # Used at once on the current (non-default) stream, as training code would.
            sums.append((b["observation"] * b["mask"][..., None]).sum(dim=(1, 2)))
            sums.append(b["reward"].clone())
    stream.synchronize()
    for i, c in enumerate(cpu):
        torch.testing.assert_close(sums[2 * i].cpu(), (c["observation"] * c["mask"][..., None]).sum(dim=(1, 2)))
        assert torch.equal(sums[2 * i + 1].cpu(), c["reward"])


def test_cuda_held_batches_survive_staging_reuse(demo_ds):
    kw = dict(slice_len=8, num_slices=8, seed=8, workers=2, prefetch=2, staging_slots=3)
    cpu = take(demo_ds.loader(**kw, max_batches=40), 40)
    it = iter(demo_ds.loader(**kw, device="cuda", max_batches=40))
    held = next(it)
    rest = [batch_numpy(b) for b in it]  # 39 more batches through 3 staging slots
    torch.cuda.synchronize()
    assert same_batches([batch_numpy(held)] + rest, cpu)


def test_cuda_state_dict_resumes(demo_ds):
    kw = dict(slice_len=8, num_slices=8, seed=9, device="cuda")
    a = demo_ds.loader(**kw)
    it = iter(a)
    for _ in range(5):
        next(it)
    sixth = batch_numpy(next(it))
    b = demo_ds.loader(**kw)
    b.load_state_dict({"position": 5})
    assert same_batches([batch_numpy(next(iter(b)))], [sixth])


def test_cuda_device_out_of_range(demo_ds):
    with pytest.raises(trajstore.InvalidArgumentError):
        demo_ds.loader(device=f"cuda:{torch.cuda.device_count()}")


def test_cuda_break_and_iterate_again_continues_the_stream(demo_ds):
    """A second iteration after a `break` continues at the next batch, with the same values as
    on the CPU (the first stream's workers must not write into the staging slots the second
    stream gathers into)."""
    kw = dict(slice_len=8, num_slices=8, seed=10, workers=2, prefetch=2)
    cpu = take(demo_ds.loader(**kw, max_batches=40), 40)
    loader = demo_ds.loader(**kw, device="cuda", staging_slots=3)
    got = []
    for _ in range(4):
        for b in loader:
            got.append(batch_numpy(b))
            if len(got) % 10 == 3:
                break
        if len(got) >= 12:
            break
    got += take(loader, 40 - len(got))
    assert same_batches(got, cpu[: len(got)])
    assert len(got) == 40


def test_cuda_mix_and_resume(tmp_path):
    """A mix on the GPU: `source` is one device tensor for every batch, the values equal the CPU
    loader's, and a state taken on the GPU resumes on the CPU exactly."""
    from growing import append, check_batch, lengths

    a, b = tmp_path / "a.trajstore", tmp_path / "b.trajstore"
    append(a, lengths(20, 10, 50, seed=1), tag=0.0, seed=1)
    append(b, lengths(20, 10, 50, seed=2), tag=1.0, seed=2)
    kw = dict(slice_len=4, num_slices=16, seed=4)
    cpu = [batch_numpy(x) for x in trajstore.mix([a, b], **kw, max_batches=10)]
    gpu = trajstore.mix([a, b], **kw, device="cuda", max_batches=5)
    got = list(gpu)
    assert got[0]["source"].is_cuda and got[0]["source"] is got[-1]["source"]
    state = gpu.state_dict()
    got = [batch_numpy(x) for x in got]
    for x in got:
        check_batch(x, (0.0, 1.0))
    resumed = trajstore.mix([a, b], **kw, max_batches=5)
    resumed.load_state_dict(state)
    assert same_batches(got + [batch_numpy(x) for x in resumed], cpu)
