"""Node 0's door: clients (run, status, down) and the other agents' console feeds connect here.

Anyone on the cluster network can connect, so nothing is read before the peer has proved it
holds the job's secret (agent.control.wire: HMAC challenge both ways, then AES-GCM frames). Each
connection gets a thread; their number is bounded, and so is the time a peer may take to
authenticate and to say what it wants. Agents' lifelines (agent.control.lifeline) leave their
thread once authenticated: node 0 holds thousands of them in one selector thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from agent.control import wire
from agent.errors import AgentError
from agent.node.hosting import free_fds

if TYPE_CHECKING:
    from agent.control.lifeline import Lifelines

log = logging.getLogger("agent")
HANDSHAKE_TIMEOUT = 1.0  # to prove the secret: a silent peer holds a slot no longer
REQUEST_TIMEOUT = 10.0  # an authenticated client's first request
MAX_UNAUTHENTICATED = 64  # peers still proving themselves; more are turned away at once
MAX_PER_PEER = 16  # of those, from one address: one host cannot take every slot
SHORT_OF_FDS = 0.1  # seconds between accepts while the process has no descriptor left
# Descriptors node 0 keeps for the job's own work (publishing a failure, the summary, the
# history, a rank's files): a peer still proving itself is turned away below that.
FDS_RESERVE = 64
FDS_LOOK_EVERY = 0.2  # seconds between counts of the open descriptors (~1 µs each)


class Handler(Protocol):
    def handle(self, channel: wire.Channel, first: dict[str, Any]) -> None: ...


class Endpoint:
    def __init__(
        self,
        auth_key: bytes,
        handler: Handler,
        lifelines: Lifelines | None = None,
        free: Callable[[], int | None] = free_fds,  # descriptors this process may still open
        reserve: int = FDS_RESERVE,
    ) -> None:
        self._key = auth_key
        self._free, self._reserve = free, reserve
        # the last count: when, free then (None: unknown), admitted since
        self._fds: tuple[float, int | None, int] = (-FDS_LOOK_EVERY, None, 0)
        self._handler = handler
        self._lifelines = lifelines  # node 0: where agents' lifelines go once authenticated
        if socket.has_dualstack_ipv6():
            self._sock = socket.create_server(
                ("", 0), family=socket.AF_INET6, dualstack_ipv6=True, backlog=512
            )
        else:
            self._sock = socket.create_server(("", 0), backlog=512)
        self.port = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # address → connections not yet authenticated
        self._closed = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="endpoint", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        if self._lifelines is not None:
            self._lifelines.close()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()

    def _accept_loop(self) -> None:
        short = False
        while not self._closed.is_set():
            try:
                conn, addr = self._sock.accept()
            except OSError as exc:
                if self._closed.is_set() or exc.errno not in _SHORT_OF_FDS:
                    return
                if not short:  # told once; the peer waits in the backlog and retries
                    log.warning(
                        "node 0's endpoint cannot accept a connection: %s (the open-files limit "
                        "is spent; raise `ulimit -n` — agents without a lifeline are still "
                        "watched by heartbeat)",
                        exc.strerror or exc,
                    )
                short = True
                time.sleep(SHORT_OF_FDS)  # not a synchronisation: the kernel has no event for it
                continue
            short = False
            host = str(addr[0]) if isinstance(addr, tuple) and addr else "?"
            why = self._admit(host)
            if why:  # a flood of silent peers must not starve real clients of threads
                _turn_away(conn, why)
                continue
            threading.Thread(
                target=self._serve, args=(conn, addr, host), name="endpoint-conn", daemon=True
            ).start()

    def _admit(self, host: str) -> str:
        """'' and a slot taken, or why the peer is turned away."""
        with self._lock:
            if self._short_of_fds():
                return f"node 0 keeps its last {self._reserve} descriptors for the job's own work"
            if sum(self._pending.values()) >= MAX_UNAUTHENTICATED:
                return f"{MAX_UNAUTHENTICATED} connections are still authenticating"
            if self._pending.get(host, 0) >= MAX_PER_PEER:
                return f"{MAX_PER_PEER} connections from {host} are still authenticating"
            self._pending[host] = self._pending.get(host, 0) + 1
            looked, free, admitted = self._fds
            self._fds = (looked, free, admitted + 1)
            return ""

    def _short_of_fds(self) -> bool:
        """Fewer free descriptors than the reserve: counted at most every FDS_LOOK_EVERY (at
        4,096 agents a count is ~16 ms), in between less the peers admitted since. The accepted
        connection's own descriptor is counted in."""
        now = time.monotonic()
        looked, free, admitted = self._fds
        if now - looked >= FDS_LOOK_EVERY:
            looked, free, admitted = self._fds = (now, self._free(), 0)
        return free is not None and free - admitted < self._reserve

    def _release(self, host: str) -> None:
        with self._lock:
            left = self._pending.get(host, 1) - 1
            if left:
                self._pending[host] = left
            else:
                self._pending.pop(host, None)

    def _serve(self, conn: socket.socket, addr: Any, host: str) -> None:
        try:
            channel = wire.accept(conn, self._key, HANDSHAKE_TIMEOUT)
        except (AgentError, OSError) as exc:
            log.warning("refused a connection from %s: %s", _peer(addr), exc)
            conn.close()
            return
        finally:
            self._release(host)
        try:
            first = channel.recv(REQUEST_TIMEOUT)
        except (AgentError, OSError) as exc:
            log.warning("client %s sent no request: %s", _peer(addr), exc)
            channel.close()
            return
        if not isinstance(first, dict):
            channel.close()
            return
        if first.get("op") == "lifeline" and self._lifelines is not None:
            if not self._lifelines.adopt(channel, first):  # held by the lifelines' thread now
                channel.close()
            return
        try:
            self._handler.handle(channel, first)
        except Exception as exc:  # one client's trouble never takes the resident agents down
            log.warning("client %s: %s", _peer(addr), exc)
        finally:
            channel.close()


_SHORT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def _turn_away(conn: socket.socket, why: str) -> None:
    """Say why in one small frame if the socket takes it now (never wait on it), then close."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(wire.busy_frame(why))
    conn.close()


def _peer(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)
