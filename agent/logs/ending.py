"""When `agent logs --follow` stops by itself although no summary.json appeared: a job that died
without one (agent killed, node lost) must not be followed forever.

What can be seen from here: LOG_DIR's files, and this machine's processes. Following ends when
- nothing new was written to LOG_DIR for --idle-exit seconds (0: never), counted from the first
  time LOG_DIR has an entry, so waiting for a job that has not started yet is not idleness; or
- LOG_DIR is quiet, no process on this machine has a file in it open for writing (an agent holds
  its agent log and its ranks' files open while it runs), two looks in a row, and either such a
  process was seen earlier while following, or every host of the rank map is this machine.
  Agents on other machines cannot be seen: for those jobs only summary.json and --idle-exit end
  it. Processes are only looked at when LOG_DIR belongs to this user (or this user is root).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

from agent.logs.hosts import read_where
from agent.logs.logdir import signature
from agent.plan.log_dir import RANKS, SUMMARY

_SURVEY = 2.0  # seconds between looks at every file's size while the shown files are quiet
_CHECK_MAX = 30.0  # the longest gap between two looks at this machine's processes
_MAPS = (RANKS, SUMMARY)


class Ending:
    """Fed every poll of --follow; says why following should stop, or None."""

    def __init__(
        self, log_dir: str, idle_exit: float, writers: Callable[[str], bool | None] | None = None
    ) -> None:
        self.log_dir = log_dir
        self.idle_exit = idle_exit
        self.writers = writers or local_writers
        self.active: float | None = None  # when a byte was last seen added; None: no job yet
        self.sizes: dict[str, tuple[int, int]] | None = None
        self.surveyed = 0.0
        self.next_check = 0.0
        self.gap = _SURVEY
        self.seen_writer = False
        self.missing = 0  # looks in a row that found no writer, with nothing written meanwhile
        self.here: tuple[object, bool] | None = None  # the rank map's files then, and the answer

    def why(self, names: list[str], grew: bool, now: float) -> str | None:
        """names: LOG_DIR's entries now; grew: a shown file had new bytes in this poll."""
        if not names:
            return None  # the job has not started (or LOG_DIR is not there yet)
        if self.active is None or grew:
            self._activity(now)
        elif now - self.active >= _SURVEY and now - self.surveyed >= _SURVEY:
            self.surveyed = now  # quiet: did any other file of the job grow?
            sizes = _sizes(self.log_dir, names)
            if self.sizes is not None and sizes != self.sizes:
                self._activity(now)
            self.sizes = sizes
        active = now if self.active is None else self.active  # never None by now
        if self.idle_exit and now - active >= self.idle_exit:
            return f"nothing new in {self.log_dir} for {self.idle_exit:g}s (--idle-exit)"
        if now >= self.next_check:
            self._look(now)
        quiet = now - active >= _SURVEY
        if self.missing >= 2 and quiet and (self.seen_writer or self._ran_here(names)):
            return (
                f"no process on this machine writes to {self.log_dir} any more and there is no "
                "new summary.json: the job is over"
            )
        return None

    def _activity(self, now: float) -> None:
        self.active = now
        self.missing = 0

    def _look(self, now: float) -> None:
        found = self.writers(self.log_dir)
        if found is None:  # cannot tell: --idle-exit alone decides
            self.next_check = now + _CHECK_MAX
            return
        if found:
            self.seen_writer, self.missing = True, 0
        else:
            if self.missing == 0 and self.seen_writer:
                self.gap = _SURVEY  # gone? look again soon to be sure
            self.missing += 1
        self.next_check = now + self.gap
        self.gap = min(self.gap * 2, _CHECK_MAX)

    def _ran_here(self, names: list[str]) -> bool:
        """Whether every host the rank map names is this machine (read again when it changed)."""
        key = (len(names), *(signature(os.path.join(self.log_dir, n)) for n in _MAPS))
        if self.here is None or self.here[0] != key:
            hosts = {where.host for where in read_where(self.log_dir, names).values()}
            self.here = key, bool(hosts) and all(_short(h) in _this_machine() for h in hosts)
        return self.here[1]


def local_writers(log_dir: str) -> bool | None:
    """Whether a process on this machine (other than this one) has a file in log_dir open for
    writing; None when that cannot be told (psutil missing, or log_dir is another user's)."""
    try:
        import psutil

        if os.geteuid() not in (0, os.stat(log_dir).st_uid):
            return None
    except (ImportError, OSError):
        return None
    root = os.path.join(os.path.realpath(log_dir), "")
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            files = proc.open_files()
        except (psutil.Error, OSError):  # gone, a zombie, or not ours to look at
            continue
        if any(f.path.startswith(root) and getattr(f, "mode", "w") != "r" for f in files):
            return True
    return False


def _sizes(log_dir: str, names: list[str]) -> dict[str, tuple[int, int]]:
    sizes = {}
    for name in names:
        try:
            st = os.stat(os.path.join(log_dir, name))
        except OSError:
            continue
        sizes[name] = (st.st_size, st.st_mtime_ns)
    return sizes


def _short(host: str) -> str:
    return host.split(".", 1)[0].lower()


def _this_machine() -> set[str]:
    return {_short(socket.gethostname()), "localhost"}
