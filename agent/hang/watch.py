"""--hang-timeout: the job hangs when no rank on any node made progress for T seconds.

Each agent tells only its changes of state: it adds 1 to the attempt's `quiet` counter when its
own ranks have been quiet for T, and takes it back if they speak again. Node 0 reads that one
counter on its own ticks; when every agent is quiet it has every node dump its ranks' stacks,
writes them to stacks-a<attempt>.txt, and returns the failure record that tears the job down
(the hang is its root cause; the lone rank whose stack differs is named first).
A node with a rank paused in pdb (agent.pause) is not quiet, nor for T seconds after it resumes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from agent.hang.desk import StackDesk
from agent.node.scope import Scope

log = logging.getLogger("agent")
STACKS_IN_RECORD = 32 << 10  # characters of the collated stacks kept in the failure record


class HangWatch:
    def __init__(
        self,
        scope: Scope,
        desk: StackDesk,
        *,
        timeout: float,
        leader: bool,
        log_dir: str,
        attempt: int,
        node_rank: int,
        host: str,
        paused: Callable[[], bool] = lambda: False,  # a rank of this node stopped in pdb
    ) -> None:
        self.scope, self.desk, self.timeout, self.leader = scope, desk, timeout, leader
        self.log_dir, self.attempt, self.node_rank, self.host = log_dir, attempt, node_rank, host
        self.quiet = False
        self.fired = False
        self.paused = paused
        self._paused_at: float | None = None  # when a rank of this node was last seen paused

    def tick(self, quiet_for: float) -> dict[str, Any] | None:
        """This node's ranks have been quiet for `quiet_for` s; a failure record if the job hangs."""
        if self.timeout <= 0 or self.fired:
            return None
        now = time.monotonic()
        if self.paused():  # a paused rank is not a hang, nor are the ranks that wait for it
            self._paused_at = now
        if self._paused_at is not None:
            quiet_for = min(quiet_for, now - self._paused_at)
        quiet = quiet_for >= self.timeout
        counter = self.scope.key("quiet")
        if quiet != self.quiet:
            self.scope.store.add(counter, 1 if quiet else -1)
            self.quiet = quiet
        if not (self.leader and quiet) or self.scope.store.add(counter, 0) < len(self.desk.nodes):
            return None
        self.fired = True
        return self._hang()

    def _hang(self) -> dict[str, Any]:
        from agent.hang.collate import collate, headline, render

        log.error("no rank made progress for %g s: capturing every rank's stack", self.timeout)
        groups = collate(self.desk.ask(native=False))
        text = render(groups)
        path = os.path.join(self.log_dir, f"stacks-a{self.attempt}.txt")
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            log.error("cannot write %s: %s", path, exc.strerror or exc)
            path = ""
        how = f"hang: no progress for {self.timeout:g} s; {headline(groups)}"
        record = {
            "kind": "hang",
            "node_rank": self.node_rank,
            "host": self.host,
            "how": how,
            "time": time.time(),
            "stacks": text[:STACKS_IN_RECORD],
        }
        if path:
            record["stacks_file"] = path
        return record
