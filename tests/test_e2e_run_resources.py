"""A resident run closes what it opened (issue 24): node 0's listening sockets and threads are
the same after many runs as after one (each run's worker store, desks and watchers end with it)."""

from __future__ import annotations

import os
import time

import psutil
import pytest
from cluster import FIXTURE, wait_for
from serving import Serving

pytestmark = pytest.mark.e2e

RUNS = int(os.environ.get("RUN_RESOURCES_RUNS", "6"))


def _held(pid: int) -> tuple[int, int]:
    """(listening sockets, threads) of the process."""
    proc = psutil.Process(pid)
    listening = [c for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    return len(listening), proc.num_threads()


def _least(pid: int, seconds: float = 3.0) -> tuple[int, int]:
    """The fewest of each seen while sampling (a run's last threads may still be ending)."""
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(_held(pid))
        time.sleep(0.1)  # a sampling interval, not a synchronisation
    return min(s[0] for s in samples), min(s[1] for s in samples)


def test_node_zero_holds_as_much_after_many_runs_as_after_one(tmp_path):
    two = Serving(tmp_path, 2, ("--preload", "none"))
    try:
        two.start().ready()
        pid = two.agents[0].proc.pid
        seen = []
        for run in range(RUNS):
            args = ("run", "--nproc-per-node", "2", FIXTURE)
            if run % 2:  # failed runs too: their attempt ends early, on an abort
                args += ("--exit", "3", "--on", "1")
            result = two.call(*args, timeout=60)
            assert (result.returncode != 0) == bool(run % 2), result.stderr + two.dump()
            seen.append(_held(pid))
            if run == 0:
                after_one = _least(pid)

        def back() -> bool:
            now = _held(pid)
            return now[0] == after_one[0] and now[1] <= after_one[1]

        wait_for(back, 30, f"{after_one} again (after each run: {seen})")
        print(f"node 0 (listening, threads): after 1 run {after_one}, after {RUNS}: {_held(pid)}")
    finally:
        two.kill()
