"""Node 0's endpoint serves its own user first: idle connections are dropped within about a
second, one address holds only a few unauthenticated slots, and a client tries again for a few
seconds and says what it saw (refused, timed out, crowded) — "remove the file" only when nothing
listens any more. A real Endpoint on a real socket; clients as the `agent status` code uses them."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from agent.control import connection, wire
from agent.control.endpoint import Endpoint
from agent.errors import AgentError, ExitCode
from agent.node.trust import JobKeys
from agent.serve import client

SECRET = "crowd-secret"
KEY = JobKeys.derive(SECRET.encode(), "77", "0").client_key


class Echo:
    def handle(self, channel: wire.Channel, first: dict) -> None:
        channel.send({"echo": first})


def target_for(tmp_path: Path, port: int) -> tuple[client.Target, dict[str, str]]:
    env = {"AGENT_SECRET": SECRET, "SLURM_JOB_ID": "77", connection.STATE_ENV: str(tmp_path)}
    path = connection.path_for(env, tmp_path, "77")
    record = {"host": "127.0.0.1", "port": port, "job": "77", "step": "0"}
    connection.write(path, record | {"pid": 99, "hostname": "node-zero", "started": 1.0})
    return client.locate(env, tmp_path, None), env


def idle_flood(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]


def test_300_idle_connections_from_one_address_leave_a_client_answered_in_5s(tmp_path) -> None:
    endpoint = Endpoint(KEY, Echo())
    endpoint.start()
    flood = idle_flood(endpoint.port, 300)
    try:
        target, env = target_for(tmp_path, endpoint.port)
        start = time.monotonic()
        channel = client.open_channel(target, env, tmp_path)
        channel.send({"op": "status"})
        assert channel.recv(10) == {"echo": {"op": "status"}}
        assert time.monotonic() - start <= 5
        channel.close()
    finally:
        for sock in flood:
            sock.close()
        endpoint.close()


def test_an_idle_connection_is_dropped_within_about_a_second() -> None:
    endpoint = Endpoint(KEY, Echo())
    endpoint.start()
    sock = socket.create_connection(("127.0.0.1", endpoint.port), timeout=10)
    start = time.monotonic()
    sock.settimeout(10)
    while sock.recv(4096):  # the greeting, then EOF when the endpoint gives up on us
        pass
    assert time.monotonic() - start < 3
    sock.close()
    endpoint.close()


def serve_once(listener: socket.socket, answer) -> threading.Thread:
    def run() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            answer(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def turn_away(conn: socket.socket) -> None:
    conn.sendall(wire.busy_frame("16 connections from 127.0.0.1 are still authenticating"))
    conn.close()


held: list[socket.socket] = []
RETRY_FOR = 1.0  # the client's window here; agent run's default is wire.RETRY_FOR (6 s)


@pytest.mark.parametrize(
    ("answer", "says", "remove"),
    [
        (turn_away, "is running but crowded", False),
        (held.append, "did not answer", False),  # accepted, never greeted: timed out
        (None, "nothing listens there", True),  # the port is closed: the agent is gone
    ],
)
def test_a_client_that_gives_up_says_what_it_saw(tmp_path, answer, says, remove) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if answer is None:
        listener.close()
    else:
        serve_once(listener, answer)
    target, env = target_for(tmp_path, port)
    start = time.monotonic()
    with pytest.raises(AgentError) as excinfo:
        client.open_channel(target, env, tmp_path, timeout=0.5, retry_for=RETRY_FOR)
    took = time.monotonic() - start
    message = excinfo.value.message
    assert excinfo.value.code == ExitCode.RENDEZVOUS and "\n" not in message
    assert says in message and ("remove the stale file" in message) == remove, message
    assert RETRY_FOR - 0.5 <= took <= RETRY_FOR + 10  # it kept trying for its window (1 s here)
    assert "tries over" in message
    listener.close()


def test_the_last_descriptors_are_kept_for_the_jobs_own_work(tmp_path) -> None:
    """Below its reserve of free descriptors node 0 turns a new peer away before reading a byte
    (and says why); once descriptors are free again, a client is answered."""
    free = {"now": 10}
    endpoint = Endpoint(KEY, Echo(), free=lambda: free["now"], reserve=64)
    endpoint.start()
    try:
        with socket.create_connection(("127.0.0.1", endpoint.port), timeout=10) as sock:
            said = b""
            while chunk := sock.recv(4096):
                said += chunk
        assert b"keeps its last 64 descriptors for the job's own work" in said, said
        free["now"] = 1000
        target, env = target_for(tmp_path, endpoint.port)
        channel = client.open_channel(target, env, tmp_path)  # retries past a count not yet retaken
        channel.send({"op": "status"})
        assert channel.recv(10) == {"echo": {"op": "status"}}
        channel.close()
    finally:
        endpoint.close()
