"""The job store of a one-agent job: a dict in this process, so a single node never imports torch.

With one agent there is nobody to meet; the agent's own threads (abort watcher, heartbeat) share
this object. Same calls and errors as agent.store_client.StoreClient.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from agent.node.store_client import StoreTimeout


class LocalStore:
    def __init__(self) -> None:
        self._values: dict[str, bytes] = {}
        self._changed = threading.Condition()

    def set(self, key: str, value: bytes | str) -> None:
        with self._changed:
            self._values[key] = value.encode() if isinstance(value, str) else bytes(value)
            self._changed.notify_all()

    def get(self, key: str) -> bytes:
        self.wait([key], None)
        return self._values[key]

    def add(self, key: str, amount: int) -> int:
        with self._changed:
            value = int(self._values.get(key, b"0")) + amount
            self._values[key] = str(value).encode()
            self._changed.notify_all()
            return value

    def check(self, keys: Sequence[str]) -> bool:
        with self._changed:
            return all(k in self._values for k in keys)

    def wait(self, keys: Sequence[str], timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not all(k in self._values for k in keys):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise StoreTimeout(f"wait timeout after {timeout:g}s")
                self._changed.wait(left)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        self.wait(keys, None)
        return [self._values[k] for k in keys]

    def close(self) -> None:
        pass
