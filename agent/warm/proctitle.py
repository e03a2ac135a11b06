"""Show a forked rank's own command in /proc/PID/cmdline (ps, top, nvidia-smi, py-spy, the
agent's binding check), instead of the zygote's, which it inherits with the zygote's memory."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

# Appended to the zygote's own command line: room for the ranks' commands in the argv area,
# which the kernel reports and whose size is fixed at exec. Spaces look like nothing in ps.
PADDING = " " * 2048


def _argv_area() -> tuple[int, int] | None:
    """[arg_start, arg_end) of this process (fields 48 and 49 of /proc/self/stat)."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return int(fields[45]), int(fields[46])
    except (OSError, ValueError, IndexError):
        return None


def retitle(argv: Sequence[str]) -> bool:
    """Write argv, NUL-separated and NUL-padded, over the argv area; truncated if it does not
    fit. Only once the area is checked to hold exactly what the kernel reports as our command
    line: a misread address must never lead to writing elsewhere. Python's sys.argv and
    sys.orig_argv are copies made at start, and argv[0] stays where glibc's
    program_invocation_name points."""
    area = _argv_area()
    try:
        with open("/proc/self/cmdline", "rb") as cmdline:
            current = cmdline.read()
    except OSError:
        return False
    if area is None or area[1] - area[0] != len(current) or not current:
        return False
    start, size = area[0], len(current)
    if ctypes.string_at(start, size) != current:
        return False
    title = b"\0".join(os.fsencode(arg) for arg in argv)[: size - 1]
    ctypes.memmove(start, title.ljust(size, b"\0"), size)
    return True
