"""Reading a sealed record from the job store when anyone can write there.

torch's TCPStore answers `list_keys`, `set`, `add`, `delete_key` to whoever connects, so any key
may hold an outsider's bytes. A value that does not open with the job's key is absent: logged
once (key and why), never a decision, never the end of a wait; the reader goes on waiting for a
sealed record, and a wait with a timeout ends as "store tampering suspected at KEY" (exit 4).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.errors import AgentError, ExitCode
from agent.node.store import Store
from agent.node.trust import JobKeys, Refused

log = logging.getLogger("agent")
TAMPERING = "store tampering suspected"

POLL_FIRST, POLL_MAX = 0.05, 1.0  # re-reading a key that holds a forgery (an outsider's write)
_told: set[str] = set()  # keys whose forgery was logged already (once each)
_TOLD_MAX = 10_000


def tell_refused(key: str, exc: Refused) -> None:
    """Log a value that does not open, once per key: it counts as absent, never as an answer."""
    if key in _told or len(_told) >= _TOLD_MAX:
        return
    _told.add(key)
    log.error("%s; treated as absent, still waiting for a sealed record", exc.message)


class Tampered(AgentError):
    """A sealed record never replaced the value that did not open there, within the timeout."""

    tampering = True

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{TAMPERING} at {key}: {why}", ExitCode.REFUSED)


def read_sealed(
    store: Store,
    keys: JobKeys,
    key: str,
    what: str,
    data: bytes,
    timeout: float | None = None,
    stop: threading.Event | None = None,
    woken: Callable[[], None] | None = None,
    copies: Callable[[int], str] | None = None,
) -> dict[str, Any] | None:
    """The sealed record at `key`, given what was read there first (`data`). A value that does
    not open is absent: logged once, and the wait goes on — re-reading the key, less often as
    it lasts (only an outsider's write leads here), and blocked meanwhile on the next of the
    writer's secret-named copies (`copies(n)`: the n-th time it put the record again), read the
    moment it is written — until a sealed record replaces it, `stop` is set (None), `woken`
    raises (a failure that ends the wait), or `timeout` passes (Tampered: the phase cannot go
    on)."""
    try:
        return keys.unseal(data, key, what)
    except Refused as exc:
        first = exc
    if woken is not None:
        woken()  # a failure woke us (its wake value never opens): no forgery to tell of
    tell_refused(key, first)
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = POLL_FIRST
    copy = 1
    while True:
        if woken is not None:
            woken()
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise Tampered(key, f"{what} did not open and no sealed one came in {timeout:g}s")
        pause = delay if left is None else min(delay, left)
        if copies is not None:
            found, came = _copy(store, keys, copies(copy), what, pause)
            if found is not None:
                return found
            if came:  # garbled before we read it: the writer's next one
                copy += 1
            while store.exists(copies(copy + 1)):  # deleted, or we came late: its latest
                copy += 1
            if stop is not None and stop.is_set():
                return None
        elif stop is None:
            time.sleep(pause)
        elif stop.wait(pause):
            return None
        delay = min(delay * 2, POLL_MAX)
        if not store.exists(key):
            continue
        try:
            return keys.unseal(store.get_bytes(key, present=True), key, what)
        except Refused as exc:
            tell_refused(key, exc)


def _copy(
    store: Store, keys: JobKeys, name: str, what: str, wait: float
) -> tuple[dict[str, Any] | None, bool]:
    """(the writer's copy at `name` if it opens, whether one came), waiting up to `wait` s."""
    if not store.wait([name], wait):
        return None, False
    try:
        return keys.unseal(store.get_bytes(name, present=True), name, what), True
    except Refused as exc:
        tell_refused(name, exc)
        return None, True
