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
