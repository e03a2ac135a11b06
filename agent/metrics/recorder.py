"""Node 0's recorder of one run: the run's hooks call it, a scrape reads `state`.

Writers are the run's own threads (the attempts and the supervisor's tick, one at a time, under
a lock); a scrape thread reads `state`, one reference swapped whole, so it always sees one
consistent state. Every other node keeps a recorder too (the hooks need not ask who they are
on); nothing reads theirs. Cost per hook: O(1), except `paced` (O(nodes + ranks), every 0.25 s).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from agent.metrics.state import AttemptTimes, RankStep, RunState, StepTimes, Straggling
from agent.plan.roster import Roster

log = logging.getLogger("agent")


class RunMetrics:
    def __init__(
        self,
        job: str = "",
        run: int = 0,
        *,
        tracks_progress: bool = False,
        lost: Callable[[], Collection[int]] = tuple,  # agents whose heartbeats stopped, now
        exported: bool = False,  # someone reads these (--metrics-port): `paced` does its work
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.state = RunState(job, run, tracks_progress)
        self.lost, self.exported, self.clock, self.wall = lost, exported, clock, wall
        self._lock = threading.Lock()
        self._closers: list[Callable[[], None]] = []

    def _update(self, change: Callable[[RunState], RunState]) -> None:
        with self._lock:
            self.state = change(self.state)

    def _attempt(self, attempt: int, **moments: Any) -> Callable[[RunState], RunState]:
        # moments: AttemptTimes' float fields by name (lined_up=..., ended=...)
        def change(state: RunState) -> RunState:
            found = next((a for a in state.attempts if a.attempt == attempt), None)
            return state if found is None else state.with_attempt(replace(found, **moments))

        return change

    # -- hooks (agent.run) --------------------------------------------------------------------
    def attempt_started(self, attempt: int) -> None:
        """Its roll call begins."""
        now = self.clock()
        self._update(
            lambda s: replace(
                s.with_attempt(AttemptTimes(attempt, now)),
                started=s.started + 1,
                ranks_running=0,
                progress=(),
                steps=None,
                stragglers=(),
            )
        )

    def lined_up(self, roster: Roster, hosts: Sequence[str]) -> None:
        """Node 0 decided who runs, waits and is out for the attempt."""
        named = tuple(hosts[a] if a < len(hosts) else f"agent {a}" for a in roster.nodes)
        self._update(
            lambda s: replace(
                s, hosts=named, spares=len(roster.spares), excluded=len(roster.excluded)
            )
        )

    def ranks_started(self, attempt: int, ranks: int) -> None:
        """Node 0's ranks are spawned: the attempt's `ranks` are running."""
        change = self._attempt(attempt, ranks_started=self.clock())
        self._update(lambda s: replace(change(s), ranks_running=ranks))

    def paced(
        self,
        attempt: int,
        progress: Sequence[float | None],
        medians: Sequence[float],
        ranks: Sequence[RankStep],
        stragglers: Sequence[Straggling],
        episodes: int,
    ) -> None:
        """Node 0's look at every node's pace (every 0.25 s): per node rank its last progress
        line (node 0's monotonic clock), every rank's median step time (`ranks`: the same per
        rank, only up to RANK_SERIES ranks), who straggles now."""
        if not self.exported:
            return
        times = StepTimes.of(medians, ranks)
        seen = [p for p in progress if p is not None]
        first = min(seen) if seen else None

        def change(state: RunState) -> RunState:
            now = state.current
            if now is not None and now.attempt == attempt and now.first_progress is None:
                state = state.with_attempt(replace(now, first_progress=first))
            return replace(
                state,
                progress=tuple(progress),
                steps=times,
                stragglers=tuple(stragglers),
                episodes=episodes,
            )

        self._update(change)

    def ranks_left(self, attempt: int, ranks: int) -> None:
        """Node 0's coordinator read every node's standing: `ranks` of the attempt still run."""
        self._update(
            lambda s: (
                replace(s, ranks_running=ranks)
                if s.current is not None and s.current.attempt == attempt
                else s
            )
        )

    def exit_skew_said(self, attempt: int) -> None:
        """Ranks that exited 0 have waited --hang-warning for the others (said once)."""
        self._update(lambda s: replace(s, skew_warnings=s.skew_warnings + 1))

    def attempt_ended(
        self, attempt: int, cause: float | None, exits: Sequence[float | None]
    ) -> None:
        """Every node's result is in. `cause`: the wall time of the attempt's root cause (a
        failure, a stop signal; None: a clean finish); `exits`: every rank's exit (wall). A
        teardown runs from the cause; a clean finish's ranks exit over its exit skew."""
        now, wall = self.clock(), self.wall()

        def at(moment: float) -> float:  # a wall time on the monotonic clock
            return now - max(0.0, wall - moment)

        ends = [e for e in exits if isinstance(e, (int, float)) and e > 0]
        if isinstance(cause, (int, float)) and cause > 0:
            change = self._attempt(attempt, teardown_from=at(cause), ended=now)
        elif ends:
            change = self._attempt(
                attempt, first_exit=at(min(ends)), last_exit=at(max(ends)), ended=now
            )
        else:
            change = self._attempt(attempt, ended=now)
        self._update(lambda s: replace(change(s), ranks_running=0))

    def finished(self, code: int) -> None:
        """The run's exit code (node 0 wrote summary.json)."""
        self._update(lambda s: replace(s, exit_code=code, ranks_running=0))

    # -- life -----------------------------------------------------------------------------------
    def on_close(self, closer: Callable[[], None]) -> None:
        self._closers.append(closer)

    def close(self) -> None:
        """The run is over: what was attached (the textfile, the server) ends, last first.
        Never raises: the run's exit code is decided already, its numbers must not change it."""
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception as exc:
                log.error("metrics: %s", exc)
