"""What NUMA binding adds to a rank's start: the exec wrapper with and without a binding.

Runs `python -S -E agent/run/child.py PARENT CPUS MEMS POLICY PATHS -- true` N times each way, interleaved, and
prints medians in milliseconds. Usage: python scripts/bench_binding.py [N]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time


def spawn_ms(cpus: str, mems: str) -> float:
    start = time.perf_counter()
    from agent.run.workers import child_paths, wrapper_argv

    subprocess.run(wrapper_argv(["true"], cpus=cpus, mems=mems, paths=child_paths()), check=True)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    cpu = str(min(os.sched_getaffinity(0)))
    plain, bound = [], []
    for _ in range(n):
        plain.append(spawn_ms("-", "-"))
        bound.append(spawn_ms(cpu, "0"))
    p, b = statistics.median(plain), statistics.median(bound)
    print(
        f"exec wrapper, unbound: {p:.1f} ms; bound (cpu {cpu}, memory node 0): {b:.1f} ms; "
        f"binding adds {b - p:+.1f} ms per rank (median of {n})"
    )


if __name__ == "__main__":
    main()
