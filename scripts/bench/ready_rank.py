"""Rank for the teardown and steady-state benchmarks (no torch).

    ready_rank.py DIR FAIL_RANK SLEEP
Touches DIR/ready-<RANK>. The rank FAIL_RANK waits until every rank of the world is ready, writes
the time (time.time()) to DIR/died and exits 1. The others sleep SLEEP seconds (0: forever) and
exit 0; SIGTERM kills them at once.
"""

import os
import sys
import time
from pathlib import Path

where, fail_rank, sleep = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
(where / f"ready-{rank}").touch()
if rank == fail_rank:
    while len(list(where.glob("ready-*"))) < world:
        time.sleep(0.01)
    time.sleep(0.5)  # the job is up: every rank of every node started
    (where / "died.tmp").write_text(repr(time.time()))
    os.replace(where / "died.tmp", where / "died")
    sys.exit(1)
deadline = time.monotonic() + (sleep if sleep > 0 else 10**9)
while time.monotonic() < deadline:
    time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
sys.exit(0)
