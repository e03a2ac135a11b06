"""The scale harness's node-0 and command-line parts, timed in one fresh process over one N.

    scale_offline.py LOG_DIR NODES

LOG_DIR is what the end-to-end run left (summary.json, ranks.json, agent logs) plus the rank
files scale_e2e.rank_files wrote (8 ranks per node). Prints one JSON object:
- verdict: node 0's work once every result is in: `judge` over every node's result (rebuilt
  from summary.json's ranks, the shape agent.run.execute posts, parsed as `Result`s), `build_summary`,
  `write_summary`, `render_report`, and ranks.json written again (`write_json` as write_ranks
  does); the results unsealed as node 0 reads them (`JobKeys.unseal`, one per node);
- logs: `agent logs --summary` and `agent logs -n 5` in process (output to a null sink);
- stacks: every rank's stack as nodes answer `agent stacks` (JSON, 8 ranks per node), parsed
  (`RankStack.from_json`), collated, rendered and summed up in a headline.
Each step is timed `REPS` times; the minimum is reported (the machine is shared).
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from agent.hang.collate import collate, headline, render
from agent.hang.stacks import RankStack
from agent.logs import main as logs_main
from agent.node.failure import Failure
from agent.node.result import Result
from agent.node.trust import JobKeys
from agent.run import outputs
from agent.run.summary import build_summary, render_report
from agent.run.verdict import Budget, judge

REPS = int(os.environ.get("LA_SCALE_REPS", "3"))


def timed(fn: Callable[[], Any], reps: int = REPS) -> tuple[float, Any]:
    best, value = float("inf"), None
    for _ in range(reps):
        t = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t)
    return best, value


class Null(io.RawIOBase):
    """A binary sink that counts what it was given."""

    def __init__(self) -> None:
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.size += len(data)
        return len(data)


# -- node 0's verdict and summary ----------------------------------------------------------
def results_of(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node's posted result (agent.run.execute._result), rebuilt from summary.json."""
    by_node: dict[int, list[dict[str, Any]]] = {}
    for rank in summary["attempts"][-1]["ranks"]:
        by_node.setdefault(rank["node_rank"], []).append(rank)
    cause = summary.get("root_cause")
    return [
        {
            "exits": exits,
            "signal": None,
            "refused": None,
            "warnings": [],
            "failure": cause if cause and cause.get("node_rank") == node else None,
        }
        for node, exits in sorted(by_node.items())
    ]


