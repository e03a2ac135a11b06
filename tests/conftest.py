"""Shared fixtures and the test layers. Tests are collected from this repo (importlib mode):
py-libnuma ships a top-level `tests` package into site-packages that must never shadow ours.

Layers (markers registered in pyproject.toml): `e2e` starts agent processes, `slurm` needs the
local Slurm cluster; everything else is the unit layer (`-m "not e2e and not slurm"`). A test
that asks for the fixtures that start agents or Slurm is marked here, so it cannot slip into the
unit layer unmarked; tests that start agents some other way carry the mark themselves."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# A shell starts a background job (`.ci/run &`, nohup) with SIGINT ignored, and an ignored signal
# stays ignored across exec: every process the tests start would then shrug off the Ctrl-C they
# send it. Tests run as if from a terminal: SIGINT raises KeyboardInterrupt here and is at its
# default in every child.
signal.signal(signal.SIGINT, signal.default_int_handler)

from cluster import Cluster  # noqa: E402
from slurm_local import slurm  # noqa: E402, F401  (the real local Slurm, for the Slurm tests)

LAYER_FIXTURES = {"cluster_factory": ("e2e",), "slurm": ("e2e", "slurm")}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        for fixture, marks in LAYER_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                for mark in marks:
                    item.add_marker(mark)


@pytest.fixture
def cluster_factory(tmp_path):
    made: list[Cluster] = []

    def make(nnodes: int, **kw) -> Cluster:
        cluster = Cluster(tmp_path, nnodes, **kw)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.kill()
