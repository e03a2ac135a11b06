"""Reading a config file, bounded: only a regular file, and at most max_bytes of it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent.errors import AgentError

_FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_text(path: Path, max_bytes: int) -> str:
    """The file's text: only a regular file, checked before opening (a FIFO would block, a device
    never end), and at most max_bytes of it, however the file changes while it is read."""
    try:
        _check_kind(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with open(fd, "rb") as file:
            info = os.fstat(file.fileno())
            _check_kind(path, info.st_mode)  # replaced since the check above
            if info.st_size > max_bytes:
                raise AgentError(_too_big(path, f"{info.st_size:,} bytes", max_bytes))
            data = file.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise AgentError(_too_big(path, "growing", max_bytes))
        return data.decode("utf-8")
    except FileNotFoundError:
        raise AgentError(
            f"config {path} not found; check the path (configs are read on node 0)"
        ) from None
    except IsADirectoryError:
        raise AgentError(f"config {path} is a directory; give a .yml file") from None
    except PermissionError:
        raise AgentError(
            f"config {path} is not readable; fix its permissions (chmod u+r {path})"
        ) from None
    except UnicodeDecodeError as exc:
        raise AgentError(
            f"config {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None
    except OSError as exc:
        raise AgentError(f"config {path} cannot be read: {exc.strerror}; check the file") from None


def _check_kind(path: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a file")
    raise AgentError(
        f"config {path} is {kind}, not a regular file; give a .yml file "
        "(a config is read whole before anything starts)"
    )


def _too_big(path: Path, size: str, max_bytes: int) -> str:
    return (
        f"config {path} is over the {max_bytes:,}-byte limit for a config ({size}); shrink it, "
        "or raise the limit with --max-config-bytes N"
    )
