"""One node's ranks as the job's coordinator sees them: which still run, which ended and how,
and whether the live ones have all been quiet for --hang-timeout (pure).

Each agent seals its standing under the attempt's `standing/<agent>` whenever it changes (its
ranks started, one exited, its quiet state turned), with a new sequence number. Node 0 reads
them (agent.run.coordinator): a node whose ranks all exited is done, not quiet; the job looks
still when no node is active and some node is quiet (`stillness`). That only makes node 0 ask:
a hang is called on the standings every node gives in answer to that question
(agent.hang.judge), never on records an outsider could have written back.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.plan.rank_set import format_ranges

MAX_RANKS = 4096  # ranks one node's record may name (more is not a node of ours)


@dataclass(frozen=True)
class RankEnd:
    rank: int
    returncode: int  # negative: killed by that signal
    end: float  # wall time


@dataclass(frozen=True)
class Standing:
    agent: int
    node_rank: int
    host: str
    seq: int  # grows with every record this node writes in the attempt
    live: tuple[int, ...]  # ranks still running
    ended: tuple[RankEnd, ...]
    quiet: bool  # every live rank silent for --hang-timeout (never while one is paused)
    overdue: tuple[int, ...] = ()  # ranks found waiting in a collective near its timeout

    @property
    def done(self) -> bool:
        return not self.live

    def to_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "node_rank": self.node_rank,
            "host": self.host,
            "seq": self.seq,
            "live": list(self.live),
            "ended": [[e.rank, e.returncode, round(e.end, 3)] for e in self.ended],
            "quiet": self.quiet,
            "overdue": list(self.overdue),
        }

    @classmethod
    def from_json(cls, data: object) -> Standing | None:
        """None for anything that is not a standing of ours (the record opened, so this is a
        bug or a version skew, never an outsider's; still: it must not raise)."""
        if not isinstance(data, dict):
            return None
        agent, node, seq = data.get("agent"), data.get("node_rank"), data.get("seq")
        live, ended = data.get("live"), data.get("ended")
        if not all(_int(v) for v in (agent, node, seq)):
            return None
        if not isinstance(live, list) or not isinstance(ended, list):
            return None
        if len(live) > MAX_RANKS or len(ended) > MAX_RANKS or not all(_int(r) for r in live):
            return None
        ends = []
        for item in ended:
            if not (isinstance(item, list) and len(item) == 3 and _int(item[0]) and _int(item[1])):
                return None
            if not isinstance(item[2], (int, float)):
                return None
            ends.append(RankEnd(item[0], item[1], float(item[2])))
        return cls(
            agent,  # type: ignore[arg-type]
            node,  # type: ignore[arg-type]
            str(data.get("host", "?"))[:255],
            seq,  # type: ignore[arg-type]
            tuple(live),
            tuple(ends),
            data.get("quiet") is True,
            tuple(r for r in _list(data.get("overdue"))[:MAX_RANKS] if _int(r)),
        )


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Stillness:
    """The job's ranks at one look: every node heard from, none active, someone quiet."""

    still: bool
    quiet: Mapping[int, int]  # quiet node (agent) → its record's sequence number


def stillness(
    nodes: Sequence[int], standings: Mapping[int, Standing], now: float, timeout: float
) -> Stillness:
    """Whether the job looks hung at wall time `now`: no node still unheard of or active, at
    least one node with live ranks (quiet; all done is an attempt that is ending, not a hang),
    and no rank ended in the last `timeout` seconds — an exit is the job's progress too: the
    ranks that waited for it (in a collective, or on a rank paused in pdb) get T from then."""
    quiet: dict[int, int] = {}
    last_end = float("-inf")
    for agent in nodes:
        found = standings.get(agent)
        if found is None or (found.live and not found.quiet):
            return Stillness(False, {})
        if found.live:
            quiet[agent] = found.seq
        last_end = max([last_end, *(e.end for e in found.ended)])
    if now - last_end < timeout:
        return Stillness(False, {})
    return Stillness(bool(quiet), quiet)


@dataclass(frozen=True)
class Ended:
    """Ranks that had exited when the job was judged: for a hang's root cause."""

    ranks: tuple[RankEnd, ...]

    @classmethod
    def of(cls, standings: Iterable[Standing]) -> Ended:
        found = [e for s in standings for e in s.ended]
        return cls(tuple(sorted(found, key=lambda e: e.rank)))

    def clause(self, local: bool = True) -> str:
        """`ranks 0-1 exited 0 at 12:03:07`; codes other than 0 named per group; "" if none."""
        if not self.ranks:
            return ""
        by_code: dict[int, list[RankEnd]] = {}
        for e in self.ranks:
            by_code.setdefault(e.returncode, []).append(e)
        parts = []
        for code, ends in sorted(by_code.items(), key=lambda item: min(e.end for e in item[1])):
            ranks = [e.rank for e in ends]
            who = f"rank{'s' if len(ranks) > 1 else ''} {format_ranges(ranks)}"
            clock = time.localtime if local else time.gmtime
            at = time.strftime("%H:%M:%S", clock(min(e.end for e in ends)))
            how = f"exited {code}" if code >= 0 else f"killed by signal {-code}"
            parts.append(f"{who} {how} at {at}")
        return "; ".join(parts)


def still_running(standings: Iterable[Standing]) -> list[tuple[int, str]]:
    """(rank, host) of every rank still running, by rank."""
    return sorted((rank, s.host) for s in standings for rank in s.live)


def skew_line(standings: Sequence[Standing], now: float, after: float, log_dir: str) -> str:
    """The exit-skew warning (or ""): ranks exited 0 `after` seconds ago or more (wall clock
    `now`) while others still run — the shape of a job stuck in its last collective or
    teardown. Names the ranks still running and their hosts, and how to see where they are."""
    clean = [e for s in standings for e in s.ended if e.returncode == 0]
    if not clean or after <= 0:
        return ""  # before every rank still running is listed: O(ranks) at each look
    running = still_running(standings)
    if not running:
        return ""
    waited = now - min(e.end for e in clean)
    if waited < after:
        return ""
    done = format_ranges(e.rank for e in clean)
    left = format_ranges(rank for rank, _ in running)
    hosts = sorted({host for _, host in running})
    shown = ", ".join(hosts[:8]) + (f" and {len(hosts) - 8} more" if len(hosts) > 8 else "")
    return (
        f"exit skew: rank{'s' if len(clean) > 1 else ''} {done} exited 0 {waited:.0f} s ago; "
        f"rank{'s' if len(running) > 1 else ''} {left} on {shown} still "
        f"run{'' if len(running) > 1 else 's'} (--hang-warning): see where with "
        f"python -m agent stacks {log_dir}"
    )


def job_line(standings: Sequence[Standing], world: int) -> str:
    """Node 0's live table's last line: the job's ranks still running and where, so the table
    still says something once node 0's own ranks have exited ("" before any node is heard)."""
    running = still_running(standings)
    if not standings:
        return ""
    if len(running) == world:
        return f"job: all {world} ranks running"
    if not running:
        return f"job: all {world} ranks exited"
    hosts = sorted({host for _, host in running})
    shown = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
    where = f": {_noun(len(running))} {format_ranges(r for r, _ in running)} on {shown}"
    return f"job: {len(running)} of {world} ranks still running{where}"


def _noun(count: int) -> str:
    return "rank" if count == 1 else "ranks"
