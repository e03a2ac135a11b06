"""Who is alive, for the life of an allocation step: store, membership, heartbeats; runs on top.

A NodeAgent is a node before it joins: its world, its options, the job's keys, its signals.
`connect` joins (hosts or connects to the store, claims its node index) and returns the
`JoinedNode` that meets the others, heartbeats, lends runs its phases (agent.run.node_run.Session
executes them) and leaves. A failure before the node joined is told to nobody: nobody counts on
it yet.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent.errors import AgentError
from agent.node import handshake
from agent.node.failure import Failure, Kind
from agent.node.joined import JoinedNode, NodeSettings, node_failure
from agent.node.membership import Membership
from agent.node.reporter import Reporter
from agent.node.signals import Signals
from agent.node.store import Endpoint, Store, public_namespace
from agent.node.trust import JobKeys
from agent.world import World, derive_port

if TYPE_CHECKING:
    from agent.node.control_seat import ControlSeat, Joining

__all__ = ["NodeAgent", "NodeSettings"]
log = logging.getLogger("agent")


class NodeAgent:
    def __init__(
        self, *, world: World, settings: NodeSettings, secret: bytes, environ: Mapping[str, str]
    ) -> None:
        self.world, self.settings, self.environ = world, settings, environ
        self.leader = world.agent_index == 0
        self.events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.signals = Signals(self.events)
        self.keys = JobKeys.derive(secret, world.job_id, world.step_id)
        self.stop = threading.Event()
        self.joined: JoinedNode | None = None  # once it holds its node index

    @functools.cached_property
    def names(self) -> list[str]:  # built once: N strings, asked for in every phase
        w = self.world
        if w.task is not None:
            return [f"task {i}" for i in range(w.agents)]
        return [
            f"node {i} ({w.hosts[i]})" if i < len(w.hosts) else f"node {i}" for i in range(w.agents)
        ]

    def connect(self) -> JoinedNode:
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
            store = Store.host(
                Endpoint(w.master_addr, port),
                ns,
                f"{w.host} (node 0)",
                alone=w.agents == 1,
                agents=w.agents,
            )
        else:
            who = "node 0's agent" + (f" ({w.hosts[0]})" if w.hosts else "")
            store = Store.connect(
                Endpoint(w.master_addr, port), ns, self.settings.rdzv_timeout, who
            )
        public = store.under(public_namespace(w.job_id, w.step_id))
        if self.leader:
            handshake.announce(public, self.keys)
        else:
            handshake.check(
                public, self.keys, w.agent_index, self.settings.rdzv_timeout, self.names[0]
            )
        membership = Membership(store, w.agents, w.agent_index, self.names, self.keys)
        membership.claim(w.host)
        reporter = Reporter(  # connected at its first report: most agents never report
            store.another_client(lazy=True), self.world, membership, self.names
        )
        self.joined = JoinedNode(
            world=w,
            settings=self.settings,
            environ=self.environ,
            keys=self.keys,
            events=self.events,
            signals=self.signals,
            stop=self.stop,
            names=self.names,
            store=store,
            membership=membership,
            reporter=reporter,
        )
        if self.leader and w.agents > 1:
            self.joined.watch_secrets(public)
        return self.joined

    def failed(self, kind: Kind, how: str, error: AgentError | None = None) -> Failure:
        """A failure of this node (a setup error, a signal), named by its node rank and host."""
        return node_failure(self.world, kind, how, error)

    def farewell(self, record: Failure | None, why: str, *, everyone: bool = False) -> None:
        """Ending early: the joined node tells everyone why (JoinedNode.farewell); before it
        claimed its index nobody waits for this agent."""
        if self.joined is not None:
            self.joined.farewell(record, why, everyone=everyone)

    def close(self) -> None:
        self.stop.set()


if TYPE_CHECKING:  # for mypy: a node agent is what `Joining` asks, a joined node every seat

    def _seats(agent: NodeAgent) -> tuple[Joining, ControlSeat]:
        return agent, agent.connect()
