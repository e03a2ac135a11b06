"""This node's share of the job's hang and exit judging: its standing (agent.hang.standing).

The supervisor tells it when the node's ranks started and when each exits, and, on its ticks,
how long the live ones have been quiet. It seals a new standing under the attempt's
`standing/<agent>` when something changed, then bumps `standing-seq` and sets the key named
after the count to its agent index — they only wake node 0's coordinator and say whose record
to read (it reads every record now and then whatever they say), who reads the sealed records
and decides. Before node 0 calls a hang it asks every node again through the stacks desk
(`RECHECK_DESK`): the node measures its silence at that moment and answers its standing under
that request's number, which no record written earlier (an outsider's replay) can stand in for.
Ranks found waiting in a collective near its timeout (agent.hang.collective_watch) are named in
the standing too (`overdue`): node 0 then checks every rank's recorder itself.
Quiet means: every live rank silent for --hang-timeout, and no rank of this node paused in pdb
(agent.pause) now or in the last --hang-timeout seconds. A node without --hang-timeout is never
quiet; its standing still says which ranks ended (exit skew, a hang's root cause).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from agent.hang.standing import RankEnd, Standing
from agent.node.scope import Scope

log = logging.getLogger("agent")
WAKE = "standing-seq"  # the counter that wakes node 0's coordinator: never read as a decision
RECHECK_DESK = "standing"  # the stacks desk's requests a node answers with its standing now


def standing_name(agent: int) -> str:
    return f"standing/{agent}"


def wake_name(count: int) -> str:
    """The key a node sets after its bump took the counter to `count`: node 0's coordinator
    blocks on the next one (a key can be waited on, a counter cannot)."""
    return f"{WAKE}/{count}"


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
        self._paused_at: float | None = None  # when a rank of this node was last seen paused
        self._overdue: tuple[int, ...] = ()
        self._lock = threading.Lock()  # the supervisor ticks, the desk's thread rechecks
        self._unposted = False  # a change not posted yet (exited with post=False)

    def started(self, ranks: Iterable[int]) -> None:
        with self._lock:
            self._live = sorted(ranks)
            self._post()

    def exited(self, rank: int, returncode: int, when: float, post: bool = True) -> None:
        """`post=False`: more exits come at once (a node's ranks end together): posted with
        the last of them, or at `flush`, one record instead of one per rank."""
        with self._lock:
            if rank in self._live:
                self._live.remove(rank)
                self._ended.append(RankEnd(rank, returncode, when))
                self.quiet = self.quiet and bool(self._live)
                self._unposted = True
            if post and self._unposted:
                self._post()

    def flush(self) -> None:
        """Post what `exited(post=False)` held back, if anything."""
        with self._lock:
            if self._unposted:
                self._post()

    def overdue(self, ranks: tuple[int, ...]) -> None:
        """Ranks of this node wait in a collective near its timeout (hang.collective_watch)."""
        with self._lock:
            if ranks != self._overdue:
                self._overdue = ranks
                self._post()

    def tick(self, quiet_for: float) -> None:
        """This node's live ranks have printed nothing for `quiet_for` seconds."""
        with self._lock:
            self._update(quiet_for)

    def recheck(self, quiet_for: float | None) -> dict[str, Any]:
        """Node 0 asks before it calls a hang: the standing as of `quiet_for` (measured now;
        None: no live rank), posted too if it changed, as this node's answer."""
        with self._lock:
            if quiet_for is not None:
                self._update(quiet_for)
            return self.standing().to_json()

    def _update(self, quiet_for: float) -> None:
        if self.timeout <= 0 or not self._live:
            return
        now = self.clock()
        if self.paused():  # a paused rank is not a hang, nor are the ranks that wait for it
            self._paused_at = now
        if self._paused_at is not None:
            quiet_for = min(quiet_for, now - self._paused_at)
        quiet = quiet_for >= self.timeout
        if quiet != self.quiet:
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
            tuple(r for r in self._overdue if r in self._live),
        )

    def _post(self) -> None:
        self._seq, self._unposted = self._seq + 1, False
        try:
            self.scope.put(standing_name(self.agent), self.standing().to_json())
            count = self.scope.store.add(self.scope.key(WAKE), 1)
            # names who posted: node 0 reads that standing, not all N (counts never decide)
            self.scope.store.set_bytes(self.scope.key(wake_name(count)), str(self.agent).encode())
        except Exception as exc:  # a store in trouble is the watchers' to report, not ours
            log.debug("standing: %s", exc)