def verdict(log_dir: str) -> dict[str, Any]:
    with open(os.path.join(log_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(log_dir, "ranks.json")) as f:
        ranks = json.load(f)
    results = results_of(summary)
    keys = JobKeys.derive(b"scale-offline", "scale", "0")
    sealed = [keys.seal(r, f"r0/a0/result/{i}") for i, r in enumerate(results)]
    out: dict[str, Any] = {"nodes": len(results), "result_bytes": sum(map(len, sealed))}
    out["unseal_s"], _ = timed(
        lambda: [keys.unseal(s, f"r0/a0/result/{i}", "result") for i, s in enumerate(sealed)]
    )
    out["parse_s"], typed = timed(lambda: [Result.from_json(r) for r in results])
    failures = [f for f in (Failure.from_json(r["failure"]) for r in results) if f is not None]
    budget = Budget(0, 0, False)
    out["judge_s"], decided = timed(lambda: judge(0, typed, failures, budget))
    job = summary["job"]
    out["build_s"], built = timed(lambda: build_summary(job, [dict(decided.record)], decided.code))
    scratch = os.path.join(log_dir, "offline")
    os.makedirs(scratch, exist_ok=True)
    os.environ["AGENT_STATE_DIR"] = scratch  # the history append is timed too, away from ~/.cache
    out["write_summary_s"], _ = timed(lambda: outputs.write_summary(scratch, built))
    out["report_s"], _ = timed(lambda: render_report(built))
    path = os.path.join(scratch, "ranks.json")
    out["write_ranks_s"], _ = timed(lambda: outputs.write_json(path, ranks, indent=1))
    out["rank_entries"] = len(ranks.get("ranks", []))
    out["total_s"] = sum(
        out[k] for k in ("unseal_s", "parse_s", "judge_s", "build_s", "write_summary_s", "report_s")
    )
    return out


# -- agent logs -------------------------------------------------------------------------
def logs(log_dir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, argv in (("summary", ["--summary"]), ("tail5", ["-n", "5"])):
        sink = Null()

        def run(argv: list[str] = argv, sink: Null = sink) -> int:
            sink.size = 0
            return logs_main([log_dir, *argv], out=sink, colour=False)

        out[f"{name}_s"], code = timed(run)
        out[f"{name}_code"], out[f"{name}_bytes"] = code, sink.size
    return out


# -- stacks -----------------------------------------------------------------------------
def _frames(names: list[tuple[str, str, int]]) -> list[list[Any]]:
    return [[function, file, line] for function, file, line in names]


_LIB = "/usr/lib/python3.11/site-packages/torch"
BASE = [
    ("<module>", "/home/u/train.py", 210),
    ("main", "/home/u/train.py", 180),
    ("train", "/home/u/train.py", 140),
] + [(f"layer_{i}", f"{_LIB}/nn/modules/module.py", 1500 + i) for i in range(12)]
ALLREDUCE = BASE + [
    ("step", "/home/u/train.py", 96),
    ("all_reduce", f"{_LIB}/distributed/distributed_c10d.py", 2050),
    ("wait", f"{_LIB}/distributed/distributed_c10d.py", 1900),
]
LOADER = BASE + [
    ("next_batch", "/home/u/data.py", 44),
    ("get", "/usr/lib/python3.11/queue.py", 180),
]
SPIN = BASE + [("step", "/home/u/train.py", 101), ("check", "/home/u/train.py", 77)]
IDLE = [
    ("_bootstrap", "/usr/lib/python3.11/threading.py", 995),
    ("run", "/usr/lib/python3.11/threading.py", 975),
    ("_pin_memory_loop", f"{_LIB}/utils/data/_utils/pin_memory.py", 50),
    ("get", "/usr/lib/python3.11/queue.py", 180),
]


def node_answers(nodes: int, per_node: int = 8) -> list[dict[str, Any]]:
    """What each node's agent posts (agent.hang.desk): {"stacks": [RankStack.to_json()...]};
    everyone waits in all_reduce but 7 ranks in the data loader and one rank that spins."""
    answers = []
    for node in range(nodes):
        stacks = []
        for local in range(per_node):
            rank = node * per_node + local
            main = (
                SPIN if rank == nodes * per_node - 1 else LOADER if rank % 4099 == 7 else ALLREDUCE
            )
            threads = [
                {"name": "MainThread", "idle": False, "frames": _frames(main)},
                {"name": "Thread-2 (_pin_memory_loop)", "idle": True, "frames": _frames(IDLE)},
            ]
            stacks.append(
                {
                    "rank": rank,
                    "host": f"node{node:04d}",
                    "pid": 10000 + rank,
                    "method": "py-spy",
                    "error": None,
                    "threads": threads,
                }
            )
        answers.append({"stacks": stacks})
    return answers


def stacks(nodes: int) -> dict[str, Any]:
    answers = node_answers(nodes)
    wire = [json.dumps(a) for a in answers]  # as they travel (sealed) through the store
    out: dict[str, Any] = {"ranks": nodes * 8, "json_bytes": sum(map(len, wire))}

    def parse() -> list[RankStack]:
        found = []
        for text in wire:
            found += [RankStack.from_json(item) for item in json.loads(text)["stacks"]]
        return sorted(found, key=lambda s: s.rank)

    out["parse_s"], parsed = timed(parse)
    out["collate_s"], groups = timed(lambda: collate(parsed))
    out["render_s"], text = timed(lambda: render(groups))
    out["headline_s"], line = timed(lambda: headline(groups))
    out["groups"] = [len(g.ranks) for g in groups]
    out["headline"] = line[:300]
    out["render_bytes"] = len(text)
    out["total_s"] = out["parse_s"] + out["collate_s"] + out["render_s"] + out["headline_s"]
    return out


def main(argv: list[str]) -> int:
    log_dir, nodes = argv[0], int(argv[1])
    out = {"verdict": verdict(log_dir), "logs": logs(log_dir), "stacks": stacks(nodes)}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
