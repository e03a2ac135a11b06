"""`python -m agent logs LOG_DIR --summary`: summary.json as a rich view, root cause first."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

from agent.errors import AgentError
from agent.logs.logdir import check_dir, read_json
from agent.logs.selection import LogsCommand, Selection
from agent.run.summary import cause_line


def summary_view(summary: Mapping[str, Any], selection: Selection) -> list[Any]:
    """rich renderables: verdict, root cause (with its traceback or stderr), then every rank."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    attempts = [a for a in summary.get("attempts") or [] if isinstance(a, dict)]
    ok = summary.get("status") == "succeeded"
    head = Text(
        f"job {summary.get('status', '?')} (exit {summary.get('exit_code', '?')}) "
        f"after {len(attempts)} attempt(s)",
        style="bold green" if ok else "bold red",
    )
    view: list[Any] = [head]
    cause = summary.get("root_cause")
    if isinstance(cause, dict):
        view.append(
            Panel(_cause_body(cause), title="root cause", title_align="left", border_style="red")
        )
    for attempt in attempts[:-1]:
        earlier = attempt.get("root_cause")
        if isinstance(earlier, dict):
            view.append(
                Text(f"attempt {attempt.get('attempt')}: {cause_line(earlier)}", style="yellow")
            )
    job = summary.get("job")
    if isinstance(job, dict):
        facts = ("id", "step", "source", "nnodes", "world_size", "nproc_per_node", "log_dir")
        view.append(
            Text(
                "  ".join(f"{k} {job[k]}" for k in facts if job.get(k) not in (None, "")),
                style="dim",
            )
        )
    if attempts:
        table = Table(
            "rank",
            "host",
            "node",
            "state",
            "how",
            "seconds",
            title=f"attempt {attempts[-1].get('attempt', len(attempts) - 1)}",
        )
        for rank in _shown_ranks(attempts[-1].get("ranks") or [], selection):
            table.add_row(*_rank_row(rank), style=_STATE_STYLE.get(str(rank.get("state")), ""))
        view.append(table)
    return view


_STATE_STYLE = {"failed": "red", "lost": "red", "terminated": "yellow", "succeeded": "green"}


def _cause_body(cause: Mapping[str, Any]) -> str:
    lines = [cause_line(cause)]
    if cause.get("traceback"):
        lines += ["", "traceback (from TORCHELASTIC_ERROR_FILE):"]
        lines += str(cause["traceback"]).rstrip().splitlines()[-25:]
    elif cause.get("stderr_tail"):
        lines += ["", "last stderr lines:"] + [str(line) for line in cause["stderr_tail"][-15:]]
    return "\n".join(lines)


def _shown_ranks(ranks: Sequence[Any], selection: Selection) -> list[dict[str, Any]]:
    shown = []
    for rank in ranks:
        if not isinstance(rank, dict):
            continue
        if selection.ranks is not None and rank.get("rank") not in selection.ranks:
            continue
        if selection.nodes is not None and rank.get("node_rank") not in selection.nodes:
            continue
        shown.append(rank)
    return shown


def _rank_row(rank: Mapping[str, Any]) -> tuple[str, ...]:
    start, end = rank.get("start"), rank.get("end")
    took = (
        f"{end - start:.1f}"
        if isinstance(start, (int, float)) and isinstance(end, (int, float)) and start
        else "-"
    )
    number = rank.get("rank")
    return (
        "-" if number is None or number < 0 else str(number),
        str(rank.get("host", "?")),
        str(rank.get("node_rank", "?")),
        str(rank.get("state", "?")),
        str(rank.get("how", "")),
        took,
    )


# --- act -----------------------------------------------------------------------------------


def show_summary(command: LogsCommand, out: BinaryIO, colour: bool) -> int:
    from rich.console import Console

    path = os.path.join(command.log_dir, "summary.json")
    try:
        summary = read_json(path)
    except (OSError, ValueError) as exc:
        raise AgentError(f"cannot read {path}: {exc}") from None
    if summary is None:
        check_dir(command.log_dir)
        raise AgentError(
            f"no summary.json in {command.log_dir}: node 0 writes it when the job ends; "
            "a running job has none yet (follow it with --follow)"
        )
    if not isinstance(summary, dict):
        raise AgentError(f"{path} is not a JSON object")
    width = shutil.get_terminal_size((100, 24)).columns if colour else 100
    console = Console(
        file=io.StringIO(), force_terminal=colour, no_color=not colour, width=width, highlight=False
    )
    with console.capture() as captured:
        for part in summary_view(summary, command.selection):
            console.print(part)
    out.write(captured.get().encode())
    out.flush()
    return 0
