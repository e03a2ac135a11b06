"""The benchmark's pure parts: statistics, formatting, tables, expected streams. Nothing is timed."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from bench import spew, stats  # noqa: E402


def test_median_ratio_minus() -> None:
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([1.0, 2.0]) == 1.5
    assert stats.median([]) is None
    assert stats.ratio(1.0, 4.0) == 0.25
    assert stats.ratio(1.0, 0.0) is None and stats.ratio(None, 1.0) is None
    assert stats.minus(5.0, 2.0) == 3.0 and stats.minus(None, 2.0) is None


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "n/a"),
        (2_500_000.0, "2.50 M/s"),
        (1500.0, "1.50 k/s"),
        (3.2e9, "3.20 G/s"),
        (12.0, "12 /s"),
    ],
)
def test_rate(value, text) -> None:
    assert stats.rate(value) == text


def test_formatting() -> None:
    assert stats.secs(1.23456) == "1.23 s" and stats.secs(None) == "n/a"
    assert stats.secs(0.01234, 3) == "0.012 s"
    assert stats.times(0.456) == "0.46×"
    assert stats.mib(3 * 2**20) == "3.0 MiB"
    assert stats.spread([]) == "-" and stats.spread([1.0]) == "1 run"
    assert stats.spread([2.0, 1.0, 3.0]) == "1.00–3.00"
    assert [stats.verdict(x) for x in (True, False, None)] == ["met", "MISSED", "n/a"]


def test_table_markdown_and_arity() -> None:
    table = stats.Table("T", ["a", "b"], notes=["why"])
    table.add("x|y", 2)
    text = table.markdown()
    assert text.splitlines()[:4] == ["### T", "", "| a | b |", "| --- | --- |"]
    assert "| x\\|y | 2 |" in text and text.rstrip().endswith("- why")
    with pytest.raises(ValueError):
        table.add("only one")


def test_targets_table() -> None:
    text = stats.targets_table(
        [stats.Target("t", "≤ 1 s", "0.5 s", True), stats.Target("u", "≥ 10×", "n/a", None)]
    ).markdown()
    assert "| t | ≤ 1 s | 0.5 s | met |" in text and "| u | ≥ 10× | n/a | n/a |" in text


@pytest.mark.parametrize(
    ("mode", "count", "size", "rounds"),
    [("lines", 2500, 64, 1), ("lines", 1000, 40, 2), ("bulk", 3 * 1000 + 7, 1000, 2)],
)
def test_spew_writes_exactly_the_expected_stream(tmp_path, mode, count, size, rounds) -> None:
    env = {"RANK": "3", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "bench" / "spew.py"),
            mode,
            str(count),
            str(size),
            str(tmp_path),
            str(rounds),
        ],
        env=env,
        capture_output=True,
        check=True,
    ).stdout
    assert (len(out), hashlib.sha1(out).hexdigest()) == spew.expected(mode, count, size, 3, rounds)
    if mode == "lines":
        assert out.count(b"\n") == count * rounds and all(
            len(line) == size - 1 for line in out.splitlines()
        )
    else:
        assert b"\n" not in out
    for r in range(rounds):
        assert (tmp_path / f"t0-3-{r}").exists() and (tmp_path / f"t1-3-{r}").exists()
    assert spew.expected(mode, count, size, 2) != spew.expected(mode, count, size, 3)


def test_node_loss_summary_reports_each_cell_and_the_heartbeat_bar() -> None:
    from bench import node_loss

    def job(nodes: int, cold: bool, first: float, ok: bool = True) -> dict:
        return {"nodes": nodes, "cold": cold, "ok": ok, "first_line": first,
                "all_reduce": first + 1.0, "preloaded": 0 if cold else nodes * 2,
                "spare_ran": True}  # fmt: skip

    data = {
        "heartbeat": 2.0,
        "nproc": 2,
        "jobs": [
            job(4, False, 3.0),
            job(4, False, 5.0),
            job(4, True, 2.0),
            job(8, False, 9.0, False),
        ],
    }
    table, targets, summary = node_loss.summarize(data)
    rows = {(r[0], r[1]): r for r in table.rows}
    assert rows[("4 × 2", "warm")][2:5] == ["2/2", "4.00 s (3.00–5.00)", "5.00 s (4.00–6.00)"]
    assert rows[("4 × 2", "warm")][5] == "16/16" and rows[("4 × 2", "cold")][5] == "0/8"
    assert rows[("8 × 2", "warm")][3] == "failed"
    assert [(t.measured, t.ok) for t in targets] == [("4.00 s", True)]
    assert summary["4xwarm"] == {"first_line": 4.0, "all_reduce": 5.0}
