"""What `agent logs` shows (pure): rank file names, the selection, line prefixes and splitting."""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.console.router import PALETTE
from agent.plan.log_dir import rank_file
from agent.text import printable

STREAMS = {"out": ("out",), "err": ("err",), "both": ("out", "err")}
_MAX_PARTIAL = 1 << 16  # a line longer than this is shown in pieces


@dataclass(frozen=True)
class RankFile:
    """One rank file: rank-00003.r1.err is rank 3, attempt 1, stream err."""

    rank: int
    attempt: int
    stream: str
    name: str

    @property
    def order(self) -> tuple[int, int, int]:
        return self.rank, self.attempt, 0 if self.stream == "out" else 1


@dataclass(frozen=True)
class Where:
    """Where a rank ran; node None when only the host is known."""

    host: str
    node: int | None


@dataclass(frozen=True)
class Selection:
    # Only ever asked `in` (never iterated, never len()): `--rank 0-9999999999` is a range.
    ranks: Container[int] | None  # None: every rank
    nodes: Container[int] | None  # None: every node
    streams: tuple[str, ...]
    attempt: int | str  # K, "all", or "latest" (following: the latest at start and later ones)
    grep: re.Pattern[str] | None


@dataclass(frozen=True)
class LogsCommand:
    log_dir: str
    selection: Selection
    follow: bool
    summary: bool
    prefix: bool
    lines: int | None  # only the last N lines of what exists at start; None: everything
    interval: float
    idle_exit: float = 600.0  # --follow ends after this long with no new byte in LOG_DIR; 0: never
    timeline: str | None = None  # --timeline FILE.svg: draw the job there instead


def parse_name(name: str) -> RankFile | None:
    named = rank_file(name)
    if named is None:
        return None
    return RankFile(named.rank, named.attempt, named.stream, name)


def latest_attempt(files: Iterable[RankFile]) -> int:
    return max((f.attempt for f in files), default=0)


def wanted(
    file: RankFile, selection: Selection, where: Mapping[int, Where], latest: int, following: bool
) -> bool | None:
    """Whether to show the file; None while --node is asked and the rank's node is not known yet."""
    if file.stream not in selection.streams:
        return False
    if selection.ranks is not None and file.rank not in selection.ranks:
        return False
    if not _attempt_matches(file.attempt, selection.attempt, latest, following):
        return False
    if selection.nodes is None:
        return True
    place = where.get(file.rank)
    if place is None or place.node is None:
        return None
    return place.node in selection.nodes


def _attempt_matches(attempt: int, wanted_attempt: int | str, latest: int, following: bool) -> bool:
    if wanted_attempt == "all":
        return True
    if wanted_attempt == "latest":
        # Following, a restart's files appear later: they are the new latest, so show them too.
        return attempt >= latest if following else attempt == latest
    return attempt == wanted_attempt


def prefix(file: RankFile, where: Mapping[int, Where], colour: bool) -> bytes:
    """b"n1:3: ", b"n1:3.r1: " for a restart, b"rank 3: " when the host is not known."""
    place = where.get(file.rank)
    name = f"{safe_text(place.host)}:{file.rank}" if place else f"rank {file.rank}"
    text = name + (f".r{file.attempt}" if file.attempt else "") + ": "
    if colour:
        text = f"\x1b[{PALETTE[file.rank % len(PALETTE)]}m{text}\x1b[0m"
    return text.encode()


def split_lines(partial: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (without "\\n") of partial + data, and what is left after the last newline."""
    lines = (partial + data).split(b"\n")
    rest = lines.pop()
    if len(rest) > _MAX_PARTIAL:
        lines.append(rest)
        rest = b""
    return lines, rest


def safe_text(value: Any, limit: int = 256, tabs: bool = False) -> str:
    """A value read from a file, fit to print as metadata: at most `limit` characters (then "…"),
    control characters escaped as text (ESC → \\x1b, U+202E → \\u202e); tabs kept if asked."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[:limit] + "…"
    if tabs:
        return "\t".join(printable(part, one_line=True) for part in text.split("\t"))
    return printable(text, one_line=True)


def selected(value: Any, chosen: Container[int] | None) -> bool:
    """Whether a rank or node number read from a file is in --rank/--node (None: all); a value
    that is not a number is in no selection."""
    if chosen is None:
        return True
    return isinstance(value, int) and not isinstance(value, bool) and value in chosen
