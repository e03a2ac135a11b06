"""One rank on a GPU node: what the agent gave it (device, CPUs, env), proven by an NCCL all_reduce.

Prints one `cuda_rank: {...}` JSON line; exits 1 if the all_reduce's sum is wrong.
"""

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    facts = {
        "rank": rank,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER"),
        "cuda_initialized_at_start": torch.cuda.is_initialized(),  # False in a warm rank too
        "device_count": torch.cuda.device_count(),
        "cpus": len(os.sched_getaffinity(0)),
        "fr_buffer": os.environ.get("TORCH_FR_BUFFER_SIZE"),
        "nccl_dump_on_timeout": os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT"),
    }
    torch.cuda.set_device(local_rank)
    facts["device"] = torch.cuda.get_device_name()
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    t = torch.full((4,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    facts["all_reduce"] = t.tolist()
    facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    dist.destroy_process_group()
    print("cuda_rank: " + json.dumps(facts), flush=True)
    if t[0].item() != world * (world + 1) / 2:
        sys.exit(1)


if __name__ == "__main__":
    main()
