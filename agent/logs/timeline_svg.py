"""The timeline drawn (pure: a `Timeline` in, SVG text out): `svg(timeline)` is plain SVG 1.1;
every text that came from a file is escaped."""

from __future__ import annotations

import re
from xml.sax.saxutils import escape

from agent.logs.timeline import COLOURS, MARKS, OTHER, RANK_LANES, STRAGGLER, WORST, Mark, Timeline

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
