"""Stop signals while a client waits on a run: the first is queued for forwarding to node 0, a
second gives up waiting.

The handler never touches the channel or the streams itself: it runs between two bytecodes of
the main thread, which may be inside the channel's send lock or in the middle of a write to the
same stream, so it only records the signal, and the client's loop (which wakes at least every
few tenths of a second) sends it. A second stop signal raises GaveUp from the handler, so the
client leaves at once even when blocked writing to a stuck terminal: it abandons the channel
anyway, so an interrupted read or write there does no harm.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class GaveUp(BaseException):
    """A second stop signal: BaseException, so no `except Exception` on the way eats it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """Installs the handlers for the duration of a `with` (main thread only: elsewhere Python
    cannot install handlers, and the caller's own handling stays in place)."""

    def __init__(self) -> None:
        self._pending: list[int] = []
        self._seen = 0
        self._saved: dict[int, Any] = {}
        self._leaving = False

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP:
                self._saved[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leaving = True  # a signal now must not raise half-way through the restoring
        for signum, previous in self._saved.items():
            # None: a handler installed from C that Python cannot name; the default is closest.
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._saved.clear()

    def take(self) -> list[str]:
        """Names of the signals received since the last call ("SIGINT", ...), oldest first."""
        taken, self._pending = self._pending, []
        return [signal.Signals(signum).name for signum in taken]

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self._seen += 1
        if self._seen == 2 and not self._leaving:  # once: a third must not break the exit
            raise GaveUp(signum)
        self._pending.append(signum)
