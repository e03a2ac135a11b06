"""Live status on a terminal: one row per rank of this node above the scrolling, prefixed lines."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence

import psutil
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text


class LiveView:
    """Owns the terminal while ranks run; the log router writes through `stream(...)`."""

    def __init__(self, console: Console, hang_warning: float) -> None:
        self.console = console
        self.hang_warning = hang_warning
        self._workers: Sequence = ()
        self._procs: dict[int, psutil.Process] = {}
        self.paused: Callable[[], Collection[int]] = frozenset  # ranks stopped in pdb now
        self._live = Live(
            console=console, refresh_per_second=2, transient=False, get_renderable=self._table
        )
        self._lock = threading.Lock()

    def start(self, workers: Sequence) -> None:
        self._workers = workers
        for worker in workers:
            try:
                self._procs[worker.spec.rank] = psutil.Process(worker.proc.pid)
            except psutil.Error:
                pass
        self._live.start()
        self._redirect_logging()

    def stop(self) -> None:
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

    def _print(self, text: str) -> None:
        with self._lock:
            self.console.print(
                Text.from_ansi(text), end="", highlight=False, markup=False, soft_wrap=True
            )

    def _table(self) -> Table:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for column in ("rank", "host", "state", "pid", "cpu %", "rss", "silent"):
            table.add_column(column, justify="right" if column not in ("host", "state") else "left")
        now = time.monotonic()
        paused = self.paused()
        for worker in self._workers:
            table.add_row(*self._row(worker, now, worker.spec.rank in paused))
        return table

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
