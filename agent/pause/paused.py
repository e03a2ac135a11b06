"""Where a rank paused, and the text about it: the console line, `agent debug --list`, answers
collated across ranks (pure). A record crosses nodes: `from_json` trusts nothing."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.pause.frames import MAX_LINE
from agent.plan.rank_set import format_ranges

MAX_TEXT = 512
_RULE = "-" * 16


@dataclass(frozen=True)
class Paused:
    rank: int
    host: str
    pid: int
    file: str
    line: int
    function: str
    reason: str  # "breakpoint", or "exception: ValueError: ..."

    @property
    def location(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line} in {self.function}"

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "pid": self.pid,
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: object) -> Paused:
        """ValueError when `data` is not a record."""
        if not isinstance(data, dict):
            raise ValueError("paused record is not an object")
        return cls(
            _int(data.get("rank")),
            _text(data.get("host")),
            _int(data.get("pid")),
            _text(data.get("file")),
            _int(data.get("line")),
            _text(data.get("function")),
            _text(data.get("reason")),
        )


def line_refused(line: str) -> str | None:
    """Why a pdb line is not sent to a rank (one line), or None: it may go."""
    if len(line) <= MAX_LINE:
        return None
    return (
        f"[agent] line refused: {len(line):,} characters, pdb lines are limited to "
        f"{MAX_LINE:,}; the rank stays paused"
    )


def console_line(paused: Paused, log_dir: str) -> str:
    """What the console says once per paused rank."""
    return (
        f"rank {paused.rank} paused at {paused.location} ({paused.reason}): "
        f"python -m agent debug {log_dir} --rank {paused.rank}"
    )


def render_list(paused: Sequence[Paused]) -> str:
    """`agent debug --list`: ranks grouped by where and why they paused."""
    if not paused:
        return "no rank is paused\n"
    groups: dict[tuple[str, int, str, str], list[Paused]] = {}
    for item in sorted(paused, key=lambda p: p.rank):
        groups.setdefault((item.file, item.line, item.function, item.reason), []).append(item)
    lines = []
    for (file, line, function, reason), members in groups.items():
        ranks = [p.rank for p in members]
        hosts = sorted({p.host for p in members})
        noun = "rank" if len(ranks) == 1 else "ranks"
        lines.append(
            f"{noun} {format_ranges(ranks)} ({', '.join(hosts)}): {file}:{line} in {function} "
            f"({reason})"
        )
    return "\n".join(lines) + "\n"


def render_answers(answers: Mapping[int, str]) -> str:
    """One pdb command's answers: identical answers once, under their rank list (as `agent
    exec` collates nodes)."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(answers):
        groups.setdefault(answers[rank], []).append(rank)
    parts = []
    for text, ranks in groups.items():
        noun = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{_RULE}\n{noun} {format_ranges(ranks)}\n{_RULE}\n{text.rstrip()}\n")
    return "".join(parts)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("paused record: not an integer")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("paused record: not a string")
    return value[:MAX_TEXT]
