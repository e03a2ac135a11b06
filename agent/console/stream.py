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


class StreamState:
    def __init__(self, stream: Stream, file_fd: int, progress: ProgressPattern | None) -> None:
        self.stream = stream
        self.file_fd = file_fd
        self.partial = b""
        self.tail = collections.deque[bytes]()
        self.tail_size = 0
        self.done = threading.Event()
        self.last_output = time.monotonic()
        self.last_progress = self.last_output  # output that counts as progress (--progress-regex)
        self.bytes = 0
        self.lost = 0  # bytes the file could not take (a full disk): the pipe is drained anyway
        self.lost_why = ""
        # Nothing to look at in the bytes (stdout, console off): move them pipe → file in the kernel.
        self.splice = stream.name == "out" and not stream.to_console and hasattr(os, "splice")
        self.splice = self.splice and progress is None  # a pattern must see the bytes
