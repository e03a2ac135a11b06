"""An authenticated, encrypted message channel over TCP between node 0's agent and its clients.

Other cluster users can connect to node 0's endpoint and watch or alter the traffic, so:
- Handshake (plain frames of at most 4 KiB, every read bounded by the caller's timeout): the
  server sends {"hello": PROTOCOL, "nonce": sn}; the client answers {"nonce": cn, "proof":
  HMAC(key, "client" + sn + cn)}; the server checks it (a wrong one gets {"error": ...} and the
  connection is closed) and answers {"proof": HMAC(key, "server" + sn + cn)}, which the client
  checks, so a process squatting on the port cannot pose as the agents. Fresh nonces on both
  sides make every proof single-use, and the distinct labels keep one side's proof from being
  reflected as the other's.
- Session: every frame is AES-GCM under HMAC(key, "session" + sn + cn) of compact JSON; the
  nonce is a direction byte (0 client to server, 1 server to client) and an 11-byte count of the
  frames sent that way. A frame that is altered, replayed, reordered, reflected back to its
  sender or taken from another session does not open: WireError (REFUSED).
Binary data travels in the JSON as base64 (`pack_bytes`, `unpack_bytes`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import socket
import time

from agent.control.channel import CLIENT, MAX_FRAME, SERVER, Channel
from agent.control.framing import (
    HEADER,
    PLAIN_LIMIT,
    FrameReader,
    WireError,
    decode_json,
    encode_json,
    pack_bytes,
    recv_plain,
    send_plain,
    unpack_bytes,
)
from agent.errors import ExitCode

__all__ = [
    "MAX_FRAME",
    "PROTOCOL",
    "Channel",
    "WireError",
    "accept",
    "busy_frame",
    "connect",
    "connect_retrying",
    "pack_bytes",
    "unpack_bytes",
]

PROTOCOL = "launch-agent/serve/1"
SEND_TIMEOUT = 60.0  # a peer that takes no data for this long is treated as gone
RETRY_FOR = 6.0  # seconds a client keeps trying while node 0 is crowded or slow to answer
_NONCE = 16
_MISMATCH_HINT = (
    "this shell must hold the same AGENT_SECRET / ~/.config/launch-agent/secret as the agents "
    "(export the one the allocation's sbatch script or salloc shell uses)"
)


def accept(
    sock: socket.socket, auth_key: bytes, timeout: float, send_timeout: float | None = SEND_TIMEOUT
) -> Channel:
    """Server side of the handshake on an accepted socket, finished within `timeout` seconds.
    On any failure the socket is closed and WireError raised (REFUSED: not our client)."""
    peer = _peer_name(sock)
    deadline = time.monotonic() + timeout
    try:
        _tune(sock)
        reader = FrameReader(sock, peer)
        server_nonce = os.urandom(_NONCE)
        send_plain(sock, {"hello": PROTOCOL, "nonce": server_nonce.hex()}, deadline, peer)
        reply = recv_plain(reader, deadline, peer, timeout)
        client_nonce = _hex(reply.get("nonce"), _NONCE)
        proof = _hex(reply.get("proof"), 32)
        if client_nonce is None or proof is None:
            raise WireError(
                f"refused a connection from {peer}: it is not a launch-agent client",
                ExitCode.REFUSED,
            )
        if not hmac.compare_digest(proof, _mac(auth_key, b"client", server_nonce, client_nonce)):
            with contextlib.suppress(WireError):
                send_plain(sock, {"error": "secret mismatch"}, deadline, peer)
            raise WireError(
                f"refused a client at {peer}: it does not hold the job's secret",
                ExitCode.REFUSED,
            )
        proof = _mac(auth_key, b"server", server_nonce, client_nonce)
        send_plain(sock, {"proof": proof.hex()}, deadline, peer)
        key = _mac(auth_key, b"session", server_nonce, client_nonce)
        return Channel(sock, key, SERVER, peer, send_timeout)
    except BaseException:
        sock.close()
        raise


def connect(
    host: str,
    port: int,
    auth_key: bytes,
    timeout: float,
    send_timeout: float | None = SEND_TIMEOUT,
) -> Channel:
    """Client side: connect and shake hands within `timeout` seconds. WireError RENDEZVOUS when
    nothing answers there, REFUSED when the server refuses our secret or cannot prove its own."""
    peer = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror as exc:  # a name that does not resolve: trying again will not help
        raise WireError(f"cannot connect to {peer}: {exc.strerror}", seen="unknown host") from None
    except UnicodeError:  # a name IDNA cannot encode (a label over 63 characters, a surrogate)
        raise WireError(
            f"cannot connect to {peer!r}: not a host name or address", seen="unknown host"
        ) from None
    except OSError as exc:
        timed_out = isinstance(exc, TimeoutError)
        why = "timed out" if timed_out else (exc.strerror or str(exc))
        seen = "timed out" if timed_out else "refused" if _refused(exc) else ""
        raise WireError(f"cannot connect to {peer}: {why}", seen=seen) from None
    try:
        _tune(sock)
        reader = FrameReader(sock, peer)
        hello = _greeting(reader, peer, deadline, timeout)
        server_nonce = _hex(hello.get("nonce"), _NONCE)
        if hello.get("hello") != PROTOCOL or server_nonce is None:
            raise WireError(_not_ours(peer, hello.get("hello")), ExitCode.REFUSED)
        client_nonce = os.urandom(_NONCE)
        proof = _mac(auth_key, b"client", server_nonce, client_nonce)
        send_plain(sock, {"nonce": client_nonce.hex(), "proof": proof.hex()}, deadline, peer)
        reply = recv_plain(reader, deadline, peer, timeout)
        if "error" in reply:
            raise WireError(
                f"node 0's agent refused us: secret mismatch (at {peer}); {_MISMATCH_HINT}",
                ExitCode.REFUSED,
            )
        theirs = _hex(reply.get("proof"), 32)
        expected = _mac(auth_key, b"server", server_nonce, client_nonce)
        if theirs is None or not hmac.compare_digest(theirs, expected):
            raise WireError(
                f"{peer} did not prove it holds the job's secret: it is not our resident agent "
                "(another process on that port?); refusing to talk to it",
                ExitCode.REFUSED,
            )
        key = _mac(auth_key, b"session", server_nonce, client_nonce)
        return Channel(sock, key, CLIENT, peer, send_timeout)
    except BaseException:
        sock.close()
        raise


def connect_retrying(
    host: str, port: int, auth_key: bytes, timeout: float, retry_for: float = RETRY_FOR
) -> Channel:
    """`connect`, tried again for `retry_for` seconds while node 0 turns us away (crowded),
    does not answer in time or refuses the connection (restarting?); a refused secret is
    final. The last error says what was seen and how often."""
    deadline = time.monotonic() + retry_for
    pause, tries = 0.05, 0
    while True:
        tries += 1
        try:
            return connect(host, port, auth_key, timeout)
        except WireError as exc:
            final = exc.code == ExitCode.REFUSED or exc.seen == "unknown host"
            if final or time.monotonic() + pause > deadline:
                if tries > 1:
                    exc.message = f"{exc.message} ({tries} tries over {retry_for:g}s)"
                raise
        time.sleep(pause)  # a backoff between tries, not a synchronisation
        pause = min(pause * 2, 0.5)


def busy_frame(why: str) -> bytes:
    """What node 0 sends a peer it turns away before any handshake, so its client can say so."""
    body = encode_json({"hello": PROTOCOL, "busy": why})
    return HEADER.pack(len(body)) + body


def _greeting(reader: FrameReader, peer: str, deadline: float, timeout: float) -> dict:
    try:
        frame = reader.read(PLAIN_LIMIT, deadline)
    except TimeoutError:
        raise WireError(f"{peer} sent no greeting within {timeout:g}s", seen="timed out") from None
    except WireError as exc:
        if exc.code == ExitCode.REFUSED:
            raise
        frame = None
    if frame is None:  # closed at once: an agent turning peers away (or one going down)
        raise WireError(f"{peer} closed the connection before its greeting", seen="crowded")
    hello = decode_json(frame, peer)
    if hello.get("busy") and hello.get("hello") == PROTOCOL:
        why = str(hello["busy"])[:200]
        raise WireError(f"node 0's agent at {peer} turned us away: {why}", seen="crowded")
    return hello


def _refused(exc: OSError) -> bool:
    return isinstance(exc, ConnectionRefusedError) or exc.errno == errno.ECONNREFUSED


def _not_ours(peer: str, greeting: object) -> str:
    if isinstance(greeting, str) and greeting.startswith("launch-agent/serve/"):
        return (
            f"the agent at {peer} speaks {greeting[:40]}, this client {PROTOCOL}: use the same "
            "launch-agent version for the resident agents and the client"
        )
    return f"{peer} is not a launch-agent resident agent (unexpected greeting); refusing it"


def _mac(key: bytes, label: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(key, label + server_nonce + client_nonce, hashlib.sha256).digest()


def _hex(value: object, size: int) -> bytes | None:
    """`size` bytes from exactly 2*size hex digits, else None."""
    if not isinstance(value, str) or len(value) != 2 * size:
        return None
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        return None
    return raw if len(raw) == size else None  # fromhex skips spaces: insist on the length


def _peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "an unknown peer"
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _tune(sock: socket.socket) -> None:
    """Small messages go out at once; keepalives notice a peer host that died without a word
    (a run can be silent for hours, and recv(None) would otherwise wait for ever)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
