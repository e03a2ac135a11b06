"""This node's ranks waiting in a collective near its timeout (agent.hang.overdue), found by
asking their probes — only ranks that have made no progress for LOOK_AFTER seconds, each again
when its pending collective comes due or every IDLE_LOOK seconds — and told to node 0 through
this node's standing (agent.hang.watch.HangWatch.overdue). One thread per node; a probe's
answer costs its rank one flight-recorder dump (~5 ms at the default 200 entries).

It only raises the question: node 0 asks every rank's recorder again (fresh, through the
stacks desk) before it calls the hang, so neither a stale answer nor an outsider's record
decides.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from agent.hang.overdue import next_look, overdue
from agent.hang.recorder import RankRecorder, ask_all

log = logging.getLogger("agent")
LOOK_AFTER = 5.0  # seconds without progress before a rank's probe is asked at all
TICK = 1.0  # seconds between the thread's looks at who is due, at least


class CollectiveWatch:
    def __init__(
        self,
        directory: str,  # where the ranks' probes listen (the agent's private dir)
        ranks: Callable[[], Sequence[tuple[int, int]]],  # this node's live (rank, pid)
        silent_for: Callable[[int], float],  # seconds since a rank's last progress
        on_overdue: Callable[[tuple[int, ...]], None],  # ranks found overdue (all so far)
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.directory, self.ranks, self.silent_for = directory, ranks, silent_for
        self.on_overdue, self.wall = on_overdue, wall
        self.found: set[int] = set()
        self.looks = 0  # probes asked
        self._due: dict[int, float] = {}  # rank → wall time of its next look
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="collectives", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        pause = TICK
        while not self._stop.wait(pause):
            try:
                pause = self.look()
            except Exception as exc:  # a rank gone between the list and the ask: next time
                log.debug("collectives: %s", exc)
                pause = TICK

    def look(self) -> float:
        """Ask the ranks that are silent and due; tell node 0 when one is overdue. Returns the
        seconds until a rank can next be due (TICK at least, LOOK_AFTER at most): a rank's
        silence cannot reach LOOK_AFTER sooner, so a quiet node's thread sleeps instead of
        ticking (thousands of agents on one machine each spent most of their idle time here)."""
        now = self.wall()
        ranks = list(self.ranks())
        silent = {rank: self.silent_for(rank) for rank, _ in ranks}
        due = [
            (rank, pid)
            for rank, pid in ranks
            if silent[rank] >= LOOK_AFTER and now >= self._due.get(rank, 0.0)
        ]
        if due:
            self._ask(due)
        soonest = min(
            (
                max(self._due.get(rank, 0.0), now + LOOK_AFTER - quiet)
                for rank, quiet in silent.items()
            ),
            default=now + LOOK_AFTER,
        )
        return min(max(soonest - now, TICK), LOOK_AFTER)

    def _ask(self, due: list[tuple[int, int]]) -> None:
        self.looks += len(due)
        answers = ask_all(self.directory, due)
        now = self.wall()
        recorders = {rank: RankRecorder.from_json(answer) for rank, answer in answers.items()}
        for rank, recorder in recorders.items():
            self._due[rank] = next_look(recorder, now)
        late = {p.rank for p in overdue(recorders, now)} - self.found
        if late:
            self.found |= late
            log.warning(
                "rank(s) %s wait in a collective near its timeout: telling node 0",
                ",".join(map(str, sorted(late))),
            )
            self.on_overdue(tuple(sorted(self.found)))
