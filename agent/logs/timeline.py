"""`agent logs LOG_DIR --timeline FILE.svg`: a job as a picture (pure: summary in, SVG text out).

`layout(summary, seatings)` reads summary.json (and, for attempts whose record lacks its
seating, ranks.json's "attempts") into a frozen `Timeline`: one lane per rank up to RANK_LANES
ranks, else one per node, and above MAX_LANES nodes one per group of consecutive nodes (the lane
shows the worst state of its ranks), so the picture stays the same size at 4,096 nodes. Per lane
and attempt one bar from the first rank start to the last rank end; attempts as bands side by
side in time, each restart a dashed line; markers for each attempt's root cause (the job's own
in red, with its words and stderr below the plot), lost nodes and spares seated in a node's
place; stragglers (summary.json's `stragglers`) shaded on their lanes from when node 0 named
them until they kept pace again (or their attempt ended). `svg(timeline)` draws it as plain
SVG 1.1; every text that came from a file is escaped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

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


def layout(summary: Mapping[str, Any], seatings: Sequence[Any] = ()) -> Timeline:
    job = _map(summary.get("job"))
    attempts = [a for a in _list(summary.get("attempts")) if isinstance(a, Mapping)]
    notes = []
    if len(attempts) > MAX_ATTEMPTS:
        notes.append(f"the first {len(attempts) - MAX_ATTEMPTS} attempts are not drawn")
        attempts = attempts[-MAX_ATTEMPTS:]
    seated = {_int(s.get("attempt")): s for s in seatings if isinstance(s, Mapping)}
    ranks = [[r for r in _list(a.get("ranks")) if isinstance(r, Mapping)] for a in attempts]
    numbers = [_int(a.get("attempt"), i) for i, a in enumerate(attempts)]
    most_ranks = max((sum(1 for r in rs if _int(r.get("rank")) >= 0) for rs in ranks), default=0)
    nodes = 1 + max(
        (_int(r.get("node_rank")) for rs in ranks for r in rs),
        default=max(0, _int(job.get("nnodes"), 1) - 1),
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
    seats = {
        number: {
            _int(_map(place).get("node")): _rank_range(_map(place).get("ranks"), RANK_LANES)
            for place in _list(_seating(attempt, seated, number).get("nodes"))
        }
        for number, attempt in zip(numbers, attempts, strict=True)
    }

    def node_lanes(number: int, node: int) -> list[int]:
        if not per_rank:
            return [node // group] if 0 <= node // group < lanes else []
        return [r for r in seats[number].get(node, range(0)) if r < lanes]

    for number, rs in zip(numbers, ranks, strict=True):
        for r in rs:
            rank, node = _int(r.get("rank")), _int(r.get("node_rank"))
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
    last_cause = _map(summary.get("root_cause"))
    for i, (number, attempt) in enumerate(zip(numbers, attempts, strict=True)):
        a_start, a_end = spans[number]
        if math.isinf(a_start):
            a_start = a_end = t1
        cause = _map(attempt.get("root_cause"))
        words = cause_words(cause)
        bands.append(
            Band(number, a_start, a_end, f"attempt {number}" + (f": {words}" if words else ""))
        )
        if cause:
            final = i == len(attempts) - 1 and cause == last_cause
            node, rank = _int(cause.get("node_rank")), _int(cause.get("rank"))
            if rank >= 0 and node >= 0:
                lane: int | None = lane_of(rank, node)
                lane = lane if lane is not None and 0 <= lane < lanes else None
            else:  # a node's failure, not a rank's: its first lane
                lane = next(iter(node_lanes(number, node)), None)
            when = _time(cause.get("time")) or a_end
            marks.append(Mark(lane, when, "failure" if final else "cause", words))
        for node in _list(attempt.get("lost_nodes")):
            for lane in node_lanes(number, _int(node))[:1]:
                marks.append(Mark(lane, a_end, "lost", f"node {node} lost"))
        seating = _seating(attempt, seated, number)
        for place in _list(seating.get("nodes")):
            host = _text(_map(place).get("host"))
            node = _int(_map(place).get("node"))
            if host in waited and node >= 0 and not per_rank and node // group < lanes:
                marks.append(
                    Mark(node // group, a_start, "spare", f"spare {host} runs node {node}")
                )
            elif host in waited and per_rank:
                for rank in _rank_range(_map(place).get("ranks"), lanes):
                    marks.append(Mark(rank, a_start, "spare", f"spare {host} runs rank {rank}"))
        spares = [_text(h) for h in _list(seating.get("spares"))]
        waited.update(spares)
        if spares:
            shown = ", ".join(spares[:8]) + (f" (+{len(spares) - 8})" if len(spares) > 8 else "")
            notes.append(f"attempt {number}: spares waiting: {shown}")
        excluded = [_text(_map(e).get("host")) for e in _list(seating.get("excluded"))]
        if excluded:
            notes.append(f"attempt {number}: excluded {', '.join(excluded[:8])}")
    if last_cause and not any(m.kind == "failure" for m in marks):
        marks.append(
            Mark(None, _time(last_cause.get("time")) or t1, "failure", cause_words(last_cause))
        )
    shades = []
    ran = dict(zip(numbers, ranks, strict=True))
    for entry in _list(summary.get("stragglers"))[:MAX_SHADES]:
        entry = _map(entry)
        number, node, rank = (
            _int(entry.get("attempt")),
            _int(entry.get("node_rank")),
            _int(entry.get("rank")),
        )
        if number not in spans or node < 0:
            continue
        a_start, a_end = spans[number]
        start = _time(entry.get("since")) or a_start
        end = min(_time(entry.get("until")) or a_end, a_end)
        if math.isinf(start) or math.isinf(end):
            continue
        if not per_rank:
            on = node_lanes(number, node)
        elif rank >= 0:
            on = [rank] if rank < lanes else []
        else:  # a whole node: the ranks it ran in that attempt
            on = [
                _int(r.get("rank")) for r in ran.get(number, []) if _int(r.get("node_rank")) == node
            ]
            on = [lane for lane in on if 0 <= lane < lanes]
        text = _straggler_words(entry)
        shades += [Shade(lane, start, max(start, end), text) for lane in sorted(set(on))]
    labels = tuple(_lane_label(lane, unit, group, hosts.get(lane, [])) for lane in range(lanes))
    status = _text(summary.get("status")) or "?"
    # a job without a scheduler has no job or step id: its run id (`local-<time>-<pid>`) is
    # what every command takes
    named = (
        f"job {_text(job.get('id'))} (step {_text(job.get('step')) or '-'})"
        if _text(job.get("id"))
        else f"local job {_text(job.get('run_id')) or '?'}"
    )
    title = (
        f"{named}: {status}, "
        f"exit {_text(summary.get('exit_code'))}, {len(attempts)} attempt(s), "
        f"{nodes} node(s), {most_ranks} rank(s)"
    )
    tail = [_text(line) for line in _list(last_cause.get("stderr_tail"))[-5:]]
    cause_lines = (f"root cause: {cause_words(last_cause)}", *tail) if last_cause else ()
    return Timeline(
        title, labels, unit, tuple(bars), tuple(marks), tuple(bands), t0, t1, cause_lines,
        tuple(notes[:12]), tuple(shades),
    )  # fmt: skip


def _add(cells: dict, hosts: dict[int, list[str]], lane: int, number: int, r: Mapping) -> None:
    """One rank's record into its lane's cell of that attempt: times, state, host."""
    host = _text(r.get("host"))
    seen = hosts.setdefault(lane, [])
    if host and host not in seen and len(seen) < 3:
        seen.append(host)
    cell = cells.setdefault((lane, number), [math.inf, -math.inf, {}])
    for t in (_time(r.get("start")), _time(r.get("end"))):
        if t is not None:
            cell[0], cell[1] = min(cell[0], t), max(cell[1], t)
    state = _text(r.get("state")) or "?"
    cell[2][state] = cell[2].get(state, 0) + 1


def _seating(attempt: Mapping[str, Any], seated: Mapping[int, Any], number: int) -> Mapping:
    """Who ran the attempt: its own record, else ranks.json's for that attempt."""
    return attempt if "nodes" in attempt else _map(seated.get(number))


