"""The session half of `agent.control.wire`: AES-GCM frames under a key the handshake agreed.

Every frame is AES-GCM of compact JSON; the nonce is a direction byte (0 client to server, 1
server to client) and an 11-byte count of the frames sent that way, so each side accepts
exactly the next frame its peer sealed: one altered, replayed, reordered, reflected back to its
sender or taken from another session does not open. A dead peer host is noticed through TCP
keepalives (set by the handshake) and bounded sends.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agent.control.framing import FrameReader, WireError, decode_json, encode_json, write_frame
from agent.errors import ExitCode

MAX_FRAME = 16 << 20
_TAG = 16
CLIENT, SERVER = 0, 1  # the direction byte of the frames each side sends


class Channel:
    """Messages (JSON objects) both ways; send is thread-safe, recv serves one reader at a time."""

    def __init__(
        self, sock: socket.socket, key: bytes, side: int, peer: str, send_timeout: float | None
    ) -> None:
        self.peer = peer
        self._sock = sock
        self._aead = AESGCM(key)
        self._side = side
        self._sent = 0
        self._received = 0
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._reader = FrameReader(sock, peer)
        self._send_failed: WireError | None = None
        self._recv_failed: WireError | None = None
        self._closed = False
        sock.settimeout(send_timeout)  # bounds sendall; reads wait on poll with their own timeout

    def send(self, msg: dict[str, Any]) -> None:
        """One message; ValueError if it is not plain JSON or too big, WireError if the peer is
        gone (the channel is then unusable for sending: a frame may have been cut)."""
        body = encode_json(msg)
        if len(body) + _TAG > MAX_FRAME:
            raise ValueError(f"a message of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
        with self._send_lock:
            if self._closed:
                raise WireError(f"the connection to {self.peer} is closed")
            if self._send_failed is not None:
                raise self._send_failed
            frame = self._aead.encrypt(nonce(self._side, self._sent), body, None)
            self._sent += 1
            try:
                write_frame(self._sock, frame)
            except OSError as exc:  # TimeoutError included: a peer that stopped reading
                why = "it stopped reading" if isinstance(exc, TimeoutError) else exc.strerror or exc
                self._send_failed = WireError(f"lost the connection to {self.peer}: {why}")
                raise self._send_failed from None

    def recv(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message; None at orderly EOF or after close(). TimeoutError when none came
        within `timeout` seconds (None: wait for ever; a partial frame is kept for the next
        call). WireError: REFUSED for a forged, altered, replayed or oversized frame (the
        channel then refuses every later read), RENDEZVOUS for a connection lost mid-frame."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._recv_lock:
            if self._closed:
                return None
            if self._recv_failed is not None:
                raise self._recv_failed
            try:
                frame = self._reader.read(MAX_FRAME, deadline)
            except WireError as exc:
                if self._closed:
                    return None  # close() from another thread woke us: that is an EOF
                self._recv_failed = exc
                raise
            if frame is None:
                return None
            try:
                body = self._aead.decrypt(nonce(1 - self._side, self._received), frame, None)
            except InvalidTag:
                self._recv_failed = WireError(
                    f"refusing a message from {self.peer}: it does not open with this session's "
                    "key (forged, altered, replayed or reordered); dropping the connection",
                    ExitCode.REFUSED,
                )
                raise self._recv_failed from None
            self._received += 1
            return decode_json(body, self.peer)

    def close(self) -> None:
        """Idempotent; wakes a thread blocked in recv (it returns None) or in send."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        # The fd is closed only once a reader woken by the shutdown has left, so that no reader
        # ever polls a number the process has reused for another file.
        locked = self._recv_lock.acquire(timeout=5.0)
        try:
            self._sock.close()
        finally:
            if locked:
                self._recv_lock.release()

    def fileno(self) -> int:
        return self._sock.fileno()


def nonce(side: int, count: int) -> bytes:
    return bytes([side]) + count.to_bytes(11, "big")
