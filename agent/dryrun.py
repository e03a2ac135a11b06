"""`--dry-run`: print every rank's placement, argv and env; start nothing."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

from agent.job import rank_specs


def print_plan(command, world, options, job, environ, topology) -> int:
    config_file = os.path.join(job.log_dir, "resolved-config.agent-NNNNN.json")
    out = sys.stdout
    out.write(
        f"plan: {world.source} world, {world.nnodes} node(s), world size {job.world_size}, "
        f"log dir {job.log_dir}; nothing started (--dry-run)\n"
    )
    nodes = range(world.nnodes) if world.task is None else [world.node_rank]
    for node in nodes:
        host = world.hosts[node] if node < len(world.hosts) else f"node{node}"
        here = replace(world, node_rank=node, host=host)
        for spec in rank_specs(command, here, options, job, environ, topology, 0, 0, config_file):
            p = spec.placement
            out.write(
                f"rank {spec.rank}  node {spec.node_rank} ({spec.host})  local {spec.local_rank}  "
                f"gpu {p.gpu or '-'}  pci {p.pci or '-'}  numa {p.numa_node if p.numa_node is not None else '-'}  "
                f"cpus {_cpus(p.cpus)}\n  argv: {' '.join(spec.argv)}\n"
                f"  env: {' '.join(f'{k}={v}' for k, v in sorted(spec.env.items()))}\n"
            )
    out.write("config:\n" + json.dumps(job.payload.config, sort_keys=True, indent=1) + "\n")
    return 0


def _cpus(cpus) -> str:
    from agent.topology import format_cpulist

    return format_cpulist(cpus) if cpus else "-"
