"""Stragglers while an attempt runs: each agent posts its ranks' pace, node 0 compares them.

Every PACE_EVERY seconds (on the supervisor's tick) each agent seals one record into the
attempt's scope, `pace/<agent>`: its ranks' median step times (from the router's step
clocks), only when some rank stepped since the last one. Node 0 reads one record per node on
the same tick (O(nodes)), judges them (agent.run.stragglers) and says on the console when a
straggler starts and when it ends; the episodes go to summary.json.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.console.stream import StepClock
from agent.node.scope import Scope
from agent.node.sealed import tell_refused
from agent.node.trust import Refused
from agent.run.stragglers import RankPace, Straggler, changes, ended_line, judge_pace, started_line

log = logging.getLogger("agent")
PACE_EVERY = 1.0  # seconds between a node's pace records (and node 0's looks)


class PaceWatch:
    def __init__(
        self,
        scope: Scope,
        clocks: Callable[[], Mapping[int, StepClock]],
        *,
        agents: Sequence[int],  # the agents running ranks in this attempt
        agent: int,
        node_rank: int,
        host: str,
        factor: float,
        leader: bool,
        attempt: int,
    ) -> None:
        self.scope, self.clocks, self.agents, self.agent = scope, clocks, agents, agent
        self.node_rank, self.host, self.factor = node_rank, host, factor
        self.leader, self.attempt = leader, attempt
        self._next = 0.0
        self._posted: tuple = ()
        self.active: list[Straggler] = []
        self.episodes: list[dict[str, Any]] = []  # node 0: every straggler episode, in order
        self._open: dict[tuple[int, int | None], dict[str, Any]] = {}
        self._seen: set[int] = set()  # node 0: agents whose pace record exists

    def tick(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now < self._next:
            return
        self._next = now + PACE_EVERY
        try:
            self._post()
            if self.leader:
                self._look()
        except Refused as exc:  # not ours: logged, never a decision
            log.error("%s", exc.message)
        except Exception as exc:  # a store in trouble is the watchers' to report, not ours
            log.debug("pace: %s", exc)

    def _post(self) -> None:
        ranks = []
        for rank, clock in sorted(self.clocks().items()):
            durations = clock.durations.copy()  # one C call: the reader thread may append
            if durations:
                ranks.append([rank, statistics.median(durations), len(durations), clock.step])
        seen = tuple((r[0], r[2], r[3]) for r in ranks)
        if not ranks or seen == self._posted:
            return
        self._posted = seen
        record = {"host": self.host, "node_rank": self.node_rank, "ranks": ranks}
        self.scope.put(f"pace/{self.agent}", record)

    def _look(self) -> None:
        paces = []
        for record in self._records():
            node, host = record.get("node_rank"), str(record.get("host"))
            for rank, median, steps, step in record.get("ranks", []):
                paces.append(RankPace(rank, node, host, median, steps, step))
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

    def _records(self) -> list[dict[str, Any]]:
        """Every node's latest pace record: one round trip once each has posted (a key, once
        there, stays for the attempt); until then one existence check per node still silent."""
        store = self.scope.store
        for agent in self.agents:
            if agent not in self._seen and store.exists(self.scope.key(f"pace/{agent}")):
                self._seen.add(agent)
        names = [f"pace/{agent}" for agent in self.agents if agent in self._seen]
        keys = [self.scope.key(name) for name in names]
        values = store.multi_get(keys, present=True) if keys else []
        records = []
        for key, value in zip(keys, values, strict=True):
            try:
                records.append(self.scope.keys.unseal(value, key, "pace record"))
            except Refused as exc:  # an outsider's value: that node is not judged this tick
                tell_refused(key, exc)
        return records

    def close(self) -> list[dict[str, Any]]:
        """Node 0, at the attempt's end: every episode, the open ones ended now."""
        for episode in self._open.values():
            episode["until"] = time.time()
        self._open.clear()
        return self.episodes
