"""`agent logs LOG_DIR --timeline FILE.svg`: a job as a picture (pure: summary in, a frozen
`Timeline` out; agent.logs.timeline_svg draws it).

`layout(summary, seatings)` reads summary.json (by agent.history.summary_doc; for attempts whose
record lacks its seating, ranks.json's "attempts") into a frozen `Timeline`: one lane per rank up
to RANK_LANES ranks, else one per node, and above MAX_LANES nodes one per group of consecutive nodes (the lane
shows the worst state of its ranks), so the picture stays the same size at 4,096 nodes. Per lane
and attempt one bar from the first rank start to the last rank end; attempts as bands side by
side in time, each restart a dashed line; markers for each attempt's root cause (the job's own
in red, with its words and stderr below the plot), lost nodes and spares seated in a node's
place; stragglers (summary.json's `stragglers`) shaded on their lanes from when node 0 named
them until they kept pace again (or their attempt ended).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.history.summary_doc import (
    Attempt,
    RankExit,
    Seating,
    Summary,
    read_seatings,
    read_summary,
)
from agent.node.failure import words

RANK_LANES = 64  # up to this many ranks: a lane per rank
MAX_LANES = 128  # above: nodes grouped so that no more lanes are drawn
MAX_ATTEMPTS = 50  # the last ones drawn (a note says how many earlier ones are not)
MAX_SHADES = 2000  # straggler episodes drawn (summary.json caps its records too)
STRAGGLER = "#ffd400"
WORST = ("failed", "lost", "terminated", "succeeded")  # a lane of many ranks shows the first
COLOURS = {
    "failed": "#d62728",
    "lost": "#9467bd",
    "terminated": "#ff9f40",
    "succeeded": "#2ca02c",
}
OTHER = "#7f7f7f"
MARKS = {  # the markers' kinds, as the legend names them
    "failure": "the job's root cause",
    "cause": "an earlier attempt's cause",
    "lost": "node lost",
    "spare": "spare seated",
}


@dataclass(frozen=True)
class Bar:
    lane: int
    attempt: int
    start: float
    end: float
    state: str
    tip: str


@dataclass(frozen=True)
class Mark:
    lane: int | None  # None: not one lane's (a join timeout): drawn across the plot
    time: float
    kind: str  # cause | failure (the job's root cause) | lost | spare
    text: str


@dataclass(frozen=True)
class Band:
    attempt: int
    start: float
    end: float
    text: str


@dataclass(frozen=True)
class Shade:
    """A straggler on its lane, from when node 0 named it until it kept pace again."""

    lane: int
    start: float
    end: float
    text: str


@dataclass(frozen=True)
class Timeline:
    title: str
    lanes: tuple[str, ...]  # lane labels, top to bottom
    unit: str  # rank | node | nodes
    bars: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    bands: tuple[Band, ...]
    t0: float
    t1: float
    cause: tuple[str, ...]  # the job's root cause: a line, then its last stderr lines
    notes: tuple[str, ...]
    shades: tuple[Shade, ...] = ()  # stragglers


def layout(
    summary: Summary | Mapping[str, Any], seatings: Mapping[int, Seating] | Sequence[Any] = ()
) -> Timeline:
    """The job's picture from its summary (a `Summary`, or summary.json parsed) and, for
    attempts whose record lacks its seating, ranks.json's "attempts" (parsed, or read)."""
    doc = summary if isinstance(summary, Summary) else read_summary(summary)
    seated = seatings if isinstance(seatings, Mapping) else read_seatings(list(seatings))
    job = doc.job
    attempts = list(doc.attempts)
    notes = []
    if len(attempts) > MAX_ATTEMPTS:
        notes.append(f"the first {len(attempts) - MAX_ATTEMPTS} attempts are not drawn")
        attempts = attempts[-MAX_ATTEMPTS:]
    ranks = [a.ranks for a in attempts]
    numbers = [a.attempt for a in attempts]
    most_ranks = max((sum(1 for r in rs if r.rank >= 0) for rs in ranks), default=0)
    nodes = 1 + max(
        (r.node_rank for rs in ranks for r in rs),
        default=max(0, (1 if job.nnodes is None else job.nnodes) - 1),
    )
    per_rank = 0 < most_ranks <= RANK_LANES
    group = 1 if per_rank else max(1, math.ceil(nodes / MAX_LANES))
    unit = "rank" if per_rank else "node" if group == 1 else "nodes"

    def lane_of(rank: int, node: int) -> int:
        return rank if per_rank else node // group

    lanes = (most_ranks if per_rank else math.ceil(nodes / group)) if ranks else 0
    hosts: dict[int, list[str]] = {}
    cells: dict[tuple[int, int], list[Any]] = {}  # (lane, attempt) -> [start, end, states]
    # Per attempt, which ranks each node ran (its seating): a lost node's record has no rank.
    seatings_of = {a.attempt: _seating(a, seated) for a in attempts}
    seats = {
        number: {place.node: _rank_range(place.ranks, RANK_LANES) for place in seating.nodes}
        for number, seating in seatings_of.items()
    }

    def node_lanes(number: int, node: int) -> list[int]:
        if not per_rank:
            return [node // group] if 0 <= node // group < lanes else []
        return [r for r in seats[number].get(node, range(0)) if r < lanes]

    for number, rs in zip(numbers, ranks, strict=True):
        for r in rs:
            rank, node = r.rank, r.node_rank
            if node < 0:
                continue
            if per_rank and rank < 0:  # a lost node: every rank it was seated with
                for lane in node_lanes(number, node):
                    _add(cells, hosts, lane, number, r)
                continue
            if per_rank and rank >= lanes:
                continue
            _add(cells, hosts, lane_of(rank, node), number, r)
    spans = {
        n: (
            min((c[0] for (_, a), c in cells.items() if a == n), default=math.inf),
            max((c[1] for (_, a), c in cells.items() if a == n), default=-math.inf),
        )
        for n in numbers
    }
    bars = []
    for (lane, number), (start, end, states) in sorted(cells.items()):
        a_start, a_end = spans[number]
        if math.isinf(start):  # no time at all (lost before it started): the attempt's span
            start, end = a_start, a_end
        if math.isinf(start):
            continue
        worst = next((s for s in WORST if s in states), next(iter(states)))
        tally = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        bars.append(Bar(lane, number, start, max(end, start), worst, f"attempt {number}: {tally}"))
    known = [t for span in spans.values() for t in span if not math.isinf(t)]
    t0, t1 = (min(known), max(known)) if known else (0.0, 0.0)
    marks: list[Mark] = []
    bands = []
    waited: set[str] = set()
    last_cause = doc.root_cause or {}
    for i, (number, attempt) in enumerate(zip(numbers, attempts, strict=True)):
        a_start, a_end = spans[number]
        if math.isinf(a_start):
            a_start = a_end = t1
        cause = attempt.root_cause or {}
        words = cause_words(cause)
        bands.append(
            Band(number, a_start, a_end, f"attempt {number}" + (f": {words}" if words else ""))
        )
        if cause:
            final = i == len(attempts) - 1 and cause == last_cause
            node, rank = _int(cause.get("node_rank")), _int(cause.get("rank"))
            at: int | None
            if rank >= 0 and node >= 0:
                at = lane_of(rank, node)
                at = at if at is not None and 0 <= at < lanes else None
            else:  # a node's failure, not a rank's: its first lane
                at = next(iter(node_lanes(number, node)), None)
            when = _time(cause.get("time")) or a_end
            marks.append(Mark(at, when, "failure" if final else "cause", words))
        for node in attempt.lost_nodes:
            for lane in node_lanes(number, node)[:1]:
                marks.append(Mark(lane, a_end, "lost", f"node {node} lost"))
        seating = seatings_of[number]
        for place in seating.nodes:
            host, node = _text(place.host), place.node
            if host in waited and node >= 0 and not per_rank and node // group < lanes:
                marks.append(
                    Mark(node // group, a_start, "spare", f"spare {host} runs node {node}")
                )
            elif host in waited and per_rank:
                for rank in _rank_range(place.ranks, lanes):
                    marks.append(Mark(rank, a_start, "spare", f"spare {host} runs rank {rank}"))
        spares = [_text(h) for h in seating.spares]
        waited.update(spares)
        if spares:
            shown = ", ".join(spares[:8]) + (f" (+{len(spares) - 8})" if len(spares) > 8 else "")
            notes.append(f"attempt {number}: spares waiting: {shown}")
        excluded = [_text(h) for h in seating.excluded]
        if excluded:
            notes.append(f"attempt {number}: excluded {', '.join(excluded[:8])}")
    if last_cause and not any(m.kind == "failure" for m in marks):
        marks.append(
            Mark(None, _time(last_cause.get("time")) or t1, "failure", cause_words(last_cause))
        )
    shades = []
    ran = dict(zip(numbers, ranks, strict=True))
    for entry in doc.stragglers[:MAX_SHADES]:
        number, node = entry.attempt, entry.node_rank
        rank = -1 if entry.rank is None else entry.rank
        if number not in spans or node < 0:
            continue
        a_start, a_end = spans[number]
        start = entry.since or a_start
        end = min(entry.until or a_end, a_end)
        if math.isinf(start) or math.isinf(end):
            continue
        if not per_rank:
            on = node_lanes(number, node)
        elif rank >= 0:
            on = [rank] if rank < lanes else []
        else:  # a whole node: the ranks it ran in that attempt
            on = [r.rank for r in ran.get(number, ()) if r.node_rank == node]
            on = [lane for lane in on if 0 <= lane < lanes]
        text = _text(entry.words)
        shades += [Shade(lane, start, max(start, end), text) for lane in sorted(set(on))]
    labels = tuple(_lane_label(lane, unit, group, hosts.get(lane, [])) for lane in range(lanes))
    status = _text(doc.status) or "?"
    # a job without a scheduler has no job or step id: its run id (`local-<time>-<pid>`) is
    # what every command takes
    named = (
        f"job {_text(job.id)} (step {_text(job.step) or '-'})"
        if _text(job.id)
        else f"local job {_text(job.run_id) or '?'}"
    )
    title = (
        f"{named}: {status}, "
        f"exit {_text(doc.exit_code)}, {len(attempts)} attempt(s), "
        f"{nodes} node(s), {most_ranks} rank(s)"
    )
    tail = [_text(line) for line in _list(last_cause.get("stderr_tail"))[-5:]]
    cause_lines = (f"root cause: {cause_words(last_cause)}", *tail) if last_cause else ()
    return Timeline(
        title, labels, unit, tuple(bars), tuple(marks), tuple(bands), t0, t1, cause_lines,
        tuple(notes[:12]), tuple(shades),
    )  # fmt: skip


def _add(cells: dict, hosts: dict[int, list[str]], lane: int, number: int, r: RankExit) -> None:
    """One rank's record into its lane's cell of that attempt: times, state, host."""
    host = _text(r.host)
    seen = hosts.setdefault(lane, [])
    if host and host not in seen and len(seen) < 3:
        seen.append(host)
    cell = cells.setdefault((lane, number), [math.inf, -math.inf, {}])
    for t in (r.started, r.ended):
        if t is not None:
            cell[0], cell[1] = min(cell[0], t), max(cell[1], t)
    state = _text(r.state) or "?"
    cell[2][state] = cell[2].get(state, 0) + 1


def _seating(attempt: Attempt, seated: Mapping[int, Seating]) -> Seating:
    """Who ran the attempt: its own record, else ranks.json's for that attempt."""
    return attempt.seating if attempt.seated else seated.get(attempt.attempt, NOBODY)


NOBODY = Seating(-1, (), (), ())


def cause_words(cause: Mapping[str, Any]) -> str:
    """agent.node.failure's words for the root cause, on one line."""
    return " ".join((words(cause) or "").split())[:1000] if cause else ""


def _rank_range(pair: tuple[int, int] | None, lanes: int) -> range:
    if pair is None:
        return range(0)
    return range(max(0, pair[0]), min(lanes, pair[1] + 1))


def _lane_label(lane: int, unit: str, group: int, hosts: list[str]) -> str:
    where = "→".join(hosts)  # a node whose host changed between attempts: a spare took it
    if unit == "nodes":
        return f"nodes {lane * group}-{(lane + 1) * group - 1}"
    return f"{unit} {lane}" + (f" · {where}" if where else "")


# What follows reads a failure record (a root cause): opaque to the summary's types (its kinds
# are the node's records'), so read here as anyone may have written it.
def _text(value: Any) -> str:
    if value is None:
        return ""
    text = " ".join(str(value).split())
    return text[:300]


def _int(value: Any, default: int = -1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _time(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
