"""Who is alive, for the life of an allocation step: store, membership, heartbeats; runs on top.

A NodeAgent joins once (hosts or connects to the store, claims its node index, meets the others,
heartbeats), lends runs its phases (agent.run.node_run.Session executes them), and leaves. Whatever ends it early — a signal in any
phase, a setup error, a lost store — is told to the other nodes through the current phase's
scope, so nobody waits out a timeout.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from agent.errors import AgentError, ExitCode
from agent.node import handshake
from agent.node.events import StoreLost
from agent.node.failure import Failure, Kind
from agent.node.membership import Membership
from agent.node.reporter import Reporter
from agent.node.scope import Scope
from agent.node.signals import Signals
from agent.node.store import Endpoint, Store, public_namespace
from agent.node.trust import JobKeys, mismatch_message
from agent.plan.option_table import HEARTBEAT_PERIOD
from agent.world import World, derive_port

log = logging.getLogger("agent")


@dataclass(frozen=True)
class NodeSettings:
    """The options every node needs before any plan exists (from its own command line)."""

    rdzv_timeout: float = 300.0
    heartbeat_timeout: float = 6.0
    master_port: int | None = None


class NodeAgent:
    def __init__(
        self, *, world: World, settings: NodeSettings, secret: bytes, environ: Mapping[str, str]
    ) -> None:
        self.world, self.settings, self.environ = world, settings, environ
        self.leader = world.agent_index == 0
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.signals = Signals(self.events)
        self.keys = JobKeys.derive(secret, world.job_id, world.step_id)
        self.stop = threading.Event()
        self._phase: Scope | None = None
        self.store: Store | None = None
        self.claimed = False  # only an agent that holds its node index may speak for it
        self.met = False  # past the join barrier
        self.reporter: Reporter | None = None

    @property
    def phase(self) -> Scope | None:
        """Where a failure of ours is reported right now (and, on node 0, a lost peer's)."""
        return self._phase

    @phase.setter
    def phase(self, scope: Scope | None) -> None:
        self.enter(scope)

    @functools.cached_property
    def names(self) -> list[str]:  # built once: N strings, asked for in every phase
        w = self.world
        if w.task is not None:
            return [f"task {i}" for i in range(w.agents)]
        return [
            f"node {i} ({w.hosts[i]})" if i < len(w.hosts) else f"node {i}" for i in range(w.agents)
        ]

    # -- joining --------------------------------------------------------------------------
    def connect(self) -> None:
        """Host or reach the store and claim this node index: from here on, failures are told."""
        w = self.world
        # One agent alone may take any free port; several must agree without talking: derive it.
        port = (
            self.settings.master_port
            or w.master_port
            or (derive_port(w.job_id, w.step_id) if w.agents > 1 else 0)
        )
        ns = self.keys.namespace
        if self.leader:
            self.store = Store.host(
                Endpoint(w.master_addr, port),
                ns,
                f"{w.host} (node 0)",
                alone=w.agents == 1,
                agents=w.agents,
            )
        else:
            who = "node 0's agent" + (f" ({w.hosts[0]})" if w.hosts else "")
            self.store = Store.connect(
                Endpoint(w.master_addr, port), ns, self.settings.rdzv_timeout, who
            )
        public = self.store.under(public_namespace(w.job_id, w.step_id))
        if self.leader:
            handshake.announce(public, self.keys)
        else:
            handshake.check(
                public, self.keys, w.agent_index, self.settings.rdzv_timeout, self.names[0]
            )
        self.membership = Membership(self.store, w.agents, w.agent_index, self.names, self.keys)
        self.membership.claim(w.host)
        self.claimed = True
        self.reporter = Reporter(  # connected at its first report: most agents never report
            self.store.another_client(lazy=True), self.world, self.membership, self.names
        )
        if self.leader and w.agents > 1:  # a mismatch noted before this is still seen
            handshake.watch(public, self.keys, self.stop, self._mismatch)

    def _mismatch(self, index: int, theirs: str) -> None:
        """Node 0: an agent holds another secret; end the join for everyone, naming it."""
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
        assert self.store is not None
        return Scope(self.store, prefix, self.world.agent_index, self.keys, wakes)

    def enter(self, scope: Scope | None, active: Mapping[int, int | None] | None = None) -> None:
        """Where failures go from now (None: nowhere, between runs or a spare's wait).
        `active`: the peers this phase counts on → node rank (None: every one)."""
        self._phase = scope
        if self.reporter is not None:
            self.reporter.enter(scope, active)

    def report(self, scope: Scope, record: Failure) -> Failure | None:
        assert self.reporter is not None, "a run reports only after its node joined"
        return self.reporter.report(scope, record)

    def tell(self, error: AgentError) -> None:
        """This node could not set up or go on: told to the current phase's peers (none
        between runs)."""
        if self._phase is not None and self.reporter is not None:
            self.reporter.report(self._phase, self.failed(Kind.SETUP, error.message, error))

    def failed(self, kind: Kind, how: str, error: AgentError | None = None) -> Failure:
        """A failure of this node (a setup error, a signal), named by its node rank and host."""
        w = self.world
        tampering = error is not None and error.tampering
        return Failure(kind, how, w.node_rank, w.host, time.time(), tampering=tampering)

    def lost(self) -> dict[int, str]:
        reporter = self.reporter
        if reporter is None:
            return {}
        return {i: reporter.lost_reason.get(i, "lost") for i in list(reporter.lost_peers)}

    def lost_failures(self, scope: Scope) -> list[Failure]:
        return self.reporter.lost_failures(scope) if self.reporter is not None else []

    def hosts(self) -> list[str]:
        return self.membership.hosts()

    def serve_workers(self) -> int:
        assert self.store is not None
        return self.store.serve_workers()

    def close_workers(self) -> None:
        if self.store is not None:
            self.store.close_workers()

    def farewell(self, record: Failure | None, why: str, *, everyone: bool = False) -> None:
        """Ending early: tell everyone (over a fresh connection: the main one may be mid-query).

        Node 0 then keeps its store up until the peers have read why: those that joined, or
        (`everyone`, for bad input they would otherwise never hear of) all of them, for a while.
        """
        if self.store is None or not self.claimed:
            return
        with contextlib.suppress(Exception):
            fresh = self.store.another_client(op_timeout=2.0)
            record = None if record is None else replace(record, agent=self.world.agent_index)
            scopes = [self.phase] if self.phase is not None else []
            if not self.met:  # peers may still wait at the join barrier
                scopes.append(self.membership.scope)
            for scope in scopes if record is not None else ():
                scope.on(fresh).report(record)
            self.membership.scope.on(fresh).put(f"gone/{self.world.agent_index}", {"why": why})
            if self.leader:
                m = self.membership.scope.on(fresh)
                peers = self._peers()
                if not everyone:  # the claim counters: an outsider's bump costs a linger only
                    peers = [i for i in peers if fresh.exists(m.key("claim", i))]
                self._linger(fresh, peers, 10.0 if everyone else 5.0)

    def _peers(self) -> list[int]:
        lost = self.reporter.lost_peers if self.reporter else set()
        return [i for i in range(1, self.world.agents) if i not in lost]

    def _linger(self, store: Store, peers: list[int], timeout: float) -> None:
        """Node 0: keep the store up until these peers have read what they need (or timeout)."""
        m = self.membership.scope
        store.wait([m.key("gone", i) for i in peers], timeout)

    def leave(self) -> None:
        """An orderly end: peers are told, node 0 waits until they have read the verdict."""
        if self.store is None or not self.claimed:
            return
        with contextlib.suppress(Exception):
            self.membership.leaving()
            if self.leader:
                self._linger(self.store, self._peers(), 10.0)

    def close(self) -> None:
        self.stop.set()


def lost_store_error(exc: BaseException) -> AgentError:
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else type(exc).__name__
    return AgentError(f"lost the job store: {first}", ExitCode.RENDEZVOUS)
