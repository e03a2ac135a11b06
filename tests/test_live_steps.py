"""The live table's step columns (step, s/step, behind), drawn from step clocks and node 0's
look at the job's pace, without a terminal."""

from __future__ import annotations

import io
import re
import time
from types import SimpleNamespace

from rich.console import Console

from agent.console.live import LiveView
from agent.console.stream import JobPace, StepClock


def _worker(rank: int, node: int) -> SimpleNamespace:
    stream = SimpleNamespace(last_output=time.monotonic())
    spec = SimpleNamespace(rank=rank, node_rank=node, host=f"n{node}")
    return SimpleNamespace(spec=spec, proc=SimpleNamespace(pid=1000 + rank), out=stream,
                           err=stream, returncode=None)  # fmt: skip


def _clock(seconds: float, steps: int) -> StepClock:
    clock = StepClock()
    for n in range(steps):
        clock.tick(n, n * seconds)
    return clock


def _draw(view: LiveView) -> str:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(view._table())
    return out.getvalue()


def test_step_columns_show_each_ranks_pace_and_how_far_behind():
    view = LiveView(Console(file=io.StringIO()), hang_warning=300)
    view._workers = [_worker(0, 0), _worker(1, 0)]
    clocks = {0: _clock(0.2, 11), 1: _clock(0.5, 5)}  # rank 0 at step 10, rank 1 at step 4
    view.follow_steps(lambda: clocks)
    drawn = _draw(view)
    assert re.search(r"silent\s+step\s+s/step\s+behind", drawn), drawn
    assert re.search(r"^\s*0 .* 10\s+0\.2\s+0\s*$", drawn, re.M), drawn
    assert re.search(r"^\s*1 .* 4\s+0\.5\s+6\s*$", drawn, re.M), drawn  # behind this node's best
    view.job = JobPace(median=0.2, furthest=25, slow_nodes=frozenset(), slow_ranks=frozenset({1}))
    drawn = _draw(view)
    assert re.search(r"^\s*1 .* 4\s+0\.5\s+21\s*$", drawn, re.M), drawn  # behind the job's best


def test_no_step_columns_without_a_step_group():
    view = LiveView(Console(file=io.StringIO()), hang_warning=300)
    view._workers = [_worker(0, 0)]
    assert "s/step" not in _draw(view)
