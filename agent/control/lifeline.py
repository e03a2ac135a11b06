"""Lifelines: every agent holds one authenticated connection to node 0 for the job's life, so
that the death of its process is known to node 0 at once.

When an agent's process dies — SIGKILL, the OOM killer, a segfault — its kernel closes its
sockets; node 0 sees the lifeline end without the agent's goodbye and declares the node lost
there and then (the heartbeat's path: `Reporter.peer_silent`), instead of after
--heartbeat-timeout. An agent that ends in order says goodbye first (after its departure record
is written), so its leaving never looks like a loss. Heartbeats still catch what a lifeline
cannot see: a hung agent, a partitioned node, a host that lost power (no FIN ever comes).

Node 0 holds thousands of these in one selector thread (`Lifelines`): no thread per
connection, a few KiB each, nothing to do while they are quiet. A connection comes through the
endpoint's handshake (agent.control.endpoint: HMAC both ways), so only a holder of the job's
secret can hold one; the frames are AES-GCM, so a goodbye cannot be forged into a live
connection. What an outsider can still do is cut a TCP connection (an RST, with root on a host
or a place on the path): that node is then declared lost — a denial of service, as cutting its
store connection would be.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.control import wire
from agent.errors import AgentError
from agent.node.control_seat import ControlSeat

log = logging.getLogger("agent")
OP = "lifeline"
CONNECT_TIMEOUT = 10.0  # one handshake
RETRY_FOR = 60.0  # node 0 may be crowded by thousands of agents' handshakes at once
LOST = "lost: its agent stopped answering (its connection to node 0 closed: the process died)"


@dataclass
class _Held:
    node: int
    channel: wire.Channel


class Lifelines:
    """Node 0: every other agent's lifeline, watched by one thread. `on_lost(node, reason)` is
    called (from that thread) once for each lifeline that ends without a goodbye."""

    def __init__(self, agents: int, on_lost: Callable[[int, str], None]) -> None:
        self.agents = agents
        self._on_lost = on_lost
        self._selector = selectors.DefaultSelector()  # epoll: no FD_SETSIZE, O(ready) a wake
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._incoming: list[_Held] = []  # handed over by endpoint threads, registered by ours
        self._held: dict[int, _Held] = {}  # node → its current lifeline (our thread only)
        self._closed = threading.Event()
        self.lost: list[int] = []  # nodes declared lost by a dropped lifeline, in order
        self._thread = threading.Thread(target=self._loop, name="lifelines", daemon=True)

    def start(self) -> Lifelines:
        self._thread.start()
        return self

    @property
    def held(self) -> int:
        return len(self._held)

    def adopt(self, channel: wire.Channel, first: dict[str, Any]) -> bool:
        """An endpoint thread hands over an authenticated connection whose first message was
        {"op": "lifeline", "node": i}; False (the caller closes it) for a node that is not a
        peer of this job."""
        node = first.get("node")
        if isinstance(node, bool) or not isinstance(node, int) or not 0 < node < self.agents:
            return False
        with self._lock:
            if self._closed.is_set():
                return False
            self._incoming.append(_Held(node, channel))
        self._wake()
        return True

    def close(self) -> None:
        """Node 0 is leaving: stop watching (no loss is declared from here on)."""
        self._closed.set()
        self._wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already wakes the thread
            self._wake_w.send(b"\0")

    def _loop(self) -> None:
        try:
            while not self._closed.is_set():
                for key, _ in self._selector.select():
                    try:
                        if key.data is None:
                            self._drain_wake()
                        else:
                            self._readable(key.data)
                    except Exception as exc:  # one connection's trouble never ends the watch
                        log.warning("lifelines: %s", exc)
        finally:
            for held in list(self._held.values()):
                held.channel.close()
            self._held.clear()
            with self._lock:
                for held in self._incoming:
                    held.channel.close()
                self._incoming.clear()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        with self._lock:
            incoming, self._incoming = self._incoming, []
        for held in incoming:
            old = self._held.pop(held.node, None)
            if old is not None:  # the same agent again (it reconnected): the old one is no loss
                self._forget(old)
            self._held[held.node] = held
            self._selector.register(held.channel.fileno(), selectors.EVENT_READ, held)

    def _readable(self, held: _Held) -> None:
        if self._held.get(held.node) is not held:
            return  # replaced by a newer lifeline of the same agent in this same wake
        try:
            message = held.channel.recv(0.001)  # data (or EOF) is there: never waits
        except TimeoutError:
            return  # part of a frame: the rest comes later
        except (AgentError, OSError) as exc:  # a reset, a frame that does not open
            message, why = None, str(exc)
        else:
            why = ""
        if message is not None and not message.get("bye"):
            return  # nothing else travels on a lifeline; ignored
        self._forget(held)
        if message is not None or self._closed.is_set():
            return  # a goodbye: the agent leaves in order (its departure record is written)
        log.info(
            "lifeline of node %d ended without a goodbye%s", held.node, f" ({why})" * bool(why)
        )
        self.lost.append(held.node)
        try:
            self._on_lost(held.node, LOST)
        except Exception as exc:  # the heartbeat still declares it lost later
            log.warning("could not declare node %d lost at once: %s", held.node, exc)

    def _forget(self, held: _Held) -> None:
        if self._held.get(held.node) is held:
            del self._held[held.node]
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(held.channel.fileno())
        held.channel.close()


class Lifeline:
    """An agent's end: connected in a thread of its own (the run never waits for it), held
    until `goodbye`. If node 0 cannot be reached, the heartbeat alone tells of this agent."""

    def __init__(self, host: str, port: int, auth_key: bytes, node: int) -> None:
        self._lock = threading.Lock()
        self._channel: wire.Channel | None = None
        self._done = False
        self.connected = threading.Event()
        args = (host, port, auth_key, node)
        self._thread = threading.Thread(target=self._connect, args=args, name=OP, daemon=True)
        self._thread.start()

    def _connect(self, host: str, port: int, auth_key: bytes, node: int) -> None:
        try:
            channel = wire.connect_retrying(host, port, auth_key, CONNECT_TIMEOUT, RETRY_FOR)
            channel.send({"op": OP, "node": node})
        except (AgentError, OSError) as exc:
            log.warning(
                "no lifeline to node 0 (%s): if this agent dies, node 0 learns of it only by "
                "its heartbeat",
                exc,
            )
            return
        with self._lock:
            if self._done:  # we said goodbye while connecting
                _bye(channel)
                return
            self._channel = channel
        self.connected.set()

    def goodbye(self) -> None:
        """Leaving in order (the departure record is written): the lifeline's end is no loss."""
        with self._lock:
            self._done = True
            channel, self._channel = self._channel, None
        if channel is not None:
            _bye(channel)


def _bye(channel: wire.Channel) -> None:
    with contextlib.suppress(AgentError, OSError, ValueError):
        channel.send({"bye": True})
    channel.close()


def watch(seat: ControlSeat) -> Lifelines | None:
    """Node 0: the lifelines of its peers, each one's end without a goodbye a loss at once
    (None: an agent alone)."""
    if seat.world.agents == 1:
        return None
    return Lifelines(seat.world.agents, seat.peer_lost).start()


def publish(seat: ControlSeat, port: int) -> None:
    """Node 0: where the peers find its endpoint (a sealed record of the node's own)."""
    if seat.world.agents > 1:
        seat.publish_endpoint(port)


def hold(seat: ControlSeat) -> Lifeline | None:
    """Any other agent, once node 0 has published its endpoint: this agent's lifeline."""
    if seat.leader:
        return None
    port = seat.endpoint_port()
    if port is None:
        log.warning("node 0 published no endpoint: it learns of this agent's death by heartbeat")
        return None
    w = seat.world
    return Lifeline(w.master_addr, port, seat.client_key, w.agent_index)
