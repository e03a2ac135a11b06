"""Stragglers while an attempt runs: each agent posts its ranks' pace, node 0 compares them.

Every POST_EVERY seconds at most (on the supervisor's tick, while the node has ranks; once its
ranks printed no progress for QUIET_AFTER seconds it looks only every QUIET_LOOK) each agent
(`PaceWatch`) seals one record into the attempt's scope, `pace/<agent>`: its ranks' median step
times (from the router's step clocks), only when some rank printed a progress line since the
last one, with the age of its latest line and a sequence number. Node 0's coordinator
(`PaceJudge`, agent.run.coordinator: from the lineup to the verdict, whatever node 0's own ranks
do) reads one record per node once a second, or every POST_EVERY seconds when the metrics or
the live table show progress ages (O(nodes); per node the one with the highest sequence number
seen, so an old record written back is no news), judges them (agent.run.stragglers) and
says on the console when a straggler starts and when it ends; the episodes go to summary.json.
A rank that exited is no straggler (its pace still counts in the job's median): an episode
lasts until its ranks keep pace or end. From the same records node 0 knows when each node last
progressed (a new sequence number: now less the age), for the run's metrics (agent.metrics) and
the live table's `behind` column (`on_look`).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.console.stream import JobPace, StepClock
from agent.metrics.recorder import RunMetrics
from agent.metrics.state import RANK_SERIES, RankStep, Straggling
from agent.node.scope import Scope
from agent.node.sealed import tell_refused
from agent.node.trust import Refused
from agent.run.stragglers import (
    Pace,
    RankPace,
    Straggler,
    changes,
    ended_line,
    judge_pace,
    started_line,
)

log = logging.getLogger("agent")
POST_EVERY = 0.25  # seconds between a node's pace records, at least (none without news)
QUIET_AFTER = 2.0  # seconds without news after which a node's ranks count as quiet...
QUIET_LOOK = 1.0  # ...and its supervisor looks for news this often instead of POST_EVERY
LOOK_EVERY = 1.0  # seconds between node 0's looks when only stragglers are judged


class PaceWatch:
    """This node's part: its ranks' pace, posted while they run."""

    def __init__(
        self,
        scope: Scope,
        clocks: Callable[[], Mapping[int, StepClock]],
        *,
        agent: int,
        node_rank: int,
        host: str,
    ) -> None:
        self.scope, self.clocks, self.agent = scope, clocks, agent
        self.node_rank, self.host = node_rank, host
        self._next = 0.0
        self._news_at = float("-inf")  # when the last record went out
        self._posted: tuple = ()
        self._seq = 0

    def tick(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now < self._next:
            return
        posted = False
        try:
            posted = self._post(now)
        except Exception as exc:  # a store in trouble is the watchers' to report, not ours
            log.debug("pace: %s", exc)
        # Looked for again soon while ranks step; an idle node's supervisor sleeps longer.
        if posted:
            self._news_at = now
        self._next = now + (POST_EVERY if now - self._news_at < QUIET_AFTER else QUIET_LOOK)

    @property
    def due(self) -> float:
        """When (monotonic) the next record may go out: the supervisor wakes for it."""
        return self._next

    def _post(self, now: float) -> bool:
        """Seal this node's pace when it has news; whether it did."""
        ranks, lines, latest = [], [], None
        for rank, clock in sorted(self.clocks().items()):
            durations = clock.durations.copy()  # one C call: the reader thread may append
            when, count = clock.when, clock.lines
            if count and when is not None:
                median = statistics.median(durations) if durations else 0.0
                ranks.append([rank, median, len(durations), clock.step])
                lines.append(count)
                latest = when if latest is None else max(latest, when)
        seen = tuple(zip((r[0] for r in ranks), lines, (r[3] for r in ranks), strict=True))
        if not ranks or seen == self._posted:
            return False
        self._posted, self._seq = seen, self._seq + 1
        record = {
            "host": self.host,
            "node_rank": self.node_rank,
            "ranks": ranks,
            "seq": self._seq,
            "age": round(max(0.0, now - (latest or now)), 3),  # its latest progress line's
        }
        self.scope.put(f"pace/{self.agent}", record)
        return True


