"""The zygote's loop: fork ranks on request, reap them, report their exits (see zygote_main)."""

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
_MAX_FDS = 64  # per recvmsg; one request carries two, the kernel never merges two requests' fds


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
        self.ranks: dict[int, int] = {}  # pid -> request id

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
        """Complete requests, each with its two descriptors."""
        data, fds, _, _ = socket.recv_fds(self.control, 1 << 16, _MAX_FDS)
        if not data:
            os._exit(0)  # the agent closed the channel or died
        self.fds.extend(fds)
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        found = []
        for line in lines:
            request = json.loads(line)
            if len(self.fds) < 2:
                os._exit(3)  # a request without its pipes: the protocol is broken
            found.append((request, [self.fds.popleft(), self.fds.popleft()]))
        return found

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rid = self.ranks.pop(pid, None)
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
    # step (Slurm's proctrack/linuxproc signals every descendant) must not end it before its
    # ranks, which would die at once by their PDEATHSIG instead of getting their grace period.
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
            for request, (out_fd, err_fd) in loop.receive():
                try:
                    pid = _fork_quietly()
                except OSError as exc:
                    os.close(out_fd)
                    os.close(err_fd)
                    loop.send({"op": "forked", "id": request["id"], "error": str(exc)})
                    continue
                if pid == 0:
                    return become_rank(request, out_fd, err_fd, origin)
                os.close(out_fd)
                os.close(err_fd)
                loop.ranks[pid] = request["id"]
                loop.send({"op": "forked", "id": request["id"], "pid": pid})
