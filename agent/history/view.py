"""What `agent history` prints (pure): the jobs as table rows, one job's attempts, JSON.

Every text came from a summary.json that anyone could have written: control characters are
escaped before they reach a terminal.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from agent.history.record import AttemptRecord
from agent.history.store import Stored

JOB_HEADER = (
    "job", "step", "started", "seconds", "nodes", "ranks", "restarts", "spares used", "exit",
    "root cause", "command",
)  # fmt: skip
ATTEMPT_HEADER = (
    "attempt", "started", "seconds", "nodes", "ranks", "failed", "spares", "lost nodes", "cause",
)  # fmt: skip
CELL = 60  # characters of a cause or a command in a table cell (--json has them whole)
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def name(stored: Stored) -> str:
    return f"{safe(stored.record.job_id)}.{stored.run}"


def job_rows(jobs: Sequence[Stored]) -> list[tuple[list[str], str]]:
    """(cells, rich style) per job, in the order given."""
    rows = []
    for stored in jobs:
        r = stored.record
        rows.append(
            (
                [
                    name(stored), safe(r.step), when(r.start), seconds(r.start, r.end),
                    str(r.nodes), str(r.ranks), str(r.restarts),
                    safe(", ".join(r.spares_used)) or "-", str(r.exit_code),
                    safe(r.cause or "-", CELL), safe(r.command, CELL) or "-",
                ],
                "" if r.exit_code == 0 else "red",
            )
        )  # fmt: skip
    return rows


def attempt_rows(attempts: Sequence[AttemptRecord]) -> list[tuple[list[str], str]]:
    return [
        (
            [
                str(a.attempt), when(a.start), seconds(a.start, a.end), str(a.nodes),
                str(a.ranks), str(a.failed), safe(", ".join(a.spares)) or "-",
                ", ".join(str(n) for n in a.lost_nodes) or "-", safe(a.cause or "-", CELL * 2),
            ],
            "red" if a.failed or a.cause else "",
        )
        for a in attempts
    ]  # fmt: skip


def job_facts(stored: Stored) -> list[str]:
    """The lines above one job's attempt table."""
    r = stored.record
    lines = [
        f"job {name(stored)} (step {safe(r.step) or '-'}): {safe(r.status)}, exit {r.exit_code}, "
        f"{r.restarts} restart(s), {r.nodes} node(s), {r.ranks} rank(s)",
        f"  command: {safe(r.command, 1000) or '-'}",
        f"  started {when(r.start)}, ended {when(r.end)} ({seconds(r.start, r.end)} s)",
        f"  log dir: {safe(r.log_dir, 4096) or '-'}",
    ]
    if r.cause:
        lines.append(f"  root cause: {safe(r.cause, 1000)}")
    if r.spares_used:
        lines.append(f"  spares used: {safe(', '.join(r.spares_used), 1000)}")
    if r.stragglers:
        lines.append(f"  stragglers: {safe(', '.join(r.stragglers), 1000)}")
    return lines


def as_json(stored: Stored) -> dict[str, Any]:
    data = asdict(stored.record)
    return {"job": f"{stored.record.job_id}.{stored.run}", "run": stored.run, **data}


def when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def seconds(start: float | None, end: float | None) -> str:
    return "-" if start is None or end is None else f"{max(0.0, end - start):.1f}"


def safe(value: Any, limit: int = 256) -> str:
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return _UNSAFE.sub(
        lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text
    )
