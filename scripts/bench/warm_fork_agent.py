"""Helper process of the warm-fork benchmark (warm_fork.py): one torch-preloaded zygote, the
ranks of one node forked from it in three ways, alternating; prints one JSON object.

    warm_fork_agent.py WORK NPROC REPS
A process of its own because two of the ways need it to be a child subreaper, as an agent is.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

from agent.warm.zygote import RankStart, Zygote

_PR_SET_CHILD_SUBREAPER = 36
# way -> (this process a subreaper, one request for the node's ranks)
WAYS = {
    "per-rank": (False, False),  # the zygote's children, a request each: the way before adoption
    "per-rank-adopted": (True, False),  # a middle process per rank
    "one-request-adopted": (True, True),  # one middle process for the lot: the agent's way
}


def batch(zygote: Zygote, starts: list[RankStart], together: bool) -> tuple[float, float]:
    """(seconds until every rank was forked, until every rank printed its first line)."""
    t0 = time.perf_counter()
    if together:
        ranks = zygote.fork_all(starts)
    else:
        ranks = [zygote.fork(s.argv, s.env, s.cwd, None, None, False) for s in starts]
    forked = time.perf_counter() - t0
    for rank in ranks:
        assert not isinstance(rank, Exception), rank
        assert os.read(rank.stdout_fd, 64), "no first line"
    first = time.perf_counter() - t0
    for rank in ranks:
        rank.wait(60)
        os.close(rank.stdout_fd)
        os.close(rank.stderr_fd)
    return forked, first


def main(argv: list[str]) -> int:
    work, nproc, reps = Path(argv[0]), int(argv[1]), int(argv[2])
    script = work / "warm_fork_rank.py"
    script.write_text("print('up', flush=True)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    libc = ctypes.CDLL(None, use_errno=True)
    t0 = time.perf_counter()
    with Zygote.start(["torch"], env) as zygote:
        assert zygote.wait_ready(300), zygote.info
        ready = time.perf_counter() - t0
        starts = [RankStart((sys.executable, str(script)), env, str(work))] * nproc
        batch(zygote, starts, True)  # untimed: the page cache, the zygote's first fork
        samples: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
        for _ in range(reps):
            for way, (subreaper, together) in WAYS.items():
                libc.prctl(_PR_SET_CHILD_SUBREAPER, int(subreaper), 0, 0, 0)
                samples[way].append(batch(zygote, starts, together))
    print(json.dumps({"zygote_ready_s": ready, "nproc": nproc, "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
