"""The per-rank table of `agent logs --summary`: drawn as rich draws its Table, without rich's
per-cell machinery when it fits the width (rich spends ~0.35 ms a row: 11 s for 32K ranks).

A `RankTable` is a rich renderable (it renders as the rich Table it stands for, so any console
prints it the same); `lines` gives the same text directly, or None where only rich can lay it
out (a table wider than the console wraps its cells).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

HEADER = ("rank", "host", "node", "state", "how", "seconds")
HEADER_STYLE = "bold"  # rich's table.header


class RankTable:
    def __init__(
        self,
        title: str,
        rows: Sequence[tuple[Sequence[str], str]],
        header: Sequence[str] = HEADER,  # `agent history` draws its own columns the same way
    ) -> None:
        self.title = title
        self.rows = rows  # (cells, row style)
        self.header = tuple(header)

    def table(self) -> Any:
        """The rich Table this stands for."""
        from rich.table import Table
        from rich.text import Text

        table = Table(*self.header, title=Text(self.title))
        for cells, style in self.rows:
            table.add_row(*(Text(cell) for cell in cells), style=style)
        return table

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield self.table()

    def lines(self, width: int, paint: Callable[[str, str], str] | None = None) -> list[str] | None:
        """The table as text lines, `paint(text, style)` colouring (None: plain); None when it
        is wider than `width` (rich then wraps cells: print `table()` instead)."""
        from rich.cells import cell_len

        def cells_of(text: str) -> int:  # printable ASCII: a cell a character, as rich counts
            return len(text) if text.isascii() and text.isprintable() else cell_len(text)

        sizes = [[cells_of(cell) for cell in cells] for cells, _ in self.rows]
        header = self.header
        widths = [len(h) for h in header]
        for row in sizes:
            widths = [max(w, s) for w, s in zip(widths, row, strict=True)]
        total = sum(widths) + 3 * len(widths) + 1
        excess = total - cell_len(self.title)
        if total > width or excess < 0:
            return None
        out = [
            " " * (excess // 2) + self.title + " " * (excess - excess // 2),
            "┏" + "┳".join("━" * (w + 2) for w in widths) + "┓",
            _row(header, [len(h) for h in header], widths, "┃", HEADER_STYLE, paint),
            "┡" + "╇".join("━" * (w + 2) for w in widths) + "┩",
        ]
        for (cells, style), size in zip(self.rows, sizes, strict=True):
            out.append(_row(cells, size, widths, "│", style, paint))
        out.append("└" + "┴".join("─" * (w + 2) for w in widths) + "┘")
        return out


def _row(
    cells: Sequence[str],
    sizes: Sequence[int],
    widths: Sequence[int],
    bar: str,
    style: str,
    paint: Callable[[str, str], str] | None,
) -> str:
    padded = [cell + " " * (w - s) for cell, s, w in zip(cells, sizes, widths, strict=True)]
    if paint is None or not style:
        return bar + " " + f" {bar} ".join(padded) + " " + bar
    space = paint(" ", style)
    return bar + bar.join(space + paint(cell, style) + space for cell in padded) + bar
