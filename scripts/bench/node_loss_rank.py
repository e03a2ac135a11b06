"""Rank for the node-loss benchmark (no torch import before the first timestamp).

    node_loss_rank.py DIR
Records time.time() at its first line, joins a gloo process group, all_reduces one tensor and
writes both times to DIR/rank-<RANK>-a<ATTEMPT>.json. Attempt 0 then waits to be torn down (the
benchmark kills one node's agent); later attempts exit 0.
"""

import time

FIRST_LINE = time.time()  # the first line of user code

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

PRELOADED = "torch" in sys.modules  # forked from an interpreter that had imported torch


def main() -> None:
    where = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)

    import torch
    import torch.distributed as dist

    try:  # no reverse-DNS lookups in the rank (see gloo_rank.py)
        from agent.node.dnsfix import disable_reverse_dns

        disable_reverse_dns(os.path.join(os.path.dirname(torch.__file__), "lib"))
    except ImportError:
        pass
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    value = torch.ones(4)
    dist.all_reduce(value)
    record = {
        "rank": rank,
        "attempt": attempt,
        "first_line": FIRST_LINE,
        "all_reduce": time.time(),
        "ok": int(value[0].item()) == dist.get_world_size(),
        "preloaded": PRELOADED,
        "host": os.environ.get("SLURMD_NODENAME"),
    }
    tmp = where / f".rank-{rank}-a{attempt}.json"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, where / f"rank-{rank}-a{attempt}.json")
    if attempt == 0:
        while True:  # until the agent tears this attempt down
            time.sleep(1.0)
    dist.destroy_process_group()


main()
