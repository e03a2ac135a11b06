"""All-reduce bandwidth benchmark, nccl-tests style, run through the agent on every rank.

    python -m agent --nproc-per-node 4 scripts/examples/allreduce_bench.py --max-bytes 1G --json out.json

Message sizes double from --min-bytes (1 KiB) to --max-bytes (1 GiB), capped so that every rank's
buffers fit in free memory (GPU memory under NCCL, host memory under gloo; the smallest cap of any
rank wins, so every rank runs the same sizes). Each size: one checked all-reduce, --warmup untimed
ones, then --iters timed ones; the time is the slowest rank's average.

As nccl-tests define them (doc/PERFORMANCE.md): algbw = bytes / time and
busbw = algbw x 2(n-1)/n for n ranks: the bandwidth each link must carry in a ring all-reduce,
comparable across world sizes and with the hardware's peak. Rank 0 prints a markdown table and,
with --json PATH, writes the rows. The math is in pure functions below, importable for tests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
GB = 1e9  # nccl-tests report GB/s in powers of ten
HEADROOM = 4  # bytes of free memory wanted per message byte (the buffer plus backend scratch)
DTYPES = ("float32", "float16", "bfloat16")
_SIZE = re.compile(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": KIB, "m": MIB, "g": GIB, "t": GIB << 10}


# --- pure math ----------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """'1048576', '64K', '64KiB', '1G', '1gb' → bytes (binary units); ValueError otherwise."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a size such as 4096, 64K, 256M or 1G")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def format_size(size: int) -> str:
    """Bytes → the largest binary unit that divides them: 65536 → '64 KiB'."""
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} B"


