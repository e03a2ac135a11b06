"""The relaunch bench's CPU split (scripts/bench/cpu_split.py): who used the machine between two
snapshots. Pure given the snapshots; one live snapshot checks that this process's children are
read and classed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bench.cpu_split import Snapshot, snapshot, split  # noqa: E402

BEFORE = Snapshot(
    busy=100.0,
    reaped=1.0,
    tree={10: ("agent", 5.0, 2.0), 11: ("zygote", 1.0, 0.5), 12: ("other", 3.0, 0.0)},
)


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (  # one warm run: the client reaped, the ranks reaped by the agent, a fork's middle
            Snapshot(
                101.5,
                1.25,
                {10: ("agent", 5.25, 2.75), 11: ("zygote", 1.0, 0.625), 12: ("other", 3.0, 0.0)},
            ),
            {"client": 0.25, "agents": 0.25, "ranks": 0.75, "zygotes": 0.125, "other": 0.125},
        ),
        (  # a process born during the run (a new zygote) is not counted: no "before" for it
            Snapshot(100.5, 1.0, {**BEFORE.tree, 13: ("zygote", 9.0, 9.0)}),
            {"client": 0.0, "agents": 0.0, "ranks": 0.0, "zygotes": 0.0, "other": 0.5},
        ),
        (  # a pid reused by another kind of process is not counted either
            Snapshot(100.25, 1.0, {**BEFORE.tree, 11: ("agent", 7.0, 7.0)}),
            {"client": 0.0, "agents": 0.0, "ranks": 0.0, "zygotes": 0.0, "other": 0.25},
        ),
        (  # the named classes outrun the machine's count (clock ticks): other is never negative
            Snapshot(100.0, 1.5, BEFORE.tree),
            {"client": 0.5, "agents": 0.0, "ranks": 0.0, "zygotes": 0.0, "other": 0.0},
        ),
    ],
)
def test_split(after: Snapshot, expected: dict[str, float]) -> None:
    found = split(BEFORE, after)
    assert found.pop("total") == pytest.approx(after.busy - BEFORE.busy)
    assert found == pytest.approx(expected)


def test_a_live_snapshot_reads_this_process_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        found = snapshot()
        assert found.tree[child.pid][0] == "other"
        assert found.busy > 0.0
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(60)
    assert child.pid not in snapshot().tree
