"""`--metrics-port`: node 0's /metrics while a job runs, metrics.prom at its end, with real
agents on loopback (and the job's straggler shaded by `agent logs --timeline`); a resident
run's server gone when its run ends."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest
from cluster import FIXTURE, base_env, wait_for
from prometheus_client.parser import text_string_to_metric_families
from serving import Serving

pytestmark = pytest.mark.e2e

STEP = r"step (?P<step>\d+)"
URL = re.compile(r"metrics: (http://127\.0\.0\.1:(\d+)/metrics)")


def _scrape(url: str) -> dict[str, dict[tuple, float]]:
    """GET /metrics, parsed by prometheus_client: sample name → {sorted labels: value}."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/plain")
        return _samples(reply.read().decode())


def _samples(text: str) -> dict[str, dict[tuple, float]]:
    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return found


def _url(agent) -> str | None:
    found = URL.search(agent.stderr() + agent.stdout())
    return found.group(1) if found else None


def _said_url(path) -> str | None:
    found = URL.search(path.read_text(errors="replace"))
    return found.group(1) if found else None


def test_metrics_during_a_job_and_metrics_prom_at_its_end(cluster_factory):
    cluster = cluster_factory(2).start(
        ["--nproc-per-node", "2", "--progress-regex", STEP, "--metrics-port", "0",
         FIXTURE, "--steps", "40", "--step-time", "0.2", "--slow-node", "1"]
    )  # fmt: skip
    url = wait_for(lambda: _url(cluster.agents[0]), 60, "node 0 to name its /metrics URL")
    assert _url(cluster.agents[1]) is None  # only node 0 serves

    def judged():
        got = _scrape(url)
        ages = got.get("launch_agent_node_seconds_since_progress", {})
        slow = got.get("launch_agent_straggler_slowdown", {})
        return got if len(ages) == 2 and slow else None

    live = wait_for(judged, 60, "both nodes' progress and node 1 named a straggler", 0.3)
    assert live["launch_agent_ranks_running"][()] == 4
    assert live["launch_agent_attempts_total"][()] == 1
    assert live["launch_agent_restarts_total"][()] == 0
    assert live["launch_agent_run_info"][(("job", cluster.job), ("run", "0"))] == 1
    assert live["launch_agent_nodes"][(("state", "running"),)] == 2
    assert live["launch_agent_nodes"][(("state", "lost"),)] == 0
    assert live["launch_agent_spares_left"][()] == 0
    hosts = live["launch_agent_node_info"]
    assert hosts == {
        (("host", "127.0.0.1"), ("node", "0")): 1,
        (("host", "127.0.0.2"), ("node", "1")): 1,
    }
    rendezvous = live["launch_agent_attempt_phase_seconds"][
        (("attempt", "0"), ("phase", "rendezvous"))
    ]
    assert 0 < rendezvous < 60
    assert all(0 <= age < 10 for age in live["launch_agent_node_seconds_since_progress"].values())
    quantiles = live["launch_agent_step_seconds"]
    assert 0.1 < quantiles[(("quantile", "0.5"),)] < 0.6  # 0.2 s steps, node 1's 0.4 s
    assert quantiles[(("quantile", "0.99"),)] >= quantiles[(("quantile", "0.5"),)]
    assert live["launch_agent_step_seconds_count"][()] == 4
    assert set(live["launch_agent_rank_step_seconds"]) == {
        (("node", str(r // 2)), ("rank", str(r))) for r in range(4)
    }  # per rank: 4 ranks, under 64
    assert live["launch_agent_straggler_slowdown"][(("node", "1"),)] > 1.5
    assert live["launch_agent_stragglers"][()] == 1

    assert cluster.wait(120) == [0, 0], cluster.dump()
    end = _samples((cluster.log_dir / "metrics.prom").read_text())
    assert end["launch_agent_exit_code"][()] == 0 and end["launch_agent_ranks_running"][()] == 0
    phases = end["launch_agent_attempt_phase_seconds"]
    first = phases[(("attempt", "0"), ("phase", "first_progress"))]
    assert 0 <= first < 30
    assert 0 <= phases[(("attempt", "0"), ("phase", "exit_skew"))] < 30  # a clean finish
    assert (("attempt", "0"), ("phase", "teardown")) not in phases  # has no teardown
    assert end["launch_agent_straggler_episodes_total"][()] >= 1
    picture = cluster.tmp / "job.svg"
    drawn = subprocess.run(
        [sys.executable, "-m", "agent", "logs", str(cluster.log_dir), "--timeline", str(picture)],
        env=base_env(cluster.tmp), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert drawn.returncode == 0, drawn.stderr
    shaded = ET.fromstring(picture.read_text()).findall(".//{*}rect[@class='straggler']")
    assert len(shaded) == 2  # node 1's two rank lanes
    assert all("node 1 (127.0.0.2)" in s.findtext("{*}title") for s in shaded)


def test_a_resident_run_serves_only_while_it_lasts(tmp_path):
    serving = Serving(tmp_path, 1).start()
    try:
        serving.ready()
        run = serving.call(
            "run", "--metrics-port", "0", "--progress-regex", STEP, FIXTURE, "--steps", "5",
            "--step-time", "0.1",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr + serving.dump()
        found = URL.search(run.stdout + run.stderr + serving.agents[0].stderr())
        assert found, run.stderr + serving.dump()
        logs = [p for p in (tmp_path / "logs").iterdir() if (p / "summary.json").exists()]
        (log_dir,) = logs
        assert _samples((log_dir / "metrics.prom").read_text())["launch_agent_exit_code"][()] == 0
        with pytest.raises(OSError):  # the run is over: its server is gone, the port free
            socket.create_connection(("127.0.0.1", int(found.group(2))), timeout=5).close()
        assert serving.alive() == [0]  # while the resident agent stays
        again = serving.call("run", "--metrics-port", found.group(2), FIXTURE)
        assert again.returncode == 0, again.stderr  # the same port binds again for the next run
        assert "cannot listen" not in again.stdout + again.stderr + serving.agents[0].stderr()
        assert serving.call("down", timeout=60).returncode == 0
        assert serving.wait(30) == [0], serving.dump()
    finally:
        serving.kill()


def test_metrics_prom_counts_a_restart(cluster_factory):
    cluster = cluster_factory(1).start(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--metrics-port", "0", FIXTURE,
         "--exit", "3", "--on", "1", "--fail-attempts", "1"]
    )  # fmt: skip
    assert cluster.wait(120) == [0], cluster.dump()
    end = _samples((cluster.log_dir / "metrics.prom").read_text())
    assert end["launch_agent_attempts_total"][()] == 2
    assert end["launch_agent_restarts_total"][()] == 1
    assert end["launch_agent_exit_code"][()] == 0
    phases = end["launch_agent_attempt_phase_seconds"]
    # attempt 0 failed: torn down from its root cause; attempt 1 finished: its ranks' exit skew
    for attempt, phase in (("0", "rendezvous"), ("0", "teardown"), ("1", "rendezvous"),
                           ("1", "exit_skew")):  # fmt: skip
        assert 0 <= phases[(("attempt", attempt), ("phase", phase))] < 30, phases
    assert (("attempt", "1"), ("phase", "teardown")) not in phases
    assert "launch_agent_node_seconds_since_progress" not in end  # no --progress-regex


def _idle_flood(url: str, count: int) -> list[socket.socket]:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    return [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]


def test_2000_idle_scrapers_leave_a_failing_job_its_root_cause(cluster_factory, tmp_path):
    """Issue 35, M6: node 0 at the soft limit many sites keep (1,024 descriptors) and 2,000
    connections to /metrics that never send a request: the rank's failure is still published
    and the job ends with its root cause, as fast as without them."""
    go = tmp_path / "go"
    cluster = cluster_factory(2).start(
        ["--nproc-per-node", "1", "--metrics-port", "0", FIXTURE, "--on", "1", "--exit", "3",
         "--stderr", "the-root-cause-line", "--others-wait", "--ready-to", str(tmp_path),
         "--fail-file", str(go)]
    )  # fmt: skip
    url = wait_for(lambda: _url(cluster.agents[0]), 60, "node 0 to name its /metrics URL")
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, 60, "both ranks to start")
    node0 = psutil.Process(cluster.agents[0].proc.pid)
    node0.rlimit(psutil.RLIMIT_NOFILE, (1024, node0.rlimit(psutil.RLIMIT_NOFILE)[1]))
    flood = _idle_flood(url, 2000)
    try:
        assert _scrape(url)["launch_agent_ranks_running"][()] == 2
        assert node0.num_fds() < 1024 - 64  # the reserve is kept
        go.touch()
        start = time.monotonic()
        assert cluster.wait(60) == [1, 1], cluster.dump()
        assert time.monotonic() - start < 15, cluster.dump()  # a hang-catcher, not a measure
    finally:
        for sock in flood:
            sock.close()
    cause = cluster.summary()["root_cause"]
    assert cause["rank"] == 1 and "the-root-cause-line" in str(cause.get("stderr_tail")), cause


def _links(pid: int) -> dict[int, str]:
    """A process's descriptors → what each is ("pipe:[inode]", "socket:[inode]", a path)."""
    links = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # closed between the listing and the look
            links[int(fd.name)] = os.readlink(fd)
    return links


def _held(agent: psutil.Process) -> int:
    """The agent's descriptors, less the pipes it shares with processes it started: the ranks
    forked ahead of the next run (three pipes each) come once the client has its answer, before
    or after a test's look (CI, busy: a baseline taken before them, every later look after)."""
    shared: set[str] = set()
    for child in agent.children(recursive=True):
        with contextlib.suppress(psutil.Error, FileNotFoundError, PermissionError):
            shared |= {link for link in _links(child.pid).values() if link.startswith("pipe:")}
    return sum(1 for link in _links(agent.pid).values() if link not in shared)


def test_a_resident_node_zero_gives_back_each_runs_descriptors(tmp_path):
    """Issue 35, M7 and O1: run after run, with idle connections to /metrics still open when
    each ends, node 0's resident agent holds no more descriptors than after its first run. Once
    warm, a one-node agent also hosts each run's ranks' store, and gives that back too."""
    serving = Serving(tmp_path, 1).start()
    try:
        serving.ready()
        wait_for(lambda: " warm" in serving.status().stdout, 120, "the node to be warm")
        assert serving.call("run", FIXTURE).returncode == 0, serving.dump()
        node0 = psutil.Process(serving.agents[0].proc.pid)
        baseline = _held(node0)
        for run in range(3):
            done, said = tmp_path / f"done-{run}", tmp_path / f"client-{run}.out"
            with open(said, "wb") as out:  # node 0's lines reach the run's client, not its stderr
                client = serving.client(
                    "run", "--metrics-port", "0", FIXTURE, "--until-file", str(done),
                    stdout=out, stderr=out,
                )  # fmt: skip
            url = wait_for(lambda said=said: _said_url(said), 60, "the run's /metrics URL")
            flood = _idle_flood(url, 100)
            done.touch()
            assert client.wait(60) == 0, serving.dump()
            # no more than after the first run (one of whose descriptors may still be closing)
            wait_for(lambda: _held(node0) <= baseline, 10, f"{baseline} descriptors again")
            for sock in flood:
                sock.close()
        assert serving.call("down", timeout=60).returncode == 0
    finally:
        serving.kill()
