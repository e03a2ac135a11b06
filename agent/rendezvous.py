"""The agents' protocol over the store: join, payload, abort, heartbeats, results, verdict.

Every agent does O(1) operations per step; only node 0 touches O(N) keys, and only in one
multi-key call (results, heartbeats). No compare-and-set loops, no polling sleeps: waits block.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from agent.errors import AgentError, ExitCode
from agent.store import Store


class Rendezvous:
    def __init__(
        self, store: Store, agents: int, index: int, names: Sequence[str], seal, unseal
    ) -> None:
        self.store = store
        self.agents = agents
        self.index = index
        self.names = names  # "node 3 (n4)" per agent, for messages
        self._seal = seal  # dict -> bytes (HMAC-signed)
        self._unseal = unseal  # (bytes, what) -> dict, raises AgentError(REFUSED)

    # -- joining --------------------------------------------------------------------------
    def arrive(self, attempt: int, timeout: float, host: str = "") -> None:
        """Barrier for one attempt; a node that never comes is named in the error."""
        s = self.store
        s.set_json(s.key(f"a{attempt}", "joined", self.index), host)
        if s.add(s.key(f"a{attempt}", "arrived")) == self.agents:
            s.set_json(s.key(f"a{attempt}", "all-arrived"), 1)
        arrived = s.wait([s.key(f"a{attempt}", "all-arrived")], timeout)
        failure = self.read_failure(attempt)
        if failure is not None and failure.get("kind") in ("setup", "signal"):
            # Someone could not join (bad input on its node, its own timeout): it woke us early.
            self._leave_failed(attempt)
            raise AgentError(
                f"{self.names[failure.get('agent', failure.get('node_rank', 0))]} could not join: {failure.get('how')}",
                ExitCode.RENDEZVOUS,
            )
        if not arrived:
            self._leave_failed(attempt)
            missing = [
                self.names[i]
                for i in range(self.agents)
                if not s.exists(s.key(f"a{attempt}", "joined", i))
            ]
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise AgentError(
                f"rendezvous timed out after {timeout:g}s: {shown} never arrived "
                f"({self.agents - len(missing)}/{self.agents} agents joined); check that srun "
                "started an agent on every node, or raise --rdzv-timeout",
                ExitCode.RENDEZVOUS,
            )

    def _leave_failed(self, attempt: int) -> None:
        """Tell node 0 we have read what we need, so it may stop serving the store."""
        if self.index == 0:
            return
        s = self.store
        if s.add(s.key(f"a{attempt}", "left")) >= s.add(s.key(f"a{attempt}", "arrived"), 0) - 1:
            s.set_json(s.key(f"a{attempt}", "all-left"), 1)

    def linger(self, attempt: int, timeout: float = 5.0) -> None:
        """Node 0, failing to join: keep the store up until every joined agent has read why."""
        s = self.store
        if s.add(s.key(f"a{attempt}", "arrived"), 0) > 1:
            s.wait([s.key(f"a{attempt}", "all-left")], timeout)

    def hosts(self, attempt: int = 0) -> list[str]:
        """Every agent's host as it announced itself when joining (node 0, after the barrier)."""
        keys = [self.store.key(f"a{attempt}", "joined", i) for i in range(self.agents)]
        return [json.loads(bytes(v) or b'""') for v in self.store.multi_get(keys)]

    def publish_payload(self, payload: dict[str, Any]) -> None:
        self.store.set_bytes(self.store.key("payload"), self._seal(payload))

    def fetch_payload(self) -> dict[str, Any]:
        return self._unseal(self.store.get_bytes(self.store.key("payload")), "config payload")

    def publish_worker_port(self, attempt: int, port: int) -> None:
        self.store.set_json(self.store.key(f"a{attempt}", "worker-port"), port)

    def worker_port(self, attempt: int) -> int:
        return int(self.store.get_json(self.store.key(f"a{attempt}", "worker-port")))

    # -- failure --------------------------------------------------------------------------
    def report_failure(self, attempt: int, record: dict[str, Any]) -> bool:
        """Publish the job's first failure; True when this call was the first."""
        s = self.store
        first = s.add(s.key(f"a{attempt}", "abort-count")) == 1
        if first:
            s.set_bytes(s.key(f"a{attempt}", "abort"), self._seal(record))
        return first

    def read_failure(self, attempt: int) -> dict[str, Any] | None:
        key = self.store.key(f"a{attempt}", "abort")
        if not self.store.exists(key):
            return None
        return self._unseal(self.store.get_bytes(key), "abort record")

    def watch_failure(
        self, attempt: int, stop: threading.Event, on_abort: Callable[[dict[str, Any]], None],
        on_lost: Callable[[str], None],
    ) -> threading.Thread:
        """A thread blocked on the abort key (its own connection). Node 0 writes a "closed" record
        when the job ends, which wakes every watcher; a dead store wakes it with an error."""
        watcher = self.store.another_client()
        key = watcher.key(f"a{attempt}", "abort")

        def run() -> None:
            try:
                while not stop.is_set():
                    if watcher.wait([key], 3600.0):
                        record = self._unseal(watcher.get_bytes(key), "abort record")
                        if record.get("kind") != "closed":
                            on_abort(record)
                        return
            except AgentError as exc:
                on_abort({"refused": exc.message})
            except Exception as exc:  # the store went away: node 0 is gone
                if not stop.is_set():
                    on_lost(f"lost the job store at {watcher.endpoint.addr}:{watcher.endpoint.port} ({exc})")

        thread = threading.Thread(target=run, name="abort-watch", daemon=True)
        thread.start()
        return thread

    # -- heartbeats -----------------------------------------------------------------------
    def heartbeat(
        self, stop: threading.Event, interval: float, lost_after: float,
        on_lost: Callable[[str], None], on_peer_lost: Callable[[int], None] | None,
    ) -> threading.Thread:
        """Tick our counter; node 0 also notices a peer whose counter stopped moving."""
        beat = self.store.another_client(op_timeout=lost_after)  # a silent store counts as lost
        keys = [beat.key("hb", i) for i in range(self.agents)]
        gone = [beat.key("gone", i) for i in range(self.agents)]

        def run() -> None:
            seen: dict[int, tuple[int, float]] = {}
            reported: set[int] = set()
            try:
                while not stop.wait(interval):
                    beat.add(keys[self.index])
                    if on_peer_lost is None:
                        continue
                    now = time.monotonic()
                    counts = beat.multi_get_ints(keys)
                    for i, count in enumerate(counts):
                        if i == self.index or i in reported:
                            continue
                        last = seen.get(i)
                        if last is None or count != last[0]:
                            seen[i] = (count, now)
                        elif now - last[1] > lost_after and not beat.exists(gone[i]):
                            reported.add(i)
                            on_peer_lost(i)
            except Exception as exc:
                if not stop.is_set():
                    on_lost(f"lost the job store at {beat.endpoint.addr}:{beat.endpoint.port} ({exc})")

        beat.add(keys[self.index])
        thread = threading.Thread(target=run, name="heartbeat", daemon=True)
        thread.start()
        return thread

    def leaving(self) -> None:
        """Tell node 0 that our silence from now on is an orderly exit, not a lost node."""
        self.store.set_json(self.store.key("gone", self.index), 1)

    # -- results and verdict --------------------------------------------------------------
    def publish_result(self, attempt: int, result: dict[str, Any]) -> None:
        self.store.set_json(self.store.key(f"a{attempt}", "result", self.index), result)

    def mark_lost(self, attempt: int, index: int, result: dict[str, Any]) -> None:
        """Node 0 writes the result of a node that died, so collecting does not wait for it."""
        key = self.store.key(f"a{attempt}", "result", index)
        if not self.store.exists(key):
            self.store.set_json(key, result)

    def collect_results(self, attempt: int) -> list[dict[str, Any]]:
        keys = [self.store.key(f"a{attempt}", "result", i) for i in range(self.agents)]
        self.store.wait(keys, None)
        return [self.store.get_json(k) for k in keys]

    def publish_verdict(self, attempt: int, verdict: dict[str, Any]) -> None:
        if not verdict.get("restart"):
            # Wakes every agent's abort watcher at once, so nobody waits out a watch slice.
            self.report_failure(attempt, {"kind": "closed"})
        self.store.set_json(self.store.key(f"a{attempt}", "verdict"), verdict)

    def wait_verdict(self, attempt: int) -> dict[str, Any]:
        key = self.store.key(f"a{attempt}", "verdict")
        self.store.wait([key], None)
        verdict = self.store.get_json(key)
        if self.store.add(self.store.key(f"a{attempt}", "acks")) == verdict.get("acks", 0):
            self.store.set_json(self.store.key(f"a{attempt}", "all-acked"), 1)
        return verdict

    def wait_acks(self, attempt: int, expected: int, timeout: float) -> None:
        """Node 0 lingers until the others have read the verdict (its store serves them)."""
        if expected > 0:
            self.store.wait([self.store.key(f"a{attempt}", "all-acked")], timeout)
