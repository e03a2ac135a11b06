"""1. Launch overhead: N loopback nodes × 2 ranks, gloo init + barrier + exit, minus the no-launcher floor."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench import common as c
from bench import launchers
from bench.stats import Table, Target, median, minus, ratio, secs, spread, times

NPROC = 2
MODES = ("floor", "ours", "torchrun")


def one_run(mode: str, nodes: int, work: Path, rep: int) -> dict[str, Any]:
    tag = f"launch-{mode}-{nodes}n-{rep}"
    cmds = launchers.build(mode, nodes, NPROC, [c.program("gloo_rank")], work, tag)
    run = c.run_all(cmds, work, timeout=60 + 25 * nodes)
    ok = run.alive() == 0 and all(code == 0 for code in run.codes)
    result: dict[str, Any] = {
        "mode": mode,
        "nodes": nodes,
        "rep": rep,
        "ok": ok,
        "codes": run.codes,
        "wall": run.wall if ok else None,
    }
    if not ok:
        result["error"] = c.tail(cmds[-1][2]) or c.tail(cmds[0][2])
    return result


def run(
    sizes: list[int], reps: dict[int, int], budget: c.Budget, work: Path, log
) -> dict[str, Any]:
    """Rounds: every size once, then more repetitions while the budget covers the last round's cost.
    Within a repetition floor/ours/torchrun are interleaved, the order rotating against drift."""
    runs: list[dict[str, Any]] = []
    cost: dict[int, float] = {}
    for rep in range(max(reps.values())):
        for nodes in sizes:
            if rep >= reps.get(nodes, 1):
                continue
            if rep > 0 and budget.left() < cost[nodes]:
                log(f"launch: {nodes} nodes: budget spent, {rep} repetition(s)")
                continue
            started = time.monotonic()
            for mode in MODES[rep % 3 :] + MODES[: rep % 3]:
                result = one_run(mode, nodes, work, rep)
                log(
                    f"launch: {nodes} nodes {mode:8s} rep {rep}: "
                    + (secs(result["wall"]) if result["ok"] else f"FAILED {result['codes']}")
                )
                runs.append(result)
            cost[nodes] = time.monotonic() - started
    return {"nproc_per_node": NPROC, "runs": runs}


def walls(data: dict[str, Any], mode: str, nodes: int) -> list[float]:
    return [
        r["wall"] for r in data["runs"] if r["mode"] == mode and r["nodes"] == nodes and r["ok"]
    ]


def summarize(data: dict[str, Any]) -> tuple[Table, list[Target], dict[str, Any]]:
    table = Table(
        "1. Launch overhead (gloo init + barrier + exit; wall, median of runs, min–max in brackets)",
        [
            "nodes × ranks",
            "runs",
            "no launcher (floor)",
            "ours",
            "torchrun (c10d)",
            "ours overhead",
            "torchrun overhead",
            "ours/torchrun overhead",
        ],
    )
    targets, summary = [], {}
    for nodes in sorted({r["nodes"] for r in data["runs"]}):
        w = {m: walls(data, m, nodes) for m in MODES}
        med = {m: median(w[m]) for m in MODES}
        over = {m: minus(med[m], med["floor"]) for m in ("ours", "torchrun")}
        rel = ratio(over["ours"], over["torchrun"])
        failed = sum(1 for r in data["runs"] if r["nodes"] == nodes and not r["ok"])
        count = min(len(v) for v in w.values())
        table.add(
            f"{nodes} × {NPROC}",
            f"{count} (+{failed} failed)" if failed else str(count),
            *(f"{secs(med[m])} ({spread(w[m])})" for m in MODES),
            secs(over["ours"]),
            secs(over["torchrun"]),
            times(rel),
        )
        summary[nodes] = {"median": med, "overhead": over, "ratio": rel, "walls": w}
        targets.append(
            Target(
                f"launch overhead, {nodes} node{'s' if nodes > 1 else ''} × {NPROC} ranks",
                "≤ 0.5 × torchrun's",
                times(rel),
                None if rel is None else rel <= 0.5,
            )
        )
    table.notes += [
        "overhead = median wall of the launcher's runs − median wall of the floor runs (same ranks started "
        "directly with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT preset, rank 0 hosting the store).",
        "wall = from starting every launcher (one per simulated node, 127.0.0.i) to the last one exiting.",
        "ours: `python -m agent --nproc-per-node 2` with a fake SLURM env per node; torchrun: "
        "`--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT --rdzv-conf is_host=0|1 --local-addr 127.0.0.i`.",
        "Every rank turns off c10d reverse DNS in itself, so a dropped DNS query in a rank cannot land in one "
        "variant by chance; the launchers' own processes are left as they are (ours does it itself, torchrun does not).",
    ]
    return table, targets, summary
