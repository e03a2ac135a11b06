"""The zygote's loop: fork ranks on request (adopted ones through a middle process), reap the
others and report their exits (see zygote_main)."""

from __future__ import annotations

import collections
import json
import os
import selectors
import signal
import socket
import sys
import warnings
from typing import Any

from agent.warm.rank_start import Origin, become_rank

IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_MAX_FDS = 64  # per recvmsg; one request carries three, the kernel never merges two requests'
_FDS_PER_REQUEST = 3  # the rank's stdout and stderr pipes, and the read end of its go pipe


class _Loop:
    def __init__(self, control: int) -> None:
        self.control = socket.socket(fileno=control)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.control, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.buffer = b""
        self.fds: collections.deque[int] = collections.deque()  # received, not yet handed out
        self.ranks: dict[int, int] = {}  # pid -> request id, for the ranks not adopted

    def close_in_child(self) -> None:
        """A rank must not hold the zygote's control socket (its EOF is how the agent learns the
        zygote died) nor its loop's descriptors; closed through their objects, so that no later
        collection closes a reused descriptor number."""
        self.selector.close()
        self.control.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.control.sendall(json.dumps(message).encode() + b"\n")
        except OSError:  # the agent is gone: so are we (our ranks follow by PDEATHSIG)
            os._exit(0)

    def receive(self) -> list[tuple[dict[str, Any], list[int]]]:
        """Complete requests, each with its three descriptors."""
        data, fds, _, _ = socket.recv_fds(self.control, 1 << 16, _MAX_FDS)
        if not data:
            os._exit(0)  # the agent closed the channel or died
        self.fds.extend(fds)
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        found = []
        for line in lines:
            request = json.loads(line)
            if len(self.fds) < _FDS_PER_REQUEST:
                os._exit(3)  # a request without its pipes: the protocol is broken
            found.append((request, [self.fds.popleft() for _ in range(_FDS_PER_REQUEST)]))
        return found

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rid = self.ranks.pop(pid, None)  # None: a middle process (see _adopted)
            if rid is not None:
                code = os.waitstatus_to_exitcode(status)  # -N for signal N, as Popen reports
                self.send({"op": "exit", "id": rid, "pid": pid, "code": code})


def _fork_quietly() -> int:
    """Python 3.12+ warns about forking with threads alive; the only other thread here is
    OpenBLAS's pool, which its own pthread_atfork handler joins before the fork."""
    sys.stdout.flush()  # nothing buffered may reach a rank's pipes
    sys.stderr.flush()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _fork_rank(
    loop: _Loop, request: dict[str, Any], pipes: list[int], origin: Origin
) -> tuple[int, bool] | None:
    """Fork one rank and answer the agent; returns only in the rank, after its code ran."""
    adopt = bool(request.get("adopt"))
    report_r, report_w = os.pipe() if adopt else (-1, -1)
    error = ""
    try:
        pid = _fork_quietly()
    except OSError as exc:
        pid, error = -1, str(exc)
    if pid == 0:
        if adopt:
            os.close(report_r)
            return _middle(request, pipes, origin, report_w)
        return become_rank(request, pipes, origin)
    for fd in pipes:
        os.close(fd)
    if adopt:
        os.close(report_w)
        if pid > 0:
            pid, error = _adopted(report_r, pid)
        os.close(report_r)
    if pid > 0:
        if not adopt:
            loop.ranks[pid] = request["id"]
        loop.send({"op": "forked", "id": request["id"], "pid": pid})
    else:
        loop.send({"op": "forked", "id": request["id"], "error": error})
    return None


def _middle(
    request: dict[str, Any], pipes: list[int], origin: Origin, report_w: int
) -> tuple[int, bool]:
    """In the middle process: fork the rank, say its pid, exit. Orphaned, the rank is re-parented
    to the nearest subreaper up the tree, the agent (the zygote, its child, is none)."""
    try:
        pid = _fork_quietly()
        answer = str(pid)
    except OSError as exc:
        pid, answer = -1, f"cannot fork: {exc}"
    if pid == 0:
        os.close(report_w)
        return become_rank(request, pipes, origin)
    try:
        os.write(report_w, answer.encode())
    finally:
        os._exit(0)  # at once: nothing of the zygote's may run on here


def _adopted(report_r: int, middle: int) -> tuple[int, str]:
    """The rank's pid once the middle process is reaped — so re-parented to the agent, whose
    waitpid then finds it — or -1 and why not."""
    answer = b""
    while chunk := os.read(report_r, 256):
        answer += chunk
    os.waitpid(middle, 0)  # the SIGCHLD loop cannot take it first: it runs between requests
    text = answer.decode(errors="replace")
    if text.isdigit():
        return int(text), ""
    return -1, text or "the middle process died before forking the rank"


def serve(
    control: int,
    info: dict[str, Any],
    modules: frozenset[str],
    fds: frozenset[int],
    base_path: list[str],
    paths: str,
    output: tuple[bytes, bytes],
) -> tuple[int, bool]:
    """Run the loop; returns only in a forked rank, after the rank's code ran."""
    loop = _Loop(control)
    origin = Origin(modules, fds, base_path, paths, output, loop.close_in_child)
    # Only the agent ends the zygote (kill, or PDEATHSIG when it dies): a signal to the whole
    # step (Slurm's proctrack/linuxproc signals every descendant) must not end it, nor the ranks
    # not adopted by the agent, which would die at once by their PDEATHSIG, with no grace period.
    for signum in IGNORED:
        signal.signal(signum, signal.SIG_IGN)  # Origin has the dispositions each rank gets back
    # A Python-level handler makes the C handler write to the wakeup fd; SIG_DFL would not.
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(loop.wake_w, warn_on_full_buffer=False)
    loop.send({"op": "ready", **info})
    while True:
        for key, _ in loop.selector.select():
            if key.fileobj == loop.wake_r:
                while True:
                    try:
                        if not os.read(loop.wake_r, 512):
                            break
                    except BlockingIOError:
                        break
                loop.reap()
                continue
            for request, pipes in loop.receive():
                ran = _fork_rank(loop, request, pipes, origin)
                if ran is not None:
                    return ran  # in the rank, after its code ran
