"""Where a warm run's time goes, from Enter to the prompt, read back from what the run left:
the press and the client's exit (the bench's clock), node 0's agent log (its millisecond
timestamps: the attempt started, ranks forked), each rank's record (first line, all_reduce
done: relaunch_rank.py) and summary.json (each rank's exit as its agent saw it; the file's own
time: the verdict written). Pure but for reading those files."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# (phase, what it measures); the all_reduce row is the user's work, the rest the launcher's
PHASES = (
    ("to_attempt", "Enter → node 0 starts the attempt (client start, handshake, plan, lineup)"),
    ("fork", "→ every rank of node 0 started (forked ahead of the run, or from the zygote now)"),
    ("first_line", "→ every rank at its first line (its start-up, as the script sees it)"),
    ("user_work", "→ every rank's all_reduce done (init_process_group + all_reduce: the user's)"),
    ("rank_end", "→ every rank's exit seen by its agent (the script's end, interpreter shutdown)"),
    ("verdict", "→ summary.json written (results, verdict, summary)"),
    ("prompt", "→ the client exited (history, farewell, client shutdown)"),
)
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ \S+ (.*)$")


def log_times(text: str) -> dict[str, float]:
    """The first time each milestone appears in an agent log (epoch seconds, local time)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        m = _LOG_LINE.match(line)
        if not m:
            continue
        when = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        what = m.group(2)
        if "starting ranks" in what:
            found.setdefault("attempt", when)
        elif "forked warm" in what or "started" in what and "ranks" in what:
            found.setdefault("forked", when)
    return found


def phases(
    press: float, exited: float, ranks: Sequence[Mapping[str, Any]], log_dir: Path
) -> dict[str, float] | None:
    """Seconds per phase (PHASES), or None when a file is missing."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        agent_log = log_times((log_dir / "agent-00000.log").read_text(errors="replace"))
        summary_path = log_dir / "summary.json"
        summary = json.loads(summary_path.read_text())
        ends = [r["end"] for r in summary["attempts"][-1]["ranks"] if r.get("end")]
        marks = [
            press,
            agent_log["attempt"],
            agent_log.get("forked", agent_log["attempt"]),
            max(r["first_line"] for r in ranks),
            max(r["all_reduce"] for r in ranks),
            max(ends),
            os.stat(summary_path).st_mtime,
            exited,
        ]
        return {name: marks[i + 1] - marks[i] for i, (name, _) in enumerate(PHASES)}
    return None
