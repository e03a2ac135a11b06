"""The job's keys, derived from the shared secret: unguessable store names and sealed records.

Anyone on the cluster network can reach node 0's store and knows the job id and our source, so
nothing may depend on a key name they can compute. From the secret and the job identity, HKDF
(from `cryptography`) derives: the namespace every key lives under, an AES-GCM key that seals
every record (confidential and authenticated), a public key-check value that lets agents
with different secrets notice it without revealing anything, and the key that clients of node
0's resident endpoint prove they hold (`agent.control.wire`). Each record is bound to the full
store key it was written under (the AEAD's associated data): a genuine record copied to another
key, attempt, run or job does not open.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from agent.errors import AgentError, ExitCode

_VERSION = b"\x01"
_NONCE = 12
_HINT = (
    "every node must share the same AGENT_SECRET (or the same ~/.config/launch-agent/secret); "
    "the sbatch script from `python -m bootstrap` exports one"
)


@dataclass(frozen=True)
class JobKeys:
    namespace: str  # "la/<32 hex>/": derived from the secret, job and step
    check_value: str  # public: equal for agents that hold the same secret, reveals nothing
    aead_key: bytes
    client_key: bytes  # authenticates clients of node 0's resident endpoint (agent.control.wire)
    naming_key: bytes  # names only the job's agents can compute (`copy_name`)
    # the cipher, keyed once: every beat, standing and note is sealed or opened with it
    aead: AESGCM = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "aead", AESGCM(self.aead_key))

    @classmethod
    def derive(cls, secret: bytes, job_id: str, step_id: str) -> JobKeys:
        if not isinstance(secret, bytes) or not secret:
            raise AgentError(
                "the job secret is empty; set AGENT_SECRET or remove it to use the file"
            )
        job = f"{job_id or 'local'}\0{step_id or '0'}".encode()
        # HKDF-Expand output is a stream: growing it to 96 bytes leaves the first 64 (and so every
        # existing name and record key) unchanged, and the client key independent of both.
        okm = HKDF(hashes.SHA256(), 96, salt=b"launch-agent/v1", info=job).derive(secret)
        naming, aead_key, client_key = okm[:32], okm[32:64], okm[64:96]
        name = hmac.new(naming, b"namespace", hashlib.sha256).hexdigest()[:32]
        check = hmac.new(naming, b"key-check", hashlib.sha256).hexdigest()[:16]
        return cls(f"la/{name}/", check, aead_key, client_key, naming)

    def copy_name(self, key: str, number: int) -> str:
        """Where the `number`-th copy of the record at `key` goes when its writer puts it again
        (agent.node.scope): a name an outsider cannot compute, so cannot write before it exists;
        a reader blocked on it is woken the moment it is written, before an outsider listing
        the keys can garble it (they can garble the key everyone knows faster than it is read)."""
        tag = hmac.new(self.naming_key, f"{key}\0{number}".encode(), hashlib.sha256)
        return f"{key}/copy/{tag.hexdigest()[:24]}"

    def seal(self, obj: Mapping[str, Any], key: str) -> bytes:
        """AES-GCM of the record's JSON, bound to `key` (the full store key)."""
        try:
            body = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise AgentError(f"cannot seal a record that is not plain JSON: {exc}") from None
        nonce = os.urandom(_NONCE)
        return _VERSION + nonce + self.aead.encrypt(nonce, body.encode(), key.encode())

    def unseal(self, data: bytes, key: str, what: str) -> dict[str, Any]:
        """The record sealed under `key`; anything else (forged, altered, moved) is refused."""
        data = bytes(data)
        if len(data) < 1 + _NONCE + 16 or data[:1] != _VERSION:
            raise Refused(f"refusing {what} at {key}: it is not a sealed launch-agent record")
        nonce, sealed = data[1 : 1 + _NONCE], data[1 + _NONCE :]
        try:
            body = self.aead.decrypt(nonce, sealed, key.encode())
        except InvalidTag:
            raise Refused(
                f"refusing {what} at {key}: it does not open with this job's key (forged, altered, "
                f"or moved from another key); {_HINT}"
            ) from None
        obj = json.loads(body)
        if not isinstance(obj, dict):
            raise Refused(f"refusing {what} at {key}: the sealed body is not a JSON object")
        return obj


class Refused(AgentError):
    """A store value that fails authentication: logged and ignored where the job can go on."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.REFUSED)


def mismatch_message(ours: str, theirs: str, who: str) -> str:
    return f"secret mismatch: {who} holds another secret (key check {theirs}, ours {ours}); {_HINT}"
