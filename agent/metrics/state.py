"""The numbers node 0 exports about a run (pure): frozen values, each hook a new state.

Times are node 0's monotonic seconds (durations between them are what is exported); the
per-node progress times come from the pace records (agent.run.pace), one look every 0.25 s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

QUANTILES = (0.5, 0.9, 0.99)  # of the ranks' median step times
KEPT_ATTEMPTS = 8  # attempts whose phase times are exported (older ones drop out)
RANK_SERIES = 64  # up to this many ranks a series per rank; above, per node or job-wide only


@dataclass(frozen=True)
class AttemptTimes:
    """One attempt's moments on node 0's monotonic clock (None: not reached)."""

    attempt: int
    start: float  # its roll call began
    ranks_started: float | None = None  # node 0's ranks were spawned
    first_progress: float | None = None  # the first progress line anywhere (within a second)
    teardown_from: float | None = None  # the first failure or stop signal (the root cause)
    ended: float | None = None  # every node's result in: the verdict
    first_exit: float | None = None  # a clean finish: the first rank's exit 0 ...
    last_exit: float | None = None  # ... and the last rank's exit

    def phases(self) -> tuple[tuple[str, float], ...]:
        """rendezvous (roll call + spawn), first_progress (spawn → first progress line),
        teardown (the root cause → every node's result), or on a clean finish exit_skew (the
        first rank's exit → the last one's): those reached."""
        spans = (
            ("rendezvous", self.start, self.ranks_started),
            ("first_progress", self.ranks_started, self.first_progress),
            ("teardown", self.teardown_from, self.ended),
            ("exit_skew", self.first_exit, self.last_exit),
        )
        return tuple(
            (name, max(0.0, b - a)) for name, a, b in spans if a is not None and b is not None
        )


@dataclass(frozen=True)
class RankStep:
    rank: int
    node: int
    median: float  # seconds per step over its last steps


@dataclass(frozen=True)
class StepTimes:
    """The ranks' median step times: quantiles over them, and per rank when few."""

    quantiles: tuple[tuple[float, float], ...]  # (q, seconds)
    count: int  # ranks with a median
    total: float  # the sum of their medians
    ranks: tuple[RankStep, ...]  # every rank's, only up to RANK_SERIES ranks

    @classmethod
    def of(cls, medians: Sequence[float], ranks: Sequence[RankStep] = ()) -> StepTimes:
        """O(r log r): nearest-rank quantiles of the medians; `ranks` kept only up to
        RANK_SERIES (the caller builds them only then: 8,192 objects a second cost more than
        the quantiles)."""
        ordered = sorted(medians)
        n = len(ordered)
        quantiles = tuple(
            (q, ordered[min(n - 1, max(0, math.ceil(q * n) - 1))]) for q in QUANTILES if n
        )
        per_rank = tuple(sorted(ranks, key=lambda s: s.rank)) if len(ranks) <= RANK_SERIES else ()
        return cls(quantiles, n, float(sum(ordered)), per_rank)


@dataclass(frozen=True)
class Straggling:
    """A node straggling now (as a whole, or one of its ranks): its worst median ÷ the job's."""

    node: int
    slowdown: float


@dataclass(frozen=True)
class RunState:
    job: str
    run: int
    tracks_progress: bool  # --progress-regex: progress and step times are known
    attempts: tuple[AttemptTimes, ...] = ()  # the last KEPT_ATTEMPTS
    started: int = 0  # attempts started
    ranks_running: int = 0
    hosts: tuple[str, ...] = ()  # per node rank, the last lineup's
    spares: int = 0
    excluded: int = 0
    progress: tuple[float | None, ...] = ()  # per node rank: its last progress line
    steps: StepTimes | None = None
    stragglers: tuple[Straggling, ...] = ()
    episodes: int = 0  # straggler episodes begun in this run
    skew_warnings: int = 0  # exit-skew lines said in this run (agent.run.coordinator)
    exit_code: int | None = None

    @property
    def restarts(self) -> int:
        return max(0, self.started - 1)

    @property
    def current(self) -> AttemptTimes | None:
        return self.attempts[-1] if self.attempts else None

    def with_attempt(self, times: AttemptTimes) -> RunState:
        """`times` in place of its attempt's, or appended (the oldest dropped past the cap)."""
        kept = [a for a in self.attempts if a.attempt != times.attempt]
        return replace(self, attempts=tuple([*kept, times][-KEPT_ATTEMPTS:]))
