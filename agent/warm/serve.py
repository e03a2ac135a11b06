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

from agent.warm import script
from agent.warm.rank_start import Origin, become_rank

IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_FDS_PER_RANK = 3  # the rank's stdout and stderr pipes, and the read end of its go pipe
# Per recvmsg: SCM_MAX_FD, the most one message can carry (the agent sends 64 ranks' at most);
# the kernel never merges two messages' descriptors into one read.
_MAX_FDS = 253


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
        self.ranks: dict[int, int] = {}  # pid -> the rank's id, for the ranks not adopted

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
        """Complete messages, each with its ranks' descriptors (three per rank)."""
        data, fds, _, _ = socket.recv_fds(self.control, 1 << 16, _MAX_FDS)
        if not data:
            os._exit(0)  # the agent closed the channel or died
        self.fds.extend(fds)
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        found = []
        for line in lines:
            message = json.loads(line)
            wanted = _FDS_PER_RANK * len(message["ranks"])
            if len(self.fds) < wanted:
                os._exit(3)  # a message without its pipes: the protocol is broken
            found.append((message, [self.fds.popleft() for _ in range(wanted)]))
        return found

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rid = self.ranks.pop(pid, None)  # None: a middle process (see _start_ranks)
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


def _start_ranks(
    loop: _Loop, message: dict[str, Any], fds: list[int], origin: Origin
) -> tuple[int, bool] | None:
    """Fork the message's ranks and answer the agent, one "forked" per rank; returns only in a
    rank, after its code ran. Adopted ranks are forked by one middle process for the lot (one
    extra fork and exit per message, not per rank)."""
    ranks = message["ranks"]
    pipes = [fds[i : i + _FDS_PER_RANK] for i in range(0, len(fds), _FDS_PER_RANK)]
    if not message.get("adopt"):
        started, ran = _fork_each(ranks, pipes, origin, False, ())
        if ran is not None:
            return ran
        for request, pid in zip(ranks, started, strict=True):
            if isinstance(pid, int):
                loop.ranks[pid] = request["id"]
        _answer(loop, ranks, started)
        return None
    report_r, report_w = os.pipe()
    try:
        middle = _fork_quietly()
    except OSError as exc:
        middle, why = -1, str(exc)
    if middle == 0:
        os.close(report_r)
        started, ran = _fork_each(ranks, pipes, origin, True, (report_w,))
        if ran is not None:
            return ran
        try:  # orphaned now, the ranks are re-parented to the nearest subreaper: the agent
            os.write(report_w, json.dumps(started).encode())
        finally:
            os._exit(0)  # at once: nothing of the zygote's may run on here
    os.close(report_w)
    for fd in fds:
        os.close(fd)
    started = _report(report_r, middle, len(ranks)) if middle > 0 else [why] * len(ranks)
    os.close(report_r)
    _answer(loop, ranks, started)
    return None


def _fork_each(
    ranks: list[dict[str, Any]],
    pipes: list[list[int]],
    origin: Origin,
    adopted: bool,
    not_theirs: tuple[int, ...],
) -> tuple[list[int | str], tuple[int, bool] | None]:
    """Fork each rank in turn: ([pid, or why not, per rank], None) here; in a rank, what
    become_rank returned. A rank gets only its own pipes (those of the ranks forked before it
    are closed here already)."""
    started: list[int | str] = []
    for index, (request, own) in enumerate(zip(ranks, pipes, strict=True)):
        try:
            pid: int | str = _fork_quietly()
        except OSError as exc:
            pid = str(exc)
        if pid == 0:
            for fd in [*not_theirs, *(fd for later in pipes[index + 1 :] for fd in later)]:
                os.close(fd)
            return started, become_rank(request, own, origin, adopted)
        for fd in own:
            os.close(fd)
        started.append(pid)
    return started, None


def _report(report_r: int, middle: int, count: int) -> list[int | str]:
    """The middle process's pids once it is reaped — its ranks re-parented to the agent by then,
    so the agent's waitpid finds them."""
    answer = b""
    while chunk := os.read(report_r, 1 << 16):
        answer += chunk
    os.waitpid(middle, 0)  # the SIGCHLD loop cannot take it first: it runs between messages
    try:
        started = json.loads(answer)
    except ValueError:
        started = None
    if not isinstance(started, list) or len(started) != count:
        return ["the middle process died before it forked the ranks"] * count
    return started


def _answer(loop: _Loop, ranks: list[dict[str, Any]], started: list[int | str]) -> None:
    for request, pid in zip(ranks, started, strict=True):
        if isinstance(pid, int):
            loop.send({"op": "forked", "id": request["id"], "pid": pid})
        else:
            loop.send({"op": "forked", "id": request["id"], "error": pid})


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
    script.freeze_preloaded(modules)  # the last thing before ranks are forked: all of it shared
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
            for message, rank_fds in loop.receive():
                ran = _start_ranks(loop, message, rank_fds, origin)
                if ran is not None:
                    return ran  # in a rank, after its code ran