def cause_words(cause: Mapping[str, Any]) -> str:
    """agent.node.failure's words for the root cause, on one line."""
    return " ".join((words(cause) or "").split())[:1000] if cause else ""


def _straggler_words(entry: Mapping[str, Any]) -> str:
    rank, node, host = entry.get("rank"), _text(entry.get("node_rank")), _text(entry.get("host"))
    what = (
        f"node {node} ({host})" if rank is None else f"rank {_text(rank)} on {host} (node {node})"
    )
    median, job = entry.get("median"), entry.get("job_median")
    pace = (
        f" at {median:.3g} s/step, the job's median {job:.3g} s/step"
        if isinstance(median, (int, float)) and isinstance(job, (int, float))
        else ""
    )
    return f"straggler in attempt {_text(entry.get('attempt'))}: {what}{pace}"


def _rank_range(value: Any, lanes: int) -> range:
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return range(max(0, value[0]), min(lanes, value[1] + 1))
    return range(0)


def _lane_label(lane: int, unit: str, group: int, hosts: list[str]) -> str:
    where = "→".join(hosts)  # a node whose host changed between attempts: a spare took it
    if unit == "nodes":
        return f"nodes {lane * group}-{(lane + 1) * group - 1}"
    return f"{unit} {lane}" + (f" · {where}" if where else "")


