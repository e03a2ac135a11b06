"""A torch-free client for c10d's TCPStore wire protocol, so agents other than node 0 never import torch.

Importing torch costs ~1.2 s of CPU and ~300 MB per agent; only node 0 needs it (to host the
server). The protocol (torch 2.x, little-endian): on connect VALIDATE + magic, then PING + nonce
echoed back; each query is one type byte followed by strings and byte vectors as u64 length +
bytes, counts as u64, integers as i64. Keys carry torch's "/" prefix, so this client and torch's
own clients see the same keys. A server that does not answer the handshake as expected raises
`ProtocolMismatch`, and the caller falls back to torch's client.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
import time
from collections.abc import Sequence

_MAGIC = 0x3C85F7CE
VALIDATE, SET, GET, ADD, CHECK, WAIT, MULTI_GET, CANCEL_WAIT, PING = 0, 1, 3, 4, 5, 6, 10, 12, 13
_READY, _STOP_WAITING, _WAIT_CANCELED = 0, 0, 1
_PREFIX = b"/"  # what torch's Python TCPStore puts before every key


# RuntimeError subclasses, like torch's DistStoreError, so callers handle both clients alike.
class ProtocolMismatch(RuntimeError):
    """The server speaks another TCPStore dialect (a torch version we do not know)."""


class StoreTimeout(RuntimeError):
    """A wait ran out of time (the keys may still appear later)."""


class StoreClosed(RuntimeError):
    """The server went away."""


class StoreClient:
    """Blocking client; one query at a time per connection (a lock makes threads take turns)."""

    def __init__(self, sock: socket.socket, op_timeout: float | None = None) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._op_timeout = op_timeout

    @classmethod
    def connect(
        cls, host: str, port: int, timeout: float, op_timeout: float | None = None
    ) -> StoreClient:
        """Connect, retrying while refused (the server may start later), then shake hands.

        `op_timeout`: a query other than wait that gets no answer for this long raises
        TimeoutError, so a server that vanished without closing the connection (a dead host, a
        partition) is noticed instead of blocking forever.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock = socket.create_connection(
                    (host, port), timeout=max(0.1, deadline - time.monotonic())
                )
                break
            except OSError as exc:
                if not _transient(exc):
                    raise  # e.g. a host name that does not resolve: waiting will not help
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"no store at {host}:{port} after {timeout:g}s") from None
                time.sleep(0.05)  # a refused connect returns at once: pace the retries
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = cls(sock, op_timeout)
        client._handshake(min(10.0, max(1.0, deadline - time.monotonic())))
        sock.settimeout(op_timeout)
        return client

    def _handshake(self, timeout: float) -> None:
        nonce = int.from_bytes(os.urandom(4), "little")
        self._sock.settimeout(timeout)
        try:
            self._sock.sendall(struct.pack("<BIBI", VALIDATE, _MAGIC, PING, nonce))
            echoed = struct.unpack("<I", self._recv(4))[0]
        except (OSError, StoreClosed) as exc:
            self.close()
            raise ProtocolMismatch(f"no answer to the handshake ({exc})") from None
        if echoed != nonce:
            self.close()
            raise ProtocolMismatch("the server answered the handshake with something else")

    # -- queries (the subset the agents use) ----------------------------------------------
    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        with self._lock:
            self._send(bytes([SET]) + _blob(_key(key)) + _blob(data))

    def get(self, key: str) -> bytes:
        """Blocks until the key exists, like torch's get."""
        with self._lock:
            self._wait([key], None)
            self._send(bytes([GET]) + _blob(_key(key)))
            return self._recv_blob()

    def add(self, key: str, amount: int) -> int:
        with self._lock:
            self._send(bytes([ADD]) + _blob(_key(key)) + struct.pack("<q", amount))
            return struct.unpack("<q", self._recv(8))[0]

    def check(self, keys: Sequence[str]) -> bool:
        with self._lock:
            self._send(bytes([CHECK]) + _keys(keys))
            return self._recv(1)[0] == _READY

    def wait(self, keys: Sequence[str], timeout: float | None) -> None:
        """Block until every key exists; StoreTimeout after `timeout` seconds (None: forever)."""
        with self._lock:
            self._wait(keys, timeout)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        with self._lock:
            self._wait(keys, None)
            self._send(bytes([MULTI_GET]) + _keys(keys))
            return [self._recv_blob() for _ in keys]

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    # -- plumbing -------------------------------------------------------------------------
    def _wait(self, keys: Sequence[str], timeout: float | None) -> None:
        self._send(bytes([WAIT]) + _keys(keys))
        self._sock.settimeout(None if timeout is None else max(timeout, 0.001))
        try:
            answer = self._recv(1)[0]
        except TimeoutError:
            answer = None
        finally:
            self._sock.settimeout(self._op_timeout)
        if answer == _STOP_WAITING:
            return
        if answer is not None:
            raise ProtocolMismatch(f"unexpected wait answer {answer}")
        # Cancel, then drain: the keys may have appeared just before the cancel arrived.
        self._send(bytes([CANCEL_WAIT]))
        answer = self._recv(1)[0]
        if answer == _STOP_WAITING:
            answer = self._recv(1)[0]
        if answer != _WAIT_CANCELED:
            raise ProtocolMismatch(f"unexpected cancel answer {answer}")
        raise StoreTimeout(f"wait timeout after {timeout:g}s")

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise StoreClosed(f"store connection lost: {exc}") from None

    def _recv(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            try:
                chunk = self._sock.recv(left)
            except TimeoutError:
                raise
            except OSError as exc:
                raise StoreClosed(f"store connection lost: {exc}") from None
            if not chunk:
                raise StoreClosed("store connection closed by the server")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _recv_blob(self) -> bytes:
        return self._recv(struct.unpack("<Q", self._recv(8))[0])


def _transient(exc: OSError) -> bool:
    """Worth retrying until the deadline: node 0 not listening yet, or its host not up yet."""
    return isinstance(
        exc, (ConnectionRefusedError, ConnectionResetError, TimeoutError)
    ) or exc.errno in (
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.EHOSTDOWN,
    )


def _key(key: str) -> bytes:
    return _PREFIX + key.encode()


def _blob(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _keys(keys: Sequence[str]) -> bytes:
    return struct.pack("<Q", len(keys)) + b"".join(_blob(_key(k)) for k in keys)
