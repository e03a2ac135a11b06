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
JUDGE_MIN = 0.25  # seconds between the judges' looks at the least, news or not
GAP_WAIT = 1.0  # seconds a wake key the counter has passed may stay unset before all are read


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
        self._wake: int | None = None  # the wake count read up to
        self._gap_since: float | None = None  # since when the next wake key is missing
        self._full_at = float("-inf")
        self._seen: set[int] = set()
        # each node's standing as last read and opened: the same bytes again are not opened
        # (the slow look reads all N every SLOW_LOOK s; 4,096 unseals were 2-4 % of node 0's
        # core while the job ran, where comparing bytes is O(N) in C)
        self._raw: dict[int, bytes] = {}
        # nodes whose standing record was missing or did not open at the last read (an
        # outsider's doing once every node has posted one): the hang judge may ask them
        self.unsure: frozenset[int] = frozenset()
        self._over = False  # the attempt has a failure: nothing left to judge
        self._judged_at = float("-inf")
        self._news = False  # standings read since the judges last looked
        self._closers: list[Callable[[], None]] = []
        self.reads = 0  # times standings were read (a wake, the slow look, the first)

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
        if self._news and not self._over:  # read already, judged JUDGE_MIN after the last
            wait = min(wait, self._judged_at + JUDGE_MIN - self.clock())
        if self.pace is not None:
            wait = min(wait, self.pace.due - self.clock())
        side.store.wait([side.key(wake_name(self._wake + 1))], max(wait, 0.001))

    def _tick(self, side: Scope) -> None:
        """The standings when the counter moved (or every SLOW_LOOK s), the pace judge on its
        own cadence, the failure key and the judges on news (JUDGE_MIN apart at most: each look
        is O(nodes), and a teardown brings 8 posts a node) or every JUDGE_EVERY seconds."""
        now = self.clock()
        reads = self.reads
        standings = self.read_standings(side, now)
        self._news = self._news or self.reads != reads
        live: set[int] | None = None

        def running() -> set[int]:
            nonlocal live
            if live is None:
                live = {rank for s in standings.values() for rank in s.live}
            return live

        known = len(standings) == len(self.nodes)
        if self.pace is not None:
            self.pace.tick(now, (lambda rank: rank in running()) if known else (lambda rank: True))
        soon = self._news and now >= self._judged_at + JUDGE_MIN
        if self._over or not (soon or now >= self._judged_at + JUDGE_EVERY):
            return
        if self._news and known:
            self.metrics.ranks_left(self.attempt, len(running()))
        self._judged_at, self._news = now, False
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
        """Every node's newest standing. On a wake, only the standings of the nodes the wake
        keys name (in order, up to the first one not set yet: each node sets its key right
        after its bump): a teardown's 8 posts per node would otherwise each read all N. Every
        standing at the first read, every SLOW_LOOK seconds, and when a wake key is garbled or
        still missing GAP_WAIT after the count passed it (an outsider's bump: a delay)."""
        wake = side.store.add(side.key(WAKE), 0)
        full = self._wake is None or (self.hang is not None and now >= self._full_at)
        if not full and wake == self._wake:
            return self.standings
        named = None if full else self._named(side, wake, now)
        if named is None:
            slow = SLOW_LOOK if self.options.hang_timeout > 0 else SLOWER_LOOK
            self._wake, self._full_at = wake, now + slow  # set back; a warning only waits
            self._read(side, self.nodes)
        elif named:
            self._read(side, sorted(named))
        return self.standings

    def _named(self, side: Scope, wake: int, now: float) -> set[int] | None:
        """The nodes that posted since the last read, as the wake keys after it name them (the
        count passed to the last key read); None: read every standing instead."""
        last = self._wake
        assert last is not None
        if wake < last or wake - last > len(self.nodes):  # set back, or more than one read
            return None
        keys = [side.key(wake_name(count)) for count in range(last + 1, wake + 1)]
        there = side.store.exists_each(keys)
        ready = keys[: there.index(False)] if False in there else keys
        if not ready:  # bumped, its key not set yet: the node sets it next, or an outsider bumped
            self._gap_since = now if self._gap_since is None else self._gap_since
            return None if now - self._gap_since >= GAP_WAIT else set()
        self._gap_since = None
        nodes, named = set(self.nodes), set()
        for value in side.store.multi_get(ready, present=True):
            agent = _agent_named(value)
            if agent not in nodes:
                return None  # garbled (or the key of the close): read them all
            named.add(agent)
        self._wake = last + len(ready)
        return named

    def _read(self, side: Scope, agents: Sequence[int]) -> None:
        """These agents' standings, each kept when newer than the one known."""
        self.reads += 1
        store = side.store
        names = {agent: side.key(standing_name(agent)) for agent in agents}
        if not self._seen.issuperset(agents) or not store.exists_all(list(names.values())):
            # One round trip, not one per node: during the start every node's first standing
            # wakes this, and N nodes asked about one by one each time was O(N²) queries.
            there = store.exists_each(list(names.values()))
            self._seen -= set(agents)
            self._seen |= {a for a, found in zip(names, there, strict=True) if found}
        present = [a for a in agents if a in self._seen]
        values = store.multi_get([names[a] for a in present], present=True) if present else []
        unsure = (set(self.unsure) - set(agents)) | {a for a in agents if a not in self._seen}
        raw = self._raw
        for agent, value in zip(present, values, strict=True):
            if raw.get(agent) == value:
                continue  # opened before: nothing new from that node
            try:
                found = Standing.from_json(side.keys.unseal(value, names[agent], "standing"))
            except Refused as exc:  # an outsider's value: what we knew of that node stands
                tell_refused(names[agent], exc)
                unsure.add(agent)
                continue
            raw[agent] = value
            known = self.standings.get(agent)
            if (
                found is not None
                and found.agent == agent
                and (known is None or found.seq > known.seq)
            ):
                self.standings[agent] = found
        self.unsure = frozenset(unsure)


def _agent_named(value: bytes) -> int | None:
    """The node a wake key names (HangWatch sets its agent index); None when it names none."""
    try:
        return int(value) if value.isdigit() else None
    except ValueError:
        return None
