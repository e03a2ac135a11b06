"""A torch-free client for c10d's TCPStore wire protocol, so agents other than node 0 never import torch.

Importing torch costs ~1.2 s of CPU and ~300 MB per agent; only node 0 needs it (to host the
server). The protocol is in agent.node.store_wire. A server that does not answer the handshake
as expected raises `ProtocolMismatch`, and the caller falls back to torch's client.
"""

from __future__ import annotations

import logging
import os
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from agent.node import store_wire as wire

_CHUNK = 1 << 16  # bytes asked of the socket at a time
PIPELINE = 1024  # queries sent before their answers are read (neither side's buffer fills)
DEFERRED_CONNECT = 2.0  # seconds a deferred client retries a refused connect
REPAIRS = 20  # counters reset in a row (each after an outsider's non-number) before giving up
RECONNECTS = 5  # fresh connections one query takes in a row before the store counts as gone
# Seconds a fresh connection may go unanswered before the store counts as gone: torch's server
# stalls on a reverse-DNS lookup per connection where resolvers drop queries (5-10 s each, more
# with a crowd of connections ahead of ours); one that refuses is gone after REFUSED_GRACE.
RECONNECT_PATIENCE = 60.0
# Seconds a refused reconnect is tried again (every REFUSED_PAUSE) before the store counts as
# gone: node 0's agent that died refuses for good, and its peers learn it this much later; a
# refusal while node 0 went on serving was seen in the tampering soak (cause unknown).
REFUSED_GRACE = 1.0
REFUSED_PAUSE = 0.1
NUMBER = re.compile(rb"\s*[-+]?\d{1,18}")  # what the server's add reads as a number (stoll)
log = logging.getLogger("agent")
T = TypeVar("T")


# RuntimeError subclasses, like torch's DistStoreError, so callers handle both clients alike.
class ProtocolMismatch(RuntimeError):
    """The server speaks another TCPStore dialect (a torch version we do not know)."""


class _Silent(ProtocolMismatch):
    """No answer to the handshake (none in time, or the connection closed): tried again on a
    new connection (torch 2.13's server leaves about 1 new connection in 50 unanswered for
    ~5 s); a server that answers something else is a mismatch at once."""


HANDSHAKES = (2.0, 4.0, 8.0)  # seconds each try at the handshake waits for its answer


class StoreTimeout(RuntimeError):
    """A wait ran out of time (the keys may still appear later)."""


class StoreClosed(RuntimeError):
    """The server went away."""


