"""What this node prints while its ranks run: prefixed rank lines, and the live table on a tty."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from agent.console.router import PALETTE, ConsoleSink, LogRouter
from agent.console.stream import JobPace
from agent.plan.options import Options, progress_pattern
from agent.plan.rank_set import parse_rank_set
from agent.plan.ranks import RankSpec
from agent.text import printable


@dataclass(frozen=True)
class Sinks:
    """Where a run's console lines go instead of this process's stdout and stderr."""

    out: ConsoleSink
    err: ConsoleSink
    colour: bool = False


class ConsoleView:
    """One per attempt: a router for the ranks' pipes, and the live table when on a terminal."""

    def __init__(self, options: Options, sinks: Sinks | None = None) -> None:
        self.sinks = sinks
        self.colour = sys.stdout.isatty() if sinks is None else sinks.colour
        self.shown = parse_rank_set(options.console_ranks, "--console-ranks")
        self.live = None
        progress = (
            None if options.progress_regex is None else progress_pattern(options.progress_regex)
        )
        if sinks is not None:  # a resident agent's run: lines go to the client that asked
            self.router = LogRouter(sinks.out, sinks.err, progress=progress)
        elif self.colour and options.live:
            from rich.console import Console

            from agent.console.live import LiveView

            self.live = LiveView(Console(), options.hang_warning)
            self.router = LogRouter(self.live.stream(), self.live.stream(), progress=progress)
        else:
            self.router = LogRouter(sys.stdout.buffer, sys.stderr.buffer, progress=progress)
        if self.live is not None and self.router.numbers_steps:
            self.live.follow_steps(self.router.clocks)

    def pace_seen(self, job: JobPace) -> None:
        """Node 0's latest look at the job's pace (agent.run.pace), for the live table."""
        if self.live is not None:
            self.live.job = job

    def prefix(self, spec: RankSpec) -> bytes:
        text = f"{spec.host}:{spec.rank}: "
        if self.colour:
            return f"\x1b[{PALETTE[spec.rank % len(PALETTE)]}m{text}\x1b[0m".encode()
        return text.encode()

    def shows(self, spec: RankSpec) -> bool:
        return self.shown is None or spec.rank in self.shown

    def note(self, line: str) -> None:
        """One line of the agent's own on the console (or to the run's client), e.g. a pause.
        With the live table up, above it as the ranks' lines go: written past the table, it
        would share the table's last line and the next redraw would take it away."""
        if self.live is not None:
            self.live.note(printable(line))
            return
        data = (printable(line) + "\n").encode(errors="replace")
        stream = self.sinks.err if self.sinks is not None else sys.stderr.buffer
        try:
            stream.write(data)
            stream.flush()
        except (OSError, ValueError):
            pass

    def show_paused(self, paused: Callable[[], Collection[int]]) -> None:
        """The live table asks `paused` which ranks are stopped in pdb (agent.pause)."""
        if self.live is not None:
            self.live.paused = paused

    def show_job(self, line: Callable[[], str]) -> None:
        """Node 0: the live table's last line says where the job's ranks still run."""
        if self.live is not None:
            self.live.caption = line

    def started(self, workers: Sequence) -> None:
        if self.live is not None:
            self.live.start(workers)

    def close(self, keep_table: bool = False) -> None:
        """This node's ranks are gone; `keep_table`: node 0's table stays up (`end_table`)."""
        self.router.close()
        if not keep_table:
            self.end_table()

    def end_table(self) -> None:
        if self.live is not None:
            self.live.stop()
