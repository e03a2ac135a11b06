"""`agent top`: the live table's rows for a whole job, as node 0 gathers them from every node.

Each agent measures its own ranks (`RankSampler`: psutil, no py-spy; cheap enough to answer at
once on its stacks thread) into `TopRow`s, bounded (`MAX_ROWS` a node); node 0 relays the
request to every node (agent.control.top_service) and the client draws them (`render_plain`
for --once, `table` for rich's redraw). Torch-free: the client imports this.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

COLUMNS = ("rank", "host", "state", "pid", "cpu %", "rss", "silent")
STEP_COLUMNS = ("step", "s/step", "behind")
MAX_ROWS = 4096  # rows one node answers with (its ranks; more are counted, not listed)
MAX_HOST = 253  # characters of a host name kept (a DNS name's longest)
DESK = "top"  # what node 0's requests say in the attempt's StackDesk `desk` field


@dataclass(frozen=True)
class TopRow:
    rank: int
    host: str
    state: str  # running | HUNG? | paused (pdb) | exited N
    pid: int
    cpu: float | None  # percent since the previous sample of this rank on its node
    rss_mib: float | None
    silent: float | None  # seconds since its last output (None: exited)
    step: int | None = None  # --progress-regex with a `step` group: its last step
    per_step: float | None = None  # median seconds per step, its last 20 steps

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "state": self.state,
            "pid": self.pid,
            "cpu": self.cpu,
            "rss": self.rss_mib,
            "silent": self.silent,
            "step": self.step,
            "s_step": self.per_step,
        }

    @classmethod
    def from_json(cls, value: object) -> TopRow | None:
        """A row from an answer (another node's: checked, never trusted); None if malformed."""
        if not isinstance(value, dict):
            return None
        rank, pid, step = _int(value.get("rank")), _int(value.get("pid")), value.get("step")
        if rank is None or pid is None or not (step is None or _int(step) is not None):
            return None
        host, state = value.get("host"), value.get("state")
        if not isinstance(host, str) or not isinstance(state, str):
            return None
        return cls(
            rank,
            host[:MAX_HOST],
            state[:40],
            pid,
            _number(value.get("cpu")),
            _number(value.get("rss")),
            _number(value.get("silent")),
            step,
            _number(value.get("s_step")),
        )


class RankSampler:
    """One node's ranks measured for `agent top`, over one attempt. The psutil handles are kept
    from one request to the next: cpu % is the share since the previous sample."""

    def __init__(self, hang_warning: float) -> None:
        self.hang_warning = hang_warning
        self._procs: dict[int, Any] = {}  # pid → psutil.Process
        self._lock = threading.Lock()  # two requests may overlap (node 0's relay and a retry)

    def rows(
        self,
        workers: Sequence[Any],  # agent.run.workers.Worker: spec, proc, returncode, out, err
        now: float,
        paused: Collection[int] = (),
        clocks: Mapping[int, Any] | None = None,  # rank → agent.console.stream.StepClock
    ) -> list[TopRow]:
        import statistics

        import psutil

        rows = []
        with self._lock:
            live = set()
            for worker in list(workers)[:MAX_ROWS]:
                spec, pid, code = worker.spec, worker.proc.pid, worker.returncode
                cpu = rss = None
                if code is None:
                    live.add(pid)
                    try:
                        proc = self._procs.get(pid) or self._procs.setdefault(
                            pid, psutil.Process(pid)
                        )
                        with proc.oneshot():
                            cpu = proc.cpu_percent()
                            rss = proc.memory_info().rss / 2**20
                    except psutil.Error:
                        pass
                silent = now - max(worker.out.last_output, worker.err.last_output)
                clock = (clocks or {}).get(spec.rank)
                step = per_step = None
                if clock is not None and clock.step is not None:
                    step = clock.step
                    durations = clock.durations.copy()  # one C call: the router may append
                    per_step = statistics.median(durations) if durations else None
                rows.append(
                    TopRow(
                        spec.rank,
                        spec.host,
                        state_of(code, silent, self.hang_warning, spec.rank in paused),
                        pid,
                        cpu,
                        rss,
                        silent if code is None else None,
                        step,
                        per_step,
                    )
                )
            for pid in set(self._procs) - live:
                del self._procs[pid]
        return rows


def answer(rows: Sequence[TopRow], total: int) -> dict[str, Any]:
    """One node's answer to node 0: its rows, and how many ranks it has beyond them."""
    return {"rows": [r.to_json() for r in rows[:MAX_ROWS]], "more": max(0, total - MAX_ROWS)}


def state_of(code: int | None, silent: float, hang_warning: float, paused: bool) -> str:
    """A rank's state as the live table words it."""
    if code is None and paused:
        return "paused (pdb)"
    if code is None:
        return "HUNG?" if silent > hang_warning else "running"
    return f"exited {code}"


STATE_STYLES = {"running": "green", "HUNG?": "bold red", "paused (pdb)": "bold yellow"}


def style_of(state: str) -> str:
    if state == "exited 0":
        return "dim"
    return STATE_STYLES.get(state, "bold red" if state.startswith("exited") else "")


def cells(rows: Sequence[TopRow]) -> tuple[tuple[str, ...], list[list[str]]]:
    """The header and each row's cells; the step columns only when some rank numbers steps
    (`behind`: steps behind the furthest rank of the job)."""
    steps = any(r.step is not None for r in rows)
    furthest = max((r.step for r in rows if r.step is not None), default=None)
    header = COLUMNS + (STEP_COLUMNS if steps else ())
    out = []
    for r in rows:
        row = [
            str(r.rank),
            r.host,
            r.state,
            str(r.pid),
            "-" if r.cpu is None else f"{r.cpu:.0f}",
            "-" if r.rss_mib is None else f"{r.rss_mib:.0f} MiB",
            "-" if r.silent is None else f"{r.silent:.0f}s",
        ]
        if steps:
            known = r.step is not None and furthest is not None
            row += [
                "-" if r.step is None else str(r.step),
                "-" if r.per_step is None else f"{r.per_step:.3g}",
                str(furthest - r.step) if known else "-",  # type: ignore[operator]
            ]
        out.append(row)
    return header, out


def render_plain(rows: Sequence[TopRow], notes: Sequence[str] = ()) -> str:
    """The table as plain text (--once, or not a terminal): columns aligned, then the notes."""
    header, body = cells(rows)
    widths = [max([len(h)] + [len(row[i]) for row in body]) for i, h in enumerate(header)]
    left = {"host", "state"}

    def line(values: Sequence[str]) -> str:
        parts = [
            v.ljust(w) if h in left else v.rjust(w)
            for v, w, h in zip(values, widths, header, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(header), *(line(row) for row in body), *notes]) + "\n"


def table(rows: Sequence[TopRow], caption: str = "") -> Any:
    """The same table for rich (the client's redraw)."""
    from rich.table import Table
    from rich.text import Text

    header, body = cells(rows)
    drawn = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        caption=caption or None,
        caption_justify="left",
    )
    for column in header:
        drawn.add_column(column, justify="left" if column in ("host", "state") else "right")
    for row, values in zip(rows, body, strict=True):
        values[2] = Text(values[2], style=style_of(row.state))  # type: ignore[call-overload]
        drawn.add_row(*values)
    return drawn


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        return float(value)
    return None
