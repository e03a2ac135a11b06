"""Length-prefixed frames on a TCP socket: read against a deadline, never trusting the length.

A frame is a 4-byte big-endian length and that many bytes. Anyone on the cluster network can
connect to node 0's endpoint, so a length over the caller's limit is refused before a byte of the
body is read or allocated, and every wait is bounded by a deadline (poll), so a peer that sends
nothing, or trickles a frame, cannot hold a reader longer than its caller allows. A reader keeps
a partly read frame across a timeout: the next read goes on where the last one stopped.
"""

from __future__ import annotations

import base64
import errno
import json
import math
import select
import socket
import struct
import time
from typing import Any

from agent.errors import AgentError, ExitCode

HEADER = struct.Struct(">I")
PLAIN_LIMIT = 4096  # handshake frames: tiny, so an unauthenticated peer costs us next to nothing


class WireError(AgentError):
    """The channel failed: REFUSED (4) for authentication failures and forged frames,
    RENDEZVOUS (3) for a dead peer, a timeout in the handshake, or a closed connection."""

    def __init__(self, message: str, code: ExitCode = ExitCode.RENDEZVOUS, seen: str = "") -> None:
        super().__init__(message, code)
        self.seen = seen  # what a client saw: "refused", "timed out", "crowded" (or "")


class FrameReader:
    """Reads whole frames from one socket; one reader at a time (the caller serialises)."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self._sock = sock
        self._peer = peer
        self._poll = select.poll()  # poll, not select: no FD_SETSIZE limit in a busy server
        self._poll.register(sock.fileno(), select.POLLIN)
        self._header = bytearray()
        self._body: bytearray | None = None
        self._got = 0

    def read(self, limit: int, deadline: float | None) -> bytes | None:
        """The next frame; None at EOF between frames. TimeoutError at `deadline` (monotonic)
        keeps what was read; WireError for an oversized length or a connection lost mid-frame."""
        while True:
            if self._body is None and len(self._header) == HEADER.size:
                (length,) = HEADER.unpack(self._header)
                if length > limit:
                    raise WireError(
                        f"{self._peer} announced a message of {length} bytes (the limit is "
                        f"{limit}): it is not a launch-agent peer, or the stream is corrupt",
                        ExitCode.REFUSED,
                    )
                self._body, self._got = bytearray(length), 0
            if self._body is not None and self._got == len(self._body):
                frame = bytes(self._body)
                self._header, self._body = bytearray(), None
                return frame
            self._wait(deadline)
            if not self._receive():
                if self._body is None and not self._header:
                    return None
                raise WireError(f"{self._peer} closed the connection in the middle of a message")

    def _receive(self) -> bool:
        """One recv into the current header or body; False at EOF."""
        try:
            if self._body is None:
                data = self._sock.recv(HEADER.size - len(self._header))
                self._header += data
                return bool(data)
            count = self._sock.recv_into(memoryview(self._body)[self._got :])
            self._got += count
            return count > 0
        except (BlockingIOError, InterruptedError):
            return True  # poll said readable but nothing came (spurious): wait again
        except TimeoutError:
            return True
        except OSError as exc:
            raise WireError(f"lost the connection to {self._peer}: {_reason(exc)}") from None

    def _wait(self, deadline: float | None) -> None:
        if deadline is None:
            events = self._poll.poll()
        else:
            left = deadline - time.monotonic()
            events = self._poll.poll(math.ceil(left * 1000)) if left > 0 else []
        if not events:
            raise TimeoutError(f"no message from {self._peer} in time")
        if any(flags & select.POLLNVAL for _, flags in events):
            raise WireError(f"the connection to {self._peer} is closed")


def write_frame(sock: socket.socket, data: bytes) -> None:
    """One frame: header and body in one sendall, so a frame never interleaves with another."""
    sock.sendall(HEADER.pack(len(data)) + data)


def encode_json(obj: dict[str, Any]) -> bytes:
    """Compact JSON; ValueError for what JSON cannot carry (a caller's bug, not the peer's)."""
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot send a message that is not plain JSON: {exc}") from None


def decode_json(body: bytes, peer: str) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        obj = None
    if not isinstance(obj, dict):
        raise WireError(
            f"{peer} sent a message that is not a JSON object: it is not a launch-agent peer",
            ExitCode.REFUSED,
        )
    return obj


def send_plain(sock: socket.socket, obj: dict[str, Any], deadline: float, peer: str) -> None:
    """A handshake frame (not encrypted), bounded by the handshake's deadline."""
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    try:
        write_frame(sock, encode_json(obj))
    except TimeoutError:
        raise WireError(f"{peer} did not take the handshake in time") from None
    except OSError as exc:
        raise WireError(f"lost the connection to {peer}: {_reason(exc)}") from None


def recv_plain(reader: FrameReader, deadline: float, peer: str, waited: float) -> dict[str, Any]:
    """The peer's next handshake frame; EOF and timeouts are WireError (RENDEZVOUS)."""
    try:
        frame = reader.read(PLAIN_LIMIT, deadline)
    except TimeoutError:
        raise WireError(f"{peer} did not complete the handshake within {waited:g}s") from None
    if frame is None:
        raise WireError(f"{peer} closed the connection during the handshake")
    return decode_json(frame, peer)


def _reason(exc: OSError) -> str:
    if exc.errno is not None and exc.errno in errno.errorcode:
        return exc.strerror or errno.errorcode[exc.errno]
    return str(exc) or type(exc).__name__


def pack_bytes(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unpack_bytes(text: str) -> bytes:
    """ValueError for anything but a base64 string."""
    if not isinstance(text, str):
        raise ValueError(f"expected base64 text, got {type(text).__name__}")
    return base64.b64decode(text, validate=True)
