"""Every node but 0, resident: wait for the next run's plan, execute it, wait again.

The next run's scope (`r<N>`) is where everything reaches a waiting agent: its plan, or node 0's
`down` record (which wakes the same key). A node 0 that vanishes is noticed by the heartbeat.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from agent.control import lifeline, wire
from agent.errors import AgentError, ExitCode, PeerFailed
from agent.node.control_seat import ControlSeat
from agent.node.events import StoreLost, drained
from agent.node.failure import Kind
from agent.node.scope import Scope
from agent.node.signals import Interrupted
from agent.node.stage import Stage
from agent.run.node_run import Session
from agent.run.tools import RunTools
from agent.run.warm_source import WarmSource
from agent.serve.leader import ANSWER_WAIT, ANSWERED
from agent.serve.relay import ChannelOut, forward_logs

log = logging.getLogger("agent")


def follow(seat: ControlSeat, warm: WarmSource, read_topology: Callable[[str], Any]) -> int:
    feed = _open_feed(seat)
    line = lifeline.hold(seat)  # node 0's endpoint is known now: hear of our death at once
    try:
        return _follow(seat, warm, read_topology, feed)
    finally:
        if line is not None:
            line.goodbye()  # leaving in order, or told already (farewell): no loss


def _follow(
    seat: ControlSeat,
    warm: WarmSource,
    read_topology: Callable[[str], Any],
    feed: wire.Channel | None,
) -> int:
    session = Session(seat)  # the runs of this resident agent
    number = 0
    while True:
        scope = seat.scope(Stage(number).scope(), wakes=("plan", "done"))
        _await(seat, scope)
        failure = scope.failure()
        if failure is not None and failure.kind is Kind.DOWN:
            log.info("node 0 stopped serving: %s", failure.how)
            return 0
        from agent.console.view import Sinks

        sinks = Sinks(ChannelOut(feed, 1, number), ChannelOut(feed, 2, number))
        with forward_logs(feed, seat.world.host, logging.WARNING, number):
            try:
                session.execute(number, None, RunTools(read_topology, warm, sinks))
            except PeerFailed as exc:
                log.warning("run %d ended: %s", number, exc.message)
            except AgentError as exc:  # ours (a missing script here, say): all must hear of it
                log.error("run %d: %s", number, exc.message)
                seat.tell(exc)
        if seat.signals.received is not None:
            raise Interrupted(seat.signals.received)
        # The next run's ranks forked between runs, once node 0's client has its end.
        with contextlib.suppress(AgentError, OSError, RuntimeError):  # a lost store: _await tells
            scope.store.wait([scope.key(ANSWERED)], ANSWER_WAIT)
        warm.stand_by()
        seat.idle()  # between runs our own trouble is a departure, not a run's failure
        number += 1


def _await(seat: ControlSeat, scope: Scope) -> None:
    key = scope.key("plan")
    while not scope.store.wait([key], 1.0):
        for event in drained(seat.events):
            if isinstance(event, StoreLost):
                raise AgentError(f"{event.why}: node 0's agent is gone", ExitCode.RENDEZVOUS)


def _open_feed(seat: ControlSeat) -> wire.Channel | None:
    """One channel to node 0 for this node's console lines, for every run."""
    w = seat.world
    try:
        port = seat.endpoint_port(seat.rdzv_timeout)
        if port is None:
            raise TimeoutError("node 0 never published its endpoint")
        channel = wire.connect_retrying(w.master_addr, port, seat.client_key, 10.0)
        channel.send({"op": "feed", "node": w.agent_index})
        return channel
    except (AgentError, OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("console lines of %s reach only its rank files: %s", w.host, exc)
        return None
