"""Hangs end to end (2 simulated nodes × 2 ranks on loopback): `agent stacks` on a live job, and
--hang-timeout tearing a hung job down with every rank's stack as the root cause."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from cluster import REPO, base_env, job_processes, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.solo]  # hang and pace clocks from the ranks' start

STUCK = str(REPO / "tests" / "fixtures" / "stuck_job.py")
RANK = str(REPO / "tests" / "fixtures" / "rank.py")
CATASTROPHIC = "a" * 40 + "b"  # (a+)+$ backtracks 2^40 times on it in Python's re


def _started(cluster) -> bool:
    files = [cluster.rank_file(r) for r in range(4)]
    return all(f.exists() and "iter 0" in f.read_text() for f in files)


def _stacks(cluster, *args):
    env = base_env(cluster.tmp)
    return subprocess.run(
        [sys.executable, "-m", "agent", "stacks", str(cluster.log_dir), *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_stacks_of_a_live_job_grouped_odd_one_first(cluster_factory):
    cluster = cluster_factory(2).start(["--nproc-per-node", "2", STUCK])
    wait_for(lambda: _started(cluster), 90, "every rank to reach its loop", interval=0.2)
    start = time.monotonic()
    result = _stacks(cluster)
    took = time.monotonic() - start
    assert result.returncode == 0, result.stderr + cluster.dump()
    out = result.stdout
    assert "---- rank 3 (1 rank on 127.0.0.2) ----" in out, out
    assert "---- ranks 0-2 (3 ranks on 127.0.0.[1-2]) ----" in out, out
    assert out.index("spin_without_progress") < out.index("wait_in_the_collective"), out
    # A hang catcher only: BENCHMARKS.md 8b measures 0.11 s (2 × 2) on this machine.
    assert took < 30, f"agent stacks took {took:.2f}s"
    assert [a.proc.poll() for a in cluster.agents] == [None, None], "the job keeps running"
    only = _stacks(cluster, "--ranks", "0")
    assert "---- rank 0 (1 rank on 127.0.0.1) ----" in only.stdout and "rank 3" not in only.stdout


def test_hang_timeout_names_the_lone_rank_and_leaves_nothing(cluster_factory):
    # 8 s: the clock runs from the ranks' start, and 4 ranks importing torch on 2 busy cores
    # can be silent for 5 s (a hang called in the imports, rightly, for that T)
    args = ["--nproc-per-node", "2", "--hang-timeout", "8", "--max-infra-restarts", "0"]
    cluster = cluster_factory(2).start([*args, STUCK])
    wait_for(lambda: _started(cluster), 90, "every rank to reach its loop", interval=0.2)
    last_output = time.monotonic()
    codes = cluster.wait(60)
    # A hang catcher only: BENCHMARKS.md 8a measures last output → every agent exited T + ~1 s.
    assert time.monotonic() - last_output < 8 + 25, "detected and torn down in time"
    assert codes == [1, 1], cluster.dump()
    cause = cluster.summary()["root_cause"]["how"]
    # The recorders first (which collective, who never came), then the stacks' groups.
    assert cause.startswith(
        "hang: no progress for 8 s from the 4 ranks still running; ranks 0-2 entered all_reduce "
        "#1 on default_pg ([1] Float); rank 3 has entered none on it and is in "
        "spin_without_progress (stuck_job.py:"
    ), cause
    assert "; rank 3 in spin_without_progress" in cause, cause
    # blocked inside torch: the innermost frame, and the user's frame that called it
    assert (
        "; ranks 0-2 in " in cause
        and "called from wait_in_the_collective (stuck_job.py:15)" in cause
    ), cause
    stacks = (cluster.log_dir / "stacks-a0.txt").read_text()
    assert "rank 3 (1 rank" in stacks and "ranks 0-2 (3 ranks" in stacks
    assert not job_processes(cluster.marker)
    after = _stacks(cluster)  # the job finished: its files, not resident agents to start
    assert after.returncode == 3, after.stderr
    assert f"has finished: its stacks at the hang: {cluster.log_dir}/stacks-a0.txt" in after.stderr
    assert "serve" not in after.stderr and len(after.stderr.splitlines()) == 1, after.stderr


def test_output_that_is_not_progress_is_still_a_hang(cluster_factory):
    # 8 s: the clock runs from the ranks' start, and 4 ranks importing torch on 2 busy cores
    # can take 4 s before the lone rank prints its first tick
    args = ["--nproc-per-node", "2", "--hang-timeout", "8", "--progress-regex", r"iter \d+"]
    args += ["--max-infra-restarts", "0"]  # one hang: a hang is an infrastructure failure
    cluster = cluster_factory(2).start([*args, STUCK, "--tick"])
    assert cluster.wait(90) == [1, 1], cluster.dump()
    assert "tick" in cluster.rank_file(3).read_text(), "the lone rank kept printing"
    cause = cluster.summary()["root_cause"]["how"]
    assert cause.startswith("hang: no progress for 8 s from the 4 ranks still running; "), cause
    assert "; rank 3 in spin_without_progress" in cause, cause


def test_a_hang_restarts_the_world_then_fails_as_a_hang(cluster_factory):
    # a hang is an infrastructure failure: it spends --max-infra-restarts (agent.run.failure_class)
    args = ["--nproc-per-node", "2", "--hang-timeout", "4", "--max-infra-restarts", "1"]
    cluster = cluster_factory(2).start([*args, STUCK])
    assert cluster.wait(120) == [1, 1], cluster.dump()
    summary = cluster.summary()
    assert len(summary["attempts"]) == 2, json.dumps(summary)[:2000]
    assert summary["root_cause"]["how"].startswith("hang: no progress for 4 s")
    assert (cluster.log_dir / "stacks-a1.txt").exists()
    assert [a["failure"]["class"] for a in summary["attempts"]] == ["infrastructure"] * 2


def test_a_catastrophic_progress_regex_neither_wedges_the_output_nor_the_signals(cluster_factory):
    """`(a+)+$` against 40 a's and a b: Python's re would hold the GIL for hours in the thread
    that drains every pipe, so rank output stops and the agent never handles SIGTERM. RE2 runs
    it in linear time: the job ends, and a job still running answers SIGTERM at once."""
    args = ["--hang-timeout", "600", "--progress-regex", "(a+)+$", RANK, "--stdout", CATASTROPHIC]
    done = cluster_factory(1).start(args)
    assert done.wait(60) == [0], done.dump()
    assert CATASTROPHIC in done.rank_file(0).read_text()
    running = cluster_factory(1, step="1").start([*args, "--others-wait"])
    line = running.rank_file(0)
    wait_for(lambda: line.exists() and CATASTROPHIC in line.read_text(), 90, "the line's arrival")
    start = time.monotonic()
    os.kill(running.agents[0].proc.pid, signal.SIGTERM)
    assert running.wait(30) == [143], running.dump()  # a hang catcher: 2 s is the promise
    print(f"SIGTERM answered in {time.monotonic() - start:.2f} s")
