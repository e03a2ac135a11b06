"""What reaches a node's supervisor besides rank exits and signals: the abort of an attempt seen
in the store (named by its stage: nothing of run N is taken for run N+1), and the store's loss."""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any

from agent.errors import AgentError, ExitCode
from agent.node.failure import Failure
from agent.node.stage import Stage


@dataclass(frozen=True)
class AbortSeen:
    stage: Stage  # the run and attempt whose abort key was set
    record: Failure


@dataclass(frozen=True)
class StoreLost:
    why: str


def drained(events: Any) -> list[Any]:
    """Every event waiting on a SimpleQueue, without blocking (for waits outside a supervisor)."""
    found = []
    while True:
        try:
            found.append(events.get_nowait())
        except queue.Empty:
            return found


def lost_store_error(exc: BaseException) -> AgentError:
    """The error an agent ends with when the store's connection broke (node 0 went away)."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else type(exc).__name__
    return AgentError(f"lost the job store: {first}", ExitCode.RENDEZVOUS)
