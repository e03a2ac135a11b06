"""A job's log dir on disk: checking it, listing it, reading its files and JSON files, bounded.

Everything in a log dir may have been written by anyone: a file read here is a regular file (a
FIFO or device named ranks.json must not hang or flood `agent logs`), JSON is at most MAX_JSON
bytes and MAX_DEPTH levels deep, and what cannot be read is an error value, never a traceback.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, BinaryIO

from agent.errors import AgentError

MAX_JSON = 64 << 20  # ranks.json of 100k ranks is ~7 MiB
MAX_DEPTH = 64  # ranks.json and summary.json are 5 levels deep


def check_dir(log_dir: str) -> None:
    if not os.path.isdir(log_dir):
        what = "is not a directory" if os.path.exists(log_dir) else "does not exist"
        raise AgentError(
            f"log dir {log_dir} {what}: pass the job's --log-dir (default logs/ID) or its id "
            "(agent history lists them)"
        )
    try:
        os.listdir(log_dir)
    except OSError as exc:
        raise AgentError(f"cannot read log dir {log_dir}: {exc.strerror}") from None


def list_names(log_dir: str) -> list[str]:
    """The names in the log dir; none while it does not exist (yet)."""
    try:
        return os.listdir(log_dir)
    except OSError:  # not there (yet), not a directory, not readable: nothing to show
        return []


def signature(path: str) -> tuple[int, int] | None:
    """(mtime, size) of the file, None when it does not exist: whether it was written since."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def open_regular(path: str) -> BinaryIO:
    """The file opened for reading; OSError when it cannot be, or is not a regular file.
    O_NONBLOCK: opening a FIFO does not wait for a writer (it is then refused)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_json(path: str) -> Any:
    """The file's JSON, None when it does not exist. ValueError (a one-line reason, without the
    path) when it is not JSON, is larger than MAX_JSON or nested deeper than MAX_DEPTH; OSError
    when it cannot be read."""
    try:
        with open_regular(path) as f:
            data = f.read(MAX_JSON + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_JSON:
        raise ValueError(f"larger than {MAX_JSON >> 20} MiB")
    try:
        value = json.loads(data)
    except RecursionError:  # the C parser recurses once per level
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if too_deep(value, MAX_DEPTH):
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    return value


def too_deep(value: Any, limit: int) -> bool:
    """Whether lists and dicts nest more than `limit` levels (iterative: no recursion). Only
    containers are stacked, by exact type (json.loads makes no subclasses): a 32,768-rank
    summary.json's 400,000 values took 0.25 s to walk, most of it in isinstance."""
    stack = [(value, 1)] if type(value) in _CONTAINERS else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if type(item) is dict else item
        stack.extend((child, depth + 1) for child in children if type(child) in _CONTAINERS)
    return False


_CONTAINERS = frozenset({dict, list})
