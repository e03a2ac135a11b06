"""The --checkpoint-dir as node 0 sees it: what was written there after the stop signal (a
bounded walk), and the one file the agent keeps there — the last stop's record, which the next
job with the same dir reads, whatever its job id (a requeue keeps it, a resubmission does not;
the checkpoint dir is what the two runs share by definition)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from typing import Any

from agent.plan.run_plan import RunPlan
from agent.run.preemption import Preemption, Written, previous_stop_line

MARKER = ".launch-agent-stop.json"  # a dot file: a loader globbing DIR/* does not see it
MARKER_BYTES = 64 * 1024
SCAN_ENTRIES = 100_000  # entries looked at, at most: a sharded checkpoint has thousands
SCAN_DEPTH = 8


def location(plan: RunPlan) -> str | None:
    """The run's --checkpoint-dir as node 0 reaches it (a relative one: from the ranks' cwd)."""
    directory = plan.options.checkpoint_dir
    return None if directory is None else os.path.join(plan.cwd or os.getcwd(), directory)


def newest_after(
    directory: str,
    since: float,
    shown: str | None = None,
    limit: int = SCAN_ENTRIES,
    uid: int | None = None,
) -> Written | None:
    """The top entry of `directory` holding the newest regular file of `uid` (default: this
    process's user, whose ranks write the checkpoints; another user's file proves nothing)
    modified at or after `since` (epoch seconds, node 0's clock: the file server's must agree,
    as NTP has them), and how many such files; None when there is none (or no such
    directory). Symlinks are not followed; the walk stops after `limit` entries. The path is
    named under `shown` (the dir as the user spelled it), else under `directory`."""
    owner = os.getuid() if uid is None else uid
    newest: tuple[float, str] | None = None
    files, seen = 0, 0
    stack: list[tuple[str, str | None, int]] = [(directory, None, 0)]
    while stack and seen < limit:
        path, top, depth = stack.pop()
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    seen += 1
                    if seen > limit:
                        break
                    if top is None and entry.name == MARKER:
                        continue
                    head = top if top is not None else entry.name
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode) and depth + 1 < SCAN_DEPTH:
                        stack.append((entry.path, head, depth + 1))
                    elif stat.S_ISREG(st.st_mode) and st.st_mtime >= since and st.st_uid == owner:
                        files += 1
                        if newest is None or st.st_mtime > newest[0]:
                            newest = (st.st_mtime, head)
        except OSError:
            continue
    if newest is None:
        return None
    return Written(os.path.join(shown or directory, newest[1]), newest[0], files)


def write_marker(directory: str, job: str, stop: Preemption | None) -> None:
    """The last job's stop, for the next job (`stop` None: it was not stopped for preemption,
    and an older record must not speak for it). Never raises: the record is a courtesy."""
    path = os.path.join(directory, MARKER)
    if stop is None:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    data = {"job": job, "saved": stop.saved, **stop.to_json()}
    temp = f"{path}.{os.getpid()}"
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def read_marker(directory: str) -> dict[str, Any] | None:
    """The last stop's record, if the dir holds a sane one (bounded; a regular file only)."""
    try:
        fd = os.open(os.path.join(directory, MARKER), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, MARKER_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > MARKER_BYTES:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def previous_stop(directory: str) -> str | None:
    """Node 0, before the job's first attempt: the warning the next job says first when the
    last one with this dir was stopped for preemption without a checkpoint (None: no such
    stop)."""
    return previous_stop_line(read_marker(directory))
