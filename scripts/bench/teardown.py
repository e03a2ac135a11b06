"""2. Teardown latency: 4 nodes × 2 ranks, a rank on node 2 dies (exit 1) once the job is up; time
from its death until every launcher process has exited (torchrun capped)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import common as c
from bench import launchers
from bench.stats import Table, Target, median, secs, spread

NODES, NPROC = 4, 2
FAIL_RANK = 5  # node 2, local rank 1: not the node that hosts the store
CAP = 60.0


def _rank_processes(where: Path) -> int:
    """Ranks of this run still alive (they carry DIR in their argv)."""
    alive = 0
    for proc in c.marked_processes():
        with contextlib.suppress(Exception):
            if str(where) in proc.cmdline() and "ready_rank.py" in " ".join(proc.cmdline()):
                alive += 1
    return alive


def one_run(
    mode: str, work: Path, rep: int, cap: float, during: Callable[[], None] | None = None
) -> dict[str, Any]:
    where = work / f"teardown-{mode}-{rep}"
    where.mkdir()
    prog = [c.program("ready_rank"), str(where), str(FAIL_RANK), "0"]
    cmds = launchers.build(mode, NODES, NPROC, prog, work, f"teardown-{mode}-{rep}")
    run = c.start(cmds, work)
    result: dict[str, Any] = {"mode": mode, "rep": rep, "ok": False}
    try:
        if not c.wait_for_files([where / "died"], 120.0):
            result["error"] = "the job never came up: " + c.tail(cmds[0][2])
            return result
        died = float((where / "died").read_text())
        if during is not None:
            run.wait(5.0)  # exits are timed by waiter threads either way
            if run.alive():
                during()  # other work that fits in the idle cap (it only costs CPU seconds)
        run.wait(max(0.0, died + cap - time.time()))
        ends = [run.wall_ends.get(i) for i in range(len(cmds))]
        result.update(
            {
                "ok": True,
                "exited": run.alive() == 0,
                "still_running": run.alive(),
                "latency": max(ends) - died if run.alive() == 0 else None,
                "first_exit": min(e for e in ends if e is not None) - died if any(ends) else None,
                "codes": run.codes,
                "orphan_ranks": _rank_processes(where) if run.alive() == 0 else None,
            }
        )
    finally:
        run.kill()
    return result


def run(
    ours_reps: int,
    torchrun_reps: int,
    budget: c.Budget,
    work: Path,
    log,
    during_torchrun_cap: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """`during_torchrun_cap` runs once while torchrun's survivors idle towards the cap."""
    runs = []
    for mode, reps in (("ours", ours_reps), ("torchrun", torchrun_reps)):
        for rep in range(reps):
            if not budget.allows(rep, 1, CAP if mode == "torchrun" else 15.0):
                break
            during, during_torchrun_cap = (
                (during_torchrun_cap, None) if mode == "torchrun" else (None, during_torchrun_cap)
            )
            result = one_run(mode, work, rep, CAP, during)
            runs.append(result)
            if not result["ok"]:
                log(f"teardown: {mode} rep {rep}: FAILED {result.get('error', '')[:300]}")
            elif result["exited"]:
                log(
                    f"teardown: {mode} rep {rep}: {secs(result['latency'])} codes {result['codes']}"
                )
            else:
                log(
                    f"teardown: {mode} rep {rep}: {result['still_running']} launcher(s) still running after {CAP:.0f} s"
                )
    return {
        "nodes": NODES,
        "nproc_per_node": NPROC,
        "fail_rank": FAIL_RANK,
        "cap_s": CAP,
        "runs": runs,
    }


def summarize(data: dict[str, Any]) -> tuple[Table, list[Target], dict[str, Any]]:
    table = Table(
        f"2. Teardown latency ({data['nodes']} nodes × {data['nproc_per_node']} ranks; rank "
        f"{data['fail_rank']} on node 2 exits 1; death → every launcher exited)",
        [
            "launcher",
            "runs",
            "median",
            "min–max",
            "failing node's launcher exited after",
            "exit codes",
            "ranks left behind",
        ],
    )
    summary: dict[str, Any] = {}
    targets = []
    for mode in ("ours", "torchrun"):
        runs = [r for r in data["runs"] if r["mode"] == mode and r["ok"]]
        if not runs:
            continue
        done = [r["latency"] for r in runs if r["exited"]]
        hung = [r for r in runs if not r["exited"]]
        first = median([r["first_exit"] for r in runs if r["first_exit"] is not None])
        med = median(done) if not hung else None
        shown = (
            secs(med)
            if not hung
            else (
                f"did not exit: {hung[0]['still_running']} of {data['nodes']} "
                f"launchers still running after {data['cap_s']:.0f} s"
            )
        )
        orphans = [r["orphan_ranks"] for r in runs if r.get("orphan_ranks") is not None]
        table.add(
            mode,
            len(runs),
            shown,
            spread(done) if done else "-",
            secs(first),
            " ".join("killed" if x is None else str(x) for x in runs[-1]["codes"]),
            max(orphans) if orphans else "-",
        )
        summary[mode] = {"median": med, "did_not_exit": len(hung), "first_exit": first}
        if mode == "ours":
            targets.append(
                Target("teardown latency", "≤ 2 s", shown, med is not None and med <= 2.0)
            )
    table.notes += [
        "The failing rank waits until every rank of the world has started, writes time.time() to a file and "
        "exits 1; the other ranks sleep (a rank stuck in a collective looks the same to a launcher).",
        "torchrun (max-restarts 0): only the failing node's torchrun exits; the others keep supervising healthy "
        f"local workers. The run is killed at {data['cap_s']:.0f} s. 'ranks left behind': ranks of the run still "
        "alive once every launcher had exited (orphans).",
    ]
    return table, targets, summary
