"""Failures published from any thread, over a connection of their own; node 0's lost peers."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from agent.node.membership import Membership
from agent.node.scope import Scope
from agent.node.store import Store
from agent.world import World

log = logging.getLogger("agent")


class Reporter:
    def __init__(self, side: Store, world: World, membership: Membership, names: list[str]) -> None:
        self._side = side  # the main connection may be blocked in a wait: never share it
        self._lock = threading.Lock()
        self.world, self.membership, self.names = world, membership, names
        self.lost: dict[int, dict[str, Any]] = {}  # node 0: this attempt's lost-node failures
        self.lost_peers: set[int] = set()  # node 0: every peer it declared lost, for good
        self.lost_why: dict[int, str] = {}  # node 0: what it said of each

    def report(
        self, scope: Scope, record: dict[str, Any], slot: object = None
    ) -> dict[str, Any] | None:
        """Publish a failure from any thread (own connection); None if the store is gone."""
        record = {**record, "agent": self.world.agent_index} if slot is None else record
        try:
            with self._lock:
                published = scope.on(self._side or scope.store).report(record, slot)
        except Exception as exc:
            log.error("could not publish the failure (store lost?): %s", exc)
            return None
        if published["seq"] == 1:
            log.error("first failure of the job: %s", record.get("how"))
        return published

    def peer_silent(self, index: int, scope: Scope | None) -> None:
        """Heartbeat thread, node 0: a peer stopped ticking. Mid-run, that fails the attempt."""
        with self._lock:
            departed = (
                self.membership.scope.on(self._side).get_if(f"gone/{index}", "departure")
                if self._side
                else None
            )
        if departed is not None and departed.get("why") is None:
            return  # an orderly exit
        name = self.names[index]
        why = (
            f"{name} left: {departed['why']}"
            if departed
            else f"{name} lost: its agent stopped answering"
        )
        log.error("%s", why)
        if scope is None:  # between runs (resident agents): later runs are refused, naming it
            self.lost_peers.add(index)
            self.lost_why[index] = why
            return
        host = self.world.hosts[index] if index < len(self.world.hosts) else name
        record = {
            "kind": "lost",
            "node_rank": index,
            "host": host,
            "how": why,
            "time": time.time(),
            "agent": index,
        }
        published = self.report(scope, record, slot=f"lost-{index}")
        if published is not None:
            self.lost[index] = published
            self.lost_peers.add(index)
            self.lost_why[index] = why
            with contextlib.suppress(Exception), self._lock:
                side = scope.on(self._side)
                if not side.store.exists(side.key("result", index)):
                    side.put(
                        f"result/{index}", {"lost": True, "node": index, "host": host, "exits": []}
                    )

    def lost_failures(self, scope: Scope) -> list[dict[str, Any]]:
        """Node 0: what it reported for lost nodes, and what they reported before vanishing."""
        found = list(self.lost.values())
        for index in self.lost:
            own = scope.failure_of(index)
            if own is not None:
                found.append(own)
        return found
