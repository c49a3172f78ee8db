"""A collector that dies mid-episode (SIGKILL, no cleanup) loses only what it had not committed,
and its lock does not outlive it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import trajstore
from trajref import Reference, column_to_numpy, subprocess_env

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import trajstore

    path = sys.argv[1]
    w = trajstore.create(path, observation_shape=(4,), action_shape=(2,))
    for i in range(3):
        rng = np.random.default_rng(i)
        t = 5 + 3 * i
        w.append_episode(
            rng.standard_normal((t, 4)).astype(np.float32),
            rng.standard_normal((t, 2)).astype(np.float32),
            rng.standard_normal(t).astype(np.float32),
            terminated=(i == 1),
            final_observation=np.full(4, i, np.float32),
        )
        w.commit()
    # A 4th episode: whole (appended, not committed) and a 5th step by step, then death.
    rng = np.random.default_rng(3)
    w.append_episode(np.ones((20, 4), np.float32), np.ones((20, 2), np.float32), np.ones(20, np.float32))
    for t in range(7):
        w.append_step(np.zeros(4), np.zeros(2), 0.5)
    print("READY", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


class ChildFailed(AssertionError):
    pass


def _run_child(path):
    p = subprocess.run([sys.executable, "-c", CHILD, str(path)], env=subprocess_env(), capture_output=True, text=True, timeout=120)
    if p.returncode != -signal.SIGKILL:
        if "NotImplementedError" in p.stderr:
            # The collector failed before it could die (the writer bug): surface that error.
            raise NotImplementedError(p.stderr.strip().splitlines()[-1])
        raise ChildFailed(f"child exited with {p.returncode}:\n{p.stdout}\n{p.stderr}")
    assert "READY" in p.stdout
    return p


def test_killed_collector_loses_only_uncommitted_episode(tmp_path):
    path = tmp_path / "crash.trajstore"
    _run_child(path)
    ds = trajstore.open(path)
    assert ds.num_episodes == 3
    assert len(ds) == 5 + 8 + 11
    ep = ds.episodes()
    assert ep.column("length").to_pylist() == [5, 8, 11]
    assert ep.column("terminated").to_pylist() == [False, True, False]
    finals, _ = column_to_numpy(ep.column("final_observation"))
    np.testing.assert_array_equal(finals, np.repeat(np.arange(3, dtype=np.float32)[:, None], 4, 1))
    ref = Reference(str(path))
    for i in range(3):
        rng = np.random.default_rng(i)
        t = 5 + 3 * i
        obs = rng.standard_normal((t, 4)).astype(np.float32)
        act = rng.standard_normal((t, 2)).astype(np.float32)
        rew = rng.standard_normal(t).astype(np.float32)
        np.testing.assert_array_equal(ref.steps(i, "observation"), obs)
        np.testing.assert_array_equal(ref.steps(i, "action"), act)
        np.testing.assert_array_equal(ref.steps(i, "reward"), rew)
        rb = ds.episode(i)
        np.testing.assert_array_equal(column_to_numpy(rb.column(rb.schema.get_field_index("observation")))[0], obs)
    # The lock died with the process: a new writer opens at once and continues at episode 3.
    w = ds.writer(lock_wait=0)
    assert w.next_episode_id == 3
    w.append_episode(np.zeros((4, 4)), np.zeros((4, 2)), np.zeros(4), terminated=True)
    w.commit()
    w.close()
    again = trajstore.open(path)
    assert again.num_episodes == 4 and len(again) == 24 + 4
    # Whatever the dead writer left in segments/ is not part of any version.
    assert Reference(str(path)).num_transitions == 28


def test_killed_writer_releases_lock(tmp_path):
    """Independent of appending: a process that holds the writer and is killed leaves the dataset
    openable for writing."""
    path = tmp_path / "lock.trajstore"
    code = textwrap.dedent(
        f"""
        import os, signal, trajstore
        w = trajstore.create({str(path)!r}, observation_shape=(4,), action_shape=(2,))
        print("LOCKED", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    p = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL and "LOCKED" in p.stdout, p.stderr
    w = trajstore.open(path).writer(lock_wait=0)
    assert not w.closed
    w.close()


def test_live_writer_in_another_process_holds_lock(tmp_path):
    path = tmp_path / "held.trajstore"
    code = textwrap.dedent(
        f"""
        import sys, trajstore
        w = trajstore.create({str(path)!r}, observation_shape=(4,), action_shape=(2,))
        print("LOCKED", flush=True)
        sys.stdin.readline()
        w.close()
        print("CLOSED", flush=True)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", code], env=subprocess_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "LOCKED"
        with pytest.raises(trajstore.LockedError):
            trajstore.open(path).writer(lock_wait=0.1)
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "CLOSED"
        trajstore.open(path).writer(lock_wait=1.0).close()
    finally:
        p.kill() if p.poll() is None else None
        p.wait(timeout=60)
