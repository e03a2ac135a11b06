"""A rank stuck in a real NCCL collective: the stream it waits on never drains.

    nccl_stall.py SECONDS    the process group's timeout (NCCL's watchdog acts on it)

One all_reduce completes (#1), then a GPU kernel that spins far longer than the job is queued
before a second all_reduce (#2), and the rank blocks in torch.cuda.synchronize(): in the
flight recorder #2 is scheduled and never completes; in Python the rank waits in synchronize.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def wait_for_the_gpu() -> None:
    torch.cuda.synchronize()


def main() -> None:
    timeout = timedelta(seconds=float(sys.argv[1]))
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", timeout=timeout, device_id=torch.device("cuda", local_rank))
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"nccl_stall: all_reduce #1 done ({t[0].item():g}); stalling the stream", flush=True)
    torch.cuda._sleep(2**40)  # ~10 minutes of spinning at 2 GHz: longer than any check here
    dist.all_reduce(t)
    wait_for_the_gpu()
    print("nccl_stall: never reached", flush=True)


if __name__ == "__main__":
    main()
