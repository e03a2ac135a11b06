"""One thread per process accepts the ranks that pause, on every desk's unix socket.

A real agent has one desk at a time; the scale harness runs thousands of agents as threads of
one process, where a thread per desk and attempt would cost each attempt's start a thread
start (a GIL hand-over among thousands). A rank's connect() does not wait for accept(): the
listen backlog takes it, so the selector's timeout only bounds how soon a closed listener is
forgotten.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from collections.abc import Callable

POLL = 0.5  # seconds between looks at listeners closed meanwhile
SHORT_OF_FDS = 0.1  # seconds between accepts while the process has no descriptor left
_NO_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

_lock = threading.Lock()
_selector: selectors.BaseSelector | None = None


def register(listener: socket.socket, accepted: Callable[[socket.socket], None]) -> None:
    """`accepted(conn)` for every connection `listener` gets, until it is unregistered."""
    global _selector
    with _lock:
        if _selector is None:
            _selector = selectors.DefaultSelector()
            threading.Thread(
                target=_loop, args=(_selector,), name="pause-accept", daemon=True
            ).start()
        listener.setblocking(False)
        _selector.register(listener, selectors.EVENT_READ, accepted)


def unregister(listener: socket.socket) -> None:
    with _lock, contextlib.suppress(KeyError, ValueError, OSError):
        if _selector is not None:
            _selector.unregister(listener)


def _loop(selector: selectors.BaseSelector) -> None:
    while True:
        try:
            ready = selector.select(POLL)
        except OSError:  # a listener closed under the selector: look again
            continue
        for key, _ in ready:
            listener = key.fileobj
            assert isinstance(listener, socket.socket)
            try:
                conn, _ = listener.accept()
            except OSError as exc:  # taken by nobody, or the listener closed meanwhile
                if exc.errno in _NO_FDS:  # the rank waits in the backlog: no busy loop on it
                    time.sleep(SHORT_OF_FDS)  # not a synchronisation: no event says "fds free"
                continue
            conn.setblocking(True)
            key.data(conn)
