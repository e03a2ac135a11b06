"""The /metrics server under a crowd (issue 35, M6/M7): anyone on the cluster network may
connect, so its connections, their time and bytes and the process's descriptors are bounded,
it never spins when accept() fails, and close() leaves nothing behind. A real MetricsServer on
real sockets; where the descriptor limit matters, in a child process with a low one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agent.metrics import scrape
from agent.metrics.server import Bounds, MetricsServer

UP = b"launch_agent_up 1\n"
HANG = 20.0  # seconds: only to fail a test that hangs, never a measure
REPO = Path(__file__).resolve().parents[1]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) - 1  # less listdir's own


def scrape_once(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=HANG) as reply:
        return reply.read()


def idle_flood(port: int, count: int) -> list[socket.socket]:
    """COUNT connections that say nothing, all made within HANG seconds (a server that stops
    accepting fills its backlog, and connecting then waits on SYN retries)."""
    flood: list[socket.socket] = []
    deadline = time.monotonic() + HANG
    try:
        while len(flood) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"{len(flood)} of {count} connections made in {HANG} s"
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=left))
    except BaseException:
        close_all(flood)
        raise
    return flood


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def test_2000_idle_connections_hold_at_most_the_cap_and_a_scrape_answers_at_once() -> None:
    server = MetricsServer(lambda: UP, "127.0.0.1", 0)
    before = open_fds()
    flood = idle_flood(server.port, 2000)
    try:
        start = time.monotonic()
        assert scrape_once(server.port) == UP  # queued behind the flood: all of it accepted now
        took = time.monotonic() - start
        held_by_server = open_fds() - before - len(flood)
        assert held_by_server <= Bounds().connections + 1, held_by_server
        assert took < Bounds().request_seconds  # it took an idle one's place, waited for none
    finally:
        close_all(flood)
        server.close()


def test_close_frees_every_descriptor_and_thread_while_peers_still_hold_theirs() -> None:
    fds, threads = open_fds(), threading.active_count()
    server = MetricsServer(lambda: UP, "127.0.0.1", 0)
    peers = idle_flood(server.port, 10)
    peers[0].sendall(b"GET /metrics HTTP/1.0\r\n")  # half a request
    assert scrape_once(server.port) == UP  # every peer accepted by now
    server.close()
    assert open_fds() == fds + len(peers)  # only the peers' own ends are left
    assert threading.active_count() == threads
    for peer in peers:
        peer.settimeout(HANG)
        assert peer.recv(1) == b""  # the server hung up on each
    close_all(peers)


def trickle(sock: socket.socket, pace: float) -> None:
    """A byte of a never-ending request every `pace` seconds, until the server hangs up."""
    sock.settimeout(pace)
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        try:
            sock.send(b"X")
        except OSError:
            return
        try:
            if sock.recv(4096) == b"":
                return
        except TimeoutError:
            continue  # the pace: nothing from the server yet
        except OSError:
            return
    raise AssertionError(f"the server still reads a trickle after {HANG} s")


@pytest.mark.parametrize("peer", ["silent", "trickling"])
def test_a_slow_request_is_dropped_at_its_deadline(peer) -> None:
    server = MetricsServer(lambda: UP, "127.0.0.1", 0, Bounds(request_seconds=0.5))
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=HANG)
    start = time.monotonic()
    try:
        if peer == "silent":
            assert sock.recv(4096) == b""
        else:
            trickle(sock, 0.05)
        took = time.monotonic() - start
        assert 0.4 <= took < HANG
    finally:
        sock.close()
        server.close()


def test_a_request_head_over_the_limit_is_refused() -> None:
    server = MetricsServer(lambda: UP, "127.0.0.1", 0)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=HANG)
    try:
        sock.sendall(b"GET /metrics HTTP/1.0\r\nX-Pad: " + b"a" * 9000)  # no end of headers
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        assert reply.startswith(b"HTTP/1.0 431 "), reply[:80]
    finally:
        sock.close()
        server.close()


REPLIES = [
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 200),
    (b"GET /metrics?x=1 HTTP/1.0\n\n", 200),
    (b"GET /other HTTP/1.1\r\n\r\n", 404),
    (b"POST /metrics HTTP/1.1\r\n\r\n", 405),
    (b"GET /metrics\r\n\r\n", 400),
    (b"\xff\xfe garbage \x00\r\n\r\n", 400),
    (b"GET \xff/metrics HTTP/1.1\r\n\r\n", 404),
]


@pytest.mark.parametrize(("head", "code"), REPLIES)
def test_the_answer_to_a_request_head(head, code) -> None:
    reply = scrape.answer(head, lambda: UP)
    assert reply.startswith(f"HTTP/1.0 {code} ".encode())
    assert reply.endswith(UP) == (code == 200)


# A child process: the server, then a soft limit of (open now + the reserve + SLOTS), so that
# the reserve, not the cap, is what bounds the server. Commands on stdin, one answer a line.
SLOTS = 20
CHILD = f"""
import os, resource, sys
from agent.metrics.server import Bounds, MetricsServer
server = MetricsServer(lambda: b"up 1\\n", "127.0.0.1", 0)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
open_now = len(os.listdir("/proc/self/fd")) - 1
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + Bounds().fd_reserve + {SLOTS}, hard))
print(server.port, flush=True)
held = []
for line in sys.stdin:
    command, *count = line.split()
    if command == "open":  # the job's own work: how many of COUNT files open
        files = []
        try:
            while len(files) < int(count[0]):
                files.append(open(os.devnull))
        except OSError:
            pass
        print(len(files), flush=True)
        for f in files:
            f.close()
    elif command == "fill":  # the job's own work spends every descriptor
        try:
            while True:
                held.append(open(os.devnull))
        except OSError:
            print(len(held), flush=True)
    elif command == "free":
        for f in held:
            f.close()
        held.clear()
        print("freed", flush=True)
    elif command == "cpu":
        print(sum(os.times()[:2]), flush=True)
"""


class Child:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env,
        )  # fmt: skip
        self.port = int(self.read())

    def read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the child died"
        return line.strip()

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(HANG)


def test_a_crowd_leaves_the_job_its_reserve_of_descriptors_and_a_scrape_still_answers() -> None:
    child = Child()
    flood = idle_flood(child.port, 2000)
    try:
        assert scrape_once(child.port) == b"up 1\n"
        reserve = Bounds().fd_reserve
        assert int(child.ask(f"open {reserve}")) == reserve  # a failure can still be reported
    finally:
        close_all(flood)
        child.close()


def test_no_busy_loop_while_accept_fails_for_want_of_descriptors() -> None:
    child = Child()
    waiting: list[socket.socket] = []
    try:
        assert int(child.ask("fill")) > 0
        waiting = idle_flood(child.port, 50)  # in the backlog: accept() fails with EMFILE
        cpu = float(child.ask("cpu"))
        threading.Event().wait(1.0)  # a window to measure the child's CPU in, not a sync
        spent = float(child.ask("cpu")) - cpu
        assert spent < 0.2, f"{spent:.2f} s of CPU in 1 s while short of descriptors"
        assert child.ask("free") == "freed"
        # served again once descriptors are free: the server counts them every 0.2 s, so a scrape
        # before its next count is still turned away (503)
        deadline = time.monotonic() + HANG
        while True:
            try:
                assert scrape_once(child.port) == b"up 1\n"
                break
            except urllib.error.HTTPError as exc:
                assert exc.code == 503 and time.monotonic() < deadline, exc
    finally:
        close_all(waiting)
        child.close()
