"""Rank for the launch benchmark: gloo init_process_group + barrier + exit, nothing else.

Every launcher runs this same program. It turns off c10d's reverse-DNS lookups in itself (as the
agent does in its own process), so a dropped DNS query in a rank never lands in one variant's
numbers by chance; the launchers' own processes are left as they are.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

try:
    from agent.node.dnsfix import disable_reverse_dns

    disable_reverse_dns(os.path.join(os.path.dirname(torch.__file__), "lib"))
except ImportError:
    pass

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
dist.barrier()
dist.destroy_process_group()
print(f"rank {os.environ['RANK']} ok", flush=True)
sys.exit(0)
