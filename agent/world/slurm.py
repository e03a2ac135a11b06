"""World sources `slurm` (one agent per node) and `slurm-task` (one srun task per rank)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from agent.errors import AgentError
from agent.world.env import (
    Int,
    below,
    lookup,
    need_int,
    opt_int,
    require,
    show,
    visible_devices,
)
from agent.world.types import Task, World, WorldFlags

_SLURM_FIX = (
    "srun sets SLURM_* for every task of a job step: run the agent as an srun task and keep "
    "them as srun set them (no overwriting, no apptainer --cleanenv)"
)
_SRUN = (
    "run under `srun --ntasks-per-node=1 --disable-status python -m agent …`, or pass --world local"
)
_SLURM_PER_NODE = (
    "one agent per node needs `srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES`; "
    "for one srun task per rank pass --world slurm-task"
)


def expand_nodelist(text: str, variable: str) -> tuple[str, ...]:
    """`gpu[001-002],cpu7` → ("gpu001", "gpu002", "cpu7"); AgentError naming `variable` when bad or empty."""
    import hostlist  # here: the clients import this package and never expand a host list

    try:
        hosts = tuple(hostlist.expand_hostlist(text.strip()))
    except hostlist.BadHostlist as err:
        raise AgentError(
            f"{show(variable, text)} is not a Slurm hostlist such as gpu[001-004,010] ({err}): "
            f"{_SLURM_FIX}"
        ) from None
    if not hosts:
        raise AgentError(f"{show(variable, text)} names no host: {_SLURM_FIX}")
    if any(not host or any(c.isspace() for c in host) for host in hosts):
        raise AgentError(f"{show(variable, text)} has a blank in a host name: {_SLURM_FIX}")
    return hosts


def slurm_step(env: Mapping[str, str]) -> tuple[str, str]:
    job = require(env, ("SLURM_JOB_ID", "SLURM_JOBID"), f"not a Slurm job step; {_SRUN}")
    step = lookup(env, "SLURM_STEP_ID", "SLURM_STEPID")
    if step is None:
        raise AgentError(
            f"SLURM allocation {show(*job)} but no job step (an sbatch script or salloc shell): "
            f"{_SRUN}"
        )
    return job[1].strip(), step[1].strip()


def _slurm_nodes(env: Mapping[str, str]) -> World:
    """The step's nodes and this node's place among them; the per-node and per-task checks come after."""
    job_id, step_id = slurm_step(env)
    nodelist = require(
        env, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"), _SLURM_FIX
    )
    hosts = expand_nodelist(nodelist[1], nodelist[0])
    nnodes = need_int(
        env, ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"), _SLURM_FIX, low=1
    )
    if len(hosts) != nnodes.value:
        raise AgentError(f"{show(*nodelist)} has {len(hosts)} hosts but {nnodes}: {_SLURM_FIX}")
    node_id = need_int(env, ("SLURM_NODEID",), _SLURM_FIX)
    below(node_id, nnodes, _SLURM_FIX)
    gpus = opt_int(env, ("SLURM_GPUS_ON_NODE",), _SLURM_FIX)
    return World(
        source="slurm",
        job_id=job_id,
        step_id=step_id,
        nnodes=nnodes.value,
        node_rank=node_id.value,
        hosts=hosts,
        host=_slurm_host(env, hosts, node_id, nodelist),
        master_addr=hosts[0],
        master_port=None,
        gpus_on_node=None if gpus is None else gpus.value,
        visible_devices=visible_devices(env),
    )


def _slurm_host(
    env: Mapping[str, str], hosts: tuple[str, ...], node_id: Int, nodelist: tuple[str, str]
) -> str:
    name = env.get("SLURMD_NODENAME", "").strip()
    expected = hosts[node_id.value]
    if name and name != expected:
        raise AgentError(
            f"SLURMD_NODENAME={name} but {show(*nodelist)} puts {node_id} on {expected}: "
            f"{_SLURM_FIX}"
        )
    return expected


def _slurm_layout(env: Mapping[str, str], nnodes: int) -> tuple[str, tuple[int, ...]] | None:
    """This step's tasks on each node. Not SLURM_NTASKS_PER_NODE: a step inherits the sbatch's
    value (3 under `sbatch --ntasks-per-node=3`) even when it runs one task per node."""
    found = lookup(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if found is None:
        return None
    counts = expand_tasks_per_node(found[1], found[0])
    if len(counts) != nnodes:
        raise AgentError(
            f"{show(*found)} describes {len(counts)} nodes, not {nnodes}: {_SLURM_FIX}"
        )
    return show(*found), counts


def from_slurm(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    world = _slurm_nodes(env)
    layout = _slurm_layout(env, world.nnodes)
    if layout is None:  # a hand-made env: SLURM_NTASKS_PER_NODE is the only clue
        per_node = opt_int(env, ("SLURM_NTASKS_PER_NODE",), _SLURM_FIX)
        if per_node is not None and per_node.value != 1:
            raise AgentError(f"{per_node}: {_SLURM_PER_NODE}")
    elif any(count != 1 for count in layout[1]):
        raise AgentError(f"{layout[0]}: {_SLURM_PER_NODE}")
    ntasks = opt_int(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"), _SLURM_FIX)
    if ntasks is not None and ntasks.value != world.nnodes:
        raise AgentError(f"{ntasks} tasks on {world.nnodes} nodes: {_SLURM_PER_NODE}")
    return world


def from_slurm_task(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    world = _slurm_nodes(env)
    ntasks = need_int(
        env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"), _SLURM_FIX, low=1
    )
    rank = need_int(env, ("SLURM_PROCID",), _SLURM_FIX)
    below(rank, ntasks, _SLURM_FIX)
    local_size, layout = _slurm_local_size(env, world.nnodes, world.node_rank, ntasks)
    local_rank = need_int(env, ("SLURM_LOCALID",), _SLURM_FIX)
    if local_rank.value >= local_size:
        raise AgentError(
            f"{local_rank} is out of range for the {local_size} tasks that {layout} puts on "
            f"node {world.node_rank}: {_SLURM_FIX}"
        )
    task = Task(rank.value, local_rank.value, ntasks.value, local_size)
    return replace(world, source="slurm-task", task=task)


def _slurm_local_size(
    env: Mapping[str, str], nnodes: int, node_rank: int, ntasks: Int
) -> tuple[int, str]:
    """Tasks on this node, and the variable that says so."""
    layout = _slurm_layout(env, nnodes)
    if layout is not None:
        shown, counts = layout
        if sum(counts) != ntasks.value:
            raise AgentError(f"{shown} adds up to {sum(counts)} tasks, not {ntasks}: {_SLURM_FIX}")
        return counts[node_rank], shown
    names = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
    per_node = need_int(env, names, _SLURM_FIX, low=1)
    return per_node.value, str(per_node)


# Slurm's compressed task layout ("2(x3),1": tasks on each node of a step).
def expand_tasks_per_node(text: str, variable: str) -> tuple[int, ...]:
    """`2(x3),1` → (2, 2, 2, 1); AgentError naming `variable` and `text` when malformed or empty."""
    import hostlist

    try:
        counts = tuple(hostlist.parse_slurm_tasks_per_node(text.strip()))
    except hostlist.BadHostlist as err:
        raise AgentError(
            f"{variable}={text!r} is not a Slurm task layout such as 2(x3),1 ({err}): "
            "srun sets it for every task of a job step; do not overwrite it in the job script"
        ) from None
    if not counts:
        raise AgentError(
            f"{variable}={text!r} lists no node: srun sets it for every task of a job step; "
            "do not overwrite it in the job script"
        )
    return counts
