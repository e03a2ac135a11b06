"""The c10d TCPStore wire format (torch 2.x, little-endian) our torch-free client speaks.

On connect VALIDATE + magic, then PING + nonce echoed back; each query is one type byte followed
by strings and byte vectors as u64 length + bytes, counts as u64, integers as i64. Keys carry
torch's "/" prefix, so our client and torch's own clients see the same keys.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Sequence

MAGIC = 0x3C85F7CE
VALIDATE, SET, GET, ADD, CHECK, WAIT, MULTI_GET, CANCEL_WAIT, PING = 0, 1, 3, 4, 5, 6, 10, 12, 13
READY, STOP_WAITING, WAIT_CANCELED = 0, 0, 1
PREFIX = b"/"  # what torch's Python TCPStore puts before every key


def add_request(key: str, amount: int) -> bytes:
    return bytes([ADD]) + blob(key_bytes(key)) + struct.pack("<q", amount)


def transient(exc: OSError) -> bool:
    """Worth retrying until the deadline: node 0 not listening yet, or its host not up yet."""
    return isinstance(
        exc, (ConnectionRefusedError, ConnectionResetError, TimeoutError)
    ) or exc.errno in (
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.EHOSTDOWN,
    )


def key_bytes(key: str) -> bytes:
    return PREFIX + key.encode()


def blob(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def keys_bytes(keys: Sequence[str]) -> bytes:
    return struct.pack("<Q", len(keys)) + b"".join(blob(key_bytes(k)) for k in keys)
