"""Shared fixtures and the test layers. Tests are collected from this repo (importlib mode):
py-libnuma ships a top-level `tests` package into site-packages that must never shadow ours.

Layers (markers registered in pyproject.toml): `e2e` starts agent processes, `slurm` needs the
local Slurm cluster; everything else is the unit layer (`-m "not e2e and not slurm"`). A test
that asks for the fixtures that start agents or Slurm is marked here, so it cannot slip into the
unit layer unmarked; tests that start agents some other way carry the mark themselves."""

from __future__ import annotations

import fcntl
import os
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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        for fixture, marks in LAYER_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                for mark in marks:
                    item.add_marker(mark)
        if item.get_closest_marker("slurm"):
            # One worker runs every Slurm test, one after the other: the local cluster has 2
            # nodes, and a second salloc would wait for the first's in its test's time.
            item.add_marker(pytest.mark.xdist_group("slurm"))


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject.toml): one worker per core, at most 4. An end-to-end test's agents
    and ranks wait on each other half the time; more workers than cores would only queue."""
    return max(1, min(len(os.sched_getaffinity(0)), 4))


@pytest.fixture(autouse=True)
def alone_if_solo(request, tmp_path_factory):
    """A `solo` test runs with no other test beside it: its clock (a hang timeout, a straggler's
    pace) runs from its ranks' start, and ranks importing torch while another worker's test
    loads the same cores were once silent past it (CI: two hangs called before the loop).
    Every other test holds the lock shared. Writer first: a solo test waiting at the gate keeps
    new shared holders out, so the other worker's stream of tests cannot starve it."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: every test is alone
        yield
        return
    shared = tmp_path_factory.getbasetemp().parent  # the run's directory, above each worker's
    solo = request.node.get_closest_marker("solo") is not None
    with open(shared / "solo.gate", "a") as gate, open(shared / "solo.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if solo else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
