"""What a run needs from its node's membership — the one seam between the two lifetimes.

A node agent (agent.node.agent.NodeAgent) lives for the allocation step: it joins (`connect`
returns the joined node, agent.node.joined.JoinedNode, which implements this), heartbeats and
leaves. A run (agent.run) lives for one script's attempts and asks its node only for what is
below: where its keys are, where a failure goes, who is lost, the hosts, and the queue its
supervisor reads. Nothing of a run is stored on the agent, and nothing of the agent beyond this
is reached from a run. (The control plane and the resident agents ask a little more:
agent.node.control_seat.ControlSeat.)
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agent.node.failure import Failure
from agent.node.ranks_store import RanksStore
from agent.node.scope import Scope
from agent.node.signals import Signals
from agent.world import World


class RunSeat(Protocol):
    world: World
    leader: bool  # node 0: hosts the store, decides plans, lineups and verdicts
    environ: Mapping[str, str]  # the ranks' base env (the job's secret taken out)
    events: queue.SimpleQueue[Any]  # what a supervisor reacts to (agent.node.events, signals)
    signals: Signals
    stop: threading.Event  # set when the agent ends: every watcher of a run stops with it

    @property
    def names(self) -> Sequence[str]:
        """Every agent's name for messages (`node 1 (host)` or `task 1`)."""
        ...

    @property
    def rdzv_timeout(self) -> float:
        """How long a run's setup may wait for the other nodes."""
        ...

    def scope(self, prefix: str, wakes: tuple[str, ...] = ()) -> Scope:
        """A phase's keys in the job store (agent.node.stage spells the prefixes)."""
        ...

    def enter(self, scope: Scope | None, active: Mapping[int, int | None] | None = None) -> None:
        """Where failures go from now (None: nowhere); `active`: the peers it counts on."""
        ...

    def report(self, scope: Scope, record: Failure) -> Failure | None:
        """Tell the phase that something failed here (any thread; None: the store is lost)."""
        ...

    def lost(self) -> Mapping[int, str]:
        """Node 0: the peers lost so far → why."""
        ...

    def lost_failures(self, scope: Scope) -> list[Failure]:
        """Node 0: the failure records written for peers lost during this phase."""
        ...

    def hosts(self) -> list[str]:
        """Every agent's host, by agent index (as each claimed it)."""
        ...

    def serve_workers(self) -> RanksStore:
        """Node 0: a fresh store for one attempt's ranks: where they meet, and who hosts it."""
        ...

    def close_workers(self) -> None:
        """Node 0: the last attempt's worker store closed (a run closes what it opened)."""
        ...
