"""`python -m agent logs LOG_DIR --summary`: summary.json as a rich view, root cause first."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Mapping
from typing import Any, BinaryIO

from agent.console.rank_table import RankTable
from agent.errors import AgentError
from agent.history.liveness import unfinished
from agent.history.summary_doc import RUNNING, RankExit, Summary, read_summary
from agent.logs.logdir import check_dir, read_json
from agent.logs.selection import LogsCommand, Selection, safe_text, selected
from agent.plan.log_dir import LogDir, is_nccl_trace
from agent.run.summary import cause_line


def summary_view(summary: Summary | Mapping[str, Any], selection: Selection) -> list[Any]:
    """rich renderables: verdict, root cause (with its traceback or stderr), then every rank.
    Every value comes from the file: shown as plain Text (no rich markup), control codes escaped."""
    from rich.panel import Panel
    from rich.text import Text

    doc = summary if isinstance(summary, Summary) else read_summary(summary)
    attempts = doc.attempts
    code = "?" if doc.exit_code is None else doc.exit_code
    head = Text(
        f"job {safe_text(doc.status or '?')} (exit {safe_text(code)}) "
        f"after {len(attempts)} attempt(s)",
        style="bold green" if doc.status == "succeeded" else "bold red",
    )
    view: list[Any] = [head]
    if doc.root_cause is not None:
        view.append(
            Panel(
                Text(_cause_body(doc.root_cause)),
                title="root cause",
                title_align="left",
                border_style="red",
            )
        )
    for attempt in attempts[:-1]:
        if attempt.root_cause is not None:
            line = f"attempt {attempt.attempt}: {safe_text(cause_line(attempt.root_cause))}"
            view.append(Text(line, style="yellow"))
    for entry in doc.stragglers[:20]:
        view.append(Text(safe_text(entry.words), style="yellow"))
    job = doc.job
    facts = {
        "id": job.id,
        "step": job.step,
        "source": job.source,
        "nnodes": job.nnodes,
        "world_size": job.world_size,
        "nproc_per_node": job.nproc_per_node,
        "log_dir": job.log_dir,
    }
    shown = "  ".join(f"{k} {safe_text(v)}" for k, v in facts.items() if v not in (None, ""))
    if shown:
        view.append(Text(shown, style="dim"))
    if attempts:
        last = attempts[-1]
        rows = [
            (_rank_row(rank), _STATE_STYLE.get(rank.state, ""))
            for rank in last.ranks
            if selected(rank.rank, selection.ranks) and selected(rank.node_rank, selection.nodes)
        ]
        view.append(RankTable(f"attempt {last.attempt}", rows))
    return view


_STATE_STYLE = {"failed": "red", "lost": "red", "terminated": "yellow", "succeeded": "green"}


def _cause_body(cause: Mapping[str, Any]) -> str:
    lines = [safe_text(cause_line(cause))]
    if cause.get("traceback"):
        lines += ["", "traceback (from TORCHELASTIC_ERROR_FILE):"]
        lines += [_line(x) for x in str(cause["traceback"]).rstrip().splitlines()[-25:]]
    elif cause.get("stderr_tail"):
        tail = cause["stderr_tail"]
        tail = tail if isinstance(tail, list) and tail else [tail]
        lines += ["", "last stderr lines:"] + [_line(x) for x in tail[-15:]]
    return "\n".join(lines)


def _line(value: Any) -> str:
    return safe_text(value, limit=1000, tabs=True)


def _rank_row(rank: RankExit) -> tuple[str, ...]:
    start, end = rank.started, rank.ended
    return (
        "-" if rank.rank < 0 else str(rank.rank),
        safe_text(rank.host or "?"),
        "?" if rank.node_rank < 0 else str(rank.node_rank),
        safe_text(rank.state or "?"),
        safe_text(rank.how or ""),
        f"{end - start:.1f}" if start is not None and end is not None else "-",
    )


def _not_over(state: str, log_dir: str) -> str:
    if state == RUNNING:
        return f"its summary comes when it ends; meanwhile: python -m agent logs {log_dir} --follow"
    return (
        f"no verdict, no root cause: what its ranks wrote is in its files (python -m agent "
        f"logs {log_dir})"
    )


# --- act -----------------------------------------------------------------------------------


def flight_recorder_dumps(log_dir: str, most: int = 1000) -> list[str]:
    """The NCCL flight recorder dumps ranks left in the log dir (named by agent.plan.ranks)."""
    try:
        with os.scandir(log_dir) as entries:
            names = [e.name for e in entries if is_nccl_trace(e.name) and e.is_file()]
    except OSError:
        return []
    return sorted(names)[:most]


def show_summary(command: LogsCommand, out: BinaryIO, colour: bool) -> int:
    from rich.console import Console

    path = LogDir(command.log_dir).summary
    try:
        summary = read_json(path)
    except (OSError, ValueError) as exc:
        raise AgentError(f"cannot read {path}: {safe_text(exc, limit=300)}") from None
    if summary is None:
        check_dir(command.log_dir)
        raise AgentError(
            f"no summary.json in {command.log_dir}: node 0 writes it when the job ends; "
            "a running job has none yet (follow it with --follow)"
        )
    if not isinstance(summary, dict):
        raise AgentError(f"{path} is not a JSON object")
    judged = unfinished(command.log_dir, summary)
    if judged is not None:  # its record from the start: still running, or killed before its end
        out.write(f"{judged[1]}\n{_not_over(judged[0], command.log_dir)}\n".encode())
        out.flush()
        return 0
    width = shutil.get_terminal_size((100, 24)).columns if colour else 100
    console = Console(
        file=io.StringIO(), force_terminal=colour, no_color=not colour, width=width, highlight=False
    )
    paint = _painter(console) if colour else None
    pieces: list[str] = []
    for part in summary_view(summary, command.selection):
        lines = part.lines(width, paint) if isinstance(part, RankTable) else None
        if lines is not None:  # the rank table, drawn directly: 32K rows in ~0.1 s
            pieces.append("\n".join(lines) + "\n")
            continue
        with console.capture() as captured:
            console.print(part)
        pieces.append(captured.get())
    with console.capture() as captured:
        dumps = flight_recorder_dumps(command.log_dir)
        if dumps:
            console.print(f"NCCL flight recorder dumps ({len(dumps)}):")
            for name in dumps:
                console.print("  " + safe_text(os.path.join(command.log_dir, name)), markup=False)
    pieces.append(captured.get())
    out.write("".join(pieces).encode())
    out.flush()
    return 0


def _painter(console: Any) -> Any:
    """text, style → the text as this console would colour it."""
    from rich.console import COLOR_SYSTEMS
    from rich.style import Style

    system = COLOR_SYSTEMS.get(console.color_system or "")
    styles: dict[str, Style] = {}

    def paint(text: str, name: str) -> str:
        style = styles.get(name)
        if style is None:
            style = styles[name] = Style.parse(name)
        return style.render(text, color_system=system)

    return paint
