"""Issue 30 on the Python side: no SQL kills the interpreter, loader states and arguments are
range-checked, permissions are reported as such, the writer checks shapes, and a loader used from
a forked DataLoader worker fails at once instead of hanging."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import trajstore


def _or_chain(n: int) -> str:
    return "SELECT episode_id FROM episodes WHERE " + " OR ".join(f"episode_id = {i}" for i in range(n))


def test_deep_sql_is_an_error_not_a_segfault(demo_ds):
    deep = _or_chain(10_000)
    plus = "SELECT " + " + ".join(["1"] * 10_000) + " AS s"
    for q in (deep, plus):
        with pytest.raises(trajstore.InvalidArgumentError, match="nested more than 1000"):
            demo_ds.sql(q)
    with pytest.raises(trajstore.InvalidArgumentError, match="nested more than 1000"):
        demo_ds.episodes_where(deep)
    with pytest.raises(trajstore.InvalidArgumentError, match="nested more than 1000"):
        demo_ds.loader(slice_len=4, num_slices=2, episodes=deep)
    # At the bound (1000 deep) it runs, in the debug extension too.
    ids = demo_ds.episodes_where(_or_chain(999))
    assert len(ids) > 0


def test_sql_memory_limit(demo_ds):
    limit, source = trajstore.sql_memory_limit()
    assert limit > 0 and source
    try:
        trajstore.set_sql_memory_limit("2MiB")
        assert trajstore.sql_memory_limit() == (2 << 20, "set by the caller")
        with pytest.raises(trajstore.SqlError, match="needs more memory than the SQL limit"):
            demo_ds.sql("SELECT * FROM transitions")
        with pytest.raises(trajstore.InvalidArgumentError):
            trajstore.set_sql_memory_limit("lots")
        with pytest.raises(trajstore.InvalidArgumentError):
            trajstore.set_sql_memory_limit(10)
    finally:
        trajstore.set_sql_memory_limit(None)
    assert trajstore.sql_memory_limit() == (limit, source)
    assert demo_ds.sql("SELECT count(*) AS n FROM transitions").to_pylist() == [{"n": len(demo_ds)}]


def _state(demo_ds, **kw):
    loader = demo_ds.loader(slice_len=8, num_slices=4, max_batches=3, workers=1, **kw)
    for _ in loader:
        pass
    return loader, loader.state_dict()


def test_load_state_dict_range_checks_every_field(demo_ds):
    loader, state = _state(demo_ds)
    for key, value in [("next_batch", 2**64 - 1), ("next_batch", 2**48 + 1), ("world_size", 0), ("rank", 5)]:
        bad = dict(state, **{key: value})
        with pytest.raises(trajstore.InvalidArgumentError):
            loader.load_state_dict(bad)
    for pos in (2**64 - 1, -1, 1.5, True, "3"):
        with pytest.raises(trajstore.InvalidArgumentError, match="position"):
            loader.load_state_dict({"position": pos})
    # The loader is untouched by the refusals: it continues where it was.
    assert loader.position == state["next_batch"]
    next(iter(loader))


def test_a_state_missing_its_sampler_is_refused(demo_ds):
    _, state = _state(demo_ds, seed=1)
    stripped = dict(state)
    stripped["parts"] = [dict(p, sampler=None) for p in state["parts"]]
    for seed in (2, 1):
        other = demo_ds.loader(slice_len=8, num_slices=4, max_batches=3, workers=1, seed=seed)
        with pytest.raises(trajstore.InvalidArgumentError, match="no sampler options"):
            other.load_state_dict(stripped)
    no_id = dict(state)
    no_id["parts"] = [dict(p, dataset_id=None) for p in state["parts"]]
    other = demo_ds.loader(slice_len=8, num_slices=4, max_batches=3, workers=1, seed=1)
    with pytest.raises(trajstore.InvalidArgumentError, match="no dataset_id"):
        other.load_state_dict(no_id)


@pytest.mark.parametrize(
    "follow", [1e20, float("inf"), 10**400, 86_401, {"every": 1e300}, {"every": 0}, {"every_batches": 2**70}]
)
def test_follow_periods_are_capped(demo_ds, follow):
    with pytest.raises(trajstore.InvalidArgumentError):
        demo_ds.loader(slice_len=4, num_slices=2, follow=follow)


def test_follow_of_a_day_is_accepted(demo_ds):
    loader = demo_ds.loader(slice_len=4, num_slices=2, follow=86_400, max_batches=1)
    assert len(list(loader)) == 1


def _drop_root_rights() -> list[str]:
    """A command prefix that runs a program without root's rights over file modes."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv is missing: cannot drop root's file rights")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]


