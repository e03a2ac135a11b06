"""A stop for preemption or the time limit, judged at the run's end (pure): when the signal
reached node 0, how the ranks ended, the step they reached, and whether the checkpoint dir got
a file after the signal — the words summary.json, the history and the console share.

The next job with the same --checkpoint-dir reads the record back (agent.run.checkpoint_dir's
marker file) and names an unsaved stop in its first console lines (`previous_stop_line`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.node.result import Result
from agent.plan.rank_set import format_ranges

# Each rank's way of ending kept in the record, and the ranks each names: ranges, so a large
# job stays a few lines (the summary's attempts have every rank).
HOW_KEPT = 20


@dataclass(frozen=True)
class Written:
    """What the checkpoint dir holds that was written after the signal."""

    path: str  # DIR/ENTRY: the top entry of DIR holding the newest such file
    mtime: float  # that file's
    files: int  # files written after the signal (counted up to the scan's bound)


@dataclass(frozen=True)
class Preemption:
    signal: str  # SIGUSR2
    arrived: float  # when node 0's agent got it (epoch seconds)
    step: int | None  # the furthest step a rank's progress line named (None: unknown)
    checkpoint_dir: str
    written: Written | None  # None: nothing in the dir was written after the signal
    exits: tuple[tuple[str, str], ...]  # (how, ranks as ranges): how the last attempt's ranks ended
    last_exit: float | None  # when the last rank ended

    @property
    def saved(self) -> bool:
        return self.written is not None

    def line(self) -> str:
        """`stopped for preemption at step 40; checkpoint written: ckpt/step-40`."""
        at = f" at step {self.step}" if self.step is not None else ""
        if self.written is None:
            return f"stopped for preemption{at}; no checkpoint written after the signal"
        return f"stopped for preemption{at}; checkpoint written: {self.written.path}"

    def details(self) -> str:
        """`SIGUSR2 at 04:40:12; ranks: exit code 0: 0-7 (12.3 s after it)`."""
        clock = time.strftime("%H:%M:%S", time.localtime(self.arrived))
        ranks = "; ".join(f"{how}: {ranks}" for how, ranks in self.exits) or "none ran"
        after = ""
        if self.last_exit is not None:
            after = f" (the last {max(0.0, self.last_exit - self.arrived):.1f} s after it)"
        return f"{self.signal} at {clock}; ranks {ranks}{after}"

    def to_json(self) -> dict[str, Any]:
        written = self.written
        return {
            "line": self.line(),
            "signal": self.signal,
            "arrived": self.arrived,
            "step": self.step,
            "checkpoint_dir": self.checkpoint_dir,
            "checkpoint": None
            if written is None
            else {"path": written.path, "mtime": written.mtime, "files": written.files},
            "exits": {how: ranks for how, ranks in self.exits},
            "last_exit": self.last_exit,
        }


def judge_stop(
    signal: str,
    arrived: float,
    step: int | None,
    checkpoint_dir: str,
    written: Written | None,
    ranks: Sequence[Mapping[str, Any]],
) -> Preemption:
    """`ranks`: the last attempt's rank records (summary.json's `attempts[k].ranks`)."""
    by_how: dict[str, list[int]] = {}
    ends: list[float] = []
    for record in ranks:
        rank = record.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            continue
        by_how.setdefault(str(record.get("how") or record.get("state")), []).append(rank)
        end = record.get("end")
        if isinstance(end, (int, float)) and not isinstance(end, bool):
            ends.append(float(end))
    exits = tuple((how, format_ranges(found)) for how, found in sorted(by_how.items())[:HOW_KEPT])
    return Preemption(
        signal, arrived, step, checkpoint_dir, written, exits, max(ends) if ends else None
    )


def furthest_step(results: Sequence[Result]) -> int | None:
    """The highest `step` the nodes' results name (each its ranks' last progress line)."""
    steps = [r.step for r in results if r.step is not None]
    return max(steps) if steps else None


def previous_stop_line(marker: Mapping[str, Any] | None) -> str | None:
    """What the next job says first about the last stop recorded in its checkpoint dir: a
    warning line when it was unsaved, None when it was saved (or there is no record). The
    marker is a file anyone who may write the dir may have written: only words come from it."""
    if not isinstance(marker, Mapping) or marker.get("saved") is not False:
        return None
    job, line = marker.get("job"), marker.get("line")
    if not isinstance(job, str) or not isinstance(line, str):
        return None
    return (
        f"this job follows job {job[:100]}, {line[:300]}: it resumes from an older "
        "checkpoint, or from the start"
    )
