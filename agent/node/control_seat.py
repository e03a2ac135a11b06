"""What the control plane and the resident agents ask of their node — the seam beside `RunSeat`.

`agent.control` (node 0's endpoint, the agents' lifelines) and `agent.serve` (the resident
agents) reach their node only through these two Protocols: `Joining`, the node agent before it
joined (its entry point connects it, and tells the others why it ends early), and `ControlSeat`,
the node once joined (`NodeAgent.connect` returns one: agent.node.joined.JoinedNode). A
`ControlSeat` is a `RunSeat` too, since a resident agent executes its runs through a
`Session` over it. What lies beyond (the store, the membership, the reporter, the job's keys)
stays in agent.node.
"""

from __future__ import annotations

from typing import Protocol

from agent.errors import AgentError
from agent.node.failure import Failure, Kind
from agent.node.scope import Scope
from agent.node.seat import RunSeat
from agent.world import World


class ControlSeat(RunSeat, Protocol):
    def host_ranks_store(self) -> None:
        """A one-agent job: its agent hosts its ranks' store from the next attempt on (it
        imports torch; agent.node.store.Store.host_ranks_store)."""
        ...

    @property
    def client_key(self) -> bytes:
        """What clients and agents prove the job's secret with (agent.control.wire)."""
        ...

    def meet(self) -> None:
        """Wait for every other agent (woken early by a failure anywhere), then heartbeat."""
        ...

    def leave(self) -> None:
        """An orderly end: peers are told, node 0 waits until they have read the verdict."""
        ...

    def idle(self) -> None:
        """Between runs: a lost peer is noted (out of later runs), and a failure of ours is a
        departure, not a run's failure."""
        ...

    def tell(self, error: AgentError) -> None:
        """This node could not set up or go on: told to the current phase's peers (none while
        idle)."""
        ...

    def failed(self, kind: Kind, how: str, error: AgentError | None = None) -> Failure:
        """A failure of this node (a setup error, a signal), named by its node rank and host."""
        ...

    def node_scope(self, *, side: bool = False, op_timeout: float | None = None) -> Scope:
        """This node's own records (each node's warm state; node 0's endpoint): `side`, over a
        connection of its own, for a thread beside the main one (`op_timeout` bounds each of
        its queries)."""
        ...

    def side_scope(
        self, prefix: str, wakes: tuple[str, ...] = (), *, op_timeout: float | None = None
    ) -> Scope:
        """A run's scope (as `scope`) over a connection of its own: a word for the others
        while the main connection may be mid-wait."""
        ...

    def publish_endpoint(self, port: int) -> None:
        """Node 0: where the other agents find its endpoint (agent.control.endpoint)."""
        ...

    def endpoint_port(self, timeout: float = 0.0) -> int | None:
        """Any other agent: node 0's endpoint's port, waiting up to `timeout` for it (and past
        a value that does not open: Tampered after `timeout`); None when it published none, or
        what is there is not a port."""
        ...

    def peer_lost(self, index: int, why: str) -> None:
        """Node 0: a peer's agent is gone (its lifeline ended without a goodbye); once, like
        the heartbeat's finding."""
        ...


class Joining(Protocol):
    """The node agent before it joined, as its entry point (`agent serve`) holds it."""

    world: World

    def connect(self) -> ControlSeat:
        """Host or reach the store and claim this node index: from here on, failures are told."""
        ...

    def farewell(self, record: Failure | None, why: str, *, everyone: bool = False) -> None:
        """Ending early: tell everyone why (nothing before the node joined)."""
        ...

    def close(self) -> None:
        """Every thread of the node stops."""
        ...