class StoreClient:
    """Blocking client; one query at a time per connection (a lock makes threads take turns)."""

    def __init__(self, sock: socket.socket | None, op_timeout: float | None = None) -> None:
        self._sock = sock  # None: `deferred`, connected at the first query
        self._address: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._op_timeout = op_timeout
        self._buf = bytearray()  # received, not yet parsed: answers are read in large chunks
        self._pos = 0
        self._encoded: tuple[tuple[str, ...], bytes] | None = None  # the last key tuple, sent

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        timeout: float,
        op_timeout: float | None = None,
        patient: bool = True,
    ) -> StoreClient:
        """Connect, retrying while refused (the server may start later), then shake hands.

        `op_timeout`: a query other than wait that gets no answer for this long raises
        TimeoutError, so a server that vanished without closing the connection (a dead host, a
        partition) is noticed instead of blocking forever. `patient=False`: a refused connect
        is not retried (the server answered before: refused now, it is gone).
        """
        deadline = time.monotonic() + timeout
        for tries, wait in enumerate(HANDSHAKES, 1):
            while True:
                try:
                    sock = socket.create_connection(
                        (host, port), timeout=max(0.1, deadline - time.monotonic())
                    )
                    break
                except OSError as exc:
                    if not patient or not wire.transient(exc):
                        raise  # e.g. a host name that does not resolve: waiting will not help
                    if time.monotonic() >= deadline:
                        raise TimeoutError(
                            f"no store at {host}:{port} after {timeout:g}s"
                        ) from None
                    time.sleep(0.05)  # a refused connect returns at once: pace the retries
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = cls(sock, op_timeout)
            client._address = (host, port)
            try:
                client._handshake(max(1.0, min(wait, deadline - time.monotonic())))
            except _Silent:
                if tries == len(HANDSHAKES) or time.monotonic() >= deadline:
                    raise
                continue
            sock.settimeout(op_timeout)
            return client
        raise AssertionError("unreachable")

    @classmethod
    def deferred(cls, host: str, port: int, op_timeout: float | None = None) -> StoreClient:
        """Connected at its first query: a connection most agents never use (failure reports)
        then costs node 0 nothing. The server answered us before, so a refusal then is not
        waited out (DEFERRED_CONNECT seconds)."""
        client = cls(None, op_timeout)
        client._address = (host, port)
        return client

    @property
    def _live(self) -> socket.socket:
        """The connection a query goes over (a deferred one is opened by `_send` first)."""
        if self._sock is None:
            raise StoreClosed("store connection not open")
        return self._sock

    def _handshake(self, timeout: float) -> None:
        nonce = int.from_bytes(os.urandom(4), "little")
        self._live.settimeout(timeout)
        try:
            self._live.sendall(struct.pack("<BIBI", wire.VALIDATE, wire.MAGIC, wire.PING, nonce))
            echoed = struct.unpack("<I", self._recv(4))[0]
        except (OSError, StoreClosed) as exc:  # silent, or closed without a word: again
            self.close()
            raise _Silent(f"no answer to the handshake ({exc})") from None
        if echoed != nonce:
            self.close()
            raise ProtocolMismatch("the server answered the handshake with something else")

    # -- queries (the subset the agents use) ----------------------------------------------
    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        query = bytes([wire.SET]) + wire.blob(wire.key_bytes(key)) + wire.blob(data)
        with self._lock:
            self._again(lambda: self._send(query))

    def get(self, key: str, wait: bool = True) -> bytes:
        """Blocks until the key exists, like torch's get; `wait=False`: the caller knows it
        exists (it waited for it, or checked it): one round trip instead of two — and b"" if
        it is gone by then: an outsider's delete between the check and the get must not read as
        a lost store (torch's libuv server answers an empty value; its older backend closes the
        connection instead, and the query is retried here after a check)."""
        tries = 0

        def query() -> bytes:
            nonlocal tries
            tries += 1
            if wait:
                self._wait([key], None)
            elif tries > 1 and not self._exists([key])[0]:
                return b""  # deleted meanwhile: a value that opens as nothing
            self._send(bytes([wire.GET]) + wire.blob(wire.key_bytes(key)))
            return self._recv_blob()

        with self._lock:
            return self._again(query)

    def _exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key exists now (one query each, pipelined)."""
        self._send(b"".join(bytes([wire.CHECK]) + wire.keys_bytes([key]) for key in keys))
        return [self._recv(1)[0] == wire.READY for _ in keys]

    def add(self, key: str, amount: int) -> int:
        return self.add_all([key], amount)[0]

    def add_all(self, keys: Sequence[str], amount: int) -> list[int]:
        """`add` to every key, the queries pipelined: a round trip per PIPELINE keys.

        torch's server closes the connection of a client whose `add` finds a value that is not
        a number (anyone may `set` one over a counter): the store is not lost then. When a new
        connection is answered, the counters of the batch that the server refused to add to are
        reset to 0 and added to again (an outsider's garbage delays, never ends the job; our
        counters only wake readers, who decide from sealed records)."""
        found: list[int] = []
        with self._lock:
            for at in range(0, len(keys), PIPELINE):
                part = keys[at : at + PIPELINE]
                for tries in range(REPAIRS + 1):
                    done = len(found)
                    try:
                        if tries:  # inside the try: the repair's own queries may be closed on
                            self._repair(part[0])
                        self._send(b"".join(wire.add_request(key, amount) for key in part))
                        for _ in part:
                            found.append(struct.unpack("<q", self._recv(8))[0])
                        break
                    except StoreClosed as exc:
                        if tries == REPAIRS:
                            raise
                        why = self._reconnect()
                        if why:
                            raise StoreClosed(f"{exc}; {why}") from None
                    part = part[len(found) - done :]  # answered before the close: added
        return found

    def _repair(self, key: str) -> None:
        """After the server closed the connection on an `add` to `key`: a value there that is
        not a number (anyone may set one over a counter) is reset to 0, or every add to it
        would close the connection again. A number is left as it is (the close had another
        cause; the add is sent again and may count twice: counters only wake readers). A key
        deleted meanwhile needs nothing: the add makes it again."""
        if not self._exists([key])[0]:
            return
        self._send(bytes([wire.GET]) + wire.blob(wire.key_bytes(key)))
        if NUMBER.fullmatch(self._recv_blob()):
            return
        log.warning(
            "the job store closed this agent's connection on `add` to %s: a value there is not "
            "a number (an outsider's?); reset to 0 and added again",
            key,
        )
        self._send(bytes([wire.SET]) + wire.blob(wire.key_bytes(key)) + wire.blob(b"0"))

    def _again(self, query: Callable[[], T], deadline: float | None = None) -> T:
        """`query` (one that may be sent twice: a read, a wait, a set), on a fresh connection
        when the server closed ours while a new one is answered: torch's server closes a
        client's connection on what it cannot parse or process, and an outsider's writes can
        lead there. The store counts as lost only when no new connection is answered; a wait
        whose `deadline` passes while a new one is made ends as a timeout (a silent handshake
        costs seconds: CI saw a 1 s wait take 5 s)."""
        for tries in range(RECONNECTS + 1):
            try:
                return query()
            except StoreClosed as exc:
                if tries == RECONNECTS:
                    raise
                why = self._reconnect(deadline)
                if why:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise StoreTimeout(f"no new store connection in time ({exc})") from None
                    raise StoreClosed(f"{exc}; {why}") from None
                log.warning(
                    "the job store closed this agent's connection (%s); connected again", exc
                )
        raise AssertionError("unreachable")

    def _reconnect(self, deadline: float | None = None) -> str:
        """A fresh connection to the same server: '' when made, else why none was (none
        answers: the store is gone, or none was made by `deadline`)."""
        if self._address is None:
            return "no address to connect to again"
        self.close()
        self._buf.clear()
        self._pos = 0
        now = time.monotonic()
        end = now + RECONNECT_PATIENCE if deadline is None else deadline
        refused_until = min(now + REFUSED_GRACE, end)
        while True:
            budget = max(0.1, min(float(sum(HANDSHAKES)), end - time.monotonic()))
            try:
                fresh = StoreClient.connect(  # refused: gone soon; silent: each handshake
                    *self._address, budget, self._op_timeout, patient=False
                )
            # Accepted and never answered, or a connect that timed out (a full listen backlog
            # drops the handshake's SYN: no RST): a server stalled, not one gone.
            except (_Silent, TimeoutError) as exc:
                if time.monotonic() < end:
                    continue
                return f"no new connection was answered ({exc})"
            except ConnectionRefusedError as exc:
                if time.monotonic() + REFUSED_PAUSE < refused_until:
                    time.sleep(REFUSED_PAUSE)  # a pause between tries, not a synchronisation
                    continue
                return f"a new connection was refused for {REFUSED_GRACE:g}s ({exc})"
            except (OSError, RuntimeError) as exc:  # node 0's agent is gone, or worse
                return f"a new connection failed ({type(exc).__name__}: {exc})"
            self._sock = fresh._sock
            return ""

    def check(self, keys: Sequence[str]) -> bool:
        query = bytes([wire.CHECK]) + wire.keys_bytes(keys)

        def ask() -> bool:
            self._send(query)
            return self._recv(1)[0] == wire.READY

        with self._lock:
            return self._again(ask)

    def check_each(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key exists: one query per key, pipelined (one round trip for all)."""
        if not keys:
            return []
        with self._lock:
            return self._again(lambda: self._exists(keys))

    def wait(self, keys: Sequence[str], timeout: float | None) -> None:
        """Block until every key exists; StoreTimeout after `timeout` seconds (None: forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._again(
                lambda: self._wait(keys, None if deadline is None else deadline - time.monotonic()),
                deadline,
            )

    def multi_get(self, keys: Sequence[str], wait: bool = True) -> list[bytes]:
        """Every key's value; `wait=False` when the caller knows they all exist (one round trip
        instead of two). A tuple of keys asked again is not encoded again (node 0's heartbeat
        reads the same N counters every second)."""

        tries = 0

        def query() -> list[bytes]:
            nonlocal tries
            tries += 1
            encoded = self._encode(keys)
            if wait:
                self._wait(keys, None, encoded)
            elif tries > 1:  # the server closed us: maybe a key was deleted after the check
                there = self._exists(keys)
                if not all(there):
                    found = iter(
                        self._multi_get([k for k, t in zip(keys, there, strict=True) if t])
                    )
                    return [next(found) if t else b"" for t in there]
            self._send(bytes([wire.MULTI_GET]) + encoded)
            return [self._recv_blob() for _ in range(len(keys))]

        with self._lock:
            return self._again(query)

    def _multi_get(self, keys: Sequence[str]) -> list[bytes]:
        if not keys:
            return []
        self._send(bytes([wire.MULTI_GET]) + wire.keys_bytes(keys))
        return [self._recv_blob() for _ in keys]

    def close(self) -> None:
        try:
            if self._sock is not None:
                self._sock.close()
        except OSError:
            pass

    # -- plumbing -------------------------------------------------------------------------
    def _encode(self, keys: Sequence[str]) -> bytes:
        if not isinstance(keys, tuple):
            return wire.keys_bytes(keys)
        if self._encoded is None or self._encoded[0] is not keys:
            self._encoded = (keys, wire.keys_bytes(keys))
        return self._encoded[1]

    def _wait(
        self, keys: Sequence[str], timeout: float | None, encoded: bytes | None = None
    ) -> None:
        self._send(bytes([wire.WAIT]) + (encoded if encoded is not None else wire.keys_bytes(keys)))
        self._live.settimeout(None if timeout is None else max(timeout, 0.001))
        try:
            answer = self._recv(1)[0]
        except TimeoutError:
            answer = None
        finally:
            self._live.settimeout(self._op_timeout)
        if answer == wire.STOP_WAITING:
            return
        if answer is not None:
            raise ProtocolMismatch(f"unexpected wait answer {answer}")
        # Cancel, then drain: the keys may have appeared just before the cancel arrived.
        self._send(bytes([wire.CANCEL_WAIT]))
        answer = self._recv(1)[0]
        if answer == wire.STOP_WAITING:
            answer = self._recv(1)[0]
        if answer != wire.WAIT_CANCELED:
            raise ProtocolMismatch(f"unexpected cancel answer {answer}")
        raise StoreTimeout(f"wait timeout after {timeout:g}s")

    def _send(self, data: bytes) -> None:
        if self._sock is None:  # deferred: connect now
            assert self._address is not None
            self._sock = StoreClient.connect(
                *self._address, DEFERRED_CONNECT, self._op_timeout
            )._sock
        elif self._ended():
            raise StoreClosed("store connection closed by the server")
        try:
            self._live.sendall(data)
        except OSError as exc:
            raise StoreClosed(f"store connection lost: {exc}") from None

    def _ended(self) -> bool:
        """Whether the server closed the connection since our last query: nothing is owed to us
        between queries, so a socket that reads as its end is closed, and a `set` sent into it
        would be lost without a word (it has no answer). One poll, no wait."""
        if self._pos < len(self._buf):
            return False
        if self._live.fileno() < 0:  # closed by a reconnect that did not finish in time
            return True
        poller = select.poll()
        poller.register(self._live, select.POLLIN)
        if not poller.poll(0):
            return False
        try:
            return not self._live.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _recv(self, size: int) -> bytes:
        """`size` bytes of the answer: from what was received already, else from the socket,
        reading as much as is there (a multi-key answer is then parsed without a syscall per
        value). A timeout leaves what arrived so far in the buffer, in order."""
        buf = self._buf
        while len(buf) - self._pos < size:
            if self._pos:
                del buf[: self._pos]
                self._pos = 0
            try:
                chunk = self._live.recv(max(_CHUNK, size - len(buf)))
            except TimeoutError:
                raise
            except OSError as exc:
                raise StoreClosed(f"store connection lost: {exc}") from None
            if not chunk:
                raise StoreClosed("store connection closed by the server")
            buf += chunk
        start = self._pos
        self._pos = start + size
        with memoryview(buf) as view:
            data = bytes(view[start : self._pos])
        if self._pos == len(buf):
            buf.clear()
            self._pos = 0
        return data

    def _recv_blob(self) -> bytes:
        return self._recv(struct.unpack("<Q", self._recv(8))[0])
