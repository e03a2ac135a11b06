"""Pure helpers: medians, ratios, number formatting and markdown tables (unit-tested)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """ours / theirs; None when either is missing or the denominator is not positive."""
    if ours is None or theirs is None or theirs <= 0:
        return None
    return ours / theirs


def minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def secs(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f} s"


def times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}×"


def rate(value: float | None) -> str:
    """Lines or bytes per second, human sized: 1.23 M/s."""
    if value is None:
        return "n/a"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}/s"
    return f"{value:.0f} /s"


def mib(n_bytes: float | None) -> str:
    return "n/a" if n_bytes is None else f"{n_bytes / 2**20:.1f} MiB"


def verdict(ok: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "n/a"}[ok]


def spread(values: Sequence[float]) -> str:
    """`min–max` of the repetitions, for the reader to judge the noise."""
    if not values:
        return "-"
    if len(values) == 1:
        return "1 run"
    return f"{min(values):.2f}–{max(values):.2f}"


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.header):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.header)} columns")
        self.rows.append([str(c) for c in cells])

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", _row(self.header), _row(["---"] * len(self.header))]
        lines += [_row(r) for r in self.rows]
        if self.notes:
            lines.append("")
            lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


@dataclass(frozen=True)
class Target:
    name: str
    wanted: str
    measured: str
    ok: bool | None


def targets_table(targets: Sequence[Target]) -> Table:
    table = Table("Targets", ["target", "wanted", "measured", "verdict"])
    for t in targets:
        table.add(t.name, t.wanted, t.measured, verdict(t.ok))
    return table
