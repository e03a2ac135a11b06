"""What the leftover audit (agent.run.leftovers) costs a node without leftovers, after every
attempt — the common case, paid once per attempt per node:

    python scripts/bench/leftovers.py [REPEATS]

- audit: `LeftoverAudit.run` with nothing to end (one /proc snapshot: every process's state,
  owner, fd links, and the env of the user's own processes), median and max over REPEATS (200);
- with fds: the same while N extra processes of ours each hold 256 open files (fd links are
  the scan's main cost), so a busy node's figure can be read off;
- processes: how many /proc showed. Target: at most 50 ms. Prints one JSON object.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agent.run.leftovers import LeftoverAudit, snapshot  # noqa: E402

HOLDER = """
import os, sys
fds = [os.open(sys.argv[1], os.O_RDONLY) for _ in range(256)]
print("ready", flush=True)
sys.stdin.read()
"""


def timed(audit: LeftoverAudit, repeats: int) -> dict[str, float]:
    audit.run(grace=1.0)  # warm: pwd, the pynvml import attempt
    took = []
    for _ in range(repeats):
        begin = time.perf_counter()
        left = audit.run(grace=1.0)
        took.append(time.perf_counter() - begin)
        assert not left.killed and not left.stays, left
    return {"median_ms": statistics.median(took) * 1e3, "max_ms": max(took) * 1e3}


def main(argv: list[str]) -> int:
    repeats = int(argv[0]) if argv else 200
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "nvidia0").write_text("")
        audit = LeftoverAudit("bench", "bench-no-such-job", str(root))
        result = {"processes": len(snapshot(str(root))), "audit": timed(audit, repeats)}
        # Processes that hold many files (not the device): every fd link is read.
        plain = root / "plain"
        plain.write_text("")
        holders = [
            subprocess.Popen(
                [sys.executable, "-c", HOLDER, str(plain)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            for _ in range(16)
        ]
        try:
            for proc in holders:
                assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            # ours by descent: keep them, as the agent keeps its warm interpreter
            keep = [p.pid for p in holders]
            kept = LeftoverAudit("bench", "bench-no-such-job", str(root))
            kept.run(grace=1.0, keep=keep)
            took = []
            for _ in range(repeats // 4 or 1):
                begin = time.perf_counter()
                kept.run(grace=1.0, keep=keep)
                took.append(time.perf_counter() - begin)
            result["with_16x256_fds"] = {
                "median_ms": statistics.median(took) * 1e3,
                "max_ms": max(took) * 1e3,
            }
        finally:
            for proc in holders:
                proc.kill()
                proc.wait()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
