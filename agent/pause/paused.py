"""Where a rank paused, and the text about it: the console line, `agent debug --list`, answers
collated across ranks (pure). A record crosses nodes: `from_json` trusts nothing."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping, Sequence
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


def console_line(paused: Paused, log_dir: str, pid: bool = False) -> str:
    """What the console says once per paused process of a rank (`pid`: another process of the
    same rank is paused too, so the command names this one)."""
    which = f"--rank {paused.rank}" + (f" --pid {paused.pid}" if pid else "")
    return (
        f"rank {paused.rank} paused at {paused.location} ({paused.reason}): "
        f"python -m agent debug {log_dir} {which}"
    )


def answer_key(rank: int, pid: int) -> str:
    """A paused process's key in the answers to a pdb command (JSON object keys are text)."""
    return f"{rank}:{pid}"


def parse_answer_key(key: object) -> tuple[int, int] | None:
    """(rank, pid) from `answer_key`'s text; None when it is not one."""
    rank, _, pid = str(key).partition(":")
    if not (rank.lstrip("-").isdigit() and pid.isdigit()):
        return None
    return int(rank), int(pid)


def several(processes: Iterable[tuple[int, int]]) -> set[int]:
    """The ranks with more than one paused process (a forked DataLoader worker, say): those
    are named with their pid."""
    seen: dict[int, set[int]] = {}
    for rank, pid in processes:
        seen.setdefault(rank, set()).add(pid)
    return {rank for rank, pids in seen.items() if len(pids) > 1}


def label(processes: Iterable[tuple[int, int]], named: Collection[int]) -> str:
    """'rank 3', 'ranks 0,2-3', 'ranks 0, 1 (pid 4242)': the ranks in `named` by process."""
    items = sorted(set(processes))
    plain = sorted({rank for rank, _ in items if rank not in named})
    by_pid = [f"{rank} (pid {pid})" for rank, pid in items if rank in named]
    noun = "rank" if len(plain) + len(by_pid) == 1 else "ranks"
    return f"{noun} {', '.join(([format_ranges(plain)] if plain else []) + by_pid)}"


def render_list(paused: Sequence[Paused]) -> str:
    """`agent debug --list`: ranks grouped by where and why they paused; a rank with several
    paused processes is listed by process (rank and pid)."""
    if not paused:
        return "no rank is paused\n"
    named = several((p.rank, p.pid) for p in paused)
    groups: dict[tuple[str, int, str, str], list[Paused]] = {}
    for item in sorted(paused, key=lambda p: (p.rank, p.pid)):
        groups.setdefault((item.file, item.line, item.function, item.reason), []).append(item)
    lines = []
    for (file, line, function, reason), members in groups.items():
        hosts = sorted({p.host for p in members})
        who = label(((p.rank, p.pid) for p in members), named)
        lines.append(f"{who} ({', '.join(hosts)}): {file}:{line} in {function} ({reason})")
    return "\n".join(lines) + "\n"


def render_answers(answers: Mapping[tuple[int, int], str]) -> str:
    """One pdb command's answers, by (rank, pid): identical answers once, under their rank list
    (as `agent exec` collates nodes)."""
    named = several(answers)
    groups: dict[str, list[tuple[int, int]]] = {}
    for process in sorted(answers):
        groups.setdefault(answers[process], []).append(process)
    parts = []
    for text, processes in groups.items():
        parts.append(f"{_RULE}\n{label(processes, named)}\n{_RULE}\n{text.rstrip()}\n")
    return "".join(parts)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("paused record: not an integer")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("paused record: not a string")
    return value[:MAX_TEXT]
