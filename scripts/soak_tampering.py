"""Soak: N tampered 2-node loopback jobs (default 200) over the fuzzer's shapes (tests/outsider.py),
each with an outsider on the job store at a seeded random schedule; prints a report: operations
tried per key family, outcome changes (shape, seed, expected vs got), and the slowest job against
its shape's untampered baseline.

    python scripts/soak_tampering.py [--jobs 200] [--seed 1000] [--shapes clean,restart,...]

A seed replays its job's schedule: `--jobs 1 --seed S --shapes SHAPE`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from outsider import OPS, SHAPES, run_job  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1000, help="the first job's seed")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--limit", type=float, default=60.0, help="seconds over the baseline")
    ns = parser.parse_args()
    shapes = [SHAPES[name] for name in ns.shapes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="soak-tampering-"))
    baseline = {}
    for shape in shapes:
        result = run_job(tmp / f"base-{shape.name}", shape, None)
        if result.changed:
            print(f"untampered {shape.name} is not its baseline: {result.describe()}")
            return 1
        baseline[shape.name] = result.took
    tried: Counter = Counter()
    changes = []
    slowest = [0.0, ""]
    start = time.monotonic()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `timeout` still gets a report
    done = 0
    try:
        for i in range(ns.jobs):
            done = i + 1
            one(ns, shapes, baseline, tmp, i, tried, changes, slowest)
    except KeyboardInterrupt:
        done -= 1
        print(f"stopped after {done} jobs")
    report(tried, changes, slowest, baseline, ns, done, time.monotonic() - start)
    return 1 if changes else 0


def one(ns, shapes, baseline, tmp, i, tried, changes, slowest) -> None:
    """The i-th tampered job, its numbers added to the report's."""
    shape = shapes[i % len(shapes)]
    seed = ns.seed + i
    result = run_job(tmp / f"job-{i}", shape, seed, baseline[shape.name] + ns.limit)
    tried.update(result.outsider.tried if result.outsider else {})
    over = result.took - baseline[shape.name]
    if over > slowest[0]:
        slowest[:] = [over, f"{shape.name} seed {seed}"]
    if result.changed:
        changes.append(result.describe())
    print(f"[{i + 1}/{ns.jobs}] {shape.name} seed {seed}: {result.outcome} "
          f"{result.took:.1f}s{'  CHANGED' if result.changed else ''}", flush=True)  # fmt: skip


def report(tried, changes, slowest, baseline, ns, jobs, took) -> None:
    families: dict[str, Counter] = defaultdict(Counter)
    for (fam, op), count in tried.items():
        families[fam][op] += count
    print(f"\n{jobs} tampered jobs (seeds {ns.seed}..{ns.seed + jobs - 1}) in {took:.0f}s; "
          f"untampered baselines: " + ", ".join(f"{k} {v:.1f}s" for k, v in baseline.items()))  # fmt: skip
    print(f"{'key family':34} " + " ".join(f"{op:>11}" for op in OPS) + f" {'total':>7}")
    for fam in sorted(families):
        row = families[fam]
        print(f"{fam:34} " + " ".join(f"{row[op]:>11}" for op in OPS) + f" {sum(row.values()):>7}")
    print(f"operations: {sum(tried.values())}; slowest over its baseline: "
          f"{slowest[0]:.1f}s ({slowest[1] or '-'})")  # fmt: skip
    print(f"outcome changes: {len(changes)}")
    for line in changes:
        print("  " + line)


if __name__ == "__main__":
    sys.exit(main())
