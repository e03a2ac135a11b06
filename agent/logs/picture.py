"""`agent logs LOG_DIR --timeline FILE.svg`: read the log dir, draw (agent.logs.timeline, timeline_svg), write."""

from __future__ import annotations

import os

from agent.errors import AgentError
from agent.history.liveness import unfinished
from agent.history.summary_doc import read_seatings, read_summary
from agent.logs.logdir import check_dir, read_json
from agent.logs.selection import safe_text
from agent.logs.timeline import layout
from agent.logs.timeline_svg import svg
from agent.plan.log_dir import LogDir


def write_timeline(log_dir: str, target: str) -> str:
    """Draw the job into `target` (write-then-rename); the line to print. AgentError (2) when
    there is no summary.json to draw or the file cannot be written."""
    summary = _json(LogDir(log_dir).summary)
    if summary is None:
        check_dir(log_dir)
        raise AgentError(
            f"no summary.json in {log_dir}: node 0 writes it when the job ends; the timeline "
            "draws a finished job"
        )
    if not isinstance(summary, dict):
        raise AgentError(f"{LogDir(log_dir).summary} is not a JSON object")
    judged = unfinished(log_dir)
    if judged is not None:  # its record from the start: no verdict to draw
        raise AgentError(f"{judged[1]}: the timeline draws a job from its summary, at its end")
    try:
        ranks = _json(LogDir(log_dir).ranks)
    except AgentError:
        ranks = None  # only a fallback for the seating of old summaries
    seatings = read_seatings(ranks.get("attempts") if isinstance(ranks, dict) else None)
    timeline = layout(read_summary(summary), seatings)
    tmp = f"{target}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(svg(timeline))
        os.replace(tmp, target)
    except OSError as exc:
        raise AgentError(f"cannot write the timeline {target}: {exc.strerror or exc}") from None
    return (
        f"timeline: {target} ({len(timeline.lanes)} lane(s) by {timeline.unit}, "
        f"{len(timeline.bands)} attempt(s))"
    )


def _json(path: str) -> object:
    try:
        return read_json(path)
    except (OSError, ValueError) as exc:
        raise AgentError(f"cannot read {path}: {safe_text(exc, limit=300)}") from None
