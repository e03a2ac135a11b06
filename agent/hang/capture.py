"""Dump the Python stacks of this node's ranks: one py-spy per rank, all at once, bounded by a
timeout; ranks py-spy cannot trace fall back to the faulthandler signal they registered.

py-spy pauses a rank for the few milliseconds it reads its memory (blocking mode: consistent
stacks). It needs ptrace rights on the rank: same uid, no Yama restriction beyond
ptrace_scope=1 (ranks name the agent as their tracer with PR_SET_PTRACER), not
ptrace_scope=3; a killed py-spy leaves its rank resumed (SIGCONT).
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Sequence

from agent.hang.fallback import (
    FALLBACK_SIGNAL,
    Dump,
    fallback_path,
    install_fallback,
    parse_faulthandler,
    registered,
)
from agent.hang.pyspy import Spy, find_pyspy, parse_dump
from agent.hang.stacks import Frame, RankStack, ThreadStack, failed, rank_stack

__all__ = [
    "FALLBACK_SIGNAL",
    "Frame",
    "RankStack",
    "ThreadStack",
    "capture",
    "fallback_path",
    "install_fallback",
    "parse_dump",
    "parse_faulthandler",
]

POLL = 0.01  # seconds between looks at a fallback file being written
PYSPY_SHARE = 0.6  # of the timeout, when a fallback could still follow


class _Rank:
    """One rank's capture in progress."""

    def __init__(self, rank: int, pid: int) -> None:
        self.rank, self.pid = rank, pid
        self.spy: Spy | None = None
        self.spy_until = 0.0  # py-spy's deadline: PYSPY_SHARE of the time if a fallback follows
        self.dump: Dump | None = None
        self.why = ""  # why py-spy gave nothing
        self.done: RankStack | None = None


def capture(
    ranks: Sequence[tuple[int, int]],
    host: str,
    *,
    native: bool = False,
    timeout: float = 2.0,
    fallback_dir: str | None = None,
    force_fallback: bool = False,
) -> list[RankStack]:
    """ranks: (rank, pid). One RankStack per entry, in order, within about `timeout` seconds:
    method "py-spy" (or "py-spy --native"), "faulthandler" (py-spy failed or force_fallback,
    and the rank registered the fallback in fallback_dir), else "none" with the error."""
    start = time.monotonic()
    deadline = start + timeout
    method = "py-spy --native" if native else "py-spy"
    binary = None if force_fallback else find_pyspy()
    work = [_Rank(rank, pid) for rank, pid in ranks]
    selector = selectors.DefaultSelector()
    try:
        for item in work:
            _start(item, selector, host, binary, native, fallback_dir, force_fallback)
            share = PYSPY_SHARE if fallback_dir and registered(fallback_dir, item.pid) else 1.0
            item.spy_until = start + timeout * share
        while any(item.done is None for item in work):
            now = time.monotonic()
            if now >= deadline:
                break
            limit = min([deadline, *(item.spy_until for item in work if item.spy)])
            if any(item.dump and item.done is None for item in work):
                limit = now + POLL
            for key, _ in selector.select(max(0.0, limit - now)):
                _read(key.data, key.fd, selector, host, fallback_dir, method)
            for item in work:
                _advance(item, selector, host, fallback_dir, start)
    finally:
        for item in work:
            if item.spy is not None:
                _unregister(selector, item.spy, every=True)
                item.spy.stop()
                item.why = item.why or _late(item, start)
            if item.done is None:
                why = item.why or "no stack"
                if item.dump is not None:
                    why = f"{why}; no faulthandler dump within {timeout:g}s"
                item.done = failed(item.rank, host, item.pid, why)
        selector.close()
    return [item.done for item in work if item.done is not None]


def _start(
    item: _Rank,
    selector: selectors.BaseSelector,
    host: str,
    binary: str | None,
    native: bool,
    fallback_dir: str | None,
    force_fallback: bool,
) -> None:
    """Start py-spy on the rank, or go straight to the fallback."""
    if item.pid <= 1:  # never kill(0) or kill(-1): that would signal a whole group
        item.done = failed(item.rank, host, item.pid, f"not a rank pid: {item.pid}")
    elif force_fallback:
        _fall_back(item, host, fallback_dir, "fallback forced")
    elif binary is None:
        _fall_back(item, host, fallback_dir, "py-spy not found (pip install py-spy)")
    else:
        try:
            item.spy = Spy(binary, item.pid, native)
        except OSError as exc:
            _fall_back(item, host, fallback_dir, f"cannot run py-spy: {exc.strerror}")
            return
        for fd in item.spy.open:
            selector.register(fd, selectors.EVENT_READ, item)


def _late(item: _Rank, start: float) -> str:
    return f"py-spy gave no stack within {item.spy_until - start:.3g}s"


def _read(
    item: _Rank,
    fd: int,
    selector: selectors.BaseSelector,
    host: str,
    fallback_dir: str | None,
    method: str,
) -> None:
    spy = item.spy
    if spy is None:
        return
    try:
        spy.feed(fd)
    except OSError as exc:
        _unregister(selector, spy, every=True)
        item.spy = None
        spy.stop()
        _fall_back(item, host, fallback_dir, f"reading py-spy: {exc.strerror}")
        return
    _unregister(selector, spy)
    if spy.open:
        return
    item.spy = None
    try:
        threads = spy.result()
    except ValueError as exc:
        gone = not os.path.exists(f"/proc/{item.pid}")  # py-spy's own words are obscure
        _fall_back(item, host, fallback_dir, "process exited" if gone else str(exc))
        return
    item.done = rank_stack(item.rank, host, item.pid, method, threads)


def _advance(
    item: _Rank,
    selector: selectors.BaseSelector,
    host: str,
    fallback_dir: str | None,
    start: float,
) -> None:
    """Time out a py-spy past its deadline, or look at a fallback dump being written."""
    if item.spy is not None and time.monotonic() >= item.spy_until:
        _unregister(selector, item.spy, every=True)
        item.spy.stop()
        item.spy = None
        _fall_back(item, host, fallback_dir, _late(item, start))
    if item.dump is None or item.done is not None:
        return
    try:
        threads = item.dump.poll()
    except (OSError, ValueError) as exc:
        item.dump = None
        item.done = failed(item.rank, host, item.pid, f"{item.why}; faulthandler: {exc}")
        return
    if threads is not None:
        item.done = rank_stack(item.rank, host, item.pid, "faulthandler", threads)


def _fall_back(item: _Rank, host: str, fallback_dir: str | None, why: str) -> None:
    """Signal the rank's faulthandler when it registered one; else the rank failed."""
    item.why = why
    if fallback_dir is None:
        item.done = failed(item.rank, host, item.pid, why)
    elif not registered(fallback_dir, item.pid):
        item.done = failed(item.rank, host, item.pid, f"{why}; no faulthandler fallback")
    else:
        try:
            item.dump = Dump(fallback_dir, item.pid)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            item.done = failed(item.rank, host, item.pid, f"{why}; faulthandler: {reason}")


def _unregister(selector: selectors.BaseSelector, spy: Spy, every: bool = False) -> None:
    for fd in (spy.out, spy.err):
        if (every or fd not in spy.open) and fd in selector.get_map():
            selector.unregister(fd)
