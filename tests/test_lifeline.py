"""Node 0 hears of an agent's death at once: each agent holds an authenticated lifeline to node
0's endpoint, and a lifeline that ends without a goodbye is a loss (a goodbye is none). A real
Endpoint on a real socket; the agents' ends live in child processes that are SIGKILLed."""

from __future__ import annotations

import os
import resource
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
from cluster import REPO, wait_for

from agent.control import wire
from agent.control.endpoint import Endpoint
from agent.control.lifeline import LOST, Lifelines
from agent.node.trust import JobKeys

KEY = JobKeys.derive(b"lifeline-secret", "5", "0").client_key
CHILD = textwrap.dedent(
    """
    import sys
    from agent.control.lifeline import Lifeline
    line = Lifeline("127.0.0.1", int(sys.argv[1]), bytes.fromhex(sys.argv[2]), int(sys.argv[3]))
    line.connected.wait(30)
    print("held", flush=True)
    if sys.stdin.readline().strip() == "bye":
        line.goodbye()
    """
)


class Refuse:
    def handle(self, channel: wire.Channel, first: dict) -> None:
        channel.send({"error": "not here"})


def agent_end(port: int, node: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(port), KEY.hex(), str(node)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def watched(agents: int) -> tuple[Endpoint, Lifelines, list[tuple[int, str]], threading.Event]:
    lost: list[tuple[int, str]] = []
    told = threading.Event()

    def on_lost(node: int, reason: str) -> None:
        lost.append((node, reason))
        told.set()

    lines = Lifelines(agents, on_lost).start()
    endpoint = Endpoint(KEY, Refuse(), lines)
    endpoint.start()
    return endpoint, lines, lost, told


def test_a_killed_agent_is_lost_at_once_and_one_that_says_goodbye_is_not() -> None:
    endpoint, lines, lost, told = watched(4)
    try:
        leaving, dying = agent_end(endpoint.port, 1), agent_end(endpoint.port, 2)
        wait_for(lambda: lines.held == 2, 10, "both lifelines held")
        assert leaving.stdin is not None
        leaving.stdin.write("bye\n")
        leaving.stdin.flush()
        assert leaving.wait(30) == 0
        wait_for(lambda: lines.held == 1, 10, "the goodbye")
        os.kill(dying.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert told.wait(10), "a killed agent's lifeline ended unnoticed"
        took = time.monotonic() - killed
        dying.wait()
        assert lost == [(2, LOST)] and lines.held == 0
        assert took < 5, f"{took:.2f}s"  # a hang-catcher: it is milliseconds
    finally:
        endpoint.close()


def test_an_agent_that_holds_a_new_lifeline_is_not_lost_with_its_old_one() -> None:
    endpoint, lines, lost, told = watched(2)
    try:
        old = agent_end(endpoint.port, 1)
        wait_for(lambda: lines.held == 1, 10, "the first lifeline held")
        new = agent_end(endpoint.port, 1)  # the same node again: the newer one counts

        def let_go() -> bool:  # node 0 closed the old one (adopting the new): CLOSE_WAIT here
            links = psutil.Process(old.pid).net_connections(kind="tcp")
            return any(c.status == psutil.CONN_CLOSE_WAIT for c in links)

        wait_for(let_go, 10, "node 0 to let the old lifeline go")
        os.kill(old.pid, signal.SIGKILL)
        old.wait()
        os.kill(new.pid, signal.SIGKILL)
        assert told.wait(10)
        new.wait()
        wait_for(lambda: lines.held == 0, 10, "both gone")
        assert lost == [(1, LOST)]  # once: the old lifeline's end was no loss
    finally:
        endpoint.close()


def test_a_lifeline_naming_no_peer_of_the_job_is_refused() -> None:
    endpoint, lines, lost, _ = watched(2)
    try:
        for node in (0, 2, "1", True):  # node 0 itself, out of range, not an int
            channel = wire.connect("127.0.0.1", endpoint.port, KEY, 10)
            channel.send({"op": "lifeline", "node": node})
            assert channel.recv(10) is None  # closed by node 0: held by nobody
            channel.close()
        assert lines.held == 0 and lost == []
    finally:
        endpoint.close()


SHORT = textwrap.dedent(
    """
    import logging, os, resource, sys
    from agent.control.endpoint import Endpoint
    logging.basicConfig(stream=sys.stderr, format="%(message)s")

    class Echo:
        def handle(self, channel, first):
            channel.send({"echo": first})

    endpoint = Endpoint(bytes.fromhex(sys.argv[1]), Echo(), reserve=0)  # accept() itself short
    endpoint.start()
    hoard = []
    try:
        while True:
            hoard.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass  # every descriptor this process may open is taken
    print(endpoint.port, flush=True)
    sys.stdin.readline()  # the client is in the backlog and node 0 said it is short
    for fd in hoard:
        os.close(fd)
    sys.stdin.readline()
    """
)


def test_an_endpoint_short_of_descriptors_says_so_once_and_serves_when_they_free_up() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", SHORT, KEY.hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)),
    )
    try:
        assert child.stdout is not None and child.stdin is not None and child.stderr is not None
        port = int(child.stdout.readline())
        answered: list[dict | None] = []

        def client() -> None:
            channel = wire.connect_retrying("127.0.0.1", port, KEY, 10.0, 30.0)
            channel.send({"op": "status"})
            answered.append(channel.recv(10))
            channel.close()

        asking = threading.Thread(target=client)
        asking.start()
        ready, _, _ = select.select([child.stderr], [], [], 30)  # a hang-catcher only
        told = child.stderr.readline() if ready else ""
        assert "cannot accept a connection" in told and "ulimit -n" in told
        child.stdin.write("free\n")
        child.stdin.flush()
        asking.join(30)
        assert answered == [{"echo": {"op": "status"}}]  # the endpoint kept accepting
    finally:
        child.kill()
        child.wait()
    assert child.stderr.read().count("cannot accept") == 0  # told once, not per try
