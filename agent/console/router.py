"""Rank pipes → rank files (raw bytes, nothing lost) + `host:rank` prefixed console lines.

One reader thread per node multiplexes every pipe with a selector and large reads; files get the
bytes synchronously. The console is a view: lines go through a bounded queue to one writer thread,
and when the console cannot keep up, lines are dropped from the console only (counted, announced),
so a slow terminal never blocks a rank.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import queue
import selectors
import threading
import time
from typing import Any, Protocol

from agent.console.stream import StepClock, Stream, StreamState
from agent.plan.options import ProgressPattern


class ConsoleSink(Protocol):
    """Where the console's bytes go: a binary stream, the live table, a resident client."""

    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


_READ = 1 << 20
_PIPE_SIZE = 1 << 20  # a chatty rank then blocks and wakes us 16x less often than with 64 KiB
_MAX_PARTIAL = 1 << 16  # a console line longer than this is shown in pieces
_TAIL_BYTES = 8192
log = logging.getLogger("agent")
PALETTE = (36, 33, 32, 35, 34, 31, 96, 93, 92, 95, 94, 91)  # ANSI colours, one per rank (mod 12)


class LogRouter:
    def __init__(
        self,
        console_out: ConsoleSink,
        console_err: ConsoleSink,
        console_depth: int = 2048,
        progress: ProgressPattern | None = None,
    ) -> None:
        self._progress = progress
        self._step_group = _step_group(progress)  # RE2 names groups in bytes
        self._clocks: dict[int, StepClock] = {}
        self._targets = {"out": console_out, "err": console_err}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)  # written with self._lock held: never waits
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._pending: list[tuple[int, StreamState]] = []
        self._lock = threading.Lock()
        self._states: list[StreamState] = []
        self._console: queue.Queue[tuple[str, tuple[bytes | memoryview, ...]] | None]
        self._console = queue.Queue(console_depth)
        self._dropped: collections.Counter[int] = collections.Counter()
        self._closing = False
        self._reader = threading.Thread(target=self._read_loop, name="log-reader", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name="console", daemon=True)
        self._reader.start()
        self._writer.start()

    def add(self, pipe_fd: int, stream: Stream) -> StreamState:
        """Route one pipe; the file is created (appending) before any byte arrives."""
        # Not O_APPEND (splice refuses it); this thread is the file's only writer.
        file_fd = os.open(stream.path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.lseek(file_fd, 0, os.SEEK_END)
        if stream.name == "out":
            with contextlib.suppress(OSError):  # over the per-user pipe quota: keep the default
                fcntl.fcntl(pipe_fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        state = StreamState(stream, file_fd, self._progress)
        with self._lock:
            state.clock = self._clocks.setdefault(stream.rank, state.clock)
            self._pending.append((pipe_fd, state))
            self._states.append(state)
            self._wake()
        return state

    def _wake(self) -> None:
        """Wake the reader (with self._lock held): a no-op once it has ended and closed the
        wake pipe."""
        if self._wake_w >= 0:
            with contextlib.suppress(BlockingIOError):  # full: the reader is woken already
                os.write(self._wake_w, b"x")

    # -- reading --------------------------------------------------------------------------
    def _read_loop(self) -> None:
        try:
            while True:
                for key, _ in self._selector.select():
                    if key.data is None:
                        os.read(self._wake_r, 4096)
                        if not self._register_pending():
                            return
                        continue
                    self._drain(key.fd, key.data)
        finally:  # a router per attempt: its selector and wake pipe end with it
            self._selector.close()
            with self._lock:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_w = -1

    def _register_pending(self) -> bool:
        with self._lock:
            pending, self._pending = self._pending, []
            closing = self._closing
        for fd, state in pending:
            self._selector.register(fd, selectors.EVENT_READ, state)
        return not (closing and len(self._selector.get_map()) == 1)

    def _drain(self, fd: int, state: StreamState) -> None:
        if state.splice and self._splice(fd, state):
            return
        try:
            data = os.read(fd, _READ)
        except OSError:
            data = b""
        if not data:
            self._selector.unregister(fd)
            os.close(fd)
            self._finish(state)
            return
        self._to_file(state, data)
        state.last_output = time.monotonic()
        if self._progress is None:
            state.last_progress = state.last_output
        else:
            self._progress_seen(state, self._progress_in(state, data))
        if state.stream.name == "err":
            self._keep_tail(state, data)
        if state.stream.to_console:
            self._to_console(state, data)
        state.bytes += len(data)  # last: a reader that sees the count sees the chunk handled

    def _to_file(self, state: StreamState, data: bytes) -> None:
        """Every byte to the rank's file; when the disk refuses, count the loss and go on
        draining the pipe, so the rank never blocks on a full log disk."""
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(state.file_fd, view) :]
        except OSError as exc:
            if not state.lost:
                state.lost_why = exc.strerror or str(exc)
                log.error(
                    "cannot write %s (%s): rank %d keeps running, its output there is lost",
                    state.stream.path,
                    state.lost_why,
                    state.stream.rank,
                )
            state.lost += len(view)

    def losses(self) -> list[str]:
        """One line per rank file that lost output (for the summary)."""
        return [
            f"rank {s.stream.rank} {s.stream.name}: {s.lost} bytes not written to "
            f"{s.stream.path} ({s.lost_why})"
            for s in self._states
            if s.lost
        ]

    def _splice(self, fd: int, state: StreamState) -> bool:
        """Move what the pipe holds straight into the file; False at EOF or if splice fails."""
        try:
            moved = os.splice(fd, state.file_fd, _READ)
        except OSError:
            state.splice = False  # e.g. a file system without splice: copy instead
            return False
        state.bytes += moved
        state.last_output = state.last_progress = time.monotonic()
        return moved > 0

    def _finish(self, state: StreamState) -> None:
        if state.unfinished and self._progress is not None:  # the rank's last line, unended
            text = bytes(state.unfinished)
            state.unfinished.clear()
            self._progress_seen(state, self._last_progress(text, 0, len(text)))
        if state.partial and state.stream.to_console:
            self._enqueue(state, (state.stream.prefix, state.partial, b"\n"), b"\n")
            state.partial = b""
        os.close(state.file_fd)
        state.done.set()
        with self._lock:
            if self._closing and len(self._selector.get_map()) == 1:
                self._wake()

    def _keep_tail(self, state: StreamState, data: bytes) -> None:
        state.tail.append(data)
        state.tail_size += len(data)
        while state.tail_size - len(state.tail[0]) >= _TAIL_BYTES:
            state.tail_size -= len(state.tail.popleft())

    # -- console --------------------------------------------------------------------------
    def _to_console(self, state: StreamState, data: bytes) -> None:
        cut = data.rfind(b"\n")
        if cut < 0:
            state.partial += data
            if len(state.partial) > _MAX_PARTIAL:
                self._enqueue(state, (state.stream.prefix, state.partial, b"\n"), b"\n")
                state.partial = b""
            return
        # The reader thread makes one copy (the replace) and hands the lines over as a view of it;
        # the console thread joins the pieces, so each write is whole lines.
        prefix = state.stream.prefix
        body = data.replace(b"\n", b"\n" + prefix)
        end = len(body) - (len(data) - cut - 1) - len(prefix)  # just after the last newline
        self._enqueue(state, (prefix + state.partial, memoryview(body)[:end]), data)
        state.partial = data[cut + 1 :]

    def _enqueue(
        self, state: StreamState, pieces: tuple[bytes | memoryview, ...], lines_in: bytes
    ) -> None:
        """Queue for the console; when it is behind, count the newlines of `lines_in` as dropped
        (counted only then: the common path makes no extra pass over the bytes)."""
        try:
            self._console.put_nowait((state.stream.name, pieces))
        except queue.Full:
            self._dropped[state.stream.rank] += lines_in.count(b"\n")

    def _write_loop(self) -> None:
        while True:
            item = self._console.get()
            if item is None:
                return
            target = self._targets[item[0]]
            try:
                target.write(b"".join(item[1]))
                if self._console.empty():
                    target.flush()
                    self._announce_drops()
            except (OSError, ValueError):
                pass  # a closed console must never stop the rank files

    def _announce_drops(self) -> None:
        if not self._dropped:
            return
        dropped, self._dropped = self._dropped, collections.Counter()
        for rank, lines in sorted(dropped.items()):
            self._targets["err"].write(
                f"[agent] console too slow: {lines} lines of rank {rank} shown only in its log file\n".encode()
            )
        self._targets["err"].flush()

    def _progress_in(self, state: StreamState, data: bytes) -> Any:
        """The progress match that counts among the lines this read completes. A pattern sees
        whole lines, never a read's pieces: an unbuffered `print('step', i)` reaches the pipe
        as four writes, and a line can straddle two reads. A line ends at `\n` or at `\r`
        (a progress bar redraws its line with `\r`); the unended rest waits for its end, up to
        _MAX_PARTIAL bytes, past which it is searched as it stands (each byte is searched once,
        so the cost stays linear)."""
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut < 0:
            state.unfinished += data
            if len(state.unfinished) <= _MAX_PARTIAL:
                return None
            text = bytes(state.unfinished)
            state.unfinished.clear()
            return self._last_progress(text, 0, len(text))
        found, start = None, 0
        if state.unfinished:  # the line begun in earlier reads ends in this one
            start = min(i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0) + 1
            head = bytes(state.unfinished) + data[:start]
            state.unfinished.clear()
            found = self._last_progress(head, 0, len(head))
        later = self._last_progress(data, start, cut + 1) if start <= cut else None
        state.unfinished += data[cut + 1 :]
        if found is None or (later is not None and self._step_group is not None):
            return later
        return found

    def _progress_seen(self, state: StreamState, found: Any) -> None:
        if found is not None:
            state.last_progress = time.monotonic()
            state.clock.tick(self._step_of(found), state.last_progress)

    def _last_progress(self, data: bytes, start: int, end: int) -> Any:
        """The progress match that counts in data[start:end] (whole lines): with a `step` group
        the last one (several step lines can arrive in one read; the rank is at the latest),
        else the first (only that one came). Linear in the bytes either way (RE2)."""
        assert self._progress is not None
        if self._step_group is None:
            return self._progress.search(data, start, end)
        found = None
        for found in self._progress.finditer(data, start, end):  # noqa: B007 — the last one
            pass
        return found

    def _step_of(self, found: Any) -> int | None:
        if self._step_group is None:
            return None
        try:
            value = found.group(self._step_group)
            return int(value) if value is not None and len(value) <= 18 else None
        except (ValueError, IndexError):
            return None

    # -- queries and shutdown -------------------------------------------------------------
    def clocks(self) -> dict[int, StepClock]:
        """Each rank's step clock (read from other threads: a clock's fields are replaced whole)."""
        with self._lock:
            return dict(self._clocks)

    @property
    def numbers_steps(self) -> bool:
        """--progress-regex has a group named `step`: progress lines carry step numbers."""
        return self._step_group is not None

    def progressed(self) -> bool:
        """Whether any rank printed a progress line (--progress-regex) since this router began."""
        return any(c.lines for c in self.clocks().values())

    def close(self, timeout: float = 5.0) -> None:
        """Wait for every pipe to reach EOF (bounded), then flush the console."""
        deadline = time.monotonic() + timeout
        for state in list(self._states):
            state.done.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._closing = True
            self._wake()
        self._reader.join(max(0.0, deadline - time.monotonic()))
        self._console.put(None)
        self._writer.join(timeout)
        for target in self._targets.values():
            with contextlib.suppress(OSError, ValueError):
                target.flush()


def _step_group(progress: ProgressPattern | None) -> int | None:
    """The index of the group named `step` when the pattern has one (its number times steps)."""
    names = getattr(progress, "groupindex", None) or {}
    return names.get(b"step", names.get("step"))
