"""`agent status` as a few plain lines, from node 0's status message (pure; any field may be
missing or of the wrong type: an older or newer agent, so render what makes sense and go on)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def render_status(status: Mapping[str, Any], now: float) -> list[str]:
    nodes = [n for n in _list(status.get("nodes")) if isinstance(n, Mapping)]
    states = [_text(n.get("state"), "unknown") for n in nodes]
    counts = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states), key=states.index))
    where = _text(status.get("host"), "")
    head = f"job {_text(status.get('job'), '?')}: {_plural(len(nodes), 'resident agent')}"
    lines = [head + (f" ({counts})" if nodes else "") + (f", node 0 on {where}" if where else "")]
    for node in nodes:
        preload = [_text(p, "?") for p in _list(node.get("preload"))]
        lines.append(
            f"  node {_text(node.get('index'), '?'):<3} {_text(node.get('host'), '?'):<20} "
            f"{_text(node.get('state'), 'unknown'):<8} {'warm' if node.get('warm') else 'cold'}"
            + (f"  preload: {', '.join(preload)}" if preload else "")
        )
    current = status.get("run")
    if isinstance(current, Mapping):
        started = current.get("started")
        since = (
            f", running for {_duration(now - started)}"
            if isinstance(started, int | float) and not isinstance(started, bool)
            else ""
        )
        log_dir = _text(current.get("log_dir"), "")
        lines.append(
            f"run {_text(current.get('id') or current.get('run'), '?')}: "
            f"{_text(current.get('script'), '?')}{since}"
            + (f", logs in {log_dir}" if log_dir else "")
        )
    else:
        lines.append("no run in progress")
    runs = status.get("runs")
    if isinstance(runs, int) and not isinstance(runs, bool):
        lines.append(f"runs so far: {runs}")
    return lines


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _text(value: object, default: str) -> str:
    """Scalars as text; anything else (a nested object from a confused peer) as the default.
    Control characters are dropped: the status comes over the network into a terminal."""
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return "".join(ch for ch in str(value) if ch.isprintable())[:200]
    return default


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list) else []
