"""Node 0's door: clients (run, status, down) and the other agents' console feeds connect here.

Anyone on the cluster network can connect, so nothing is read before the peer has proved it
holds the job's secret (agent.control.wire: HMAC challenge both ways, then AES-GCM frames). Each
connection gets a thread; their number is bounded, and so is the time a peer may take to
authenticate and to say what it wants.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any, Protocol

from agent.control import wire
from agent.errors import AgentError

log = logging.getLogger("agent")
HANDSHAKE_TIMEOUT = 10.0
MAX_UNAUTHENTICATED = 64  # peers still proving themselves; more are turned away at once


class Handler(Protocol):
    def handle(self, channel: wire.Channel, first: dict[str, Any]) -> None: ...


class Endpoint:
    def __init__(self, auth_key: bytes, handler: Handler) -> None:
        self._key = auth_key
        self._handler = handler
        if socket.has_dualstack_ipv6():
            self._sock = socket.create_server(
                ("", 0), family=socket.AF_INET6, dualstack_ipv6=True, backlog=512
            )
        else:
            self._sock = socket.create_server(("", 0), backlog=512)
        self.port = self._sock.getsockname()[1]
        self._slots = threading.BoundedSemaphore(MAX_UNAUTHENTICATED)
        self._closed = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="endpoint", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, addr = self._sock.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                conn.close()  # a flood of silent peers must not starve real clients of threads
                continue
            threading.Thread(
                target=self._serve, args=(conn, addr), name="endpoint-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket, addr: Any) -> None:
        try:
            channel = wire.accept(conn, self._key, HANDSHAKE_TIMEOUT)
            first = channel.recv(HANDSHAKE_TIMEOUT)
        except (AgentError, OSError) as exc:
            log.warning("refused a connection from %s: %s", _peer(addr), exc)
            conn.close()
            self._slots.release()
            return
        self._slots.release()
        if not isinstance(first, dict):
            channel.close()
            return
        try:
            self._handler.handle(channel, first)
        except Exception as exc:  # one client's trouble never takes the resident agents down
            log.warning("client %s: %s", _peer(addr), exc)
        finally:
            channel.close()


def _peer(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)
