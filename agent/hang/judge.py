"""--hang-timeout, node 0's part: the job hangs when every rank still running, on every node,
has made no progress for T seconds (agent.hang.standing). Ranks that exited are done, not quiet.

At the first look where the job is still it only suspects; it judges at a later look, once every
quiet node has written a newer quiet record (they re-post every QUIET_REPOST s), so an old
record written back cannot fake a hang. Then every node dumps its live ranks' stacks, they go to
stacks-a<attempt>.txt, and the failure record names the ranks still running (the odd stack
first) and those that had exited.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agent.hang.collectives import collective_view, render_view
from agent.hang.desk import StackDesk
from agent.hang.standing import Ended, Standing, Stillness, confirmed, stillness

log = logging.getLogger("agent")
STACKS_IN_RECORD = 32 << 10  # characters of the collated stacks kept in the failure record


class HangJudge:
    def __init__(
        self,
        desk: StackDesk,
        *,
        timeout: float,
        log_dir: str,
        attempt: int,
        node_rank: int,
        host: str,
    ) -> None:
        self.desk, self.timeout, self.log_dir, self.attempt = desk, timeout, log_dir, attempt
        self.node_rank, self.host = node_rank, host
        self.fired = False
        self._suspected: Mapping[int, int] | None = None

    def look(self, standings: Mapping[int, Standing]) -> dict[str, Any] | None:
        """A failure record when the job hangs (once); None otherwise."""
        if self.fired or self.timeout <= 0:
            return None
        now: Stillness = stillness(self.desk.nodes, standings)
        if not now.still:
            self._suspected = None
            return None
        if self._suspected is None or not set(now.quiet) <= set(self._suspected):
            self._suspected = now.quiet  # newly quiet nodes: confirm on their next records
            return None
        if not confirmed(self._suspected, now.quiet):
            return None
        self.fired = True
        return self._hang([standings[a] for a in self.desk.nodes])

    def _hang(self, standings: Sequence[Standing]) -> dict[str, Any]:
        from agent.hang.collate import collate, headline, render

        running = sum(len(s.live) for s in standings)
        log.error(
            "no progress for %g s from the %d rank(s) still running: capturing their stacks",
            self.timeout,
            running,
        )
        stacks = self.desk.ask(native=False)
        groups = collate(stacks)
        ended = Ended.of(standings)
        view = collective_view(stacks, groups, {e.rank: e.returncode for e in ended.ranks})
        text = render_view(view) + render(groups)
        path = os.path.join(self.log_dir, f"stacks-a{self.attempt}.txt")
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            log.error("cannot write %s: %s", path, exc.strerror or exc)
            path = ""
        noun = "rank" if running == 1 else "ranks"
        how = f"hang: no progress for {self.timeout:g} s from the {running} {noun} still running"
        parts = [how, *view[:1], headline(groups), ended.clause()]
        record = {
            "kind": "hang",
            "node_rank": self.node_rank,
            "host": self.host,
            "how": "; ".join(p for p in parts if p),
            "time": time.time(),
            "stacks": text[:STACKS_IN_RECORD],
        }
        if path:
            record["stacks_file"] = path
        return record
