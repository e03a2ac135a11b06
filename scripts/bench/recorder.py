"""15. The flight recorder and its probe (issue 37): what they cost a rank, and what collating
them costs node 0.

- A rank's start: `python -c pass` with the probe on the path (its sitecustomize, one thread,
  one unix socket) against without, in one run, alternating.
- A collective: 2 local gloo ranks run ALLREDUCES small all_reduces with torch's recorder at the
  agent's default buffer (200) and with it off (TORCH_FR_BUFFER_SIZE=0), alternating.
- Node 0's collation: synthetic recorders of 32,768 ranks (4,096 nodes × 8; a deadlock by order
  in a world group and pair groups) through agent.hang.collectives.findings.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common as c
from bench.stats import Table, Target, median, secs, spread

ALLREDUCES = 2000
COLLATE_RANKS = 32768
COLLATE_TARGET = 1.0  # seconds for node 0 to collate every rank's recorder

LOOP = """
import os, sys, time, torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank,
                        world_size=2)
x = torch.ones(4)
for _ in range(50):
    dist.all_reduce(x)
t0 = time.perf_counter()
for _ in range({n}):
    dist.all_reduce(x)
if rank == 0:
    print(time.perf_counter() - t0)
"""


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _start(probe: bool, work: Path) -> float:
    from agent.hang.recorder import probe_env

    env = c.base_env()
    if probe:
        env.update(probe_env(str(work), env))
        env["AGENT_PROBE_PID"] = "0"  # no pid matches: the import, not the listening thread
    t0 = time.perf_counter()
    subprocess.run([c.PY, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - t0


def _loop(buffer: str, work: Path) -> float | None:
    script = work / "recorder_loop.py"
    script.write_text(LOOP.format(n=ALLREDUCES))
    env = {**c.base_env(), "TORCH_FR_BUFFER_SIZE": buffer}
    port = _port()
    procs = [
        subprocess.Popen(
            [c.PY, str(script), str(r), port], env=env, stdout=subprocess.PIPE, text=True
        )  # fmt: skip
        for r in range(2)
    ]
    out = [p.communicate(timeout=300)[0] for p in procs]
    try:
        return float(out[0].strip()) / ALLREDUCES
    except ValueError:
        return None


def _collate() -> float:
    from agent.hang.collectives import findings
    from agent.hang.recorder import Collective, GroupState, RankRecorder

    world = tuple(range(COLLATE_RANKS))
    recorders = {}
    for rank in world:
        behind = rank == COLLATE_RANKS - 1
        entered = 1042 if behind else 1043
        groups = [
            GroupState("0", "default_pg", world, entered, 1042,
                       (Collective(entered, "all_reduce", "[4096, 1024] Float"),)),
            GroupState(str(1 + rank // 2), "undefined", (rank - rank % 2, rank - rank % 2 + 1),
                       7, 7 - behind, (Collective(7, "broadcast", "[8] Float"),)),
        ]  # fmt: skip
        recorders[rank] = RankRecorder(True, True, tuple(groups))
    t0 = time.perf_counter()
    lines = findings(recorders)
    took = time.perf_counter() - t0
    assert lines and lines[0].startswith("ranks 0-32766 entered all_reduce #1043"), lines[:1]
    return took


def run(reps: int, work: Path, log) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=work) as probe_dir:
        starts: dict[str, list[float]] = {"with the probe": [], "without": []}
        for _ in range(reps):
            starts["with the probe"].append(_start(True, Path(probe_dir)))
            starts["without"].append(_start(False, Path(probe_dir)))
    log("rank start timed")
    loops: dict[str, list[float]] = {"recorder on (200)": [], "recorder off (0)": []}
    for _ in range(max(1, reps // 5)):
        for name, buffer in (("recorder on (200)", "200"), ("recorder off (0)", "0")):
            found = _loop(buffer, work)
            if found is not None:
                loops[name].append(found)
    log("all_reduce loops timed")
    collate = [_collate() for _ in range(3)]
    log("collation timed")
    return {"starts": starts, "loops": loops, "collate": collate, "cpus": os.cpu_count()}


def summarize(data: dict[str, Any]) -> tuple[Table, list[Target], dict[str, Any]]:
    table = Table(
        "15. The flight recorder and its probe (what a rank pays; what node 0 pays to collate)",
        ["what", "median", "spread", "n"],
    )
    for name, times in data["starts"].items():
        table.add(f"rank start (`python -c pass`), {name}", secs(median(times), 4),
                  spread(times), len(times))  # fmt: skip
    for name, times in data["loops"].items():
        per = median(times)
        shown = f"{per * 1e6:.1f} µs" if per is not None else "n/a"
        low, high = (min(times) * 1e6, max(times) * 1e6) if times else (0.0, 0.0)
        table.add(f"one small gloo all_reduce, 2 ranks, {name}", shown,
                  f"{low:.0f}–{high:.0f} µs", len(times))  # fmt: skip
    took = median(data["collate"])
    table.add(f"collate {COLLATE_RANKS:,} ranks' recorders (node 0)", secs(took, 3),
              spread(data["collate"]), len(data["collate"]))  # fmt: skip
    table.notes.append(
        "rank start: the probe's sitecustomize is imported (and chains the site's own) whatever "
        "the rank; its listening thread starts only in the rank itself. all_reduce: torch's "
        f"recorder at the agent's default buffer (200) against TORCH_FR_BUFFER_SIZE=0, {ALLREDUCES} "
        "calls after 50 warm-up ones, alternating runs."
    )
    ok = took is not None and took <= COLLATE_TARGET
    target = Target("collate 32K ranks' recorders", f"≤ {COLLATE_TARGET:g} s", secs(took, 3), ok)
    return table, [target], {"collate_s": took}
