"""Who is slow (pure): every rank's median step time → the job's median and its stragglers.

The job's median is the lower median of the ranks' medians (with two equal halves, the faster
half's pace: a node stepping twice as slow as the other is slow, not the norm). A node whose
median (the lower median of its ranks') exceeds `factor` × the job's is a straggler as a whole,
its ranks are not named again; a rank on any other node is one on its own when its median
exceeds `factor` × the job's. Ranks with fewer than MIN_STEPS step times are not judged yet;
ranks that exited are judged no more, but their pace stays in the job's median.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_STEPS = 3  # step times a rank needs before its median means anything


@dataclass(frozen=True)
class RankPace:
    """One rank's recent pace, as its agent reports it."""

    rank: int
    node_rank: int
    host: str
    median: float  # seconds per step over its last steps
    steps: int  # how many step times the median is over
    step: int | None = None  # the last step number it printed
    live: bool = True  # still running: a rank that exited is no straggler (its pace still
    # counts in the job's median: the ones left are compared with the pace the job kept)


@dataclass(frozen=True)
class Straggler:
    node_rank: int
    host: str
    rank: int | None  # None: the whole node
    median: float
    job_median: float
    step: int | None

    @property
    def key(self) -> tuple[int, int | None]:
        return (self.node_rank, self.rank)

    def what(self) -> str:
        """`node 1 (n2)` or `rank 3 on n2 (node 1)`."""
        if self.rank is None:
            return f"node {self.node_rank} ({self.host})"
        return f"rank {self.rank} on {self.host} (node {self.node_rank})"

    def to_json(self) -> dict[str, Any]:
        return {
            "node_rank": self.node_rank,
            "host": self.host,
            "rank": self.rank,
            "median": round(self.median, 6),
            "job_median": round(self.job_median, 6),
            "step": self.step,
        }


@dataclass(frozen=True)
class Pace:
    job_median: float | None  # None: too few ranks with enough steps to say
    stragglers: tuple[Straggler, ...]


def judge_pace(paces: Iterable[RankPace], factor: float) -> Pace:
    """The job's median step time and who exceeds `factor` times it (O(ranks log ranks))."""
    judged = [p for p in paces if p.steps >= MIN_STEPS and p.median >= 0]
    if len(judged) < 2:
        return Pace(None, ())
    job = statistics.median_low(p.median for p in judged)
    limit = factor * job
    by_node: dict[int, list[RankPace]] = {}
    for p in judged:
        by_node.setdefault(p.node_rank, []).append(p)
    found: list[Straggler] = []
    for node, ranks in sorted(by_node.items()):
        running = [p for p in ranks if p.live]
        if not running:
            continue
        node_median = statistics.median_low(p.median for p in running)
        if len(by_node) > 1 and node_median > limit:
            step = _last_step(running)
            found.append(Straggler(node, running[0].host, None, node_median, job, step))
            continue
        for p in sorted(running, key=lambda p: p.rank):
            if p.median > limit:
                found.append(Straggler(node, p.host, p.rank, p.median, job, p.step))
    return Pace(job, tuple(found))


def _last_step(ranks: Sequence[RankPace]) -> int | None:
    steps = [p.step for p in ranks if p.step is not None]
    return max(steps) if steps else None


@dataclass(frozen=True)
class Change:
    started: tuple[Straggler, ...]
    ended: tuple[Straggler, ...]  # as they were when last seen straggling


def changes(before: Sequence[Straggler], now: Pace) -> Change:
    """Who started and who stopped straggling since the last look."""
    old = {s.key: s for s in before}
    new = {s.key: s for s in now.stragglers}
    started = tuple(s for k, s in new.items() if k not in old)
    ended = tuple(s for k, s in old.items() if k not in new)
    return Change(started, ended)


def started_line(s: Straggler) -> str:
    at = f" at step {s.step}" if s.step is not None else ""
    return (
        f"straggler: {s.what()} steps in {s.median:.3g} s, the job's median is "
        f"{s.job_median:.3g} s ({s.median / s.job_median:.2g}x){at}"
        if s.job_median > 0
        else f"straggler: {s.what()} steps in {s.median:.3g} s{at}"
    )


def ended_line(s: Straggler) -> str:
    return f"straggler no more: {s.what()} keeps the job's pace again"
