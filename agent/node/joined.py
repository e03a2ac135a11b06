"""A node that joined its job: the store reached, its index claimed, failures told from now on.

`NodeAgent.connect` returns one, its store, membership and reporter in hand from the start, so
nothing that holds it asks whether they exist. It is all its holders may ask of their node: a
run's (agent.node.seat.RunSeat) and the control plane's and the resident agents'
(agent.node.control_seat.ControlSeat). Whatever ends it early — a signal in any phase, a setup
error, a lost store — is told to the other nodes through the current phase's scope, so nobody
waits out a timeout.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.errors import AgentError
from agent.node.events import StoreLost
from agent.node.failure import Failure, Kind
from agent.node.membership import Membership
from agent.node.ranks_store import RanksStore
from agent.node.reporter import Reporter
from agent.node.scope import Scope
from agent.node.signals import Signals
from agent.node.store import Store
from agent.node.trust import JobKeys, mismatch_message
from agent.plan.option_table import HEARTBEAT_PERIOD
from agent.world import World

ENDPOINT = "endpoint"  # node 0's control endpoint: a sealed record in the membership's scope


@dataclass(frozen=True)
class NodeSettings:
    """The options every node needs before any plan exists (from its own command line)."""

    rdzv_timeout: float = 300.0
    heartbeat_timeout: float = 6.0
    master_port: int | None = None


def node_failure(world: World, kind: Kind, how: str, error: AgentError | None = None) -> Failure:
    """A failure of this node (a setup error, a signal), named by its node rank and host."""
    tampering = error is not None and error.tampering
    return Failure(kind, how, world.node_rank, world.host, time.time(), tampering=tampering)


class JoinedNode:
    def __init__(
        self,
        *,
        world: World,
        settings: NodeSettings,
        environ: Mapping[str, str],
        keys: JobKeys,
        events: queue.SimpleQueue[Any],
        signals: Signals,
        stop: threading.Event,
        names: list[str],
        store: Store,
        membership: Membership,
        reporter: Reporter,
    ) -> None:
        self.world, self.settings, self.environ, self.keys = world, settings, environ, keys
        self.leader = world.agent_index == 0
        self.events, self.signals, self.stop = events, signals, stop
        self._names = names
        self.store, self.membership, self.reporter = store, membership, reporter
        self.met = False  # past the join barrier
        self._phase: Scope | None = None  # where a failure of ours is reported right now

    @property
    def names(self) -> list[str]:
        return self._names

    def watch_secrets(self, public: Store) -> None:
        """Node 0, while the agents join: one that holds another secret ends the join for
        everyone (a mismatch noted before this is still seen)."""
        from agent.node import handshake

        handshake.watch(public, self.keys, self.stop, self._mismatch)

    def _mismatch(self, index: int, theirs: str) -> None:
        if self.met:
            return
        name = self.names[index] if 0 <= index < len(self.names) else f"node {index}"
        how = mismatch_message(self.keys.check_value, theirs, name)
        record = Failure(Kind.SECRET, how, index, time=time.time(), agent=index)
        self.reporter.report(self.membership.scope, record, slot=f"secret-{index}")

    def meet(self) -> None:
        """Wait for every other agent (woken early by a failure anywhere), then heartbeat."""
        self.membership.join(self.settings.rdzv_timeout)
        self.met = True
        self.membership.heartbeat(
            self.stop,
            HEARTBEAT_PERIOD,
            self.settings.heartbeat_timeout,
            on_lost=lambda why: self.events.put(StoreLost(why)),
            on_silent=self.reporter.peer_silent if self.leader else None,
        )

    # -- what a run asks of its node (agent.node.seat.RunSeat) -----------------------------
    @property
    def rdzv_timeout(self) -> float:
        return self.settings.rdzv_timeout

    def scope(self, prefix: str, wakes: tuple[str, ...] = ()) -> Scope:
        """A phase's keys in the job store (a run: `r<run>`, its rounds and attempts below)."""
        return Scope(self.store, prefix, self.world.agent_index, self.keys, wakes)

    def enter(self, scope: Scope | None, active: Mapping[int, int | None] | None = None) -> None:
        """Where failures go from now (None: nowhere, between runs or a spare's wait).
        `active`: the peers this phase counts on → node rank (None: every one)."""
        self._phase = scope
        self.reporter.enter(scope, active)

    def report(self, scope: Scope, record: Failure) -> Failure | None:
        return self.reporter.report(scope, record)

    def tell(self, error: AgentError) -> None:
        """This node could not set up or go on: told to the current phase's peers (none
        between runs)."""
        if self._phase is not None:
            self.reporter.report(self._phase, self.failed(Kind.SETUP, error.message, error))

    def failed(self, kind: Kind, how: str, error: AgentError | None = None) -> Failure:
        return node_failure(self.world, kind, how, error)

    def lost(self) -> dict[int, str]:
        reporter = self.reporter
        return {i: reporter.lost_reason.get(i, "lost") for i in list(reporter.lost_peers)}

    def lost_failures(self, scope: Scope) -> list[Failure]:
        return self.reporter.lost_failures(scope)

    def hosts(self) -> list[str]:
        return self.membership.hosts()

    def serve_workers(self) -> RanksStore:
        return self.store.serve_workers()

    def host_ranks_store(self) -> None:
        self.store.host_ranks_store()

    def close_workers(self) -> None:
        self.store.close_workers()

    # -- what the control plane and resident agents ask (agent.node.control_seat) ----------
    @property
    def client_key(self) -> bytes:
        return self.keys.client_key

    def idle(self) -> None:
        self.enter(None)

    def node_scope(self, *, side: bool = False, op_timeout: float | None = None) -> Scope:
        scope = self.membership.scope
        return scope.on(self.store.another_client(op_timeout=op_timeout)) if side else scope

    def side_scope(
        self, prefix: str, wakes: tuple[str, ...] = (), *, op_timeout: float | None = None
    ) -> Scope:
        return self.scope(prefix, wakes).on(self.store.another_client(op_timeout=op_timeout))

    def publish_endpoint(self, port: int) -> None:
        self.membership.scope.put(ENDPOINT, {"port": port})

    def endpoint_port(self, timeout: float = 0.0) -> int | None:
        m = self.membership.scope
        if timeout <= 0:
            record = m.get_if(ENDPOINT, "node 0's endpoint")
        elif m.store.wait([m.key(ENDPOINT)], timeout):  # a forgery there is waited past
            record = m.get(ENDPOINT, "node 0's endpoint", present=True, timeout=timeout)
        else:
            return None
        port = record.get("port") if record else None
        return None if isinstance(port, bool) or not isinstance(port, int) else port

    def peer_lost(self, index: int, why: str) -> None:
        self.reporter.peer_silent(index, why)

    # -- ending --------------------------------------------------------------------------
    def farewell(self, record: Failure | None, why: str, *, everyone: bool = False) -> None:
        """Ending early: tell everyone (over a fresh connection: the main one may be mid-query).

        Node 0 then keeps its store up until the peers have read why: those that joined, or
        (`everyone`, for bad input they would otherwise never hear of) all of them, for a while.
        """
        with contextlib.suppress(Exception):
            fresh = self.store.another_client(op_timeout=2.0)
            if record is not None:
                record = replace(record, agent=self.world.agent_index)
                scopes = [self._phase] if self._phase is not None else []
                if not self.met:  # peers may still wait at the join barrier
                    scopes.append(self.membership.scope)
                for scope in scopes:
                    scope.on(fresh).report(record)
            self.membership.scope.on(fresh).put(f"gone/{self.world.agent_index}", {"why": why})
            if self.leader:
                m = self.membership.scope.on(fresh)
                peers = self._peers()
                if not everyone:  # the claim counters: an outsider's bump costs a linger only
                    peers = [i for i in peers if fresh.exists(m.key("claim", i))]
                self._linger(fresh, peers, 10.0 if everyone else 5.0)

    def _peers(self) -> list[int]:
        lost = self.reporter.lost_peers
        return [i for i in range(1, self.world.agents) if i not in lost]

    def _linger(self, store: Store, peers: list[int], timeout: float) -> None:
        """Node 0: keep the store up until these peers have read what they need (or timeout)."""
        m = self.membership.scope
        store.wait([m.key("gone", i) for i in peers], timeout)

    def leave(self) -> None:
        """An orderly end: peers are told, node 0 waits until they have read the verdict."""
        with contextlib.suppress(Exception):
            self.membership.leaving()
            if self.leader:
                self._linger(self.store, self._peers(), 10.0)
