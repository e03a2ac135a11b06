"""Restarts that know a bug from a fault, end to end on loopback nodes: the same exception
twice ends the job (exit 5) whatever --max-restarts allows; a lost node is infrastructure and
spends --max-infra-restarts."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from cluster import FIXTURE, job_processes, wait_for

pytestmark = pytest.mark.e2e

RAISE_LINE = next(
    n for n, line in enumerate(Path(FIXTURE).read_text().splitlines(), 1) if "RAISE_LINE" in line
)
QUICK = ["--nproc-per-node", "1", "--heartbeat-timeout", "2", "--grace", "1"]


def test_the_same_exception_twice_ends_the_job_naming_it(cluster_factory):
    cluster = cluster_factory(2).start(
        [*QUICK, "--max-restarts", "10", FIXTURE, "--on", "1", "--raise", "bad batch"]
    )
    assert cluster.wait(120) == [5, 5], cluster.dump()
    summary = cluster.summary()
    said = f"the same failure twice: ValueError at rank.py:{RAISE_LINE}; not restarting"
    assert summary["exit_code"] == 5 and len(summary["attempts"]) == 2, json.dumps(summary)[:3000]
    cause = summary["root_cause"]
    assert cause["how"] == said and cause["attempts"] == [0, 1], cause
    assert cause["failure"]["rank"] == 1  # the attempt's own failure, kept
    signature = f"ValueError at rank.py:{RAISE_LINE}"
    assert [a["failure"] for a in summary["attempts"]] == [
        {"class": "program", "why": f"rank 1: {signature}", "signature": signature}
    ] * 2
    job = summary["job"]
    assert (job["max_restarts"], job["max_infra_restarts"]) == (10, 3)
    assert said in cluster.agents[0].stderr(), cluster.dump()
    assert not job_processes(cluster.marker)


def test_restart_same_failure_restarts_up_to_max_restarts(cluster_factory):
    args = [*QUICK, "--max-restarts", "2", "--restart-same-failure"]
    cluster = cluster_factory(2).start([*args, FIXTURE, "--on", "1", "--raise", "bad batch"])
    assert cluster.wait(120) == [1, 1], cluster.dump()
    summary = cluster.summary()
    assert len(summary["attempts"]) == 3, json.dumps(summary)[:3000]
    assert summary["root_cause"]["kind"] == "rank" and summary["root_cause"]["rank"] == 1
    assert [a["failure"]["class"] for a in summary["attempts"]] == ["program"] * 3
    assert summary["job"]["restart_same_failure"] is True


def _env(directory, rank: int) -> dict | None:
    try:
        return json.loads((directory / f"env-{rank}.json").read_text())["env"]
    except (OSError, ValueError, KeyError):
        return None


def _running(directory, attempt: int) -> bool:
    envs = [_env(directory, r) for r in range(2)]
    return all(e is not None and e["TORCHELASTIC_RESTART_COUNT"] == str(attempt) for e in envs)


def test_a_node_lost_in_every_attempt_spends_the_infrastructure_budget(cluster_factory, tmp_path):
    """Node 1's agent is SIGKILLed in every attempt: infrastructure, restarted with a spare in
    its place whatever --max-restarts says (0), and ended by --max-infra-restarts 1 while a
    spare is still left — with the lost node as the root cause and its exit code (3)."""
    args = [*QUICK, "--spares", "2", "--max-infra-restarts", "1", FIXTURE]
    args += ["--env-out", str(tmp_path), "--until-file", str(tmp_path / "never")]
    cluster = cluster_factory(4).start(args)
    killed = []
    for attempt in (0, 1):
        wait_for(lambda a=attempt: _running(tmp_path, a), 90, f"attempt {attempt}'s ranks")
        host = _env(tmp_path, 1)["SLURMD_NODENAME"]  # node 1's agent in this attempt
        agent = int(host.rsplit(".", 1)[1]) - 1
        os.kill(cluster.agents[agent].proc.pid, signal.SIGKILL)
        killed.append(agent)
    codes = cluster.wait(90)
    assert killed[0] == 1 and killed[1] in (2, 3), killed
    assert codes[0] == 3, cluster.dump()
    summary = cluster.summary()
    assert summary["exit_code"] == 3 and len(summary["attempts"]) == 2, json.dumps(summary)[:3000]
    cause = summary["root_cause"]
    host = f"127.0.0.{killed[1] + 1}"
    assert cause["kind"] == "lost" and cause["host"] == host, cause
    assert [a["failure"]["class"] for a in summary["attempts"]] == ["infrastructure"] * 2
    assert summary["attempts"][1]["failure"]["why"] == f"node 1 ({host}) lost"
    assert len(summary["attempts"][1]["spares"]) == 1, "a spare was left: the budget ended it"
    assert (summary["job"]["max_restarts"], summary["job"]["max_infra_restarts"]) == (0, 1)
    wait_for(lambda: not job_processes(cluster.marker), 30, "no process of the job left")
