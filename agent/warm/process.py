"""Agent-side pieces of a zygote: a forked rank as the agent sees it (the part of
subprocess.Popen it uses), a fork request awaiting its answer, where the zygote imports from,
whether this process adopts the ranks (a child subreaper)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_GONE_WAIT = 5.0  # seconds for a rank to die by PDEATHSIG once its zygote is gone
_PR_GET_CHILD_SUBREAPER = 37
_STATUS_LOST = 255  # an adopted rank someone else reaped (nothing in the agent should)


class ZygoteGone(Exception):
    """This rank cannot be forked (the zygote is dead, still importing, or its fork failed):
    start it the cold way."""


@functools.cache
def import_paths() -> str:
    """Where the zygote finds our package and py-libnuma (as agent.run.workers.child_paths)."""
    import importlib.util

    dirs = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
    spec = importlib.util.find_spec("numa")
    if spec is not None and spec.origin:
        dirs.append(os.path.dirname(os.path.dirname(spec.origin)))
    return os.pathsep.join(dirs)


def adopts_orphans() -> bool:
    """Whether this process is a child subreaper (agent.run.workers.become_subreaper): then the
    zygote hands it each rank as its own child, and the ranks outlive their zygote."""
    import ctypes

    flag = ctypes.c_int(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and bool(
            flag.value
        )
    except (OSError, AttributeError):
        return False


def file_tail(fd: int, size: int = 4096) -> str:
    """The last `size` bytes of a file, as text (the zygote's own output, for messages)."""
    end = os.fstat(fd).st_size
    start = max(0, end - size)
    return os.pread(fd, end - start, start).decode(errors="replace")


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat, which tells this process from a later one with its pid."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[19] if len(fields) > 19 else None


class WarmProcess:
    """pid, stdout_fd/stderr_fd (read ends the caller owns), returncode (Popen's convention:
    -N when killed by signal N), wait() and poll(). An adopted rank is the agent's own child
    (forked through a process that exited at once, so the agent, a subreaper, inherited it): a
    thread here reaps it. Otherwise it is the zygote's child: the zygote reaps it, and its reader
    thread in the agent calls exited()."""

    def __init__(
        self, pid: int, args: Sequence[str], stdout_fd: int, stderr_fd: int, adopted: bool = False
    ) -> None:
        self.pid = pid
        self.args = list(args)
        self.stdout_fd = stdout_fd
        self.stderr_fd = stderr_fd
        self.adopted = adopted
        self.returncode: int | None = None
        self.lost_with: str | None = None  # why it died, when its zygote's death killed it
        self.ahead = False  # forked before its request, between runs (Zygote.stand_by)
        self._started = _start_time(pid)
        self._done = threading.Event()
        if adopted:
            threading.Thread(target=self._reap, name=f"reap-{pid}", daemon=True).start()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._done.set()

    def _reap(self) -> None:
        try:
            _, status = os.waitpid(self.pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped by someone else: its status is lost, never guessed
            while self.alive():
                time.sleep(0.05)  # bounded by the process's own life; no exit fd for a non-child
            code = _STATUS_LOST
        self.exited(code)

    def alive(self) -> bool:
        """Still running as the process we forked (not a zombie, not a reused pid)."""
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                state = stat.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X") and _start_time(self.pid) == self._started

    def __repr__(self) -> str:
        return f"WarmProcess(pid={self.pid}, returncode={self.returncode})"


@dataclass(frozen=True)
class RankStart:
    """One rank to fork: `argv` with exactly `env` in `cwd`, bound as agent/run/child.py binds a
    fresh rank (None: unbound)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    cpus: tuple[int, ...] | None = None
    mems: tuple[int, ...] | None = None
    strict: bool = False
    fallback_dir: str | None = None  # stacks by faulthandler where py-spy cannot attach


class Pending:
    """A fork request waiting for the zygote's answer: a WarmProcess, or an error."""

    def __init__(self, argv: Sequence[str], stdout_fd: int, stderr_fd: int, adopt: bool) -> None:
        self.argv, self.stdout_fd, self.stderr_fd = list(argv), stdout_fd, stderr_fd
        self.adopt = adopt
        self.answered = threading.Event()
        self.proc: WarmProcess | None = None
        self.error = ""

    def started(self, pid: int) -> WarmProcess:
        return WarmProcess(pid, self.argv, self.stdout_fd, self.stderr_fd, self.adopt)

    def close(self) -> None:
        """No process came of it: the pipes' read ends go too."""
        os.close(self.stdout_fd)
        os.close(self.stderr_fd)


def exit_after_zygote(proc: WarmProcess) -> int:
    """The exit code of a rank whose zygote died before reporting it. PDEATHSIG kills it with
    SIGKILL; wait (bounded) until it is really gone, so that the agent never counts a live rank
    as dead. Reparented to the agent (a subreaper), it is ours to reap, with its real status."""
    deadline = time.monotonic() + _GONE_WAIT
    while True:
        try:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass
        if not proc.alive() or time.monotonic() > deadline:
            return -signal.SIGKILL
        time.sleep(0.01)  # bounded poll on a condition: the kernel has no "pid exited" fd here
