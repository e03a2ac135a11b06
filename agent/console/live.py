"""Live status on a terminal: one row per rank of this node above the scrolling, prefixed lines.

With a --progress-regex that numbers steps (a group named `step`), three more columns: the
rank's last step, its median seconds per step (its last 20 steps) and how many steps it is
behind the furthest rank known here (on node 0 the job's, from its once-a-second look at every
node's pace; elsewhere this node's). A rank node 0 named a straggler (or whose node it named)
is shown in yellow.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence

import psutil
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from agent.console.stream import JobPace, StepClock


class LiveView:
    """Owns the terminal while ranks run; the log router writes through `stream(...)`."""

    def __init__(self, console: Console, hang_warning: float) -> None:
        self.console = console
        self.hang_warning = hang_warning
        self._workers: Sequence = ()
        self._procs: dict[int, psutil.Process] = {}
        self._clocks: Callable[[], Mapping[int, StepClock]] | None = None
        self.job: JobPace | None = None  # node 0: set on each look at the job's pace
        self.paused: Callable[[], Collection[int]] = frozenset  # ranks stopped in pdb now
        self.caption: Callable[[], str] = str  # node 0: the job's ranks still running
        self._saved: list = []  # the log handlers' streams while the table is up
        self._stopped = False
        self._live = Live(  # renders once already: every field the table reads is set above
            console=console, refresh_per_second=2, transient=False, get_renderable=self._view
        )
        self._lock = threading.Lock()

    def follow_steps(self, clocks: Callable[[], Mapping[int, StepClock]]) -> None:
        """Show the step columns, from these clocks (the router's)."""
        self._clocks = clocks

    def start(self, workers: Sequence) -> None:
        self._workers = workers
        for worker in workers:
            try:
                self._procs[worker.spec.rank] = psutil.Process(worker.proc.pid)
            except psutil.Error:
                pass
        self._live.start(refresh=True)  # drawn with its rows now, not at the first tick
        self._redirect_logging()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._live.refresh()
        self._live.stop()
        for handler, stream in self._saved:
            handler.setStream(stream)

    def _redirect_logging(self) -> None:
        """The agent's own messages go above the table too, not through it."""
        self._saved = []
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler:
                self._saved.append((handler, handler.setStream(_TextStream(self._print))))

    def stream(self, style: str = "") -> _Stream:
        return _Stream(self._print)

    def note(self, line: str) -> None:
        """One line of the agent's own (a rank paused), above the table on a line of its own."""
        self._print(line + "\n")

    def _print(self, text: str) -> None:
        with self._lock:
            self.console.print(
                Text.from_ansi(text), end="", highlight=False, markup=False, soft_wrap=True
            )

    def _view(self) -> RenderableType:
        """The table, and under it the job's line (node 0): as wide as the terminal, not as the
        table (a table of small pids is narrower than `job: 1 of 2 ranks still running: ...`)."""
        table = self._table()
        caption = self.caption()
        return Group(table, Text(caption, style="dim italic")) if caption else table

    def _table(self) -> Table:
        table = Table(box=None, pad_edge=False, header_style="bold")
        columns = ["rank", "host", "state", "pid", "cpu %", "rss", "silent"]
        clocks = self._clocks() if self._clocks is not None else None
        if clocks is not None:
            columns += ["step", "s/step", "behind"]
        for column in columns:
            table.add_column(column, justify="right" if column not in ("host", "state") else "left")
        now = time.monotonic()
        furthest = _furthest(clocks or {}, self.job)
        paused = self.paused()
        for worker in self._workers:
            row = self._row(worker, now, worker.spec.rank in paused)
            if clocks is not None:
                row += self._steps(worker.spec, clocks.get(worker.spec.rank), furthest)
            table.add_row(*row)
        return table

    def _steps(self, spec, clock: StepClock | None, furthest: int | None) -> list[str | Text]:
        """step, s/step, behind: one rank's pace (yellow when node 0 named it a straggler)."""
        if clock is None or clock.step is None:
            return ["-", "-", "-"]
        durations = clock.durations.copy()  # one C call: the router's thread may append
        per_step = f"{statistics.median(durations):.3g}" if durations else "-"
        behind = str(furthest - clock.step) if furthest is not None else "-"
        job = self.job
        slow = job is not None and (spec.rank in job.slow_ranks or spec.node_rank in job.slow_nodes)
        style = "bold yellow" if slow else ""
        return [str(clock.step), Text(per_step, style=style), Text(behind, style=style)]

    def _row(self, worker, now: float, paused: bool = False) -> list[str | Text]:
        spec = worker.spec
        silent = now - max(worker.out.last_output, worker.err.last_output)
        cpu, rss = "-", "-"
        proc = self._procs.get(spec.rank)
        if worker.returncode is None and proc is not None:
            try:
                with proc.oneshot():
                    cpu = f"{proc.cpu_percent():.0f}"
                    rss = f"{proc.memory_info().rss / 2**20:.0f} MiB"
            except psutil.Error:
                pass
        if worker.returncode is None and paused:
            state = Text("paused (pdb)", style="bold yellow")
        elif worker.returncode is None:
            state = (
                Text("HUNG?", style="bold red")
                if silent > self.hang_warning
                else Text("running", style="green")
            )
        elif worker.returncode == 0:
            state = Text("exited 0", style="dim")
        else:
            state = Text(f"exited {worker.returncode}", style="bold red")
        shown = f"{silent:.0f}s" if worker.returncode is None else "-"
        return [str(spec.rank), spec.host, state, str(worker.proc.pid), cpu, rss, shown]


def _furthest(clocks: Mapping[int, StepClock], job: JobPace | None) -> int | None:
    steps = [c.step for c in clocks.values() if c.step is not None]
    if job is not None and job.furthest is not None:
        steps.append(job.furthest)
    return max(steps) if steps else None


class _Stream:
    """A binary file-like object for the log router: complete lines go above the live table."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit

    def write(self, data: bytes) -> int:
        self._emit(data.decode("utf-8", "replace"))
        return len(data)

    def flush(self) -> None:
        pass


class _TextStream:
    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit

    def write(self, text: str) -> int:
        self._emit(text)
        return len(text)

    def flush(self) -> None:
        pass
