"""`--dry-run`: print the plan the agents would execute — every rank's placement, argv, env."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from agent.plan.run_plan import RunPlan, node_layout, rank_specs
from agent.plan.topology import format_cpulist
from agent.world import World


def print_plan(
    plan: RunPlan, world: World, environ: Mapping[str, str], read_topology: Callable[[str], Any]
) -> int:
    config_file = os.path.join(plan.log_dir, "resolved-config.agent-NNNNN.json")
    topology = read_topology(plan.options.sysfs_root)
    out = sys.stdout
    out.write(
        f"plan: {world.source} world, {world.nnodes} node(s), world size {plan.world_size}, "
        f"log dir {plan.log_dir}; nothing started (--dry-run)\n"
    )
    nodes = range(world.nnodes) if world.task is None else [world.node_rank]
    for node in nodes:
        host = world.hosts[node] if node < len(world.hosts) else f"node{node}"
        here = replace(world, node_rank=node, host=host)
        lay = node_layout(plan, here, topology)
        specs = rank_specs(
            plan, here, lay, attempt=0, port=0, config_file=config_file, environ=environ
        )
        for spec in specs:
            p = spec.placement
            out.write(
                f"rank {spec.rank}  node {spec.node_rank} ({spec.host})  local {spec.local_rank}  "
                f"gpu {p.gpu or '-'}  pci {p.pci or '-'}  numa {p.numa_node if p.numa_node is not None else '-'}  "
                f"cpus {format_cpulist(p.cpus) if p.cpus else '-'}\n  argv: {' '.join(spec.argv)}\n"
                f"  env: {' '.join(f'{k}={v}' for k, v in sorted(spec.env.items()))}\n"
            )
    out.write("options:\n" + json.dumps(plan.to_json()["options"], sort_keys=True, indent=1) + "\n")
    out.write("config:\n" + json.dumps(plan.payload.config, sort_keys=True, indent=1) + "\n")
    return 0
