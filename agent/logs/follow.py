"""`agent logs` reading and following: prints selected rank files, then new lines as they arrive.

Pure choices (which files, which prefix, how lines split) live in agent.logs.selection, the rank →
host map in agent.logs.hosts; this module does the reading and the polling loop.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from typing import BinaryIO

from agent.errors import AgentError
from agent.history.liveness import KILLED, unfinished
from agent.logs.ending import Ending
from agent.logs.hosts import read_where
from agent.logs.logdir import check_dir, list_names, open_regular, signature
from agent.logs.selection import (
    LogsCommand,
    RankFile,
    Where,
    latest_attempt,
    parse_name,
    prefix,
    split_lines,
    wanted,
)
from agent.plan.log_dir import LogDir

_CHUNK = 1 << 20  # bytes read per file per poll: one chatty rank cannot starve the others
_STALE = 1.0  # seconds without growth before a partial line is shown
_REMAP = 2.0  # seconds between re-reads of the rank → host sources while a rank is unnamed
_JUDGE = 2.0  # seconds between looks at whether a running record's node 0 is still there


class _Followed:
    """Reading state of one shown file."""

    def __init__(self, file: RankFile, path: str, offset: int | None) -> None:
        self.file = file
        self.path = path
        self.offset = offset  # None: the last --lines lines, found when the file is first read
        self.partial = b""
        self.grown = time.monotonic()


class Tail:
    """The rank files of one log dir: scan, select, read what is new, print prefixed lines."""

    def __init__(self, command: LogsCommand, out: BinaryIO, colour: bool) -> None:
        self.command = command
        self.selection = command.selection
        self.out = out
        self.colour = colour
        self.where: dict[int, Where] = {}
        self.where_read = -1e9
        self.remap = _REMAP
        self.seen: set[str] = set()  # every name in the dir that was looked at once
        self.pending: list[RankFile] = []  # rank files waiting to learn their node (--node)
        self.ordered: list[_Followed] = []  # the shown files, in rank order
        self.unnamed = False  # some shown rank has no host yet: re-read the rank map now and then
        self.latest: int | None = None  # fixed at the first scan that finds rank files
        self.started = False
        self.names: list[str] = []  # the dir's entries at the last poll
        self.grew = False  # a shown file had new bytes in the last poll
        self.unreadable: set[str] = set()  # files already reported as unreadable

    def run(self) -> int:
        log_dir = self.command.log_dir
        if not self.command.follow or os.path.exists(log_dir):
            check_dir(log_dir)
        if not self.command.follow:
            self.poll(to_eof=True, final=True)
            if not self.ordered:
                print(
                    f"agent logs: no rank file in {log_dir} matches the selection", file=sys.stderr
                )
            judged = unfinished(log_dir)
            if judged is not None and judged[0] == KILLED:  # these files are all there will be
                print(f"agent logs: {judged[1]}", file=sys.stderr)
            return 0
        if not os.path.exists(log_dir):
            print(f"agent logs: waiting for {log_dir} to appear (Ctrl-C to stop)", file=sys.stderr)
        summary = LogDir(log_dir).summary
        before = signature(summary)  # a summary.json from before we started does not count
        ending = Ending(log_dir, self.command.idle_exit)
        running = before is not None and unfinished(log_dir) is not None
        judge_at = 0.0  # when to ask again whether a running record's agents are still there
        try:
            while True:
                busy = self.poll(to_eof=not self.started)
                self.started = True
                now = signature(summary)
                if now != before:
                    before = now  # the job's record: its start, or its end
                    running = unfinished(log_dir) is not None
                    if not running:
                        self.poll(to_eof=True, final=True)  # it ended: all is in the files now
                        return 0
                if running and time.monotonic() >= judge_at:
                    judge_at = time.monotonic() + _JUDGE
                    judged = unfinished(log_dir)
                    if judged is not None and judged[0] == KILLED:
                        self.poll(to_eof=True, final=True)
                        print(f"agent logs: {judged[1]}; stopping", file=sys.stderr)
                        return 0
                why = ending.why(self.names, self.grew, time.monotonic())
                if why is not None:
                    self.poll(to_eof=True, final=True)
                    print(f"agent logs: {why}; stopping", file=sys.stderr)
                    return 0
                if not busy:
                    time.sleep(self.command.interval)
        except KeyboardInterrupt:
            self.flush_partials()
            return 0

    # -- one poll -------------------------------------------------------------------------
    def poll(self, to_eof: bool, final: bool = False) -> bool:
        """Scan, then read what is new in every shown file; True when a file had more to read.
        final: nothing more will come, so a file's partial last line is shown right after it."""
        names = self.names = list_names(self.command.log_dir)
        self.grew = False
        fresh = [f for f in map(parse_name, set(names) - self.seen) if f is not None]
        self.seen.update(names)
        if fresh and self.latest is None:
            self.latest = latest_attempt(fresh)
        self.pending = sorted(self.pending + fresh, key=lambda f: f.order)
        if self.pending or self.unnamed:
            self._track(names)
        busy = False
        now = time.monotonic()
        for followed in self.ordered:
            busy |= self._read(followed, now, to_eof)
            if final and followed.partial:
                self._emit(followed, [followed.partial])
                followed.partial = b""
        self.out.flush()
        return busy

    def _track(self, names: list[str]) -> None:
        """Decide on the pending files; those whose node is not known yet stay pending."""
        named = self.command.prefix or self.selection.nodes is not None
        if named and (self.unnamed or any(f.rank not in self.where for f in self.pending)):
            self._load_where(names)
        undecided = []
        for file in self.pending:
            shown = wanted(file, self.selection, self.where, self.latest or 0, self.command.follow)
            if shown is None and not self.where and not self.command.follow:
                raise AgentError(
                    f"--node: nothing in {self.command.log_dir} says which node ran which rank "
                    "(no ranks.json, summary.json or agent logs naming hosts); select with --rank"
                )
            if shown is None:
                undecided.append(file)
            elif shown:
                path = os.path.join(self.command.log_dir, file.name)
                self.ordered.append(_Followed(file, path, self._start_offset(path)))
        self.pending = undecided if self.command.follow else []
        self.ordered.sort(key=lambda f: f.file.order)
        self.unnamed = self.command.prefix and any(
            f.file.rank not in self.where for f in self.ordered
        )

    def _start_offset(self, path: str) -> int | None:
        """A new file's start, or at startup its last --lines lines (None: `_read` finds them)."""
        if self.command.lines is None or self.started:
            return 0
        return None

    def _load_where(self, names: list[str]) -> None:
        now = time.monotonic()
        if now - self.where_read < self.remap:
            return  # a rank that no source names must not make every poll re-read them all
        self.where_read = now
        before = len(self.where)
        self.where = read_where(self.command.log_dir, names)
        # Backs off while nothing new turns up (an agent that writes no ranks.json, say).
        self.remap = _REMAP if len(self.where) > before else min(self.remap * 2, 60.0)

    def _read(self, followed: _Followed, now: float, to_eof: bool) -> bool:
        try:
            st = os.stat(followed.path)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a directory named like a rank file
            return False
        size = st.st_size
        if followed.offset is not None and size < followed.offset:  # truncated or replaced
            followed.offset, followed.partial = 0, b""
        if size == followed.offset:
            if followed.partial and now - followed.grown >= _STALE:
                self._emit(followed, [followed.partial])
                followed.partial = b""
            return False
        followed.grown = now
        try:
            with open_regular(followed.path) as f:
                if followed.offset is None:
                    followed.offset = lines_offset(f, self.command.lines or 0)
                limit = size if to_eof else min(size, followed.offset + _CHUNK)
                f.seek(followed.offset)
                while followed.offset < limit:
                    data = f.read(min(_CHUNK, limit - followed.offset))
                    if not data:
                        break
                    followed.offset += len(data)
                    self.grew = True
                    lines, followed.partial = split_lines(followed.partial, data)
                    self._emit(followed, lines)
        except OSError as exc:  # not readable (permissions, I/O error): say so once, go on
            if followed.path not in self.unreadable:
                self.unreadable.add(followed.path)
                print(
                    f"agent logs: cannot read {followed.path}: {exc.strerror or exc}",
                    file=sys.stderr,
                )
            return False
        return followed.offset < size

    def _emit(self, followed: _Followed, lines: list[bytes]) -> None:
        grep = self.selection.grep
        if grep is not None:
            lines = [line for line in lines if grep.search(line.decode("utf-8", "replace"))]
        if not lines:
            return
        head = prefix(followed.file, self.where, self.colour) if self.command.prefix else b""
        self.out.write(b"".join(head + line + b"\n" for line in lines))

    def flush_partials(self) -> None:
        for followed in self.ordered:
            if followed.partial:
                self._emit(followed, [followed.partial])
                followed.partial = b""
        self.out.flush()


def last_lines_offset(path: str, count: int) -> int:
    """The offset of the last `count` lines of the file (a final unterminated line counts);
    0 when it cannot be read (reading it later says why)."""
    try:
        f = open_regular(path)
    except OSError:
        return 0
    with f:
        return lines_offset(f, count)


def lines_offset(f: BinaryIO, count: int) -> int:
    """`last_lines_offset` of a file already open (its position is left anywhere)."""
    end = f.seek(0, os.SEEK_END)
    if count == 0:
        return end
    position, seen = end, 0
    while position > 0:
        step = min(1 << 16, position)
        position -= step
        f.seek(position)
        block = f.read(step)
        if position + step == end and block.endswith(b"\n"):
            block = block[:-1]  # the file's last newline ends the last line, not a new one
        index = len(block)
        while (index := block.rfind(b"\n", 0, index)) >= 0:
            seen += 1
            if seen == count:
                return position + index + 1
    return 0
