"""Scheduler environment → World: how many agents there are, which one this is, where node 0 is.

Auto-detection (`--world auto`), first match wins; a forced `--world SOURCE` ignores the others:
1. any of --nnodes / --node-rank / --master-addr    → explicit
2. OMPI_COMM_WORLD_SIZE                             → mpi    (LOCAL_SIZE > 1: error, see mpi-task)
3. SLURM_JOB_ID and SLURM_STEP_ID                   → slurm  (>1 task per node: error, see slurm-task)
4. SLURM_JOB_ID without a step (sbatch, salloc)     → error: run the agent under srun
5. MASTER_ADDR, WORLD_SIZE and RANK                 → k8s    (pod-level WORLD_SIZE and RANK)
6. none of the above                                → local

Each name below comes from its own module at its first use (agent.world.detect: the detection;
types: the records; slurm: the host lists): the clients of the resident agents import
agent.world.shell and agent.world.state_dir, which runs this file, and must start without the
scheduler parsers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "PORT_HIGH",
    "PORT_LOW",
    "SOURCES",
    "Task",
    "World",
    "WorldFlags",
    "derive_port",
    "expand_nodelist",
    "world_from_env",
]

if TYPE_CHECKING:
    from agent.world.detect import PORT_HIGH, PORT_LOW, SOURCES, derive_port, world_from_env
    from agent.world.slurm import expand_nodelist
    from agent.world.types import Task, World, WorldFlags

_HOME = {
    "Task": "types",
    "World": "types",
    "WorldFlags": "types",
    "expand_nodelist": "slurm",
    **dict.fromkeys(
        ("PORT_HIGH", "PORT_LOW", "SOURCES", "derive_port", "world_from_env"), "detect"
    ),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'agent.world' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"agent.world.{home}"), name)
    globals()[name] = value  # found once
    return value
