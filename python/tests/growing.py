"""Small datasets written with the Python writer whose observations say where each step came
from: ``observation[t] = [tag, episode_id, step, noise...]``, so that a batch checks itself
(every real step of a slice must carry its dataset's tag, the slice's episode id and the step
``start_step + t``), whatever version or dataset of a mix it was drawn from."""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

import trajstore

OBS_DIM, ACT_DIM = 4, 2


def episode(tag: float, eid: int, t: int, rng: np.random.Generator):
    obs = np.zeros((t, OBS_DIM), np.float32)
    obs[:, 0] = tag
    obs[:, 1] = eid
    obs[:, 2] = np.arange(t)
    obs[:, 3:] = rng.standard_normal((t, OBS_DIM - 3))
    act = rng.standard_normal((t, ACT_DIM)).astype(np.float32)
    rew = rng.standard_normal(t).astype(np.float32)
    return obs, act, rew


def append(path, lengths: Sequence[int], tag: float = 0.0, seed: int = 0) -> List[int]:
    """Appends one episode per length (creating the dataset if needed) and commits; returns
    the new episode ids."""
    rng = np.random.default_rng(seed)
    ids = []
    with trajstore.create(path, observation_shape=(OBS_DIM,), action_shape=(ACT_DIM,), append=True) as w:
        for t in lengths:
            eid = w.next_episode_id
            obs, act, rew = episode(tag, eid, int(t), rng)
            ids.append(w.append_episode(obs, act, rew, terminated=bool(eid % 2)))
    return ids


def lengths(n: int, lo: int, hi: int, seed: int) -> List[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(lo, hi + 1, n)]


def check_batch(b: Dict[str, np.ndarray], tags: Sequence[float] = (0.0,)) -> None:
    """Every real step of every slice of ``b`` (NumPy) is its dataset's, episode's and step's;
    padding is zeros. ``tags[s]``: the tag of the dataset of source ``s``."""
    obs, mask = b["observation"], b["mask"]
    n, l = mask.shape
    source = b.get("source", np.zeros(n, np.int64))
    for i in range(n):
        m = mask[i]
        assert m.any(), f"slice {i} has no real step"
        o = obs[i][m]
        steps = b["start_step"][i] + np.arange(l)[m]
        assert (o[:, 0] == tags[int(source[i])]).all(), f"slice {i}: dataset tags {o[:, 0]}, source {source[i]}"
        assert (o[:, 1] == b["episode_id"][i]).all(), f"slice {i}: episode {b['episode_id'][i]}, rows of {o[:, 1]}"
        assert (o[:, 2] == steps).all(), f"slice {i}: steps {o[:, 2]}, expected {steps}"
        assert not obs[i][~m].any(), f"slice {i}: padding is not zero"


def chi2_critical_001(df: int) -> float:
    """Upper 0.001 critical value of chi-square with ``df`` degrees of freedom (Wilson–Hilferty,
    as tests/common/sampling.rs; no SciPy needed)."""
    z = 3.090232306
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * a**0.5) ** 3


def assert_fits(what: str, observed: Sequence[int], weights: Sequence[float]) -> None:
    """``observed`` counts fit probabilities proportional to ``weights`` (chi-square at 0.001;
    cells of weight 0 must be empty)."""
    observed = np.asarray(observed, np.float64)
    weights = np.asarray(weights, np.float64)
    assert observed.shape == weights.shape, what
    assert not observed[weights == 0].any(), f"{what}: draws in cells of weight 0"
    keep = weights > 0
    expected = observed.sum() * weights[keep] / weights[keep].sum()
    assert expected.min() >= 5, f"{what}: too few draws for a chi-square test"
    stat = float(((observed[keep] - expected) ** 2 / expected).sum())
    crit = chi2_critical_001(int(keep.sum()) - 1)
    assert stat < crit, f"{what}: chi-square {stat:.1f} >= {crit:.1f} (df {keep.sum() - 1})"
