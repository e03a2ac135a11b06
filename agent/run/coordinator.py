"""Node 0's job services for one attempt, from its lineup to its verdict.

Node 0 is a node with ranks and the job's coordinator. The coordinator's work — relaying
`agent stacks` and `agent debug` (the attempt's desks stay open), judging hangs
(agent.hang.judge) and stragglers (agent.run.pace.PaceJudge), saying when ranks that finished
wait on ranks that still run (exit skew), and feeding the run's metrics — runs on a thread of
its own from the moment node 0's desks are up until the verdict is out, whatever node 0's own
ranks do: they are one member's ranks like any other node's.

Every node's standing (agent.hang.standing) is read from the sealed records, on a wake of the
`standing-seq` counter or, whatever the counter says, every SLOW_LOOK seconds with
--hang-timeout (a decision rides on them) and every SLOWER_LOOK seconds without (the overdue
collectives' judge: an outsider who holds the counter still delays it, never decides); for
each node the record with the highest sequence number is kept, so a record deleted, garbled or
written back by an outsider is never newer knowledge than what was seen.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.hang.desk import StackDesk
from agent.hang.judge import HangJudge
from agent.hang.standing import Standing, job_line, skew_line
from agent.hang.watch import WAKE, standing_name, wake_name
from agent.metrics.recorder import RunMetrics
from agent.node.failure import Failure
from agent.node.scope import Scope
from agent.node.sealed import tell_refused
from agent.node.trust import Refused
from agent.pause.desk import PauseDesk
from agent.plan.options import Options
from agent.run.pace import PaceJudge

log = logging.getLogger("agent")
JUDGE_EVERY = 1.0  # seconds between the coordinator's looks when no node posted a standing
RETRY = 0.5  # seconds before the next look after a store error
SLOW_LOOK = 5.0  # seconds between reads of every standing when the wake counter is still
SLOWER_LOOK = 30.0  # the same without --hang-timeout (only overdue collectives are judged)


@dataclass
class Coordination:
    """What the coordinator leaves for the attempt's verdict."""

    failure: Failure | None = None  # the hang it published
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    exit_skew: str | None = None  # the line it said, if it said one


