"""`agent logs` at scale: the --summary rank table drawn without rich's per-cell work must read
exactly as rich's Table did (plain and coloured), and falls back to rich where rich would wrap."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from agent.console.rank_table import RankTable
from agent.logs import main as logs_main
from agent.logs.selection import Selection
from agent.logs.summary_view import _painter, summary_view

ANSI = re.compile(r"\x1b\[[0-9;]*m")
EVERY = Selection(None, None, ("out", "err"), "latest", None)


def _rich(renderable, colour: bool, width: int = 100) -> str:
    console = Console(
        file=io.StringIO(), force_terminal=colour, no_color=not colour, width=width, highlight=False
    )
    with console.capture() as captured:
        console.print(renderable)
    return captured.get()


def _direct(table: RankTable, colour: bool, width: int = 100) -> str | None:
    console = Console(
        file=io.StringIO(), force_terminal=colour, no_color=not colour, width=width, highlight=False
    )
    lines = table.lines(width, _painter(console) if colour else None)
    return None if lines is None else "\n".join(lines) + "\n"


ROWS = {
    "none": [],
    "one": [(("0", "n1", "0", "succeeded", "exit code 0", "2.5"), "green")],
    "states": [
        (("0", "n1", "0", "terminated", "killed by SIGTERM", "2.5"), "yellow"),
        (("1", "n1", "0", "failed", "exit code 1", "-"), "red"),
        (("-", "n2", "1", "lost", "did not exit (agent lost)", "-"), "red"),
        (("3", "n2", "1", "odd", "", "0.0"), ""),
    ],
    "wide characters": [(("0", "日本語ホスト", "0", "?", "\\x1b[31m", "-"), "")],
    # not ASCII, so measured by rich: one cell each, a combining accent and a zero-width space
    "accents and zero widths": [(("0", "nœud-ü", "0", "e\u0301tat", "a\u200bb", "1.0"), "")],
    "long title": [(("0", "n", "0", "s", "h", "1"), "")],
}


@pytest.mark.parametrize("colour", [False, True])
@pytest.mark.parametrize("case", sorted(ROWS))
def test_the_rank_table_reads_exactly_as_richs(case, colour) -> None:
    title = "attempt 123456789012345678901234567890" if case == "long title" else "attempt 0"
    table = RankTable(title, ROWS[case])
    assert _direct(table, colour) == _rich(table.table(), colour)


@pytest.mark.parametrize("colour", [False, True])
def test_a_table_wider_than_the_console_is_left_to_rich(colour) -> None:
    table = RankTable("attempt 0", [(("0", "n" * 120, "0", "failed", "exit code 1", "-"), "red")])
    assert _direct(table, colour) is None
    text = _rich(table, colour)  # RankTable renders as its Table, which wraps the host
    assert text == _rich(table.table(), colour)
    assert all(len(ANSI.sub("", line)) <= 100 for line in text.splitlines())


def _summary(ranks: int) -> dict:
    entries = [
        {
            "rank": r,
            "local_rank": r % 8,
            "node_rank": r // 8,
            "host": f"node{r // 8:04d}",
            "state": "failed" if r == ranks - 1 else "terminated",
            "how": "exit code 1" if r == ranks - 1 else "killed by SIGTERM",
            "start": 10.0,
            "end": 12.5,
        }
        for r in range(ranks)
    ]
    cause = {"kind": "rank", "rank": ranks - 1, "host": "nodeX", "node_rank": 0, "how": "exit 1"}
    return {"status": "failed", "exit_code": 1, "root_cause": cause, "attempts": [
        {"attempt": 0, "root_cause": cause, "ranks": entries}
    ]}  # fmt: skip


@pytest.mark.parametrize("selection", [[], ["--rank", "3-9"], ["--node", "1"]])
def test_summary_output_is_what_rich_alone_printed(tmp_path, selection) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(_summary(40)))
    out = io.BytesIO()
    assert logs_main([str(tmp_path), "--summary", *selection], out=out, colour=False) == 0
    from agent.logs import parse

    view = summary_view(_summary(40), parse([str(tmp_path), *selection]).selection)
    assert out.getvalue().decode() == "".join(_rich(part, False) for part in view)


def test_a_large_summary_keeps_every_rank_row(tmp_path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(_summary(5000)))
    out = io.BytesIO()
    assert logs_main([str(tmp_path), "--summary"], out=out, colour=False) == 0
    rows = [line for line in out.getvalue().decode().splitlines() if re.match(r"│ \d", line)]
    assert len(rows) == 5000
    assert re.fullmatch(r"│ 4999 +│ node0624 │ 624 +│ failed +│ exit code 1 +│ 2\.5 +│", rows[-1])


def test_the_coloured_table_is_the_plain_one_painted() -> None:
    table = RankTable("attempt 0", ROWS["states"])
    assert ANSI.sub("", _direct(table, True) or "") == _direct(table, False)


def test_tail_opens_each_rank_file_once(tmp_path, monkeypatch) -> None:
    """`agent logs -n N` finds each file's last N lines in the open it reads them with."""
    import os

    for rank in range(40):
        (tmp_path / f"rank-{rank:05d}.out").write_bytes(b"".join(b"%d\n" % i for i in range(9)))
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, *args, **kwargs):
        opened.append(os.path.basename(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    out = io.BytesIO()
    assert logs_main([str(tmp_path), "-n", "2", "--no-prefix"], out=out, colour=False) == 0
    assert out.getvalue() == b"7\n8\n" * 40
    rank_opens = [name for name in opened if name.startswith("rank-")]
    assert sorted(rank_opens) == sorted(f"rank-{r:05d}.out" for r in range(40))
