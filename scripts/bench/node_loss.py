"""9. Node loss → the next attempt: N loopback nodes × 2 ranks plus one hot spare
(`--spares 1 --max-restarts 1`); once every rank of attempt 0 has done a gloo all_reduce, node
1's agent is SIGKILLed (its ranks die with it); measured: kill → every rank of attempt 1 at its
first line of user code, and → every rank past its first all_reduce. Warm (ranks forked from the
preloaded interpreter; the spare warms up while it waits) against --cold. A killed agent's
lifeline to node 0 closes with its process, so node 0 knows at once (agent.control.lifeline);
the baseline in the same run is a hung agent (SIGSTOP: its lifeline stays open), which only the
heartbeat catches — both at --heartbeat-timeout 2 (the least allowed; 6 s, the default, adds
4 s to a hang). NVIDIA's ft_launcher publishes about a minute per restart cycle: their figure,
on their clusters, not measured here.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from bench import common as c
from bench import launchers
from bench.stats import Table, Target, median, secs, spread

NPROC = 2
HEARTBEAT = 2.0
TIMEOUT = 120.0
COST = {4: 25.0, 8: 45.0}  # seconds per job on a loaded 2-core machine
FT_LAUNCHER_CYCLE = 60.0  # NVIDIA's published figure (about a minute per restart cycle)


def _records(where: Path, world: int, attempt: int) -> list[dict[str, Any]] | None:
    found = []
    for rank in range(world):
        try:
            found.append(json.loads((where / f"rank-{rank}-a{attempt}.json").read_text()))
        except (OSError, ValueError):
            return None
    return found


def _await(where: Path, world: int, attempt: int, timeout: float) -> list[dict[str, Any]] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _records(where, world, attempt)
        if found is not None:
            return found
        time.sleep(0.01)
    return None


def one(nodes: int, cold: bool, work: Path, log, how: str = "kill") -> dict[str, Any]:
    """`how`: "kill" (SIGKILL: the lifeline tells) or "hang" (SIGSTOP: the heartbeat tells)."""
    tag = f"loss{nodes}{'c' if cold else 'w'}{how[0]}-{c.unique_job()}"
    where = work / tag
    where.mkdir()
    extra = ["--spares", "1", "--max-restarts", "1", "--heartbeat-timeout", str(HEARTBEAT)]
    extra += ["--grace", "1"] + (["--cold"] if cold else [])
    prog = [c.program("relaunch_rank"), str(where), "hold"]
    cmds = launchers.ours(nodes + 1, NPROC, prog, work, tag, extra)
    world = nodes * NPROC
    started = c.start(cmds, work)
    result: dict[str, Any] = {"nodes": nodes, "cold": cold, "how": how, "ok": False}
    try:
        if _await(where, world, 0, TIMEOUT) is None:
            log(f"node loss {nodes}: attempt 0 never ran\n{c.tail(cmds[0][2])}")
            return result
        killed = time.time()
        os.kill(started.procs[1].pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        after = _await(where, world, 1, TIMEOUT)
        if after is None:
            log(f"node loss {nodes}: attempt 1 never ran\n{c.tail(cmds[0][2])}")
            return result
        if how == "hang":  # the hung agent is out of the job: end it (and its ranks) now
            c.kill_group([started.procs[1]])
        ended = started.wait(60.0)
        spare_host = f"127.0.0.{nodes + 1}"
        result.update(
            ok=ended and all(r["ok"] for r in after),
            first_line=max(r["first_line"] for r in after) - killed,
            all_reduce=max(r["all_reduce"] for r in after) - killed,
            preloaded=sum(r["preloaded"] for r in after),
            spare_ran=[r["rank"] for r in after if r["host"] == spare_host] == [2, 3],
            codes=[code for i, code in enumerate(started.codes) if i != 1],
        )
        return result
    finally:
        started.kill()


def run(sizes: list[int], reps: int, budget: c.Budget, work: Path, log) -> dict[str, Any]:
    jobs = []
    for rep in range(reps):
        for nodes in sizes:
            for cold, how in ((False, "kill"), (True, "kill"), (False, "hang")):
                if rep and budget.left() < COST.get(nodes, 6.0 * nodes):
                    continue
                jobs.append(one(nodes, cold, work, log, how))
                kind = f"{'cold' if cold else 'warm'} {how}"
                log(f"node loss {nodes} × {NPROC} {kind}: {jobs[-1]}")
    return {"jobs": jobs, "heartbeat": HEARTBEAT, "nproc": NPROC}


CELLS = ((False, "kill"), (True, "kill"), (False, "hang"))
LIFELINE_TARGET = 0.5  # seconds, SIGKILL → attempt 1 running (issue 25)


def summarize(data: dict[str, Any]) -> tuple[Table, list[Target], dict[str, Any]]:
    table = Table(
        "9. Node loss → next attempt (N loopback nodes × 2 ranks + 1 hot spare, "
        f"--heartbeat-timeout {data['heartbeat']:g}; SIGKILL of node 1's agent (its lifeline "
        "closes) or SIGSTOP (a hang: only the heartbeat tells) → every rank of attempt 1 at its "
        "first line / past its first gloo all_reduce; median (min–max))",
        ["nodes × ranks", "ranks", "node 1's agent", "jobs", "→ first line", "→ all_reduce",
         "forked warm", "spare ran node 1's ranks", "vs ft_launcher's ~60 s (their figure)"],
    )  # fmt: skip
    summary: dict[str, Any] = {}
    targets: list[Target] = []
    for nodes in sorted({j["nodes"] for j in data["jobs"]}):
        for cold, how in CELLS:
            jobs = [
                j
                for j in data["jobs"]
                if j["nodes"] == nodes and j["cold"] == cold and j.get("how", "kill") == how
            ]
            if not jobs:
                continue
            good = [j for j in jobs if j["ok"]]
            firsts = [j["first_line"] for j in good]
            reduces = [j["all_reduce"] for j in good]
            kind = "cold" if cold else "warm"
            med = median(reduces)
            table.add(
                f"{nodes} × {data['nproc']}",
                kind,
                "SIGKILL (lifeline)" if how == "kill" else "SIGSTOP (heartbeat)",
                f"{len(good)}/{len(jobs)}",
                f"{secs(median(firsts))} ({spread(firsts)})" if firsts else "failed",
                f"{secs(med)} ({spread(reduces)})" if reduces else "failed",
                f"{sum(j['preloaded'] for j in good)}/{len(good) * nodes * data['nproc']}",
                "yes" if good and all(j["spare_ran"] for j in good) else "no",
                f"{FT_LAUNCHER_CYCLE / med:.0f}× less" if med else "n/a",
            )
            summary[f"{nodes}x{kind}-{how}"] = {"first_line": median(firsts), "all_reduce": med}
            if cold or not firsts:
                continue
            bar = LIFELINE_TARGET if how == "kill" else data["heartbeat"] + 2.0
            what = "killed" if how == "kill" else "hung"
            targets.append(
                Target(
                    f"{what} node → attempt 1 running, {nodes} × {data['nproc']} warm",
                    f"≤ {bar:g} s" + ("" if how == "kill" else " (heartbeat timeout + 2 s)"),
                    secs(median(firsts)),
                    median(firsts) <= bar,
                )
            )
    return table, targets, summary
