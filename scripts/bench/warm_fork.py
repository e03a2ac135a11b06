"""11. Warm fork: one node's ranks forked from a torch-preloaded zygote, from the request until
every rank printed its first line. The agent's way (one request; the ranks adopted by the agent
through one middle process, so they outlive their zygote) against one request per rank as the
zygote's children (the way before adoption) and against one middle process per rank."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from bench import common as c
from bench.stats import Table, Target, median, ratio, secs, spread, times

NPROC = 8
LABELS = {
    "one-request-adopted": "one request, adopted (the agent's way)",
    "per-rank": "a request per rank, the zygote's children (before)",
    "per-rank-adopted": "a request per rank, adopted (a middle process each)",
}


def run(reps: int, work: Path, log) -> dict[str, Any]:
    where = work / "warm-fork"
    where.mkdir()
    done = subprocess.run(
        [c.PY, c.program("warm_fork_agent"), str(where), str(NPROC), str(reps)],
        env=c.base_env(),
        cwd=where,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        log(f"warmfork: failed: {done.stderr[-2000:]}")
        return {"error": done.stderr[-2000:]}
    data = json.loads(done.stdout)
    for way, rows in data["samples"].items():
        log(f"warmfork: {way}: first lines median {median([r[1] for r in rows]):.3f} s")
    return data


def summarize(data: dict[str, Any]) -> tuple[Table, list[Target], dict[str, Any]]:
    table = Table(
        f"11. Warm fork: {NPROC} ranks of one node from a torch zygote (alternating, same zygote)",
        [
            "way",
            "runs",
            "forked (median)",
            "every rank at its first line (median)",
            "min–max",
            "÷ before",
        ],
    )
    if "error" in data:
        table.notes.append(f"failed: {data['error'][-300:]}")
        return table, [], {}
    firsts = {way: median([r[1] for r in rows]) for way, rows in data["samples"].items()}
    for way, label in LABELS.items():
        rows = data["samples"][way]
        table.add(
            label,
            len(rows),
            secs(median([r[0] for r in rows]), 3),
            secs(firsts[way], 3),
            spread([r[1] for r in rows]),
            times(ratio(firsts[way], firsts["per-rank"])),
        )
    ours = ratio(firsts["one-request-adopted"], firsts["per-rank"])
    target = Target(
        "warm fork: adopted ranks, every rank at its first line vs before",
        "≤ 1.2×",
        times(ours),
        ours is not None and ours <= 1.2,
    )
    return table, [target], {"firsts": firsts}
