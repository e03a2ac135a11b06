"""Rank for the relaunch and node-loss benchmarks (no torch import before the first timestamp).

    relaunch_rank.py DIR [FAIL_RANK FAIL_AFTER | hold]
Records time.time() at its first line, joins a gloo process group (env:// from the launcher),
all_reduces one tensor, records the time again and writes both to DIR/rank-<RANK>-a<ATTEMPT>.json
(ATTEMPT from TORCHELASTIC_RESTART_COUNT, 0 without it), then exits 0.
With FAIL_RANK: at attempt 0 the rank FAIL_RANK waits until FAIL_AFTER seconds after its first
line, writes DIR/died-a0.json with the time just before it exits, and exits 1 (os._exit); the
other ranks of attempt 0 wait for the launcher's teardown. With `hold` every rank of attempt 0
waits for it (the node-loss benchmark kills one node's agent). Later attempts exit 0.
"""

import time

FIRST_LINE = time.time()  # the first line of user code

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

PRELOADED = "torch" in sys.modules  # forked from an interpreter that had imported torch


def _write(path: Path, record: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def main() -> None:
    where = Path(sys.argv[1])
    hold = sys.argv[2:] == ["hold"]
    fail_rank = int(sys.argv[2]) if len(sys.argv) > 2 and not hold else -1
    fail_after = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)

    import torch
    import torch.distributed as dist

    try:  # as gloo_rank.py: no reverse-DNS lookups in the rank, whatever launched it
        from agent.node.dnsfix import disable_reverse_dns

        disable_reverse_dns(os.path.join(os.path.dirname(torch.__file__), "lib"))
    except ImportError:
        pass

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    value = torch.ones(4)
    dist.all_reduce(value)
    reduced = time.time()
    ok = int(value[0].item()) == dist.get_world_size()
    record = {
        "rank": rank,
        "attempt": attempt,
        "first_line": FIRST_LINE,
        "all_reduce": reduced,
        "ok": ok,
        "preloaded": PRELOADED,
        "pid": os.getpid(),
        "host": os.environ.get("SLURMD_NODENAME"),
    }
    _write(where / f"rank-{rank}-a{attempt}.json", record)
    if (hold or fail_rank >= 0) and attempt == 0:
        if rank == fail_rank:
            time.sleep(max(0.0, FIRST_LINE + fail_after - time.time()))
            _write(where / "died-a0.json", {"rank": rank, "died": time.time()})
            os._exit(1)
        while True:  # stopped by the launcher's teardown (FAIL_RANK failed, or a node was lost)
            time.sleep(1.0)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


main()
