"""6. Steady-state cost: the launcher process's own CPU (children excluded) and memory while its 2
ranks sleep. Ours and torchrun run side by side (CPU seconds, not wall, so they do not disturb
each other's numbers much)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import psutil

from bench import common as c
from bench import launchers
from bench.stats import Table, Target, mib

NPROC = 2


def _sample(pid: int) -> dict[str, float] | None:
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        with proc.oneshot():
            cpu = proc.cpu_times()
            return {
                "cpu": cpu.user + cpu.system,
                "rss": proc.memory_info().rss,
                "threads": proc.num_threads(),
            }
    return None


def run(seconds: float, work: Path, log) -> dict[str, Any]:
    jobs = {}
    for mode in ("ours", "torchrun"):
        where = work / f"steady-{mode}"
        where.mkdir()
        prog = [c.program("ready_rank"), str(where), "-1", str(seconds + 3)]
        cmds = launchers.build(mode, 1, NPROC, prog, work, f"steady-{mode}")
        jobs[mode] = (where, c.start(cmds, work))
    result: dict[str, Any] = {"seconds": seconds}
    try:
        ready = [where / f"ready-{r}" for where, _ in jobs.values() for r in range(NPROC)]
        if not c.wait_for_files(ready, 120.0):
            return {**result, "error": "ranks never started"}
        time.sleep(0.5)  # both launchers past their start-up work
        before = {mode: _sample(run.procs[0].pid) for mode, (_, run) in jobs.items()}
        time.sleep(seconds)
        after = {mode: _sample(run.procs[0].pid) for mode, (_, run) in jobs.items()}
        for mode in jobs:
            b, a = before[mode], after[mode]
            if a is None or b is None:
                result[mode] = {"error": "the launcher exited early"}
                continue
            result[mode] = {
                "cpu_window_s": a["cpu"] - b["cpu"],
                "cpu_total_s": a["cpu"],
                "rss": a["rss"],
                "threads": a["threads"],
            }
            log(
                f"steady: {mode}: {a['cpu'] - b['cpu']:.3f} s CPU in {seconds:.0f} s, rss {mib(a['rss'])}"
            )
        for _, run in jobs.values():
            run.wait(15.0)
        result["codes"] = {mode: run.codes for mode, (_, run) in jobs.items()}
    finally:
        for _, run in jobs.values():
            run.kill()
    return result


def summarize(data: dict[str, Any]) -> tuple[Table, list[Target], dict[str, Any]]:
    seconds = data["seconds"]
    table = Table(
        f"6. Steady state: launcher process while its {NPROC} ranks sleep {seconds:.0f} s "
        "(children excluded)",
        [
            "launcher",
            f"CPU in the {seconds:.0f} s window",
            "CPU % of one core",
            "CPU since start",
            "RSS",
            "threads",
        ],
    )
    summary = {}
    for mode in ("ours", "torchrun"):
        row = data.get(mode)
        if not row or "error" in row:
            table.add(mode, (row or data).get("error", "not run"), "-", "-", "-", "-")
            continue
        table.add(
            mode,
            f"{row['cpu_window_s']:.3f} s",
            f"{100 * row['cpu_window_s'] / seconds:.2f} %",
            f"{row['cpu_total_s']:.2f} s",
            mib(row["rss"]),
            row["threads"],
        )
        summary[mode] = row
    table.notes.append(
        "psutil cpu_times (user+system) of the launcher process itself, sampled when every rank "
        "was up (+0.5 s) and again after the window; RSS at the end of the window. Both launchers "
        "ran at the same time, one node × 2 ranks each."
    )
    return table, [], summary
