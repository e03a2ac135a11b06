"""Issue 35: 2,000 idle connections to node 0's control endpoint (the port in LOG_DIR/control.json,
open to anyone on the cluster network) during a 2-node job with a failing rank. Node 0 runs at the
soft limit many sites keep (1,024 descriptors): the crowd takes no descriptor node 0 needs, the
rank's failure is published and the job ends with its true root cause, as fast as without them,
and node 0's descriptors come back once the crowd leaves — in a resident node 0, after the run as
before it."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from cluster import FIXTURE, wait_for
from serving import Serving

pytestmark = pytest.mark.e2e

CROWD = 2000
LIMIT = 1024  # node 0's soft limit on open files


@pytest.fixture(autouse=True)
def room_for_the_crowd():
    """The test process itself holds 2,000 client sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = CROWD + 512
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard open-files limit ({hard}) is below {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def crowd(port: int) -> list[socket.socket]:
    """Connections that never say a word (each completes TCP's handshake: the kernel's backlog
    holds those node 0 has not accepted yet)."""
    return [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(CROWD)]


def leave(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def test_2000_idle_connections_to_the_control_endpoint_leave_a_failing_job_its_root_cause(
    cluster_factory, tmp_path
):
    go = tmp_path / "go"
    cluster = cluster_factory(2).start(
        ["--nproc-per-node", "1", FIXTURE, "--on", "1", "--exit", "3",
         "--stderr", "the-root-cause-line", "--others-wait", "--ready-to", str(tmp_path),
         "--fail-file", str(go)]
    )  # fmt: skip
    control = cluster.log_dir / "control.json"
    wait_for(control.exists, 60, "node 0 to write control.json")
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, 60, "both ranks to start")
    port = json.loads(control.read_text())["port"]
    node0 = psutil.Process(cluster.agents[0].proc.pid)
    node0.rlimit(psutil.RLIMIT_NOFILE, (LIMIT, node0.rlimit(psutil.RLIMIT_NOFILE)[1]))
    baseline = node0.num_fds()

    # A first crowd comes and goes: node 0 gives back what it took.
    first = crowd(port)
    held = node0.num_fds()
    leave(first)
    assert held < LIMIT - 64, f"{held} descriptors with the crowd connected (limit {LIMIT})"
    wait_for(lambda: node0.num_fds() <= baseline + 8, 30, f"about {baseline} descriptors again")

    # A second crowd stays while the rank fails.
    second = crowd(port)
    try:
        assert node0.num_fds() < LIMIT - 64
        go.touch()
        start = time.monotonic()
        codes = cluster.wait(60)
        took = time.monotonic() - start
    finally:
        leave(second)
    assert codes == [1, 1], cluster.dump()
    assert took < 15, f"{took:.1f}s\n{cluster.dump()}"  # a hang-catcher, not a measure
    summary = cluster.summary()
    cause = summary["root_cause"]
    assert cause["rank"] == 1 and "the-root-cause-line" in str(cause.get("stderr_tail")), cause


def _failing_run(serving: Serving, tmp_path, name: str) -> tuple[subprocess.Popen, Path]:
    """A run whose rank 1 fails once `go` exists, started and waited for until both ranks run."""
    ready, go = tmp_path / f"ready-{name}", tmp_path / f"go-{name}"
    ready.mkdir()
    run = serving.client(
        "run", "--nproc-per-node", "1", FIXTURE, "--on", "1", "--exit", "3",
        "--stderr", "the-root-cause-line", "--others-wait", "--ready-to", str(ready),
        "--fail-file", str(go),
    )  # fmt: skip
    wait_for(lambda: len(list(ready.glob("ready-*"))) == 2, 60, f"both ranks of {name} to start")
    return run, go


def test_a_resident_node_zero_ends_a_crowded_failing_run_and_gives_back_its_descriptors(tmp_path):
    """The same crowd on a resident node 0's endpoint (the port in the connection file) while a
    run's rank fails: the run ends with its root cause in the usual time, and once the run is
    over and the crowd gone, node 0 holds as many descriptors as after the same run uncrowded
    (node 1's first failure leaves it one store connection more than a clean run does)."""
    serving = Serving(tmp_path, 2, ("--preload", "none"))
    try:
        serving.start().ready()
        port = json.loads(serving.connection_file.read_text())["port"]
        node0 = psutil.Process(serving.agents[0].proc.pid)
        node0.rlimit(psutil.RLIMIT_NOFILE, (LIMIT, node0.rlimit(psutil.RLIMIT_NOFILE)[1]))
        alone, go = _failing_run(serving, tmp_path, "alone")
        go.touch()
        assert alone.wait(60) == 1, serving.dump()
        baseline = node0.num_fds()

        crowded, go = _failing_run(serving, tmp_path, "crowded")
        people = crowd(port)
        try:
            assert node0.num_fds() < LIMIT - 64
            go.touch()
            start = time.monotonic()
            _, err = crowded.communicate(timeout=60)
            took = time.monotonic() - start
        finally:
            leave(people)
        assert crowded.returncode == 1, err.decode(errors="replace") + serving.dump()
        assert took < 15, f"{took:.1f}s\n{serving.dump()}"  # a hang-catcher, not a measure
        [summary] = (tmp_path / "logs").glob("*.0.r1/summary.json")
        cause = json.loads(summary.read_text())["root_cause"]
        assert cause["rank"] == 1 and "the-root-cause-line" in str(cause.get("stderr_tail")), cause
        wait_for(lambda: node0.num_fds() <= baseline, 30, f"{baseline} descriptors again")
        assert serving.call("down", timeout=60).returncode == 0
    finally:
        serving.kill()