# -- drawing ---------------------------------------------------------------------------------
WIDTH = 1200
LEFT = 230  # the lane labels
CHAR = 6.5  # the widest a character of 11 px sans-serif is drawn, on average, in pixels
LABEL_CHARS = int((LEFT - 10) / CHAR)  # a lane label ends at LEFT - 6: this many fit before 0
RIGHT = 20
TOP = 70


def svg(t: Timeline) -> str:
    lane_h = 16 if len(t.lanes) <= RANK_LANES else 9
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = max(lane_h, lane_h * len(t.lanes))
    bottom = TOP + plot_h
    span = max(t.t1 - t.t0, 1e-3)

    def x(time: float) -> float:
        return LEFT + (min(max(time, t.t0), t.t1) - t.t0) / span * plot_w

    below = 50 + 16 * (len(t.cause) + len(t.notes)) + 30
    height = bottom + below
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        f'<text x="10" y="20" font-size="14" font-weight="bold">'
        f"{_esc(_cut(t.title, int((WIDTH - 20) / (CHAR * 14 / 11))))}</text>",
    ]
    for i, band in enumerate(t.bands):  # attempts side by side; a restart is a dashed line
        x0, x1 = x(band.start), x(band.end)
        fill = "#f0f0f8" if i % 2 == 0 else "#f8f8f0"
        out.append(
            f'<g class="attempt" data-attempt="{band.attempt}"><title>{_esc(band.text)}</title>'
            f'<rect x="{x0:.1f}" y="{TOP - 30}" width="{max(x1 - x0, 1):.1f}" '
            f'height="{plot_h + 30}" fill="{fill}"/>'
            f'<text x="{x0 + 2:.1f}" y="{TOP - 18 + 10 * (i % 2)}">'
            f"{_esc(_cut(band.text, min(90, int((WIDTH - x0 - 6) / CHAR))))}</text>"
            "</g>"
        )
        if i:
            out.append(
                f'<line class="restart" x1="{x0:.1f}" y1="{TOP - 30}" x2="{x0:.1f}" y2="{bottom}" '
                f'stroke="#444" stroke-dasharray="4 3"><title>restart {band.attempt}</title></line>'
            )
    # Every lane is labelled when they are tall enough; else every 4th, and always the lanes
    # where something went wrong (in red), never one right beside those (it would be misread).
    marked = {b.lane for b in t.bars if b.state in ("failed", "lost")}
    marked |= {m.lane for m in t.marks if m.lane is not None}
    size = min(11, lane_h)
    for lane, label in enumerate(t.lanes):
        if lane in marked:
            style = ' fill="#d62728" font-weight="bold"'
        elif lane_h >= 12 or (lane % 4 == 0 and not {lane - 1, lane + 1} & marked):
            style = ""
        else:
            continue
        y = TOP + lane * lane_h + lane_h / 2 + size * 0.35
        out.append(
            f'<text x="{LEFT - 6}" y="{y:.1f}" text-anchor="end" font-size="{size}"{style}>'
            f"{_esc(_cut(label, LABEL_CHARS))}</text>"
        )
    for bar in t.bars:
        y = TOP + bar.lane * lane_h + 2
        x0 = x(bar.start)
        out.append(
            f'<rect class="bar {_esc(bar.state)}" x="{x0:.1f}" y="{y}" '
            f'width="{max(x(bar.end) - x0, 1.5):.1f}" height="{lane_h - 4}" '
            f'fill="{COLOURS.get(bar.state, OTHER)}"><title>{_esc(t.lanes[bar.lane])} {_esc(bar.tip)}</title></rect>'
        )
    for shade in t.shades:  # over the bars, translucent: the bar's state still shows
        x0 = x(shade.start)
        out.append(
            f'<rect class="straggler" x="{x0:.1f}" y="{TOP + shade.lane * lane_h}" '
            f'width="{max(x(shade.end) - x0, 1.5):.1f}" height="{lane_h}" fill="{STRAGGLER}" '
            f'fill-opacity="0.6" stroke="#b8860b"><title>{_esc(shade.text)}</title></rect>'
        )
    for mark in t.marks:
        out.append(_mark(mark, x(mark.time), lane_h, bottom))
    out.append(
        f'<line x1="{LEFT}" y1="{bottom}" x2="{LEFT + plot_w}" y2="{bottom}" stroke="#000"/>'
    )
    for k in range(7):  # the time axis: seconds since the first rank started
        tx = LEFT + plot_w * k / 6
        out.append(
            f'<line x1="{tx:.1f}" y1="{bottom}" x2="{tx:.1f}" y2="{bottom + 4}" stroke="#000"/>'
            f'<text x="{tx:.1f}" y="{bottom + 16}" text-anchor="middle">{span * k / 6:.1f} s</text>'
        )
    y = bottom + 36
    lx = 10
    for name in WORST:  # the bars' colours, then the markers drawn as on the plot
        out.append(
            f'<rect x="{lx}" y="{y - 9}" width="10" height="10" fill="{COLOURS[name]}"/>'
            f'<text x="{lx + 14}" y="{y}">{name}</text>'
        )
        lx += 24 + 7 * len(name)
    out.append(
        f'<g class="legend straggler"><rect x="{lx}" y="{y - 9}" width="10" height="10" '
        f'fill="{STRAGGLER}" stroke="#b8860b"/></g><text x="{lx + 14}" y="{y}">straggler</text>'
    )
    lx += 24 + 7 * len("straggler")
    for kind, name in MARKS.items():
        key = _mark(Mark(None, 0.0, kind, name), lx + 5, 10, 0, y - 4)
        out.append(key.replace('class="mark ', 'class="legend ', 1))
        out.append(f'<text x="{lx + 14}" y="{y}">{name}</text>')
        lx += 24 + 7 * len(name)
    for i, line in enumerate(t.cause):
        y += 16
        style = ' font-weight="bold" fill="#d62728"' if i == 0 else ' font-family="monospace"'
        out.append(f'<text class="cause" x="10" y="{y}"{style}>{_esc(_cut(line, 180))}</text>')
    for note in t.notes:
        y += 16
        out.append(f'<text class="note" x="10" y="{y}" fill="#555">{_esc(_cut(note, 180))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _mark(mark: Mark, mx: float, lane_h: int, bottom: int, cy: float | None = None) -> str:
    """A marker on its lane (at `cy` when given: the legend's); across the plot without one."""
    tip = f"<title>{_esc(mark.text)}</title>"
    if mark.lane is None and cy is None:
        return (
            f'<line class="mark {mark.kind}" x1="{mx:.1f}" y1="{TOP}" x2="{mx:.1f}" y2="{bottom}" '
            f'stroke="#d62728" stroke-width="2">{tip}</line>'
        )
    if cy is None:
        cy = TOP + (mark.lane or 0) * lane_h + lane_h / 2
    r = max(3.0, lane_h / 2 - 1)
    if mark.kind in ("failure", "cause"):
        colour = "#d62728" if mark.kind == "failure" else "#ff7f0e"
        return (
            f'<g class="mark {mark.kind}">{tip}<path d="M{mx - r:.1f},{cy - r:.1f} L{mx + r:.1f},{cy + r:.1f} '
            f'M{mx - r:.1f},{cy + r:.1f} L{mx + r:.1f},{cy - r:.1f}" stroke="{colour}" stroke-width="3"/></g>'
        )
    if mark.kind == "spare":
        return (
            f'<g class="mark spare">{tip}<polygon points="{mx:.1f},{cy - r:.1f} {mx + r * 1.5:.1f},{cy:.1f} '
            f'{mx:.1f},{cy + r:.1f}" fill="#1f77b4"/></g>'
        )
    return f'<g class="mark {mark.kind}">{tip}<circle cx="{mx:.1f}" cy="{cy:.1f}" r="{r:.1f}" fill="#9467bd"/></g>'


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffe\uffff\ud800-\udfff]")


_QUOTES = {'"': "&quot;", "'": "&apos;"}


def _esc(text: str) -> str:
    """Text fit for an SVG element or an attribute's value: characters XML 1.0 cannot hold shown
    as \\xNN, then escaped, quotes included (a quote would end the attribute)."""
    return escape(_NOT_XML.sub(lambda m: f"\\x{ord(m[0]):02x}", text), _QUOTES)


def _cut(text: str, limit: int) -> str:
    if limit < 1:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


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


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
