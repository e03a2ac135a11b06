"""`--dry-run`: print the plan the agents would execute — every rank's placement, argv, env.

The ranks are those the first attempt would spawn, from the same function (`seat_specs`) and
the same roster the roll call starts from: ranks 0..W-1, the spares named as standing by.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from agent.plan.log_dir import LogDir
from agent.plan.rank_set import format_ranges
from agent.plan.roster import Roster
from agent.plan.run_plan import RunPlan, seat_specs
from agent.world import World


def print_plan(
    plan: RunPlan, world: World, environ: Mapping[str, str], read_topology: Callable[[str], Any]
) -> int:
    config_file = LogDir(plan.log_dir).resolved_config(None)
    topology = read_topology(plan.options.sysfs_root)
    out = sys.stdout
    spares = plan.options.spares if world.task is None else 0
    roster = Roster.initial(world.agents, spares)
    standby = f", {spares} spare(s) standing by" if spares else ""
    out.write(
        f"plan: {world.source} world, {plan.nnodes} node(s){standby}, world size "
        f"{plan.world_size}, log dir {plan.log_dir}; nothing started (--dry-run)\n"
    )
    for agent in range(world.agents) if world.task is None else [world.agent_index]:
        here = _as_agent(world, agent)
        if roster.role(agent) == "spare":
            out.write(
                f"spare  agent {agent} ({here.host})  stands by: no ranks until a node is lost\n"
            )
            continue
        specs = seat_specs(
            plan, here, roster, topology, attempt=0, port=0, config_file=config_file,
            environ=environ,
        )  # fmt: skip
        for spec in specs:
            p = spec.placement
            numa = p.numa_node if p.numa_node is not None else "-"
            out.write(
                f"rank {spec.rank}  node {spec.node_rank} ({spec.host})  local {spec.local_rank}  "
                f"gpu {p.gpu or '-'}  pci {p.pci or '-'}  numa {numa}  "
                f"cpus {format_ranges(p.cpus) if p.cpus else '-'}\n  argv: {' '.join(spec.argv)}\n"
                f"  env: {' '.join(f'{k}={v}' for k, v in sorted(spec.env.items()))}\n"
            )
    out.write("options:\n" + json.dumps(plan.to_json()["options"], sort_keys=True, indent=1) + "\n")
    out.write("config:\n" + json.dumps(plan.payload.config, sort_keys=True, indent=1) + "\n")
    return 0


def _as_agent(world: World, agent: int) -> World:
    """Node 0's world as agent `agent` sees it (one agent per node)."""
    if world.task is not None:
        return world
    host = world.hosts[agent] if agent < len(world.hosts) else f"node{agent}"
    return replace(world, node_rank=agent, host=host)