class PaceJudge:
    """Node 0's part: every node's pace, judged from the lineup to the verdict."""

    def __init__(
        self,
        scope: Scope,
        *,
        agents: Sequence[int],  # the agents running ranks in this attempt
        factor: float,
        attempt: int,
        metrics: RunMetrics | None = None,  # the run's recorder
        on_look: Callable[[JobPace], None] | None = None,  # the live table
    ) -> None:
        self.scope, self.agents, self.factor, self.attempt = scope, agents, factor, attempt
        self.metrics, self.on_look = metrics, on_look
        ages_shown = on_look is not None or (metrics is not None and metrics.exported)
        self.every = POST_EVERY if ages_shown else LOOK_EVERY
        self._progress: dict[int, tuple[int, float]] = {}  # node rank → (seq, when)
        self.active: list[Straggler] = []
        self.due = 0.0  # when (monotonic) its next look is
        self.episodes: list[dict[str, Any]] = []  # every straggler episode, in order
        self._open: dict[tuple[int, int | None], dict[str, Any]] = {}
        self._seen: set[int] = set()  # agents whose pace record exists
        # agent → the sealed record with the highest `seq` seen: an older one written back (a
        # replay), a value that does not open or a deleted key leaves it standing
        self._latest: dict[int, dict[str, Any]] = {}

    def tick(
        self, now: float | None = None, live: Callable[[int], bool] = lambda rank: True
    ) -> None:
        """`live`: whether a rank still runs (the nodes' standings): only those straggle."""
        now = time.monotonic() if now is None else now
        if now < self.due:
            return
        self.due = now + self.every
        try:
            self._look(now, live)
        except Refused as exc:  # not ours: logged, never a decision
            log.error("%s", exc.message)
        except Exception as exc:  # a store in trouble is the watchers' to report, not ours
            log.debug("pace: %s", exc)

    def _look(self, now: float, live: Callable[[int], bool]) -> None:
        paces = []
        for record in self._records():
            node, host = record.get("node_rank"), str(record.get("host"))
            if not isinstance(node, int):
                continue  # sealed by an agent, but of no version this one reads
            self._progressed(node, record.get("seq"), record.get("age"), now)
            for rank, median, steps, step in record.get("ranks", []):
                paces.append(RankPace(rank, node, host, median, steps, step, live(rank)))
        pace = judge_pace(paces, self.factor)
        change = changes(self.active, pace)
        for s in change.started:
            log.warning("%s", started_line(s))
            self._open[s.key] = {"attempt": self.attempt, **s.to_json(), "since": time.time()}
            self.episodes.append(self._open[s.key])
        for s in change.ended:
            log.warning("%s", ended_line(s))
            self._open.pop(s.key)["until"] = time.time()
        for s in pace.stragglers:  # the latest numbers of every open episode
            self._open[s.key].update(s.to_json())
        self.active = list(pace.stragglers)
        if self.metrics is not None and self.metrics.exported:
            self._measured(paces)
        if self.on_look is not None:
            self.on_look(_job_pace(pace, paces))

    def _progressed(self, node: object, seq: object, age: object, now: float) -> None:
        """A record with a new sequence number: its node printed a progress line `age` ago."""
        if not (isinstance(node, int) and isinstance(seq, int) and isinstance(age, (int, float))):
            return
        last = self._progress.get(node)
        if last is None or last[0] != seq:
            self._progress[node] = (seq, now - max(0.0, float(age)))

    def _measured(self, paces: Sequence[RankPace]) -> None:
        """Node 0, --metrics-port: this look's numbers to the run's recorder (O(ranks))."""
        assert self.metrics is not None
        progress = [self._progress.get(node, (0, None))[1] for node in range(len(self.agents))]
        medians = [p.median for p in paces if p.steps]
        ranks = (
            [RankStep(p.rank, p.node_rank, p.median) for p in paces if p.steps]
            if len(paces) <= RANK_SERIES
            else []
        )
        worst: dict[int, float] = {}
        for s in self.active:
            slowdown = s.median / s.job_median if s.job_median > 0 else 0.0
            worst[s.node_rank] = max(worst.get(s.node_rank, 0.0), slowdown)
        slow = [Straggling(node, worst[node]) for node in sorted(worst)]
        self.metrics.paced(self.attempt, progress, medians, ranks, slow, len(self.episodes))

    def _records(self) -> list[dict[str, Any]]:
        """Every node's newest pace record: one round trip once each has posted (a key, once
        there, stays for the attempt); until then one existence check per node still silent.
        Per node the record with the highest sequence number seen is kept, so an outsider's
        value, a deletion or an old record written back is never news."""
        store = self.scope.store
        for agent in self.agents:
            if agent not in self._seen and store.exists(self.scope.key(f"pace/{agent}")):
                self._seen.add(agent)
        present = [agent for agent in self.agents if agent in self._seen]
        keys = [self.scope.key(f"pace/{agent}") for agent in present]
        values = store.multi_get(keys, present=True) if keys else []
        for agent, key, value in zip(present, keys, values, strict=True):
            try:
                record = self.scope.keys.unseal(value, key, "pace record")
            except Refused as exc:  # an outsider's value: what we knew of that node stands
                tell_refused(key, exc)
                continue
            seq, known = record.get("seq"), self._latest.get(agent, {}).get("seq", 0)
            if isinstance(seq, int) and not isinstance(seq, bool) and seq > known:
                self._latest[agent] = record
        return [self._latest[agent] for agent in self.agents if agent in self._latest]

    def close(self) -> list[dict[str, Any]]:
        """Node 0, at the attempt's end: every episode, the open ones ended now."""
        for episode in self._open.values():
            episode["until"] = time.time()
        self._open.clear()
        return self.episodes


def _job_pace(pace: Pace, paces: Sequence[RankPace]) -> JobPace:
    steps = [p.step for p in paces if p.step is not None]
    return JobPace(
        median=pace.job_median,
        furthest=max(steps) if steps else None,
        slow_nodes=frozenset(s.node_rank for s in pace.stragglers if s.rank is None),
        slow_ranks=frozenset(s.rank for s in pace.stragglers if s.rank is not None),
    )
