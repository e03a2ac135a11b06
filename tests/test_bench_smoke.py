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


def test_node_loss_summary_reports_each_cell_and_its_bar() -> None:
    from bench import node_loss

    def job(nodes: int, cold: bool, first: float, ok: bool = True, how: str = "kill") -> dict:
        return {"nodes": nodes, "cold": cold, "ok": ok, "first_line": first, "how": how,
                "all_reduce": first + 1.0, "preloaded": 0 if cold else nodes * 2,
                "spare_ran": True}  # fmt: skip

    data = {
        "heartbeat": 2.0,
        "nproc": 2,
        "jobs": [
            job(4, False, 0.3),
            job(4, False, 0.5),
            job(4, True, 2.0),
            job(4, False, 3.0, how="hang"),
            job(8, False, 9.0, False),
        ],
    }
    table, targets, summary = node_loss.summarize(data)
    rows = {(r[0], r[1], r[2]): r for r in table.rows}
    kill, hang = ("4 × 2", "warm", "SIGKILL (lifeline)"), ("4 × 2", "warm", "SIGSTOP (heartbeat)")
    assert rows[kill][3:6] == ["2/2", "0.40 s (0.30–0.50)", "1.40 s (1.30–1.50)"]
    assert rows[kill][6] == "16/16" and rows[("4 × 2", "cold", "SIGKILL (lifeline)")][6] == "0/8"
    assert rows[("8 × 2", "warm", "SIGKILL (lifeline)")][4] == "failed"
    assert [(t.measured, t.ok) for t in targets] == [("0.40 s", True), ("3.00 s", True)]
    assert "0.5 s" in targets[0].wanted and "4 s" in targets[1].wanted
    assert summary["4xwarm-kill"] == {"first_line": 0.4, "all_reduce": 1.4}
    assert rows[hang][4] == "3.00 s (1 run)"


def test_lifelines_summary_compares_the_selector_with_a_thread_each() -> None:
    from bench import lifelines

    def job(mode: str, rss_full: int, notices: list[float]) -> dict:
        return {"mode": mode, "agents": 4096, "ok": True, "held": 4095, "open_s": 3.0,
                "rss_empty": 30 << 20, "rss_full": rss_full, "threads_empty": 3,
                "threads_full": 3 if mode == "selector" else 4097, "idle_cpu_per_s": 0.0001,
                "notices": notices, "false_losses": 0}  # fmt: skip

    data = {"idle_s": 5.0, "connectors": 8, "jobs": [
        job("selector", (30 << 20) + 4095 * 4096, [0.002, 0.003]),
        job("threads", (30 << 20) + 4095 * 27 * 1024, [0.002]),
        {"mode": "selector", "agents": 64, "ok": False},
    ]}  # fmt: skip
    table, targets, summary = lifelines.summarize(data)
    assert [r[5] for r in table.rows[:2]] == ["4.0 KiB", "27.0 KiB"]
    assert table.rows[0][6] == "3 → 3" and table.rows[2][2] == "failed"
    assert [(t.measured, t.ok) for t in targets] == [("0.003 s", True)]
    assert summary["4096-selector"]["notice"] == 0.0025
