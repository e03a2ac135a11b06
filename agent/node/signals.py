"""Signals to the agent, in every phase: raised where the agent waits, queued while ranks run.

While the supervisor runs, a signal becomes an event on its queue (it forwards SIGUSR1/2 and
tears down on SIGTERM/SIGINT/SIGHUP). In every other phase (joining, waiting for the plan,
between attempts, finishing) a stop signal raises Interrupted in the main thread, which breaks
any blocking store wait at once (the waits are Python socket reads), so the agent can tell the
other nodes and exit 128+N instead of waiting out a timeout.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

STOP = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)
ARRIVALS_KEPT = 64


@dataclass(frozen=True)
class Signalled:
    signum: int
    how: str | None = None  # who asked, when not the agent's own signal (a resident's client)
    run: int | None = None  # a client's signal: the run it stops (None: the agent's own signal)


class Interrupted(BaseException):
    """A stop signal outside the supervisor: BaseException, so no `except Exception` eats it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Signals:
    """Installs the handlers; `events` is a SimpleQueue (its put is safe in a signal handler)."""

    def __init__(self, events: queue.SimpleQueue) -> None:
        self.events = events
        self._queued = False
        self.received: int | None = None  # the last stop signal this process got (not a client's)
        # When each signal reached this process (epoch seconds, the last ARRIVALS_KEPT): node 0
        # judges a stop for preemption against the first in its run (agent.run.preemption).
        self.arrived: dict[int, collections.deque[float]] = {}

    def install(self) -> None:
        for signum in (*STOP, *FORWARDED):
            signal.signal(signum, self._handle)

    @contextlib.contextmanager
    def queued(self) -> Iterator[None]:
        """Within this block signals are events for the supervisor, not exceptions."""
        self._queued = True
        try:
            yield
        finally:
            self._queued = False

    def first_since(self, signum: int, since: float) -> float | None:
        """When `signum` first reached this process at or after `since` (None: not yet)."""
        return next((t for t in list(self.arrived.get(signum, ())) if t >= since), None)

    def _handle(self, signum: int, _frame: object) -> None:
        kept = self.arrived.setdefault(signum, collections.deque(maxlen=ARRIVALS_KEPT))
        kept.append(time.time())
        if signum in STOP:
            self.received = signum
        if self._queued:
            self.events.put(Signalled(signum))
        elif signum in STOP:
            raise Interrupted(signum)