def message_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """min_bytes, min_bytes x factor, ... up to max_bytes inclusive."""
    if min_bytes < 1 or factor < 2:
        raise ValueError("min_bytes must be positive and factor at least 2")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def memory_cap(max_bytes: int, free_bytes: int, sharing: int = 1, headroom: int = HEADROOM) -> int:
    """The largest message to try: max_bytes, or less where `sharing` ranks split free_bytes."""
    return max(0, min(max_bytes, free_bytes // (max(sharing, 1) * headroom)))


def element_count(size: int, itemsize: int) -> int:
    return size // itemsize


def bus_factor(ranks: int) -> float:
    """nccl-tests' all-reduce correction: each rank sends and receives 2(n-1)/n of the data."""
    if ranks < 1:
        raise ValueError(f"need at least one rank, got {ranks}")
    return 2 * (ranks - 1) / ranks


def algbw(size: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: the message size over the time of one all-reduce."""
    return size / seconds / GB if seconds > 0 else float("inf")


def busbw(alg: float, ranks: int) -> float:
    return alg * bus_factor(ranks)


@dataclass(frozen=True)
class Row:
    size: int  # bytes
    count: int  # elements
    type: str
    time_us: float  # one all-reduce, slowest rank's average
    algbw: float  # GB/s
    busbw: float  # GB/s


def make_row(size: int, itemsize: int, dtype: str, seconds: float, ranks: int) -> Row:
    alg = algbw(size, seconds)
    return Row(size, element_count(size, itemsize), dtype, seconds * 1e6, alg, busbw(alg, ranks))


def average_busbw(rows: Sequence[Row]) -> float:
    return sum(r.busbw for r in rows) / len(rows) if rows else 0.0


def format_table(rows: Sequence[Row]) -> str:
    """A markdown table, right-aligned: size, count, type, time (us), algbw and busbw (GB/s)."""
    header = ("size (B)", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)")
    cells = [
        (str(r.size), str(r.count), r.type, f"{r.time_us:.1f}", f"{r.algbw:.3f}", f"{r.busbw:.3f}")
        for r in rows
    ]
    widths = [max(len(c[i]) for c in (header, *cells)) for i in range(len(header))]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.rjust(w) for v, w in zip(values, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(c) for c in cells)])


def report(rows: Sequence[Row], ranks: int, meta: dict[str, Any]) -> dict[str, Any]:
    """What --json writes."""
    return {
        **meta,
        "world_size": ranks,
        "bus_factor": bus_factor(ranks),
        "avg_busbw": average_busbw(rows),
        "rows": [asdict(r) for r in rows],
    }


# --- the benchmark (torch from here on) ---------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--min-bytes", type=parse_size, default=KIB, help="smallest message (default 1K)"
    )
    p.add_argument("--max-bytes", type=parse_size, default=GIB, help="largest message (default 1G)")
    p.add_argument("--factor", type=int, default=2, help="size multiplier between rows (default 2)")
    p.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size (default 5)")
    p.add_argument("--iters", type=int, default=20, help="timed all-reduces per size (default 20)")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--json", help="rank 0 writes the rows here as JSON")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be at least 1 and --warmup not negative")
    if args.min_bytes < 4:
        p.error("--min-bytes must hold one element: at least 4")
    return args


def free_host_memory() -> int:
    """MemAvailable from /proc/meminfo, else free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * KIB
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def agreed_cap(max_bytes: int, device: torch.device) -> int:
    """Every rank's memory cap, the smallest one: all ranks must run the same sizes."""
    import torch
    import torch.distributed as dist

    if device.type == "cuda":
        free, sharing = torch.cuda.mem_get_info(device)[0], 1
    else:
        free, sharing = free_host_memory(), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cap = torch.tensor([memory_cap(max_bytes, free, sharing)], dtype=torch.int64, device=device)
    dist.all_reduce(cap, op=dist.ReduceOp.MIN)
    return int(cap.item())


def check_sum(tensor: torch.Tensor, ranks: int, rank: int) -> None:
    """One all-reduce of rank+1 everywhere must give n(n+1)/2 everywhere."""
    import torch.distributed as dist

    tensor.fill_(rank + 1)
    dist.all_reduce(tensor)
    expected = ranks * (ranks + 1) / 2
    for value in (tensor[0].item(), tensor[-1].item()):
        if abs(value - expected) > 1e-2 * expected:  # float16/bfloat16 may round large sums
            raise RuntimeError(f"all_reduce gave {value}, expected {expected}")


def time_all_reduce(
    tensor: torch.Tensor, warmup: int, iters: int, sync: Callable[[], None]
) -> float:
    """Seconds per all-reduce, the slowest rank's average over `iters`."""
    import torch
    import torch.distributed as dist

    tensor.zero_()  # sums of zeros stay zero: no overflow, no denormals
    for _ in range(warmup):
        dist.all_reduce(tensor)
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    sync()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=tensor.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item()) / iters


def header(ranks: int, meta: dict[str, Any], sizes: Sequence[int], cap: int, max_bytes: int) -> str:
    span = f"{format_size(sizes[0])}..{format_size(sizes[-1])}" if sizes else "none"
    capped = f" (--max-bytes capped to {cap} B by free memory)" if cap < max_bytes else ""
    return (
        f"# all_reduce: {ranks} ranks ({meta['nnodes']} nodes x {meta['nproc_per_node']}), "
        f"{meta['backend']}, {meta['dtype']}, warmup {meta['warmup']}, iters {meta['iters']}, "
        f"sizes {span}{capped}"
    )


def pick_device() -> torch.device:
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    # modulo: under srun --gpus-per-task each rank sees only its own GPU, as cuda:0
    device = torch.device(
        "cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    )
    torch.cuda.set_device(device)
    return device


def measure(sizes: Sequence[int], args: argparse.Namespace, device: torch.device) -> list[Row]:
    import torch
    import torch.distributed as dist

    rank, ranks = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    itemsize = torch.tensor([], dtype=dtype).element_size()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for size in sizes:
        tensor = torch.empty(element_count(size, itemsize), dtype=dtype, device=device)
        check_sum(tensor, ranks, rank)
        seconds = time_all_reduce(tensor, args.warmup, args.iters, sync)
        rows.append(make_row(tensor.numel() * itemsize, itemsize, args.dtype, seconds, ranks))
        del tensor
    return rows


def run(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = pick_device()
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend)
    cap = agreed_cap(args.max_bytes, device)
    sizes = message_sizes(args.min_bytes, cap, args.factor)
    meta = {
        "backend": backend,
        "dtype": args.dtype,
        "warmup": args.warmup,
        "iters": args.iters,
        "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        "nproc_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    }
    if rank == 0:
        print(header(ranks, meta, sizes, cap, args.max_bytes), flush=True)
    rows = measure(sizes, args, device)
    dist.destroy_process_group()
    if rank == 0:
        print(format_table(rows))
        print(
            f"# avg busbw: {average_busbw(rows):.3f} GB/s (bus factor 2(n-1)/n = {bus_factor(ranks):.4f})"
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report(rows, ranks, meta), f, indent=1)
    if not sizes:
        print(
            "allreduce_bench: no message size fits: raise --max-bytes or free memory",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
