"""A script written for DeepSpeed's launcher: it insists on `--local_rank` in argv.

DeepSpeed's launcher passes `--local_rank=N` before the script's own arguments; the agent does
the same under `--deepspeed`, so this runs unchanged:

    python -m agent --deepspeed --nproc-per-node 2 scripts/examples/deepspeed_style.py --tag demo

Without `--deepspeed` argparse rejects the command line (exit 2) and the agent reports it.
Prints `deepspeed_style: OK ...` when --local_rank agrees with LOCAL_RANK; exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local_rank", type=int, required=True, help="set by the launcher")
    p.add_argument("--tag", default="", help="any script argument, to show they still arrive")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env_local = os.environ.get("LOCAL_RANK")
    if env_local is None or int(env_local) != args.local_rank:
        print(
            f"deepspeed_style: FAIL: --local_rank={args.local_rank} but LOCAL_RANK={env_local}",
            file=sys.stderr,
        )
        return 1
    report = {
        "local_rank": args.local_rank,
        "rank": int(os.environ["RANK"]),
        "tag": args.tag,
        "argv": sys.argv[1:],
    }
    print("deepspeed_style: OK " + json.dumps(report, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
