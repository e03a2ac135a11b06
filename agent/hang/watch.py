"""This node's share of the job's hang and exit judging: its standing (agent.hang.standing).

The supervisor tells it when the node's ranks started and when each exits, and, once a tick,
how long the live ones have been quiet. It seals a new standing under the attempt's
`standing/<agent>` when something changed, and while the node is quiet every QUIET_REPOST
seconds (node 0 confirms a hang only on fresh records), then bumps `standing-seq` — a counter
that only wakes node 0's coordinator, who reads the sealed records and decides.
Quiet means: every live rank silent for --hang-timeout, and no rank of this node paused in pdb
(agent.pause) now or in the last --hang-timeout seconds. A node without --hang-timeout is never
quiet; its standing still says which ranks ended (exit skew, a hang's root cause).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from agent.hang.standing import QUIET_REPOST, RankEnd, Standing
from agent.node.scope import Scope

log = logging.getLogger("agent")
WAKE = "standing-seq"  # the counter that wakes node 0's coordinator: never read as a decision


def standing_name(agent: int) -> str:
    return f"standing/{agent}"


class HangWatch:
    def __init__(
        self,
        scope: Scope,  # the attempt's
        *,
        agent: int,
        node_rank: int,
        host: str,
        timeout: float,  # --hang-timeout (0: never quiet)
        paused: Callable[[], bool] = lambda: False,  # a rank of this node stopped in pdb
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scope, self.agent, self.node_rank, self.host = scope, agent, node_rank, host
        self.timeout, self.paused, self.clock = timeout, paused, clock
        self.quiet = False
        self._live: list[int] = []
        self._ended: list[RankEnd] = []
        self._seq = 0
        self._posted_at = float("-inf")
        self._paused_at: float | None = None  # when a rank of this node was last seen paused

    def started(self, ranks: Iterable[int]) -> None:
        self._live = sorted(ranks)
        self._post()

    def exited(self, rank: int, returncode: int, when: float) -> None:
        if rank in self._live:
            self._live.remove(rank)
            self._ended.append(RankEnd(rank, returncode, when))
            self.quiet = self.quiet and bool(self._live)
            self._post()

    def tick(self, quiet_for: float) -> None:
        """This node's live ranks have printed nothing for `quiet_for` seconds."""
        if self.timeout <= 0 or not self._live:
            return
        now = self.clock()
        if self.paused():  # a paused rank is not a hang, nor are the ranks that wait for it
            self._paused_at = now
        if self._paused_at is not None:
            quiet_for = min(quiet_for, now - self._paused_at)
        quiet = quiet_for >= self.timeout
        if quiet != self.quiet or (quiet and now - self._posted_at >= QUIET_REPOST):
            self.quiet = quiet
            self._post()

    def standing(self) -> Standing:
        return Standing(
            self.agent,
            self.node_rank,
            self.host,
            self._seq,
            tuple(self._live),
            tuple(self._ended),
            self.quiet,
        )

    def _post(self) -> None:
        self._seq += 1
        self._posted_at = self.clock()
        try:
            self.scope.put(standing_name(self.agent), self.standing().to_json())
            self.scope.store.add(self.scope.key(WAKE), 1)
        except Exception as exc:  # a store in trouble is the watchers' to report, not ours
            log.debug("standing: %s", exc)
