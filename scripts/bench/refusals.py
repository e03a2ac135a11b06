"""11. Refusals: how long hostile input takes to be refused (config bombs, huge rank lists).

The tests only bound these by 10 s, to catch a hang; the figures live here. Each cell is the
in-process time of the same call the CLI makes (no interpreter start), best of a few tries.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from agent.errors import AgentError
from agent.plan import config as cfg
from agent.plan.rank_set import parse_rank_set
from bench.stats import Table, Target, secs

DEPTH = cfg.MAX_DEPTH


def _laughs(levels: int = 9) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


BOMBS = {
    "billion laughs (9 levels of 9 aliases)": _laughs(),
    "10k nested lists": "a: " + "[" * 10_000 + "]" * 10_000 + "\n",
    "10k nested maps": "a: " + "{b: " * 10_000 + "1" + "}" * 10_000 + "\n",
    "1M nested lists": "[" * 1_000_000,
    f"block nesting ({DEPTH + 5} levels)": "".join(" " * i + f"k{i}:\n" for i in range(DEPTH + 5)),
    "a 5,000-digit integer": "a: " + "1" * 5000 + "\n",
    "a base-60 integer of 200,000 parts": "a: 1" + ":00" * 200_000 + "\n",
}
TARGET_S = 0.1  # every refusal: milliseconds; the tests allow 10 s (100x) to catch hangs only


def _refusal_time(path: Path, tries: int) -> tuple[float, bool]:
    best, refused = float("inf"), False
    for _ in range(tries):
        started = time.perf_counter()
        try:
            cfg.read_config(str(path))
        except AgentError:
            refused = True
        best = min(best, time.perf_counter() - started)
    return best, refused


def run(tries: int, work: Path, log) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        for name, text in BOMBS.items():
            path = Path(scratch) / "bomb.yml"
            path.write_text(text)
            took, refused = _refusal_time(path, tries)
            rows[name] = {"s": took, "refused": refused}
            log(f"refusals: {name}: {took * 1000:.1f} ms")
    started = time.perf_counter()
    ranks = parse_rank_set("0-9999999999,20000000000-29999999999", "--console-ranks")
    took = time.perf_counter() - started
    rows["--console-ranks covering 2·10^10 ranks (parsed, not refused)"] = {
        "s": took,
        "refused": ranks is not None and len(ranks) == 2 * 10**10,
    }
    return {"rows": rows}


def summarize(data: dict[str, Any]) -> tuple[Table, list[Target], dict[str, Any]]:
    table = Table(
        "11. Refusals of hostile input (in-process, best of the tries)",
        ["input", "time", "refused (rank list: parsed as 2 ranges)"],
    )
    worst = max(row["s"] for row in data["rows"].values())
    for name, row in data["rows"].items():
        table.add(name, secs(row["s"], 4), "yes" if row["refused"] else "NO")
    ok = all(row["refused"] for row in data["rows"].values()) and worst < TARGET_S
    target = Target("Refusals: slowest hostile input", f"< {TARGET_S} s", secs(worst, 4), ok)
    return table, [target], {"worst_s": worst}
