"""The Python examples run as a user would run them, and do what they claim."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("h5py")

ROOT = Path(__file__).resolve().parents[2]
TRAIN_BC = ROOT / "examples" / "train_bc.py"
FLOAT = r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)"


def run_example(script, *args, timeout=300):
    env = dict(os.environ)
    # The package under test (python/), whatever the current directory.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.mark.parametrize("slice_len,batch_size", [(1, 256), (8, 32)])
def test_train_bc_learns(tmp_path, slice_len, batch_size):
    dataset = tmp_path / "bc.trajstore"
    p = run_example(
        TRAIN_BC, "--steps", 150, "--log-every", 50, "--device", "cpu", "--dataset", dataset,
        "--slice-len", slice_len, "--batch-size", batch_size,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    # Ingest of the synthetic D4RL file: its flags became the episode boundaries.
    assert re.search(r"ingested 50000 transitions in \d+ episodes", p.stdout), out
    assert "boundaries: flags terminals, timeouts" in p.stdout, out
    assert dataset.is_dir()
    # The loss was printed at steps 1, 50, 100 and 150 ...
    steps = [int(s) for s, _ in re.findall(r"^step\s+(\d+)\s+loss " + FLOAT, p.stdout, re.M)]
    assert steps == [1, 50, 100, 150], out
    # ... and fell: final (mean of the last steps) well below the first.
    m = re.search(r"^final loss " + FLOAT + r" \(first " + FLOAT + r"\)$", p.stdout, re.M)
    assert m, out
    final, first = float(m.group(1)), float(m.group(2))
    assert first > 0.3, out  # an untrained policy is far off
    assert final < 0.3 * first, out
    held_out = float(re.search(r"held-out MSE " + FLOAT, p.stdout).group(1))
    assert held_out < 0.5 * first, out


def test_train_bc_reuses_dataset_and_fails_when_not_learning(tmp_path):
    dataset = tmp_path / "bc.trajstore"
    first = run_example(TRAIN_BC, "--steps", 20, "--dataset", dataset, "--device", "cpu")
    assert first.returncode == 0, first.stdout + first.stderr
    # A second run opens the existing dataset instead of ingesting again; with a learning rate
    # of 0 the loss cannot fall, and the script says so with a non-zero exit status.
    p = run_example(TRAIN_BC, "--steps", 20, "--dataset", dataset, "--device", "cpu", "--lr", 0)
    out = p.stdout + p.stderr
    assert f"reusing the dataset at {dataset}" in p.stdout, out
    assert "ingested" not in p.stdout, out
    assert "50000 transitions" in p.stdout, out
    assert p.returncode == 1, out
    assert "the loss did not fall" in p.stderr, out


PREEMPTIBLE = ROOT / "examples" / "preemptible_training.py"
OFFLINE_TO_ONLINE = ROOT / "examples" / "offline_to_online.py"
COLLECTOR = ROOT / "examples" / "collector.py"


def _step_lines(out):
    return re.findall(r"^step \d+ loss \S+$", out, re.M)


def test_preemptible_training_resumes_bit_for_bit(tmp_path):
    dataset = tmp_path / "data.trajstore"
    common = ["--steps", 40, "--save-every", 10, "--dataset", dataset]
    full = run_example(PREEMPTIBLE, *common, "--checkpoint", tmp_path / "full.pt")
    assert full.returncode == 0, full.stdout + full.stderr
    assert "wrote a synthetic dataset" in full.stdout
    want = _step_lines(full.stdout)
    assert [int(l.split()[1]) for l in want] == list(range(1, 41)), full.stdout
    ckpt = tmp_path / "preempted.pt"
    # Preempted (SIGKILL) right after step 25: the last checkpoint is step 20's.
    killed = run_example(PREEMPTIBLE, *common, "--checkpoint", ckpt, "--kill-at", 25, "--workers", 1)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    before = _step_lines(killed.stdout)
    assert before == want[:25], killed.stdout
    assert not (tmp_path / "preempted.pt.tmp").exists()
    # A collector commits more episodes meanwhile: the run resumes on the checkpoint's version.
    grow = run_example(COLLECTOR, dataset, "--commit-every", 0.1, "--episodes-per-commit", 2,
                       "--episode-len", 50, "--seconds", 0.35)
    assert grow.returncode == 0 and "commit version" in grow.stdout, grow.stdout + grow.stderr
    resumed = run_example(PREEMPTIBLE, *common, "--checkpoint", ckpt, "--workers", 3)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming from step 20 (dataset version 2, batch 20)" in resumed.stdout, resumed.stdout
    assert before[:20] + _step_lines(resumed.stdout) == want


def test_offline_to_online_samples_new_commits(tmp_path):
    p = run_example(
        OFFLINE_TO_ONLINE, "--dir", tmp_path, "--steps", 150, "--log-every", 10, "--commit-every", 0.2,
        "--step-delay", 0.01, "--follow", 0.2, "--batch-size", 64, "--episode-len", 100, "--device", "cpu",
        timeout=120,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    logs = [
        (int(s), int(v), int(n), int(newest))
        for s, v, n, newest in re.findall(
            r"^step\s+(\d+)\s+online v (\d+)\s+online episodes seen (\d+) \(newest (\d+)\)\s+loss ", p.stdout, re.M
        )
    ]
    assert [s for s, *_ in logs] == [1] + list(range(10, 151, 10)), out
    versions = [v for _, v, _, _ in logs]
    assert versions == sorted(versions) and versions[-1] >= versions[0] + 3, out
    # The collector's commits, and the episodes each made.
    commits = [(int(v), int(a), int(b)) for v, a, b in
               re.findall(r"\[collector\] commit version (\d+): episodes (\d+)\.\.(\d+)", p.stdout)]
    assert len(commits) >= 5, out
    # Episodes committed during the run were sampled: far beyond the 2 the online data began with.
    newest = logs[-1][3]
    assert newest >= commits[2][1], out
    assert logs[-1][2] > logs[0][2] + 4, out
    assert "collector stopped after" in p.stdout and "collector exited with status 0" in p.stdout, out
