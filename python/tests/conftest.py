"""Shared fixtures: small synthetic datasets written by the `trajstore` CLI (``$TRAJSTORE_BIN``,
set by scripts/test-python.sh), opened with the package, and read independently with pyarrow
(trajref.Reference)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import trajref  # noqa: E402
from trajref import _bin, make_demo  # noqa: E402

# The dataset most tests read: 20k transitions, episodes of 10..400 steps, four segments (so that
# references and gathers cross segment files).
DEMO_ARGS = ["--transitions", "20000", "--mean-episode-len", "100", "--seed", "0", "--segment-size", "600KiB"]
DISCRETE_ARGS = [
    "--transitions", "6000", "--mean-episode-len", "60", "--seed", "3", "--discrete", "--act-dim", "5",
    "--obs-dim", "4",
]


@pytest.fixture(scope="session")
def trajstore_bin() -> str:
    return _bin()


@pytest.fixture(scope="session")
def demo_path(tmp_path_factory) -> str:
    return make_demo(tmp_path_factory.mktemp("demo") / "demo.trajstore", *DEMO_ARGS)


@pytest.fixture(scope="session")
def demo_ds(demo_path):
    import trajstore

    return trajstore.open(demo_path)


@pytest.fixture(scope="session")
def ref(demo_path) -> trajref.Reference:
    return trajref.Reference(demo_path)


@pytest.fixture(scope="session")
def discrete_path(tmp_path_factory) -> str:
    return make_demo(tmp_path_factory.mktemp("discrete") / "discrete.trajstore", *DISCRETE_ARGS)


@pytest.fixture(scope="session")
def discrete_ds(discrete_path):
    import trajstore

    return trajstore.open(discrete_path)


@pytest.fixture(scope="session")
def discrete_ref(discrete_path) -> trajref.Reference:
    return trajref.Reference(discrete_path)


@pytest.fixture
def fresh_demo(tmp_path):
    """A private copy of the demo dataset a test may damage or append to."""

    def make(*extra: str) -> str:
        return make_demo(tmp_path / "copy.trajstore", *DEMO_ARGS, *extra)

    return make
