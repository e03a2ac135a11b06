"""What `agent history` and `--timeline` cost (issue 28), in one fresh process, on synthetic
summaries shaped as node 0 writes them:

    python scripts/bench/history_timeline.py [SCRATCH_DIR]

- append: node 0's history append of a small job into a database already at its row cap
  (`store.ROW_CAP` rows, so every append also prunes), median and p99 over 200 appends;
- big job: `from_summary` + `append` of a 4,096 nodes × 8 ranks, 2-attempt summary;
- cli: `python -m agent history` (the last 20) and `--last 0` over the full database, wall time
  of the command, interpreter start included;
- timeline: `layout` + `svg` of that 4,096-node summary, and the SVG's size and lane count.
Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agent.history import store  # noqa: E402
from agent.history.record import from_summary  # noqa: E402
from agent.logs.timeline import layout  # noqa: E402
from agent.logs.timeline_svg import svg  # noqa: E402


def summary(nodes: int, per_node: int, attempts: int = 2) -> dict[str, Any]:
    def ranks(attempt: int, t: float, failing: int | None) -> list[dict[str, Any]]:
        return [
            {"rank": n * per_node + k, "local_rank": k, "node_rank": n, "host": f"n{n:05d}",
             "state": "failed" if n * per_node + k == failing else
             "terminated" if failing is not None else "succeeded",
             "returncode": 0, "start": t, "end": t + 10, "attempt": attempt}
            for n in range(nodes) for k in range(per_node)
        ]  # fmt: skip

    cause = {"kind": "rank", "rank": 3, "node_rank": 0, "host": "n00000", "how": "exit code 1",
             "time": 110.0}  # fmt: skip
    return {
        "job": {"id": "bench", "step": "0", "nnodes": nodes, "world_size": nodes * per_node,
                "log_dir": "/logs/bench", "command": ["train.py", "a.yml"]},
        "status": "succeeded", "exit_code": 0, "root_cause": None,
        "attempts": [
            {"attempt": a, "root_cause": cause if a < attempts - 1 else None,
             "ranks": ranks(a, 100.0 + 30 * a, 3 if a < attempts - 1 else None),
             "nodes": [{"node": n, "host": f"n{n:05d}"} for n in range(nodes)], "spares": []}
            for a in range(attempts)
        ],
    }  # fmt: skip


def main(scratch: Path) -> dict[str, Any]:
    state = scratch / "state"
    environ = {"AGENT_STATE_DIR": str(state)}
    warnings: list[str] = []
    small = from_summary(summary(2, 2), time.time())
    store.append(small, environ, state, os.getuid(), warnings.append)  # the schema
    con = sqlite3.connect(state / store.FILE_NAME)  # then the cap's worth of rows at once
    (row,) = con.execute("SELECT * FROM jobs").fetchall()
    con.executemany(
        "INSERT INTO jobs (job_id, run, step, command, start_time, end_time, nodes, ranks, "
        "spares_used, exit_code, status, cause, restarts, stragglers, log_dir) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(f"fill{i}", 0, *row[3:]) for i in range(store.ROW_CAP)],
    )
    con.commit()
    con.close()
    times = []
    for _ in range(200):
        start = time.perf_counter()
        store.append(small, environ, state, os.getuid(), warnings.append)
        times.append(time.perf_counter() - start)
    times.sort()
    big = summary(4096, 8)
    start = time.perf_counter()
    record = from_summary(big, time.time())
    built = time.perf_counter() - start
    store.append(record, environ, state, os.getuid(), warnings.append)
    appended = time.perf_counter() - start - built
    env = {**os.environ, "PYTHONPATH": str(REPO), **environ}
    cli = {}
    for name, argv in (("history", []), ("history --last 0", ["--last", "0"])):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "agent", "history", *argv], env=env,
                       stdout=subprocess.DEVNULL, check=True, timeout=120)  # fmt: skip
        cli[name] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    picture = layout(big)
    laid = time.perf_counter() - start
    text = svg(picture)
    drawn = time.perf_counter() - start - laid
    return {
        "rows": store.ROW_CAP,
        "append_median_ms": round(times[len(times) // 2] * 1e3, 2),
        "append_p99_ms": round(times[int(len(times) * 0.99)] * 1e3, 2),
        "big_job_from_summary_s": round(built, 3),
        "big_job_append_s": round(appended, 3),
        "cli_s": cli,
        "timeline_layout_s": round(laid, 3),
        "timeline_svg_s": round(drawn, 4),
        "timeline_bytes": len(text),
        "timeline_lanes": len(picture.lanes),
        "warnings": warnings,
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp)
        print(json.dumps(main(where), indent=1))
