"""What `agent history` prints (pure): the jobs as table rows, one job's attempts, JSON.

Every text came from a summary.json that anyone could have written: control characters are
escaped before they reach a terminal.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from agent.console.rank_table import RankTable
from agent.history.liveness import KILLED_WORDS
from agent.history.record import AttemptRecord
from agent.history.store import Stored
from agent.text import printable


@dataclass(frozen=True)
class Column:
    """A column of a history table and how it gives way when the terminal is narrow."""

    title: str
    drop: int = 0  # columns go in this order (1 first) until the table fits; 0: never dropped
    shrink: int = 0  # a text cut (with …) to no fewer cells than this; 0: never cut


JOB_COLUMNS = (
    Column("job"),  # the id to type next: never dropped, never cut
    Column("step", drop=2),
    Column("started", drop=8),
    Column("seconds", drop=6),
    Column("nodes", drop=4),
    Column("ranks", drop=5),
    Column("restarts", drop=3),
    Column("spares used", drop=1),
    Column("exit"),
    Column("root cause", drop=9, shrink=32),
    Column("command", drop=7, shrink=20),
)
ATTEMPT_COLUMNS = (
    Column("attempt"),
    Column("started", drop=6),
    Column("seconds", drop=5),
    Column("nodes", drop=2),
    Column("ranks", drop=4),
    Column("failed", drop=7),
    Column("spares", drop=1),
    Column("lost nodes", drop=3),
    Column("cause", drop=8, shrink=32),
)
JOB_HEADER = tuple(c.title for c in JOB_COLUMNS)
ATTEMPT_HEADER = tuple(c.title for c in ATTEMPT_COLUMNS)
CELL = 60  # characters of a cause or a command in a table cell (--json has them whole)


def name(stored: Stored) -> str:
    """The job's id (agent.plan.run_id), as every other command takes it."""
    return safe(stored.record.run_id)


def job_rows(jobs: Sequence[Stored]) -> list[tuple[list[str], str]]:
    """(cells, rich style) per job, in the order given."""
    rows = []
    for stored in jobs:
        r = stored.record
        rows.append(
            (
                [
                    name(stored), safe(r.step), when(r.start),
                    "-" if r.exit_code is None else seconds(r.start, r.end),
                    str(r.nodes), str(r.ranks), str(r.restarts),
                    safe(", ".join(r.spares_used)) or "-", exit_text(r.exit_code),
                    safe(r.cause or r.stop or _NO_VERDICT.get(r.status, "-"), CELL),
                    safe(r.command, CELL) or "-",
                ],
                "" if r.status in ("succeeded", "running") else "red",
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


def fit(
    columns: Sequence[Column], rows: Sequence[tuple[list[str], str]], width: int
) -> tuple[tuple[str, ...], list[tuple[list[str], str]]]:
    """(header, rows) of a table at most `width` cells wide where it can be: the columns with
    the lowest `drop` go first until it fits (texts counted at their shortest), then the text
    columns share the width left, left to right. Never cut: the columns without `shrink`, the
    job id among them (a table of those alone may be wider than `width`)."""
    from rich.cells import cell_len

    natural = [
        max([cell_len(column.title), *(cell_len(cells[i]) for cells, _ in rows)])
        for i, column in enumerate(columns)
    ]
    least = [
        min(size, max(column.shrink, cell_len(column.title))) if column.shrink else size
        for column, size in zip(columns, natural, strict=True)
    ]

    def wide(kept: Sequence[int]) -> int:  # rank_table's layout: "│ a │ b │"
        return sum(least[i] for i in kept) + 3 * len(kept) + 1

    kept = list(range(len(columns)))
    for i in sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: columns[i].drop):
        if wide(kept) <= width:
            break
        kept.remove(i)
    sizes = {i: least[i] for i in kept}
    spare = width - wide(kept)
    for i in kept:  # left to right: the root cause before the command
        grow = max(0, min(spare, natural[i] - sizes[i]))
        sizes[i] += grow
        spare -= grow
    header = tuple(columns[i].title for i in kept)
    return header, [([_cut(cells[i], sizes[i]) for i in kept], style) for cells, style in rows]


def fitted_table(
    title: str, rows: Sequence[tuple[list[str], str]], columns: Sequence[Column], width: int
) -> RankTable:
    """The table `agent history` draws at `width` (a terminal's; unbounded for a pipe)."""
    header, fitted = fit(columns, rows, width)
    return RankTable(title, fitted, header)


def _cut(text: str, cells: int) -> str:
    from rich.cells import cell_len, set_cell_size

    if cell_len(text) <= cells:
        return text
    return set_cell_size(text, cells - 1).rstrip(" ") + "…"


# What a job without its verdict shows in place of a root cause (agent.history.liveness).
_NO_VERDICT = {"running": "running", "killed": KILLED_WORDS}


def exit_text(code: int | None) -> str:
    return "-" if code is None else str(code)


def job_facts(stored: Stored) -> list[str]:
    """The lines above one job's attempt table."""
    r = stored.record
    verdict = _NO_VERDICT.get(r.status) or f"{safe(r.status)}, exit {r.exit_code}"
    lines = [
        f"job {name(stored)} (step {safe(r.step) or '-'}): {verdict}, "
        f"{r.restarts} restart(s), {r.nodes} node(s), {r.ranks} rank(s)",
        f"  command: {safe(r.command, 1000) or '-'}",
        f"  started {when(r.start)}"
        + ("" if r.exit_code is None else f", ended {when(r.end)} ({seconds(r.start, r.end)} s)"),
        f"  log dir: {safe(r.log_dir, 4096) or '-'}",
    ]
    if r.cause:
        lines.append(f"  root cause: {safe(r.cause, 1000)}")
    if r.stop:
        lines.append(f"  {safe(r.stop, 1000)}")
    if r.spares_used:
        lines.append(f"  spares used: {safe(', '.join(r.spares_used), 1000)}")
    if r.stragglers:
        lines.append(f"  stragglers: {safe(', '.join(r.stragglers), 1000)}")
    for a in r.attempts:  # a node its last ranks left unusable (agent.run.leftovers)
        if a.held:
            lines.append(f"  after attempt {a.attempt}: {safe(a.held, 1000)}")
    return lines


def as_json(stored: Stored) -> dict[str, Any]:
    data = asdict(stored.record)
    return {"job": stored.record.run_id, **data}


def when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def seconds(start: float | None, end: float | None) -> str:
    return "-" if start is None or end is None else f"{max(0.0, end - start):.1f}"


def safe(value: Any, limit: int = 256) -> str:
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return printable(text, one_line=True)
