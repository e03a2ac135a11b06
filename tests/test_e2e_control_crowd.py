"""Issue 35: 2,000 idle connections to node 0's control endpoint (the port in LOG_DIR/control.json,
open to anyone on the cluster network) during a 2-node job with a failing rank. Node 0 runs at the
soft limit many sites keep (1,024 descriptors): the crowd takes no descriptor node 0 needs, the
rank's failure is published and the job ends with its true root cause, as fast as without them,
and node 0's descriptors come back once the crowd leaves."""

from __future__ import annotations

import json
import resource
import socket
import time

import psutil
import pytest
from cluster import FIXTURE, wait_for

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
