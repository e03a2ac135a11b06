"""Failures published from any thread, over a connection of their own; node 0's lost peers.

Node 0's heartbeat thread reports a silent peer into the phase the agent is in right now (set
by `enter`), but only a peer that runs ranks there: a lost spare is noted, never a failure. A
peer lost in one phase and still counted on in the next is reported there again on entering,
so no phase waits for a node that is gone.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import replace

from agent.node.failure import Failure, Kind
from agent.node.membership import Membership
from agent.node.result import Result
from agent.node.scope import Scope
from agent.node.store import Store
from agent.world import World

log = logging.getLogger("agent")
SILENT = "lost: its agent stopped answering"


class Reporter:
    def __init__(self, side: Store, world: World, membership: Membership, names: list[str]) -> None:
        self._side = side  # the main connection may be blocked in a wait: never share it
        self._lock = threading.Lock()
        self.world, self.membership, self.names = world, membership, names
        self.lost: dict[int, Failure] = {}  # node 0: this attempt's lost-node failures
        self.lost_peers: set[int] = set()  # node 0: every peer it declared lost, for good
        self.lost_reason: dict[int, str] = {}  # node 0: what it said of each, e.g. SILENT
        self.scope: Scope | None = None  # the phase a lost peer fails
        # peers counted on → node rank (None: a spare's, it has none yet); None: all peers
        self.active: Mapping[int, int | None] | None = None

    def enter(self, scope: Scope | None, active: Mapping[int, int | None] | None = None) -> None:
        """A new phase (None: between runs, or a spare's wait): lost peers fail it from now."""
        with self._lock:
            self.scope, self.active = scope, active
            self.lost.clear()
            # Only a phase that names who it counts on (a lineup, an attempt) hears of old losses.
            carried = [i for i in self.lost_peers if self._counts(i)] if active else []
        for index in carried:
            if scope is not None:
                self._fail(index, self.lost_reason[index], scope)

    def _counts(self, index: int) -> bool:
        return self.active is None or index in self.active

    def report(self, scope: Scope, record: Failure, slot: object = None) -> Failure | None:
        """Publish a failure from any thread (own connection); None if the store is gone."""
        record = replace(record, agent=self.world.agent_index) if slot is None else record
        try:
            with self._lock:
                published = scope.on(self._side or scope.store).report(record, slot)
        except Exception as exc:
            log.error("could not publish the failure (store lost?): %s", exc)
            return None
        if published.seq == 1:
            said = record.how
            if record.kind is Kind.LOST:  # its `how` does not name the node
                said = f"node {record.node_rank} ({record.host}) {said}"
            log.error("first failure of the job: %s", said)
        return published

    def peer_silent(self, index: int, reason: str = SILENT) -> None:
        """Node 0, heartbeat thread (a peer stopped ticking) or lifelines thread (its process
        ended): the peer is lost, once. Mid-run, that fails the attempt."""
        with self._lock:  # noted and the phase read together: `enter` carries it, or we report
            if index in self.lost_peers:
                return  # the other watcher named it first
            departed = (
                self.membership.scope.on(self._side).get_if(f"gone/{index}", "departure")
                if self._side
                else None
            )
            if departed is not None and departed.get("why") is None:
                return  # an orderly exit
            reason = f"left: {departed['why']}" if departed else reason
            why = f"{self.names[index]} {reason}"
            self.lost_peers.add(index)
            self.lost_reason[index] = reason
            scope = self.scope if self._counts(index) else None
        log.error("%s", why)
        if scope is not None:  # else between runs, or a spare: excluded before the next attempt
            self._fail(index, reason, scope)

    def _fail(self, index: int, reason: str, scope: Scope) -> None:
        """The record names the node by its fields; `how` is only what befell it (`lost: ...`,
        `left: ...`), so a reader writes `node 1 (n2) lost: ...` without naming it twice."""
        host = self.world.hosts[index] if index < len(self.world.hosts) else self.names[index]
        node = self.active.get(index, index) if self.active is not None else index
        record = Failure(Kind.LOST, reason, node, host, time.time(), agent=index)
        published = self.report(scope, record, slot=f"lost-{index}")
        if published is not None:
            self.lost[index] = published
            with contextlib.suppress(Exception), self._lock:
                side = scope.on(self._side)
                if side.get_if(f"result/{index}", "result") is None:  # a forgery: not a result
                    side.put(f"result/{index}", Result.gone(node, host).to_json())

    def lost_failures(self, scope: Scope) -> list[Failure]:
        """Node 0: what it reported for lost nodes, and what they reported before vanishing."""
        found = list(self.lost.values())
        for index in self.lost:
            own = scope.failure_of(index)
            if own is not None:
                found.append(own)
        return found
