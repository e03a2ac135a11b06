"""Checks the launcher's env contract on every rank, then proves it with gloo (or NCCL on GPUs).

Run it through the agent: `python -m agent --nproc-per-node 2 scripts/examples/check_args.py`.
Exits non-zero, naming the problem, if anything is missing or wrong.
"""

import json
import os
import sys

REQUIRED = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_ERROR_FILE",
    "CUDA_DEVICE_ORDER",
    "AGENT_CONFIG",
)


def fail(message: str) -> None:
    print(f"check_args: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    missing = [k for k in REQUIRED if k not in os.environ]
    if missing:
        fail(f"missing env: {', '.join(missing)}")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world, local_world = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    node = int(os.environ["GROUP_RANK"])
    if not (0 <= rank < world and 0 <= local_rank < local_world):
        fail(f"rank {rank}/{world}, local rank {local_rank}/{local_world} out of range")
    if os.environ["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID":
        fail("CUDA_DEVICE_ORDER is not PCI_BUS_ID")
    with open(os.environ["AGENT_CONFIG"]) as f:
        config = json.load(f)

    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend)
    device = "cuda" if backend == "nccl" else "cpu"
    total = torch.tensor([rank], dtype=torch.int64, device=device)
    dist.all_reduce(total)
    expected = world * (world - 1) // 2
    if int(total.item()) != expected:
        fail(f"all_reduce of ranks gave {int(total.item())}, expected {expected}")
    report = {
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world,
        "local_world_size": local_world,
        "group_rank": node,
        "node_rank": int(os.environ["NODE_RANK"]),
        "master_addr": os.environ["MASTER_ADDR"],
        "master_port": os.environ["MASTER_PORT"],
        "restart_count": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
        "all_reduce": int(total.item()),
        "backend": backend,
        "config_keys": sorted(config),
        "argv": sys.argv[1:],
    }
    print("check_args: OK " + json.dumps(report, sort_keys=True))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