def test_permission_denied_is_reported_as_such(tmp_path, demo_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    inner = locked / "d"
    shutil.copytree(demo_path, inner)
    private = tmp_path / "private"
    shutil.copytree(demo_path, private)
    os.chmod(private, 0o700)
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "65534:65534", str(private)], check=True)
    os.chmod(locked, 0)
    try:
        code = (
            "import sys, trajstore\n"
            "try:\n"
            "    trajstore.open(sys.argv[1])\n"
            "except trajstore.PermissionDeniedError as e:\n"
            "    assert isinstance(e, PermissionError) and sys.argv[1] in str(e), e\n"
            "    print('denied:', e)\n"
        )
        for path in (inner, private):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
            out = subprocess.run(
                [*_drop_root_rights(), sys.executable, "-c", code, str(path)],
                capture_output=True,
                text=True,
                env=env,
            )
            assert out.returncode == 0, out.stderr
            assert "denied:" in out.stdout and "Permission denied" in out.stdout, out.stdout
    finally:
        os.chmod(locked, 0o755)
    with pytest.raises(trajstore.DatasetNotFoundError):
        trajstore.open(tmp_path / "missing")


def test_writer_checks_shapes_not_counts(tmp_path):
    path = tmp_path / "img.trajstore"
    rng = np.random.default_rng(3)
    t = 5
    with trajstore.create(path, observation_shape=(3, 8, 6), action_shape=(2,), observation_dtype="uint8") as w:
        channel_last = rng.integers(0, 255, (t, 8, 6, 3), dtype=np.uint8)
        act = rng.normal(size=(t, 2)).astype(np.float32)
        rew = rng.normal(size=t).astype(np.float32)
        with pytest.raises(trajstore.InvalidArgumentError, match=r"shaped \(8, 6, 3\).*\(3, 8, 6\)"):
            w.append_episode(channel_last, act, rew)
        with pytest.raises(trajstore.InvalidArgumentError, match="shaped"):
            w.append_episode(channel_last.reshape(t, 3, 6, 8), act, rew)
        with pytest.raises(trajstore.InvalidArgumentError, match="shaped"):
            w.append_episode(channel_last.transpose(0, 3, 2, 1), act, rew)
        assert w.next_episode_id == 0
        # The right layout, and size-1 axes added or dropped, are accepted.
        chw = channel_last.transpose(0, 3, 1, 2).copy()
        w.append_episode(chw, act, rew.reshape(t, 1))
        w.append_step(chw[0], act[0], float(rew[0]))
        w.end_episode(terminated=True)
    ds = trajstore.open(path)
    b = next(iter(ds.loader(slice_len=5, num_slices=1, max_batches=1, episodes=[0])))
    assert np.array_equal(b["observation"][0].numpy(), chw)


def test_a_forked_dataloader_worker_fails_at_once(demo_ds):
    torch = pytest.importorskip("torch")
    loader = demo_ds.loader(slice_len=4, num_slices=2, max_batches=4, workers=1)
    dl = torch.utils.data.DataLoader(loader, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60)
    with pytest.raises(Exception, match="num_workers=0") as e:
        for _ in dl:
            pass
    assert "forked" in str(e.value)
    # The loader still works in its own process, and with num_workers=0.
    assert len(list(torch.utils.data.DataLoader(loader, batch_size=None, num_workers=0))) == 4


def test_a_forked_child_using_a_loader_gets_an_error(demo_ds):
    loader = demo_ds.loader(slice_len=4, num_slices=2, max_batches=2, workers=1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what happened, never run pytest's teardown
        os.close(r)
        try:
            next(iter(loader))
            msg = b"no error"
        except trajstore.InvalidArgumentError as e:
            msg = b"ok " + str(e).encode()
        except BaseException as e:  # noqa: BLE001
            msg = repr(e).encode()
        os.write(w, msg[:4000])
        os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    got = os.read(r, 4096).decode()
    os.close(r)
    assert os.WEXITSTATUS(status) == 0
    assert got.startswith("ok ") and "num_workers=0" in got, got
    assert len(list(loader)) == 2


def test_a_loader_cannot_be_pickled(demo_ds):
    import pickle

    loader = demo_ds.loader(slice_len=4, num_slices=2, max_batches=1)
    with pytest.raises(trajstore.InvalidArgumentError, match="num_workers=0"):
        pickle.dumps(loader)
