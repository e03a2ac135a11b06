"""Rank lists like `0,3-5`, `all`, `none`: parsed into ranges, so any list costs O(parts)."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator

from agent.errors import AgentError

MAX_RANK_PARTS = 10_000  # comma-separated parts in one rank list
_RANK_PART = re.compile(r"\s*([0-9]{1,18})\s*(?:-\s*([0-9]{1,18})\s*)?")


def format_ranges(numbers: Iterable[int]) -> str:
    """{0, 1, 2, 3, 8} -> "0-3,8" (the kernel's cpulist spelling, Slurm's rank lists); a
    negative number (no rank: a node's own error in collated stacks) stands alone. The one
    formatter for CPU lists, rank lists and node lists."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and spans[-1][0] >= 0 and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in spans)


class RankSet:
    """An immutable set of ranks kept as sorted, merged, inclusive (low, high) ranges: memory
    grows with the number of ranges, never with the ranks they cover (0-9999999999 is one).

    It answers `rank in s` by bisection and equals a frozenset of the same ints, so it stands in
    wherever parse_rank_set's result used to be a frozenset."""

    __slots__ = ("_lows", "_highs", "_len")
    _lows: tuple[int, ...]
    _highs: tuple[int, ...]
    _len: int

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        merged: list[list[int]] = []
        for low, high in sorted((int(low), int(high)) for low, high in ranges):
            if low > high:
                raise ValueError(f"range {low}-{high} is reversed")
            if merged and low <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], high)
            else:
                merged.append([low, high])
        object.__setattr__(self, "_lows", tuple(low for low, _ in merged))
        object.__setattr__(self, "_highs", tuple(high for _, high in merged))
        object.__setattr__(self, "_len", sum(high - low + 1 for low, high in merged))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("RankSet is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("RankSet is immutable")

    def __reduce__(self) -> tuple[type, tuple[tuple[tuple[int, int], ...]]]:
        return RankSet, (self.ranges,)

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self._lows, self._highs, strict=True))

    def __contains__(self, rank: object) -> bool:
        if isinstance(rank, float) and rank.is_integer():
            rank = int(rank)  # as `1.0 in frozenset({1})`
        if not isinstance(rank, int):
            return False
        at = bisect.bisect_right(self._lows, rank) - 1
        return at >= 0 and rank <= self._highs[at]

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return bool(self._lows)

    def __iter__(self) -> Iterator[int]:
        for low, high in zip(self._lows, self._highs, strict=True):
            yield from range(low, high + 1)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankSet):
            return self.ranges == other.ranges
        if isinstance(other, (set, frozenset)):
            return len(other) == self._len and all(rank in self for rank in other)
        return NotImplemented

    def __hash__(self) -> int:
        # Equal objects hash equal: a set small enough to be a frozenset hashes as one.
        return hash(frozenset(self)) if self._len <= 65536 else hash(self.ranges)

    def __str__(self) -> str:
        return ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges) or "none"

    def __repr__(self) -> str:
        return f"RankSet({str(self)!r})"


def parse_rank_set(text: str | None, what: str) -> RankSet | None:
    """'0,3-5' → {0,3,4,5}; None/'all' → None (every rank); 'none' → empty.

    The result is a RankSet: `rank in result` costs a bisection and memory stays small whatever
    the ranges cover. Negative ranks, reversed ranges (5-3) and more than MAX_RANK_PARTS parts
    are one-line errors."""
    if text is None or text.strip() == "all":
        return None
    if text.strip() == "none":
        return RankSet()
    shown = repr(text) if len(text) <= 80 else repr(text[:60]) + f"... ({len(text):,} chars)"
    if text.count(",") >= MAX_RANK_PARTS:
        raise AgentError(
            f"{what} {shown}: more than {MAX_RANK_PARTS:,} comma-separated parts; "
            "use ranges like 0-511 instead"
        )
    ranges = []
    for part in text.split(","):
        match = _RANK_PART.fullmatch(part)
        if match is None:
            bad = part.strip()
            hint = " (ranks are 0 or more)" if bad.startswith("-") else ""
            raise AgentError(
                f"{what} {shown}: {bad[:40]!r} is not a rank or a range{hint}; "
                "expected ranks like 0,3-5, 'all' or 'none'"
            )
        low, high = int(match[1]), int(match[2] or match[1])
        if low > high:
            raise AgentError(
                f"{what} {shown}: the range {low}-{high} is reversed; write {high}-{low}"
            )
        ranges.append((low, high))
    return RankSet(ranges)
