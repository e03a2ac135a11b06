"""Which run and attempt a thing belongs to: `Stage(run, attempt)`, named `r3.a0`.

Every event a run puts on the agent's queue, every key of its scopes (`r<run>/a<attempt>`,
`r<run>/l<attempt>`) and every line the agent logs while it executes the run carry its stage,
so nothing of run N can be taken for run N+1 (every run's first attempt is attempt 0).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agent.log_format import PrintableFormatter


@dataclass(frozen=True)
class Stage:
    run: int
    attempt: int | None = None  # None: the run before (or between) its attempts

    def at(self, attempt: int) -> Stage:
        return Stage(self.run, attempt)

    def scope(self, kind: str = "") -> str:
        """The store scope of this stage: `r<run>`, or `r<run>/<kind><attempt>` (kind a or l)."""
        return f"r{self.run}" if not kind else f"r{self.run}/{kind}{self.attempt}"

    def __str__(self) -> str:
        return f"r{self.run}" if self.attempt is None else f"r{self.run}.a{self.attempt}"


_current: Stage | None = None  # what this agent executes now (one run at a time per agent)


def enter(stage: Stage | None) -> None:
    """From now on the agent's log lines name `stage` (None: between runs)."""
    global _current
    _current = stage


def current() -> Stage | None:
    return _current


class StageFilter(logging.Filter):
    """Adds `%(stage)s` (" r3.a0", or "" between runs) to every record a handler formats."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.stage = f" {_current}" if _current is not None else ""
        return True


def tagged(handler: logging.Handler, prefix: str) -> logging.Handler:
    """`handler` formatting `[<prefix> r3.a0] message`."""
    handler.addFilter(StageFilter())
    handler.setFormatter(PrintableFormatter(f"[{prefix}%(stage)s] %(message)s"))
    return handler
