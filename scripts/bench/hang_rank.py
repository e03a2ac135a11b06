"""Rank for the hang benchmark: the hang of tests/fixtures/stuck_job.py, with timestamps.

    hang_rank.py DIR
As stuck_job.py: the last rank (the lone one) spins in spin_without_progress, the others block
in a gloo all_reduce in wait_in_the_collective. Each rank writes time.time() to DIR/last-<RANK>
just before its last line of output, and touches DIR/ready-<RANK> once that line is out.

One difference, so that one job serves both measures: the lone rank prints a line every 0.5 s
while it spins (output is progress for --hang-timeout, so the job is not torn down while
`agent stacks` is timed against it) until DIR/quiet appears; then it writes DIR/last-<RANK>,
prints one last line and spins in silence. The stacks are the same in both phases.

Until its first line every rank also prints "starting" once a second from a thread (gone before
the hang): --hang-timeout counts start-up too, and 16 ranks importing torch on 2 cores take
longer than the benchmark's T = 5 s without a line.
"""

import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

STARTED = threading.Event()


def _starting() -> None:
    while not STARTED.wait(1.0):
        print("starting", flush=True)


STARTER = threading.Thread(target=_starting, name="starting", daemon=True)
STARTER.start()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

try:  # as gloo_rank.py: no reverse-DNS lookups in the rank, whatever launched it
    from agent.node.dnsfix import disable_reverse_dns

    disable_reverse_dns(os.path.join(os.path.dirname(torch.__file__), "lib"))
except ImportError:
    pass


def _stamp(path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(repr(time.time()))
    os.replace(tmp, path)


def wait_in_the_collective():
    x = torch.ones(1)
    dist.all_reduce(x)


def spin_without_progress(where: Path, rank: int):
    quiet, talking, last = where / "quiet", True, time.monotonic()
    while True:
        if talking and time.monotonic() - last > 0.5:
            last = time.monotonic()
            if quiet.exists():
                _stamp(where / f"last-{rank}")
                print("going quiet", flush=True)
                talking = False
            else:
                print("tick", flush=True)


if __name__ == "__main__":
    where = Path(sys.argv[1])
    dist.init_process_group("gloo", timeout=timedelta(minutes=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    lone = rank == world - 1
    STARTED.set()
    STARTER.join()  # its last "starting" is out before the first real line
    if not lone:
        _stamp(where / f"last-{rank}")
    print(f"iter 0 on rank {rank}", flush=True)
    (where / f"ready-{rank}").touch()
    if lone:
        spin_without_progress(where, rank)
    else:
        wait_in_the_collective()
