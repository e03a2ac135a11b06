"""Ranks waiting in a collective near its process group's timeout: a hang by default (pure).

torch ends a collective that waits past its group's timeout (NCCL 10 min, gloo 30 min unless
the script sets one) with a bare error on some ranks, or with nothing when the watchdog is off.
Each rank's flight recorder (agent.hang.recorder) says, per group, the last collective it
entered and completed, when it entered it and the group's timeout: a rank that entered #N and
has not completed it has waited `now - created`. Near the timeout — at `near(T)`: a minute
before it, or half of it for timeouts under two minutes — the agent calls it a hang, so the job
ends with every stack and the collation instead of a timeout error on some ranks. A rank with
no collective pending (computing, compiling, evaluating, saving, asleep) is never overdue,
however long it is silent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.hang.recorder import RankRecorder
from agent.plan.rank_set import format_ranges

MARGIN = 60.0  # seconds before the group's timeout that the agent calls it
IDLE_LOOK = 5.0  # seconds between looks at a silent rank with no collective pending


@dataclass(frozen=True)
class Pending:
    """A collective one rank entered and has not completed."""

    rank: int
    group: str  # its label: default_pg, the user's description, or "group 3 (ranks 2,3)"
    op: str
    seq: int
    created: float  # wall time it entered it
    timeout: float  # the group's, seconds

    def waited(self, now: float) -> float:
        return max(0.0, now - self.created)

    @property
    def due(self) -> float:
        """The wall time it becomes overdue."""
        return self.created + near(self.timeout)


def near(timeout: float) -> float:
    """How long a collective may wait before the agent calls it a hang."""
    return max(timeout / 2, timeout - MARGIN)


def pending(rank: int, recorder: RankRecorder) -> list[Pending]:
    """The collectives `rank` waits in (one per group at most) whose start and timeout the
    recorder gives."""
    found = []
    for group in recorder.groups:
        if group.entered <= group.completed:
            continue
        last = group.at(group.entered)
        if last is None or last.created is None or last.timeout is None:
            continue
        found.append(Pending(rank, group.label(), last.op, last.seq, last.created, last.timeout))
    return found


def overdue(recorders: Mapping[int, RankRecorder], now: float) -> list[Pending]:
    """Every rank's collective that has waited past `near` its timeout, by rank."""
    found = [p for rank, rec in recorders.items() for p in pending(rank, rec) if now >= p.due]
    return sorted(found, key=lambda p: (p.rank, p.group))


def next_look(recorder: RankRecorder, now: float) -> float:
    """When to ask this rank again: when its pending collective comes due (it may complete
    before), else in IDLE_LOOK seconds."""
    dues = [p.due for p in pending(0, recorder) if p.due > now]
    return min([now + IDLE_LOOK, *dues])


def clause(found: Sequence[Pending], now: float) -> str:
    """ "ranks 0-2 waited 16 s in all_reduce #4 on default_pg, near its 20 s timeout": the
    collective the most overdue ranks wait in (the collectives' view says who it waits for)."""
    if not found:
        return ""
    alike: dict[tuple[str, int, str], list[Pending]] = {}
    for p in found:
        alike.setdefault((p.group, p.seq, p.op), []).append(p)
    (group, seq, op), waiting = max(
        alike.items(), key=lambda item: (len(item[1]), max(p.waited(now) for p in item[1]))
    )
    ranks = sorted({p.rank for p in waiting})
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranges(ranks)}"
    waited = max(p.waited(now) for p in waiting)
    # Past it too: NCCL's watchdog, once it fires, dumps and then waits up to a minute before
    # it ends the rank (torch 2.11 on an H200: 60 s), and the agent's look can come in between.
    where = "near" if waited < waiting[0].timeout else "past"
    return (
        f"{who} waited {waited:.0f} s in {op} #{seq} on {group}, "
        f"{where} its {waiting[0].timeout:g} s timeout"
    )