class Coordinator:
    def __init__(
        self,
        scope: Scope,  # the attempt's
        *,
        nodes: Sequence[int],  # the agents running ranks in this attempt
        options: Options,
        log_dir: str,
        attempt: int,
        node_rank: int,
        host: str,
        report: Callable[[Failure], Failure | None],  # publishes a failure
        metrics: RunMetrics,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.scope, self.nodes, self.options, self.log_dir = scope, tuple(nodes), options, log_dir
        self.attempt, self.node_rank, self.host = attempt, node_rank, host
        self.report, self.metrics, self.clock, self.wall = report, metrics, clock, wall
        self.side = scope
        self.desk: StackDesk | None = None
        self.pauses: PauseDesk | None = None
        self.hang: HangJudge | None = None
        self.pace: PaceJudge | None = None
        self.result = Coordination()
        self.standings: dict[int, Standing] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake: int | None = None
        self._full_at = float("-inf")
        self._seen: set[int] = set()
        # nodes whose standing record was missing or did not open at the last read (an
        # outsider's doing once every node has posted one): the hang judge may ask them
        self.unsure: frozenset[int] = frozenset()
        self._over = False  # the attempt has a failure: nothing left to judge
        self._judged_at = float("-inf")
        self._closers: list[Callable[[], None]] = []
        self.reads = 0  # times every standing was read (a wake, or the slow look)

    @property
    def serving(self) -> bool:
        return self.desk is not None and not self._stop.is_set()

    def begin(
        self, desk: StackDesk, pauses: PauseDesk, on_look: Callable[[Any], None] | None = None
    ) -> None:
        """Node 0's desks are up: serve and judge until `close`."""
        options = self.options
        self.desk, self.pauses = desk, pauses
        # A connection of its own (node 0's main one blocks in the wait for every result),
        # made by the thread's first query: not on the way to the ranks' start.
        self.side = self.scope.on(self.scope.store.another_client(lazy=True))
        if options.hang_timeout > 0 or options.flight_recorder:  # overdue collectives
            self.hang = HangJudge(
                desk,
                self.side,
                timeout=options.hang_timeout,
                log_dir=self.log_dir,
                attempt=self.attempt,
                node_rank=self.node_rank,
                host=self.host,
            )
        if options.progress_regex is not None:
            self.pace = PaceJudge(
                self.side,
                agents=self.nodes,
                factor=options.straggler_factor,
                attempt=self.attempt,
                metrics=self.metrics,
                on_look=on_look,
            )
        self._thread = threading.Thread(target=self._serve, name="coordinator", daemon=True)
        self._thread.start()

    def when_closed(self, closer: Callable[[], None]) -> None:
        """`closer` runs at `close` (node 0's live table stays up until the verdict)."""
        self._closers.append(closer)

    def job_line(self) -> str:
        """The job's ranks still running, for node 0's live table (its render thread)."""
        standings = list(self.standings.values())
        if len(standings) < len(self.nodes):
            return ""  # a node not heard from yet: no count to give
        return job_line(standings, sum(len(s.live) + len(s.ended) for s in standings))

    def close(self) -> Coordination:
        """Every result is in: the judges stop, the desks' answering threads everywhere end
        (again: a no-op)."""
        if self._stop.is_set():
            return self.result
        self._stop.set()
        if self._thread is not None:
            awaited = self._wake  # the thread blocks on the key after it, or stops before
            if awaited is not None:
                with contextlib.suppress(Exception):
                    self.scope.store.set_bytes(self.scope.key(wake_name(awaited + 1)), b"")
            self._thread.join()
        if self.desk is not None:
            self.desk.end()
        if self.pace is not None:
            self.result.stragglers = self.pace.close()
        for closer in self._closers:
            with contextlib.suppress(Exception):
                closer()
        return self.result

    # -- the thread -----------------------------------------------------------------------
    def _serve(self) -> None:
        side = self.side
        try:
            while not self._stop.is_set():
                try:
                    self._await(side)
                    if not self._stop.is_set():
                        self._tick(side)
                except Exception as exc:  # a store in trouble is the watchers' to report
                    log.debug("coordinator: %s", exc)
                    self._stop.wait(RETRY)
        finally:
            with contextlib.suppress(Exception):
                side.store.close()

    def _await(self, side: Scope) -> None:
        """Blocks until a node posts a standing (the key of the counter's next value), the
        pace judge's next look or JUDGE_EVERY. An outsider's bump makes the awaited key one
        no node sets: that look waits for the timeout, a delay, never a decision."""
        if self._wake is None:
            return  # the first look: nothing read yet
        wait = JUDGE_EVERY
        if self.pace is not None:
            wait = min(wait, self.pace.due - self.clock())
        side.store.wait([side.key(wake_name(self._wake + 1))], max(wait, 0.001))

    def _tick(self, side: Scope) -> None:
        """The standings when the counter moved (or every SLOW_LOOK s), the pace judge on its
        own cadence, the failure key and the judges on news or every JUDGE_EVERY seconds."""
        now = self.clock()
        reads = self.reads
        standings = self.read_standings(side, now)
        fresh = self.reads != reads
        live = {rank for s in standings.values() for rank in s.live}
        known = len(standings) == len(self.nodes)
        if known and fresh:
            self.metrics.ranks_left(self.attempt, len(live))
        if self.pace is not None:
            self.pace.tick(now, (lambda rank: rank in live) if known else (lambda rank: True))
        if self._over or (not fresh and now < self._judged_at + JUDGE_EVERY):
            return
        self._judged_at = now
        if side.failure() is not None:
            self._over = True
            return
        self._exit_skew(standings)
        if self.hang is not None:
            record = self.hang.look(standings, self.unsure)
            if record is not None:
                self.result.failure = self.report(record) or record

    def _exit_skew(self, standings: Mapping[int, Standing]) -> None:
        """Once: ranks that exited 0 have waited --hang-warning for ranks that still run."""
        if self.result.exit_skew is not None:
            return
        line = skew_line(
            list(standings.values()), self.wall(), self.options.hang_warning, self.log_dir
        )
        if line:
            self.result.exit_skew = line
            self.metrics.exit_skew_said(self.attempt)
            log.warning("%s", line)

    def read_standings(self, side: Scope, now: float) -> dict[int, Standing]:
        """Every node's newest standing; read again when woken or every SLOW_LOOK seconds."""
        wake = side.store.add(side.key(WAKE), 0)
        if wake == self._wake and (self.hang is None or now < self._full_at):
            return self.standings  # the slow look guards decisions (hangs) against a counter
        slow = SLOW_LOOK if self.options.hang_timeout > 0 else SLOWER_LOOK
        self._wake, self._full_at = wake, now + slow  # set back; a warning only waits
        self.reads += 1
        store = side.store
        names = {agent: side.key(standing_name(agent)) for agent in self.nodes}
        if len(self._seen) < len(self.nodes) or not store.exists_all(list(names.values())):
            # One round trip, not one per node: during the start every node's first standing
            # wakes this, and N nodes asked about one by one each time was O(N²) queries.
            there = store.exists_each(list(names.values()))
            self._seen = {a for a, found in zip(names, there, strict=True) if found}
        present = [a for a in self.nodes if a in self._seen]
        values = store.multi_get([names[a] for a in present], present=True) if present else []
        unsure = {a for a in self.nodes if a not in self._seen}
        for agent, value in zip(present, values, strict=True):
            try:
                found = Standing.from_json(side.keys.unseal(value, names[agent], "standing"))
            except Refused as exc:  # an outsider's value: what we knew of that node stands
                tell_refused(names[agent], exc)
                unsure.add(agent)
                continue
            known = self.standings.get(agent)
            if (
                found is not None
                and found.agent == agent
                and (known is None or found.seq > known.seq)
            ):
                self.standings[agent] = found
        self.unsure = frozenset(unsure)
        return self.standings
