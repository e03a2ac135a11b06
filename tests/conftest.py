"""Shared fixtures. Tests are collected from this repo (importlib mode): py-libnuma ships a
top-level `tests` package into site-packages that must never shadow ours."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Cluster  # noqa: E402
from slurm_local import slurm  # noqa: E402, F401  (the real local Slurm, for the Slurm tests)


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
