"""Who is alive: claiming a node index, the join barrier, heartbeats, lost and departed peers.

Every agent does O(1) store operations to join; only node 0 touches O(N) keys, and only in one
multi-key call per heartbeat tick. No compare-and-set loops, no polling sleeps: waits block.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from agent.errors import AgentError, ExitCode
from agent.node.scope import Scope
from agent.node.store import Store
from agent.node.trust import JobKeys


class Membership:
    def __init__(
        self,
        store: Store,
        agents: int,
        index: int,
        names: Sequence[str],
        keys: JobKeys,
    ) -> None:
        self.store = store
        self.agents = agents
        self.index = index
        self.names = names  # "node 3 (n4)" per agent, for messages
        self.scope = Scope(store, "m", index, keys, wakes=("done",))

    def claim(self, host: str) -> None:
        """Take this node index for the job, once: a second agent with the same one is refused
        before it writes anything else, so the job that holds the index is left untouched."""
        if self.store.add(self.scope.key("claim", self.index)) != 1:
            raise AgentError(
                f"{self.names[self.index]} is already taken in this job (job {self.store.ns!r}): "
                "another agent with the same job, step and node index is running; start one "
                "agent per node (srun --ntasks-per-node=1), or give this job its own --job-id",
                ExitCode.RENDEZVOUS,
            )
        self.host = host

    def join(self, timeout: float) -> None:
        self.scope.barrier(self.agents, timeout, self.names, {"host": self.host})

    def hosts(self) -> list[str]:
        """Every agent's host as it announced itself when joining (after the barrier)."""
        notes = self.scope.get_all([f"in/{i}" for i in range(self.agents)], "host announcement")
        return [str(note.get("host", "")) for note in notes]

    def leaving(self, why: str | None = None) -> None:
        """Our silence from now on is a departure (why=None: an orderly one), not a loss."""
        self.scope.put(f"gone/{self.index}", {"why": why})

    def heartbeat(
        self,
        stop: threading.Event,
        interval: float,
        lost_after: float,
        on_lost: Callable[[str], None],
        on_silent: Callable[[int], None] | None,
    ) -> threading.Thread:
        """Tick our counter; node 0 (`on_silent` given) also notices a peer that stopped."""
        beat = self.store.another_client(op_timeout=lost_after)  # a silent store counts as lost
        keys = [beat.key("hb", i) for i in range(self.agents)]

        def run() -> None:
            seen: dict[int, tuple[int, float]] = {}
            reported: set[int] = set()
            try:
                while not stop.wait(interval):
                    beat.add(keys[self.index])
                    if on_silent is None:
                        continue
                    now = time.monotonic()
                    for i, count in enumerate(beat.multi_get_ints(keys)):
                        if i == self.index or i in reported:
                            continue
                        last = seen.get(i)
                        if last is None or count != last[0]:
                            seen[i] = (count, now)
                        elif now - last[1] > lost_after:
                            reported.add(i)
                            on_silent(i)
            except Exception as exc:
                if not stop.is_set():
                    on_lost(
                        f"lost the job store at {beat.endpoint.addr}:{beat.endpoint.port} ({exc})"
                    )

        beat.add(keys[self.index])  # ours exists before node 0 reads every counter
        thread = threading.Thread(target=run, name="heartbeat", daemon=True)
        thread.start()
        return thread
