"""The client side of `agent top`: ask node 0 for every rank's row, draw it, again every second.

One request a connection (node 0's endpoint answers one and closes): each redraw opens a new,
authenticated one. The redraw ends when the job does (LOG_DIR's verdict is written, or its
agents were killed, or node 0 no longer answers), or at Ctrl-C; both exit 0. `--once` prints
the table once as plain text; so does every redraw when the output is no terminal (a pipe, a
file: one table after another, like `top -b`). Torch-free: the client starts at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

from agent.console.top import TopRow, render_plain, table
from agent.control.wire import Channel
from agent.errors import AgentError, ExitCode
from agent.serve import client
from agent.text import printable

PERIOD = 1.0  # seconds between redraws
ANSWER_WAIT = 15.0  # node 0 gathers within 2 s; more is a stuck or overloaded node 0


def follow(
    first: Channel,
    opener: Callable[[], Channel],  # a fresh authenticated connection to node 0
    run: int | None,  # LOG_DIR's run (resident agents' control.json): never a later run's ranks
    once: bool,
    # whether LOG_DIR's job has ended (its verdict written, or its agents killed); None: no
    # LOG_DIR (the resident agents: the redraw ends when node 0 no longer answers)
    ended: Callable[[], bool] | None,
    out: TextIO,
) -> int:
    request: dict[str, Any] = {"op": "top"}
    if run is not None:
        request["run"] = run
    if once:
        rows, notes = _ask(first, request)
        out.write(printable(render_plain(rows, notes)))
        return 0
    from rich.console import Console
    from rich.live import Live

    def over() -> bool:
        return ended is not None and ended()

    channel: Channel | None = first
    terminal = out.isatty()
    console = Console(file=out)
    try:
        with Live(console=console, auto_refresh=False) if terminal else _Plain(out) as live:
            while not over():
                try:
                    rows, notes = _ask(channel or opener(), request)
                    shown: Any = table(rows, _caption(rows, notes)) if terminal else None
                    shown = shown or printable(render_plain(rows, [_caption(rows, notes)]))
                except AgentError as exc:
                    if exc.code == ExitCode.RENDEZVOUS or over():
                        break  # node 0 is gone: the job (or the resident agents) ended
                    # between attempts or runs: say so, and keep looking
                    shown = printable(exc.message, one_line=True) + "\n"
                channel = None
                live.update(shown, refresh=True)
                time.sleep(PERIOD)  # the redraw's pace, not a wait for anything
    except KeyboardInterrupt:
        return 0
    print("the job has ended" if ended is not None else "node 0 no longer answers", file=out)
    return 0


class _Plain:
    """Live's stand-in off a terminal: each table printed after the last."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __enter__(self) -> _Plain:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, text: str, refresh: bool = True) -> None:
        self.out.write(text + "\n")
        self.out.flush()


def _ask(channel: Channel, request: dict[str, Any]) -> tuple[list[TopRow], list[str]]:
    try:
        channel.send(request)
        answer = client.answer(channel, "top", ANSWER_WAIT, _Discard())
    finally:
        channel.close()
    if not isinstance(answer, dict):
        return [], []
    items = answer.get("rows")
    rows = [r for r in (TopRow.from_json(i) for i in _list(items)) if r is not None]
    notes = [printable(str(n), one_line=True) for n in _list(answer.get("notes"))[:64]]
    return rows, notes


def _caption(rows: list[TopRow], notes: list[str]) -> str:
    hosts = len({r.host for r in rows})
    head = f"{len(rows)} ranks on {hosts} hosts; {time.strftime('%H:%M:%S')}"
    return "\n".join([head, *notes])


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
