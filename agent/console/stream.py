"""One rank pipe as the router sees it: where it goes, and what it has seen so far."""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass

from agent.plan.options import ProgressPattern


@dataclass(frozen=True)
class Stream:
    rank: int
    name: str  # "out" | "err"
    path: str
    prefix: bytes  # b"host:rank: ", maybe coloured
    to_console: bool


STEPS_KEPT = 20  # step durations a rank keeps: its median is over these


@dataclass(frozen=True)
class JobPace:
    """What node 0 last judged of the whole job's pace (agent.run.pace), for the live table."""

    median: float | None  # the job's median step time (None: not enough steps yet)
    furthest: int | None  # the highest step number any rank printed
    slow_nodes: frozenset[int] = frozenset()  # node ranks straggling as a whole
    slow_ranks: frozenset[int] = frozenset()  # ranks straggling on their own


class StepClock:
    """One rank's recent step times, from the moments its progress lines arrive (bounded: the
    last STEPS_KEPT durations). With a `step` number in the line, a gap of several steps counts
    as that many steps of equal length; a number that does not grow restarts the clock."""

    def __init__(self) -> None:
        self.durations = collections.deque[float](maxlen=STEPS_KEPT)
        self.step: int | None = None
        self.when: float | None = None
        self.lines = 0  # progress lines (chunks with a match) seen

    def tick(self, step: int | None, when: float) -> None:
        """O(1): one progress line at `when` (monotonic seconds)."""
        self.lines += 1
        if self.when is not None and step is not None and self.step is not None:
            if step > self.step:
                self.durations.append((when - self.when) / (step - self.step))
        elif self.when is not None and step is None:
            self.durations.append(when - self.when)
        self.step, self.when = step, when


class StreamState:
    def __init__(self, stream: Stream, file_fd: int, progress: ProgressPattern | None) -> None:
        self.stream = stream
        self.file_fd = file_fd
        self.partial = b""  # the console's unended line
        self.unfinished = bytearray()  # the unended line a --progress-regex has yet to see
        self.tail = collections.deque[bytes]()
        self.tail_size = 0
        self.done = threading.Event()
        self.last_output = time.monotonic()
        self.last_progress = self.last_output  # output that counts as progress (--progress-regex)
        self.bytes = 0
        self.lost = 0  # bytes the file could not take (a full disk): the pipe is drained anyway
        self.lost_why = ""
        self.clock = StepClock()  # the router gives a rank's two streams one clock
        # Nothing to look at in the bytes (stdout, console off): move them pipe → file in the kernel.
        self.splice = stream.name == "out" and not stream.to_console and hasattr(os, "splice")
        self.splice = self.splice and progress is None  # a pattern must see the bytes
