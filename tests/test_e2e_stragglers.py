"""Stragglers from step lines and the restart loop guard, with real agents on loopback."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from cluster import FIXTURE, base_env

pytestmark = [pytest.mark.e2e, pytest.mark.solo]  # hang and pace clocks from the ranks' start

STEP = r"step (?P<step>\d+)"


def _steps(cluster_factory, *fixture: str):
    cluster = cluster_factory(2).start(
        ["--nproc-per-node", "2", "--progress-regex", STEP, FIXTURE, *fixture]
    )
    assert cluster.wait(120) == [0, 0], cluster.dump()
    return cluster


def _logs_summary(cluster, tmp_path) -> str:
    shown = subprocess.run(
        [sys.executable, "-m", "agent", "logs", str(cluster.log_dir), "--summary"],
        env=base_env(tmp_path), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_a_slow_node_is_named_a_straggler(cluster_factory, tmp_path):
    cluster = _steps(cluster_factory, "--steps", "30", "--step-time", "0.2", "--slow-node", "1")
    console = cluster.agents[0].stdout() + cluster.agents[0].stderr()
    found = re.search(r"straggler: node 1 \(127\.0\.0\.2\) steps in .* at step (\d+)", console)
    assert found, cluster.dump()
    assert int(found.group(1)) <= 10, found.group(0)  # named within its first 10 steps
    assert "straggler: rank" not in console and "node 0 (" not in found.group(0)
    stragglers = cluster.summary()["stragglers"]
    assert [(s["node_rank"], s["host"], s["rank"]) for s in stragglers] == [
        (1, "127.0.0.2", None)
    ], stragglers
    (entry,) = stragglers
    assert entry["median"] > 1.5 * entry["job_median"] > 0
    assert 0.15 < entry["job_median"] < 0.3 and 0.3 < entry["median"] < 0.6  # seconds per step
    assert "ended" not in console and "straggler no more" not in console  # once, not flapping
    assert "straggler in attempt 0: node 1 (127.0.0.2) at 0." in _logs_summary(cluster, tmp_path)


def test_equal_ranks_name_no_straggler(cluster_factory, tmp_path):
    cluster = _steps(cluster_factory, "--steps", "20", "--step-time", "0.2")
    console = "".join(a.stdout() + a.stderr() for a in cluster.agents)
    assert "straggler" not in console, cluster.dump()
    summary = cluster.summary()
    assert summary["stragglers"] == [] and summary["attempts"][0]["progressed"] is True
    assert "straggler" not in _logs_summary(cluster, tmp_path)


def test_restart_loop_guard_stops_after_two_attempts_without_progress(cluster_factory):
    cluster = cluster_factory(2).start(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "5",
            "--progress-regex",
            STEP,
            "--restart-same-failure",  # the same failure every time: the progress guard decides
            FIXTURE,
            "--on",
            "1",
            "--exit",
            "3",
            "--after",
            "0.3",
            "--others-wait",
        ]
    )
    assert cluster.wait(180) == [5, 5], cluster.dump()
    summary = cluster.summary()
    assert summary["exit_code"] == 5 and len(summary["attempts"]) == 2
    cause = summary["root_cause"]
    assert cause["how"] == "no progress in attempts 0 and 1; not restarting", cause
    assert cause["failure"]["rank"] == 1
    console = cluster.agents[0].stderr()
    assert "no progress in attempts 0 and 1; not restarting" in console, cluster.dump()


def test_restart_without_progress_turns_the_guard_off(cluster_factory):
    cluster = cluster_factory(2).start(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "2",
            "--progress-regex",
            STEP,
            "--restart-without-progress",
            "--restart-same-failure",
            FIXTURE,
            "--on",
            "1",
            "--exit",
            "3",
            "--after",
            "0.3",
            "--others-wait",
        ]
    )
    assert cluster.wait(180) == [1, 1], cluster.dump()
    summary = cluster.summary()
    assert len(summary["attempts"]) == 3 and summary["root_cause"]["rank"] == 1


def test_progress_in_every_attempt_keeps_restarting(cluster_factory):
    cluster = cluster_factory(2).start(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "2",
            "--progress-regex",
            STEP,
            "--restart-same-failure",
            FIXTURE,
            "--stdout",
            "step 1",
            "--on",
            "1",
            "--exit",
            "3",
            "--after",
            "0.5",
            "--others-wait",
        ]
    )
    assert cluster.wait(180) == [1, 1], cluster.dump()
    summary = cluster.summary()
    assert len(summary["attempts"]) == 3 and summary["root_cause"]["rank"] == 1
    assert all(a["progressed"] for a in summary["attempts"])
