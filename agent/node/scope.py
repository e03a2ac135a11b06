"""One phase's keys in the job store (the membership, a run, an attempt) and its failure channel.

A failure can never be lost: a reporter takes a sequence number, writes its record under its
own key, and only then sets the phase's wake keys (the abort key every watcher blocks on, the
barrier and plan keys others may be waiting for). A reporter that dies half-way leaves a gap in
the sequence, never a phase nobody can end: node 0 reports the lost node itself, and the root
cause is the existing record with the lowest sequence number.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any

from agent.errors import AgentError, ExitCode, PeerFailed
from agent.node.store import Store
from agent.node.trust import JobKeys, Refused

log = logging.getLogger("agent")


# torch's TCPStore refuses values over 8 MiB (MAX_PAYLOAD_LEN) by closing the connection.
VALUE_LIMIT = 8 * 1024 * 1024 - 4096


class TooLarge(AgentError):
    def __init__(self, name: str, size: int) -> None:
        super().__init__(
            f"the {name} record is {size / 2**20:.1f} MiB once sealed; the job store carries at "
            f"most {VALUE_LIMIT / 2**20:.1f} MiB per value"
        )
        self.size = size


class Scope:
    """Keys under `<namespace><prefix>/`; `index` is this agent's index (its own keys)."""

    def __init__(
        self, store: Store, prefix: str, index: int, keys: JobKeys, wakes: Sequence[str] = ()
    ) -> None:
        self.store, self.prefix, self.index, self.keys = store, prefix, index, keys
        self.wakes = tuple(wakes)  # names of keys that waiters of this phase may block on

    def key(self, *parts: object) -> str:
        return self.store.key(self.prefix, *parts)

    def on(self, store: Store) -> Scope:
        """The same scope over another connection (for a thread of its own)."""
        return Scope(store, self.prefix, self.index, self.keys, self.wakes)

    # -- records --------------------------------------------------------------------------
    def put(self, name: str, record: dict[str, Any]) -> None:
        key = self.key(name)
        sealed = self.keys.seal(record, key)
        if len(sealed) > VALUE_LIMIT and not self.store.local:  # torch would drop the connection
            raise TooLarge(name, len(sealed))
        self.store.set_bytes(key, sealed)

    def get(self, name: str, what: str, present: bool = False) -> dict[str, Any]:
        """The record, waiting for it (`present`: known to exist, one round trip less)."""
        key = self.key(name)
        return self.keys.unseal(self.store.get_bytes(key, present), key, what)

    def get_if(self, name: str, what: str) -> dict[str, Any] | None:
        return self.get(name, what, present=True) if self.store.exists(self.key(name)) else None

    def get_all(self, names: Sequence[str], what: str) -> list[dict[str, Any]]:
        """Several records in one round trip (waits until every one exists)."""
        keys = [self.key(name) for name in names]
        return [
            self.keys.unseal(data, key, what)
            for key, data in zip(keys, self.store.multi_get(keys), strict=True)
        ]

    # -- failures -------------------------------------------------------------------------
    def report(self, record: dict[str, Any], slot: object = None) -> dict[str, Any]:
        """Publish a failure of this phase; returns it with its sequence number (1: first)."""
        seq = self.store.add(self.key("fail-seq"))
        record = {**record, "seq": seq}
        try:
            self.put(f"fail/{self.index if slot is None else slot}", record)
        except TooLarge:  # never lose a failure to its size: keep what names it
            record = {k: v for k, v in record.items() if k not in ("stderr_tail", "traceback")}
            record["note"] = "details too large for the store: see the rank's files"
            self.put(f"fail/{self.index if slot is None else slot}", record)
        self.put("abort", record)
        for name in self.wakes:
            self.store.set_bytes(self.key(name), b"")
        return record

    def failure(self) -> dict[str, Any] | None:
        """The phase's latest failure (the abort key), None if there is none (or if what is
        there does not open with the job's key: logged, and ignored)."""
        try:
            record = self.get_if("abort", "abort record")
        except Refused as exc:
            log.error("%s", exc.message)
            return None
        return None if record is None or record.get("kind") == "closed" else record

    def failure_of(self, slot: object) -> dict[str, Any] | None:
        return self.get_if(f"fail/{slot}", "failure record")

    def close(self) -> None:
        """Wakes every watcher of this phase with a record that means: over, no failure."""
        self.put("abort", {"kind": "closed"})

    def watch(
        self,
        stop: threading.Event,
        on_abort: Callable[[dict[str, Any]], None],
        on_lost: Callable[[str], None],
    ) -> threading.Thread:
        """A thread blocked on the abort key over its own connection."""
        watcher = self.on(self.store.another_client())

        def run() -> None:
            try:
                while not stop.is_set():
                    if watcher.store.wait([watcher.key("abort")], 3600.0):
                        record = watcher.get("abort", "abort record", present=True)
                        if record.get("kind") != "closed":
                            on_abort(record)
                        return
            except Refused as exc:  # not ours: logged and ignored, never a reason to stop
                log.error("%s; no longer watching for aborts", exc.message)
            except Exception as exc:  # the store went away: node 0 is gone
                if not stop.is_set():
                    end = watcher.store.endpoint
                    on_lost(f"lost the job store at {end.addr}:{end.port} ({exc})")

        thread = threading.Thread(target=run, name=f"watch-{self.prefix}", daemon=True)
        thread.start()
        return thread

    # -- barrier --------------------------------------------------------------------------
    def barrier(
        self,
        agents: int,
        timeout: float,
        names: Sequence[str],
        note: dict[str, Any] | None = None,
        absent: Collection[int] = (),
        doing: str = "to join",
    ) -> None:
        """Every agent arrives once (indexes are claimed, so the count is of distinct agents),
        leaving a sealed `note` under `in/<index>`; `absent` agents (lost before this phase) are
        not waited for. A failure reported in this phase wakes it at once; a timeout names who
        never came. `doing`: what the others are still doing, for the user ("to join")."""
        s = self.store
        self.put(f"in/{self.index}", note or {})
        count = s.add(self.key("arrived"))
        expected = agents - len(absent)
        if count == expected:
            s.set_bytes(self.key("done"), b"")
        else:
            log.info("waiting for %d more agent(s) %s", expected - count, doing)
        arrived = s.wait([self.key("done")], timeout)
        failure = self.failure()
        if failure is not None:
            raise PeerFailed(could_not(failure, names), refused=failure.get("kind") == "secret")
        if not arrived:
            missing = [
                names[i]
                for i in range(agents)
                if i not in absent and not s.exists(self.key("in", i))
            ]
            shown = ", ".join(missing[:8]) + (
                f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            )
            raise AgentError(
                f"rendezvous timed out after {timeout:g}s: {shown} never arrived "
                f"({expected - len(missing)}/{expected} agents joined); check that srun "
                "started an agent on every node, or raise --rdzv-timeout",
                ExitCode.RENDEZVOUS,
            )


def could_not(failure: dict[str, Any], names: Sequence[str]) -> str:
    who = failure.get("agent", failure.get("node_rank", 0))
    name = names[who] if isinstance(who, int) and 0 <= who < len(names) else failure.get("host")
    return f"{name} could not join: {failure.get('how')}"
