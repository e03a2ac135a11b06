"""π by the trapezoid rule, spread over every rank: the "first distributed app".

Each rank integrates 4/(1+x²) over its own slice of [0, 1]; one all_reduce adds the slices.
Run it through the agent, on any number of nodes and ranks:

    python -m agent --nproc-per-node 4 scripts/examples/pi.py [--intervals N] [--tolerance T]

gloo on CPU, NCCL on GPUs. Rank 0 prints `pi=3.14159265... error=...`; every rank exits 1 if
the error is above the tolerance (default 1e-6).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence


def integrand(x: float) -> float:
    return 4.0 / (1.0 + x * x)


def rank_slice(intervals: int, rank: int, world: int) -> tuple[int, int]:
    """Rank's share [first, last) of `intervals` equal intervals; shares differ by at most one."""
    base, extra = divmod(intervals, world)
    first = rank * base + min(rank, extra)
    return first, first + base + (1 if rank < extra else 0)


def trapezoid(first: int, last: int, intervals: int) -> float:
    """∫ of 4/(1+x²) over intervals [first, last) of [0, 1] cut into `intervals` pieces."""
    if last <= first:
        return 0.0
    h = 1.0 / intervals
    inner = math.fsum(integrand(i * h) for i in range(first + 1, last))
    return h * (0.5 * integrand(first * h) + inner + 0.5 * integrand(last * h))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--intervals", type=int, default=1_000_000, help="trapezoids in all (default 1e6)"
    )
    p.add_argument(
        "--tolerance", type=float, default=1e-6, help="largest acceptable |pi - math.pi|"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cpu")
    if torch.cuda.is_available():
        # modulo: under srun --gpus-per-task each rank sees only its own GPU, as cuda:0
        device = torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        )
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        part = trapezoid(*rank_slice(args.intervals, rank, world), args.intervals)
        total = torch.tensor([part], dtype=torch.float64, device=device)
        dist.all_reduce(total)
        pi = float(total.item())
    finally:
        dist.destroy_process_group()
    error = abs(pi - math.pi)
    if rank == 0:
        print(
            f"pi={pi:.15f} error={error:.3e} ranks={world} intervals={args.intervals}", flush=True
        )
    if error > args.tolerance:
        print(f"pi: error {error:.3e} is above the tolerance {args.tolerance:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
